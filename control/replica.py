"""A replica as the router sees it: its identity, its live bookkeeping, and the errors of
routing to it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from llmsla.control.estimator import ServiceEstimate
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


class EngineSignal:
    """What the replica's engine last said about itself (its /metrics, scraped): requests
    waiting for a batch slot, requests running, KV-cache usage in [0, 1], and when (router
    clock). Fed by :meth:`Router.update_engine`; see docs/control.md#engine-signals."""

    __slots__ = ("waiting", "running", "kv_usage", "at")

    def __init__(self, waiting: float, running: float, kv_usage: float, at: float) -> None:
        self.waiting, self.running, self.kv_usage, self.at = waiting, running, kv_usage, at

    def __repr__(self) -> str:
        return (f"EngineSignal(waiting={self.waiting:g}, running={self.running:g}, "
                f"kv_usage={self.kv_usage:g}, at={self.at:g})")


def check_engine(waiting: Any, running: Any, kv_usage: Any) -> tuple[float, float, float]:
    """The engine values as floats, or ValueError naming the bad one (a scrape may carry NaN,
    a negative gauge after a bug, or a KV usage in percent)."""
    out = []
    for name, v, hi in (("waiting", waiting, math.inf), ("running", running, math.inf), ("kv_usage", kv_usage, 1.0)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= hi:
            bound = "in [0, 1]" if hi == 1.0 else "a finite number >= 0"
            raise ValueError(f"engine {name}: must be {bound}, got {v!r}")
        out.append(float(v))
    return out[0], out[1], out[2]


class ReplicaState:
    """Mutable per-replica bookkeeping (slots: touched on every begin/end)."""

    __slots__ = (
        "rep", "outstanding", "drained", "down", "last_seen", "lat_sum", "lat_n", "avg_ms", "win_n",
        "reported_queue", "reported_at", "queue", "raw", "score", "picks", "errors", "fresh",
        "pick_child", "avg_eff", "score_child", "levels", "lat_ema", "extra_q", "slots", "pending", "leaving",
        "engine", "engine_fresh", "engine_out", "engine_peak", "svc", "wait_tok", "tok_n", "tok_gap_s", "tok_load",
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
        self.engine: EngineSignal | None = None  # the engine's own last reported state
        self.engine_fresh = False  # engine data no older than engine_ttl_s at the last refresh
        self.engine_out = 0  # this router's outstanding requests here when the engine last reported
        self.engine_peak = 0.0  # the largest running batch the engine has reported: its batch when full
        self.svc = ServiceEstimate()  # learnt speed (LADR's expected-completion-time term)
        self.wait_tok = 0.0  # prompt tokens routed here that await their first token (ECT term)
        # tokens streamed back past their stream's first since the last cadence reading: how
        # many, the sum of their inter-token gaps, and of the load here as each came back
        self.tok_n = 0
        self.tok_gap_s = 0.0
        self.tok_load = 0.0


def check_weight(weight: Any) -> None:
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
        raise ValueError(f"weight: must be a finite number >= 0, got {weight!r}")
