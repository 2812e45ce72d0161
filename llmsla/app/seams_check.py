"""Each implementer of a seam checked against its Protocol (llmsla/seams.py), by mypy only.

An annotation at a call site checks an implementer only where one is passed; this module
assigns every implementer to its Protocol once, so ``scripts/typecheck.sh`` fails as soon as a
method's signature drifts from the seam, whether or not a caller passes that class today. It
lives in the composition root because only the root may import every component; nothing
imports it and it does nothing at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psycopg

    from llmsla import seams
    from llmsla.control.replica import Replica
    from llmsla.control.rollout import Assignment, Rollout
    from llmsla.control.router import Router
    from llmsla.control.shared_state import RedisSharedState
    from llmsla.control_client import ControlClient, Result
    from llmsla.exporters.recorder import RequestRecorder
    from llmsla.spool import SpoolWriter

    def _implementers(router: Router, replica: Replica, shared: RedisSharedState, rollout: Rollout,
                      assignment: Assignment, recorder: RequestRecorder, spool: SpoolWriter,
                      client: ControlClient, result: Result, conn: psycopg.Connection,
                      cursor: psycopg.Cursor) -> None:
        _router: seams.ReplicaRouter = router
        _replica: seams.ReplicaRef = replica
        _shared: seams.SharedState = shared
        _host: seams.SharedOpsHost = router
        _rollout: seams.RolloutHandle = rollout
        _arm: seams.ArmAssignment = assignment
        _metrics: seams.MetricsSink = recorder
        _events: seams.EventSink = spool
        _control: seams.ControlApi = client
        _answer: seams.ControlAnswer = result
        _store: seams.StoreReader = conn
        _rows: seams.Rows = cursor
