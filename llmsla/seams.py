"""The seams between components, declared once, as ``typing.Protocol``s.

A component that calls another through one of these depends on the methods named here, not on
the other's class, so a test double, the simulator or a second implementation can stand in, and
mypy (``scripts/typecheck.sh``, run by ``make test``) checks both sides. Each Protocol is
minimal: only what its callers use today. Core holds them because every component may import
core (tests/test_architecture.py). The seams are drawn in docs/architecture.md.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llmsla.discovery import Found
    from llmsla.events import RequestEvent
    from llmsla.experiments import Strategy

__all__ = [
    "ArmAssignment", "ControlAnswer", "ControlApi", "EventSink", "MetricsSink", "ReplicaRef", "ReplicaRouter",
    "ReplicaSource",
    "RolloutHandle", "Rows", "SharedOpsHost", "SharedState", "StoreReader",
]


# -- routing ----------------------------------------------------------------------------------------
class ReplicaRef(Protocol):
    """A replica as a caller of the router sees it: implemented by
    :class:`llmsla.control.replica.Replica`; read by the gateway (where to send the request)."""

    @property
    def id(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def url(self) -> str: ...


class ReplicaRouter(Protocol):
    """Replica selection for one request: implemented by :class:`llmsla.control.router.Router`;
    called by the gateway (exporters/gateway.py) through
    :meth:`llmsla.control.distill.DistillControls.pick`, and by the fleet simulator."""

    def pools(self) -> list[str]: ...
    def replicas(self, pool: str | None = None) -> Sequence[ReplicaRef]: ...
    def has_role(self, pool: str, role: str) -> bool: ...
    def pick(self, pool: str, *, role: str | None = None, exclude: Collection[str] = (),
             policy: str | None = None, prompt_tokens: int | None = None) -> ReplicaRef: ...
    def begin(self, replica_id: str, prompt_tokens: int | None = None) -> float: ...
    def first_token(self, replica_id: str, ttft_ms: float, *, prompt_tokens: int | None = None,
                    ahead_tokens: float | None = None) -> None: ...
    def end(self, replica_id: str, latency_ms: float, *, ok: bool = True, ttft_ms: float | None = None,
            output_tokens: int | None = None, prompt_tokens: int | None = None) -> None: ...


class ReplicaSource(Protocol):
    """Which replicas there are now: implemented by :mod:`llmsla.discovery`'s static, file and
    DNS sources and :mod:`llmsla.discovery_k8s`'s; called every ``gateway.discovery_interval_s`` by
    :class:`llmsla.control.membership.Membership`. ``resolve`` raises
    :class:`llmsla.discovery.DiscoveryError` when it cannot answer (the caller keeps the last set)."""

    def describe(self) -> str: ...
    async def resolve(self) -> list[Found]: ...


class SharedState(Protocol):
    """What several gateways share (router stats, the operator-action stream): implemented by
    :class:`llmsla.control.shared_state.RedisSharedState`; called by the router (publish, read,
    replay the inbox), by the distillation controls and the rollout (broadcast an operator
    action), and by the gateway that built it (close)."""

    healthy: bool
    inbox: deque[dict[str, Any]]

    def publish(self, stats: dict[str, dict[str, Any]]) -> None: ...
    def broadcast(self, op: dict[str, Any]) -> None: ...
    def latest(self) -> dict[str, list[dict[str, Any]]]: ...
    def describe(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


class SharedOpsHost(Protocol):
    """The router as the carrier of shared operator actions: implemented by
    :class:`llmsla.control.router.Router`; :class:`~llmsla.control.distill.DistillControls` and
    :class:`~llmsla.control.rollout.Rollout` register their handler and broadcast through it."""

    op_handlers: dict[str, Callable[[dict[str, Any]], None]]
    shared: SharedState | None


# -- A/B rollout ------------------------------------------------------------------------------------
class ArmAssignment(Protocol):
    """One request's arm: implemented by :class:`llmsla.control.rollout.Assignment`; read by the
    gateway and the fleet simulator (the label on its series, the strategy it applies)."""

    @property
    def label(self) -> str: ...
    @property
    def strategy(self) -> Strategy | None: ...
    @property
    def version(self) -> str: ...


class RolloutHandle(Protocol):
    """The arm assignment of a request's unit: implemented by
    :class:`llmsla.control.rollout.Rollout`; called by the gateway, the ASGI middleware's
    assigner and the fleet simulator."""

    def assign(self, pool: str, unit: str) -> ArmAssignment: ...


# -- telemetry --------------------------------------------------------------------------------------
class EventSink(Protocol):
    """Where finished events go as JSON lines: implemented by :class:`llmsla.spool.SpoolWriter`;
    called by the request and GPU recorders and the policy tracer (exporters/)."""

    def write_line(self, line: str) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class MetricsSink(Protocol):
    """A finished request -> metrics and an event line: implemented by
    :class:`llmsla.exporters.recorder.RequestRecorder`; called by the gateway, the ASGI
    middleware and the fleet simulator, so their traffic looks the same downstream."""

    def record(self, event: RequestEvent, *, itl_gaps_ms: Sequence[float] | None = None,
               validate: bool = True, first_token: bool = True, admit: bool | None = None) -> None: ...


# -- the control API, as its clients see it ---------------------------------------------------------
class ControlAnswer(Protocol):
    """The outcome of one control-API call, never an exception: implemented by
    :class:`llmsla.control_client.Result`; read by the alert receiver, which audits it."""

    @property
    def ok(self) -> bool: ...
    @property
    def status(self) -> int: ...
    @property
    def body(self) -> Any: ...
    @property
    def error(self) -> str: ...
    @property
    def refused(self) -> bool: ...
    @property
    def permanent(self) -> bool: ...
    @property
    def latency_ms(self) -> float: ...
    def summary(self) -> dict[str, Any]: ...


class ControlApi(Protocol):
    """The control API's actions: implemented by
    :class:`llmsla.control_client.ControlClient`; called by the alert receiver's engine
    (alerting/engine.py), which never imports control."""

    async def state(self) -> ControlAnswer: ...
    async def set_weight(self, replica: str, weight: float, reason: str) -> ControlAnswer: ...
    async def drain(self, replica: str, reason: str) -> ControlAnswer: ...
    async def undrain(self, replica: str, reason: str) -> ControlAnswer: ...
    async def set_student_share(self, pool: str, pct: float, reason: str) -> ControlAnswer: ...
    async def set_schedule(self, pool: str, name: str, params: dict[str, Any], reason: str) -> ControlAnswer: ...
    async def set_shed(self, pool: str, classes: dict[str, float], reason: str) -> ControlAnswer: ...


# -- the store, as its readers see it ---------------------------------------------------------------
class Rows(Protocol):
    """The result of one statement: implemented by ``psycopg.Cursor``."""

    def fetchall(self) -> list[tuple[Any, ...]]: ...
    def fetchone(self) -> tuple[Any, ...] | None: ...


class StoreReader(Protocol):
    """Read-only statements on the store: implemented by ``psycopg.Connection``; called by the
    forecaster's store reads (forecaster/store_io.py) and the A/B report (control/ab_data.py)."""

    def execute(self, query: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> Rows: ...
