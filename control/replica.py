"""A replica as the router sees it: its identity, its live bookkeeping, and the errors of
routing to it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from llmsla.replicas import Replica  # the identity is core (one numbering for every command)

if TYPE_CHECKING:
    from llmsla.control.sampler import LadrSampler, LoadLevels

ROLES: tuple[str, ...] = ("teacher", "student", "")


class NoReplicaAvailable(RuntimeError):
    """No replica of the pool (and role) can take the request: empty, all drained, or excluded."""


class UnknownReplica(LookupError):
    """A replica id the router does not know."""

    def __str__(self) -> str:  # LookupError would quote the message
        return str(self.args[0]) if self.args else "unknown replica"


class LastReplicaError(RuntimeError):
    """Draining this replica would leave its pool with no healthy (non-drained) replica."""


class ReplicaState:
    """Mutable per-replica bookkeeping (slots: touched on every begin/end)."""

    __slots__ = (
        "rep", "outstanding", "drained", "down", "last_seen", "lat_sum", "lat_n", "avg_ms", "win_n",
        "reported_queue", "reported_at", "queue", "raw", "score", "picks", "errors", "fresh",
        "pick_child", "avg_eff", "score_child", "levels", "lat_ema", "extra_q", "slots", "pending", "leaving",
    )

    def __init__(self, rep: Replica, now: float) -> None:
        self.rep = rep
        self.outstanding = 0
        self.drained = False  # by an operator (control API, alert receiver)
        self.down = False  # by a health checker (the fleet simulator's); never shared
        self.pending = False  # discovered, not yet answered a health probe: no traffic yet
        self.leaving = False  # gone from discovery: no new requests, forgotten once idle
        self.last_seen = now  # a new replica gets one TTL of grace
        self.lat_sum = 0.0
        self.lat_n = 0
        self.avg_ms: float | None = None
        self.win_n = 0
        self.reported_queue: int | None = None
        self.reported_at = -math.inf
        self.queue = 0.0
        self.raw: float | None = None
        self.score: float | None = None
        self.picks = 0
        self.errors = 0
        self.fresh = True
        self.pick_child: Any = None
        self.score_child: Any = None
        self.levels: LoadLevels | None = None  # the pool's least-outstanding index
        self.avg_eff: float | None = None  # avg latency merged with other gateways' reports
        self.lat_ema: float | None = None  # EMA of avg_eff (ms), refreshed every refresh_s
        self.extra_q = 0.0  # queue seen beyond our own outstanding (other gateways, reports)
        self.slots: list[tuple[LadrSampler, int]] = []  # LADR samplers this replica is in, and where


def check_weight(weight: Any) -> None:
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
        raise ValueError(f"weight: must be a finite number >= 0, got {weight!r}")
