"""A/B rollout: which arm of which experiment a unit (user or session) is in, by consistent hashing.

Each arm owns a segment of the hash space as wide as its weight and coverage uses the first part
of each segment, so ramping coverage and rolling an arm back move nobody else; versions are
labels, not hashed. Assignment is a pure function of configuration and unit, so every gateway
and the simulator agree without sharing state. Do not replace this with one cumulative range
scaled by coverage: that moves units between arms as coverage grows.
See docs/ab.md#1-configure-an-experiment.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from prometheus_client import CollectorRegistry

from llmsla import experiments as specs
from llmsla import names
from llmsla.control.audit import OUTCOME_APPLIED, OUTCOME_REFUSED, AuditLog
from llmsla.control.metrics import RolloutMetrics
from llmsla.experiments import Experiment, Strategy
from llmsla.seams import SharedOpsHost

_SPACE = 1 << 64


class UnknownExperiment(LookupError):
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown experiment"


class WeightTooLarge(ValueError):
    """An arm's weight above its configured one would move other units (refused)."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """The outcome for one request: the arm label, and the strategy to apply (None: the pool's)."""

    label: str
    experiment: str | None = None
    arm: str | None = None
    strategy: Strategy | None = None
    version: str = ""
    forced: bool = False


OUTSIDE = Assignment(names.DEFAULT_ARM)


def hash_prefix(experiment: str, seed: int) -> bytes:
    return f"llmsla-ab/{experiment}/{seed}/".encode()


def point(prefix: bytes, unit: str) -> int:
    """The unit's point in [0, 2^64): stable across processes, machines and Python versions."""
    return int.from_bytes(blake2b(prefix + unit.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class _Plan:
    """The precomputed lookup of one enabled experiment: segment starts and used-part limits."""

    __slots__ = ("exp", "prefix", "starts", "limits", "assigned", "forced")

    # starts/limits are 8-byte big-endian: comparing digests as bytes is comparing the integers,
    # and skips an int.from_bytes per request

    def __init__(self, exp: Experiment, weights: Mapping[str, float], coverage: float) -> None:
        self.exp = exp
        self.prefix = hash_prefix(exp.key, exp.seed)
        total = sum(a.weight for a in exp.arms)
        self.starts: list[bytes] = []
        self.limits: list[bytes] = []
        acc = 0.0
        for a in exp.arms:
            start = round(acc / total * _SPACE)
            acc += a.weight
            end = round(acc / total * _SPACE)
            used = coverage * weights[a.name] / a.weight  # the share of the segment in use
            limit = start + math.floor((end - start) * min(1.0, used))
            self.starts.append(start.to_bytes(8, "big"))
            # the limit is exclusive; at the top of the space it cannot be written in 8 bytes
            self.limits.append(limit.to_bytes(8, "big") if limit < _SPACE else b"\xff" * 9)
        self.assigned = [Assignment(exp.label(a.name), exp.key, a.name, a.strategy, a.version) for a in exp.arms]
        self.forced: dict[str, Assignment] = {}


class Rollout:
    """Assignments for every enabled experiment, by pool; weights and coverage changeable at run
    time (audited, broadcast to other gateways through the router's shared stream)."""

    def __init__(self, experiments: Mapping[str, Experiment], *, audit: AuditLog | None = None,
                 registry: CollectorRegistry | None = None, router: SharedOpsHost | None = None) -> None:
        self.experiments = dict(experiments)
        self.audit = audit or AuditLog()
        self.metrics = RolloutMetrics.of(registry)
        self._lock = threading.Lock()
        self._weights = {k: {a.name: a.weight for a in e.arms} for k, e in self.experiments.items()}
        self._coverage = {k: e.coverage for k, e in self.experiments.items()}
        self._forced: dict[str, dict[str, str]] = {k: dict(e.forced) for k, e in self.experiments.items()}
        self._plans: dict[str, _Plan] = {}
        for key in self.experiments:
            self._rebuild(key)
        self._shared = getattr(router, "shared", None)
        if router is not None:
            router.op_handlers["rollout"] = self._apply_shared_op

    @classmethod
    def from_config(cls, cfg: Any, *, audit: AuditLog | None = None, registry: CollectorRegistry | None = None,
                    router: SharedOpsHost | None = None) -> Rollout:
        return cls(specs.parse(cfg.ab.experiments), audit=audit, registry=registry, router=router)

    def _rebuild(self, key: str) -> None:
        """Recompute an experiment's plan (after a weight/coverage change); swaps one reference,
        so a concurrent ``assign`` sees the old plan or the new one, never a mix."""
        e = self.experiments[key]
        for a in e.arms:
            self.metrics.weight.labels(key, a.name).set(self._weights[key][a.name])
        self.metrics.coverage.labels(key).set(self._coverage[key])
        if not e.enabled:
            return
        plan = _Plan(e, self._weights[key], self._coverage[key])
        for unit, arm in self._forced[key].items():
            a = e.arm(arm)
            plan.forced[unit] = Assignment(e.label(arm, forced=True), e.key, arm, a.strategy, a.version, True)
        self._plans[e.pool] = plan

    # -- hot path ----------------------------------------------------------------------------------
    def assign(self, pool: str, unit: str) -> Assignment:
        """The arm of ``unit`` for a request to ``pool`` (:data:`OUTSIDE` when none applies)."""
        plan = self._plans.get(pool)
        if plan is None:
            return OUTSIDE
        if plan.forced:
            f = plan.forced.get(unit)
            if f is not None:
                return f
        try:
            raw = unit.encode()
        except UnicodeEncodeError:  # a lone surrogate from a JSON body: still a stable key
            raw = unit.encode("utf-8", "surrogatepass")
        x = blake2b(plan.prefix + raw, digest_size=8).digest()
        k = bisect.bisect_right(plan.starts, x) - 1
        return plan.assigned[k] if x < plan.limits[k] else OUTSIDE

    # -- operator changes --------------------------------------------------------------------------
    def _experiment(self, key: str) -> Experiment:
        try:
            return self.experiments[key]
        except KeyError:
            raise UnknownExperiment(f"unknown experiment {key!r} (known: {', '.join(self.experiments) or 'none'})") from None

    def set_weight(self, key: str, arm: str, weight: Any, *, actor: str, reason: str = "") -> dict[str, Any]:
        """An arm's weight in force, in [0, its configured weight]; 0 rolls the arm back."""
        e = self._experiment(key)
        try:
            configured = e.arm(arm).weight
        except KeyError as exc:
            raise UnknownExperiment(str(exc.args[0])) from None
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight: must be a number >= 0, got {weight!r}")
        target = f"{key}/{arm}"
        with self._lock:
            before = self._weights[key][arm]
            if weight > configured + 1e-12:
                self.audit.record(actor=actor, action="set_arm_weight", target=target, before=before, after=before,
                                  reason=reason, outcome=OUTCOME_REFUSED, extra={"requested": weight, "configured": configured})
                raise WeightTooLarge(
                    f"weight: {weight:g} is above arm {arm!r}'s configured weight {configured:g}; raising it would move "
                    "other units between arms (configure a new experiment or seed instead)")
            self._weights[key][arm] = float(weight)
            self._rebuild(key)
            self._broadcast(key)
            return self.audit.record(actor=actor, action="set_arm_weight", target=target, before=before,
                                     after=float(weight), reason=reason, outcome=OUTCOME_APPLIED,
                                     extra={"configured": configured})

    def set_coverage(self, key: str, coverage: Any, *, actor: str, reason: str = "") -> dict[str, Any]:
        """Ramp an experiment: units only join (or, ramping down, only leave) their arms."""
        self._experiment(key)
        if isinstance(coverage, bool) or not isinstance(coverage, int | float) or not 0 <= coverage <= 1:
            raise ValueError(f"coverage: must be a number in [0, 1], got {coverage!r}")
        with self._lock:
            before = self._coverage[key]
            self._coverage[key] = float(coverage)
            self._rebuild(key)
            self._broadcast(key)
            return self.audit.record(actor=actor, action="set_coverage", target=key, before=before,
                                     after=float(coverage), reason=reason, outcome=OUTCOME_APPLIED)

    def force(self, key: str, unit: str, arm: str | None) -> None:
        """Pin a test unit to an arm (None: unpin); its requests are labelled ``...:forced``."""
        e = self._experiment(key)
        if arm is not None:
            e.arm(arm)
        with self._lock:
            if arm is None:
                self._forced[key].pop(unit, None)
            else:
                self._forced[key][unit] = arm
            self._rebuild(key)

    def _broadcast(self, key: str) -> None:
        if self._shared is not None:
            self._shared.broadcast({"op": "rollout", "experiment": key, "coverage": self._coverage[key],
                                    "weights": dict(self._weights[key])})

    def _apply_shared_op(self, op: dict[str, Any]) -> None:
        """A change made on another gateway (or ours, back in stream order): absolute values."""
        key = op["experiment"]
        e = self._experiment(key)
        weights = {a.name: float(op["weights"][a.name]) for a in e.arms}
        if not all(0 <= weights[a.name] <= a.weight for a in e.arms) or not 0 <= float(op["coverage"]) <= 1:
            raise ValueError(f"rollout op out of range: {op}")
        with self._lock:
            self._weights[key] = weights
            self._coverage[key] = float(op["coverage"])
            self._rebuild(key)

    # -- reads -------------------------------------------------------------------------------------
    def weights(self, key: str) -> dict[str, float]:
        self._experiment(key)
        return dict(self._weights[key])

    def coverage(self, key: str) -> float:
        self._experiment(key)
        return self._coverage[key]

    def expected_shares(self, key: str) -> dict[str, float]:
        """Share of each arm among the experiment's (non-forced) units with the weights in force:
        what the sample-ratio test compares the observed split with."""
        e = self._experiment(key)
        w = self._weights[key]
        total = sum(a.weight for a in e.arms)
        used = {a.name: a.weight / total * min(1.0, w[a.name] / a.weight) for a in e.arms}
        s = sum(used.values())
        return {k: (v / s if s > 0 else 0.0) for k, v in used.items()}

    def snapshot(self) -> dict[str, Any]:
        return {
            key: {
                "pool": e.pool, "seed": e.seed, "enabled": e.enabled, "control": e.control,
                "coverage": self._coverage[key],
                "arms": {a.name: {"label": e.label(a.name), "weight": self._weights[key][a.name],
                                  "configured_weight": a.weight, "version": a.version,
                                  "strategy": a.strategy.to_dict()} for a in e.arms},
                "forced": dict(self._forced[key]),
            }
            for key, e in self.experiments.items()
        }
