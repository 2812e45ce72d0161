"""Distillation controls: per pool, the share of traffic to student replicas and the temperature
schedule in force, changed in bounded steps with every change audited.

Bounded because the alert receiver acts automatically: a runaway loop (or a fat-fingered
operator) must not move all traffic onto an untested student in one call. A schedule step is
refused, not clamped, since clamping would produce a schedule nobody asked for. Student or teacher
is a hash of ``pool:key``, so raising the share only moves keys teacher -> student.
See docs/control.md#distillation-controls.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from llmsla.control.audit import OUTCOME_APPLIED, OUTCOME_CLAMPED, OUTCOME_REFUSED, AuditLog
from llmsla.control.metrics import DistillMetrics
from llmsla.seams import ReplicaRef, ReplicaRouter, SharedOpsHost
from llmsla.temperature import DEFAULT_SCHEDULE, Schedule, validate_schedule

STUDENT = "student"
TEACHER = "teacher"
_BPS = 10_000  # share resolution: basis points
#: Schedule bounds whose movement per change is limited by ``max_temperature_step``.
TEMPERATURE_BOUND_KEYS: tuple[str, ...] = ("t_min", "t_max", "t_init")


class StepTooLarge(ValueError):
    """A change exceeds the configured bounded step (and clamping does not apply)."""


class UnknownPool(LookupError):
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown pool"


@dataclass
class PoolControls:
    student_share_pct: float = 0.0
    schedule: Schedule = field(default_factory=lambda: DEFAULT_SCHEDULE)


def key_point(pool: str, key: str) -> int:
    """Deterministic point in [0, 10000) of a request key (stable across processes and runs)."""
    h = hashlib.blake2b(f"{pool}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") % _BPS


def role_for_share(pool: str, key: str, share_pct: float) -> str:
    """``student`` iff the key's point is below the share (the gateway and the simulator)."""
    if share_pct <= 0:
        return TEACHER
    if share_pct >= 100:
        return STUDENT
    return STUDENT if key_point(pool, key) < round(share_pct * 100) else TEACHER


class DistillControls:
    """Per-pool student share and temperature schedule; see the module docstring."""

    def __init__(
        self,
        pools: list[str] | None = None,
        *,
        max_share_step_pct: float = 10.0,
        max_temperature_step: float = 0.5,
        audit: AuditLog | None = None,
        registry: CollectorRegistry | None = None,
        router: SharedOpsHost | None = None,
    ) -> None:
        self.max_share_step_pct = float(max_share_step_pct)
        self.max_temperature_step = float(max_temperature_step)
        self.audit = audit or AuditLog()
        self.metrics = DistillMetrics.of(registry)
        self._fixed_pools = False  # while adding the initial pools
        self._pools: dict[str, PoolControls] = {}
        self._lock = threading.Lock()
        for p in pools or ():
            self._get(p)
        self._fixed_pools = pools is not None  # a given list is the complete set: others are 404
        # With a Redis-shared router, changes ride its operator-action stream to every gateway
        # (absolute values, applied in stream order; bounds were enforced where the change was made).
        self._shared = getattr(router, "shared", None)
        if router is not None:
            router.op_handlers["distill"] = self._apply_shared_op

    @classmethod
    def from_config(cls, cfg: Any, pools: list[str] | None = None, *, audit: AuditLog | None = None,
                    registry: CollectorRegistry | None = None, router: SharedOpsHost | None = None) -> DistillControls:
        c = cfg.control
        return cls(pools, max_share_step_pct=c.max_share_step_pct, max_temperature_step=c.max_temperature_step,
                   audit=audit, registry=registry, router=router)

    def _broadcast(self, pool: str, pc: PoolControls) -> None:
        if self._shared is not None:
            self._shared.broadcast({"op": "distill", "pool": pool, "student_share_pct": pc.student_share_pct,
                                    "schedule": pc.schedule.to_dict()})

    def _apply_shared_op(self, op: dict[str, Any]) -> None:
        """A change made on another gateway (or our own, coming back in stream order)."""
        pool = op["pool"]
        share = float(op["student_share_pct"])
        if not 0 <= share <= 100:
            raise ValueError(f"student_share_pct out of range: {share}")
        schedule = validate_schedule(op["schedule"]["name"], op["schedule"]["params"])
        with self._lock:
            pc = self._get(pool)  # UnknownPool (a LookupError) -> skipped by the router
            pc.student_share_pct = share
            pc.schedule = schedule
            self.metrics.student_share.labels(pool).set(share / 100.0)

    def _get(self, pool: str) -> PoolControls:
        pc = self._pools.get(pool)
        if pc is None:
            if self._fixed_pools:
                raise UnknownPool(f"unknown pool {pool!r} (known: {', '.join(self._pools)})")
            if not isinstance(pool, str) or not pool:
                raise ValueError(f"pool: expected a non-empty string, got {pool!r}")
            pc = self._pools[pool] = PoolControls()
            self.metrics.student_share.labels(pool).set(0.0)
        return pc

    def pools(self) -> list[str]:
        return list(self._pools)

    # -- reads (hot path: the gateway asks per request) ------------------------------------------
    def student_share_pct(self, pool: str) -> float:
        pc = self._pools.get(pool)
        return pc.student_share_pct if pc else 0.0

    def schedule(self, pool: str) -> Schedule:
        pc = self._pools.get(pool)
        return pc.schedule if pc else DEFAULT_SCHEDULE

    def schedule_in_force(self, pool: str) -> Schedule | None:
        """The pool's schedule when the control plane set one other than the default, else
        None: the default leaves each request's own temperature and ``llmsla_policy`` in force."""
        pc = self._pools.get(pool)
        return pc.schedule if pc is not None and pc.schedule != DEFAULT_SCHEDULE else None

    def role_for(self, pool: str, key: str, share_pct: float | None = None) -> str:
        """``student`` or ``teacher`` for this request key (deterministic, see module doc);
        ``share_pct`` overrides the pool's share (an A/B arm's strategy)."""
        if share_pct is None:
            pc = self._pools.get(pool)
            share_pct = pc.student_share_pct if pc is not None else 0.0
        return role_for_share(pool, key, share_pct)

    def pick(self, router: ReplicaRouter, pool: str, key: str, *, exclude: Collection[str] = (),
             share_pct: float | None = None, policy: str | None = None,
             prompt_tokens: int | None = None) -> ReplicaRef:
        """Route a request: the key's role if the pool has replicas of it, else any replica (a
        pool without a teacher/student split routes as if there were no controls). ``share_pct``
        and ``policy`` are an A/B arm's overrides of the pool's share and the router's policy;
        ``prompt_tokens`` the request's prompt size (the router's pick weighs it)."""
        from llmsla.control.router import NoReplicaAvailable

        role = self.role_for(pool, key, share_pct)
        if router.has_role(pool, role):
            try:
                return router.pick(pool, role=role, exclude=exclude, policy=policy, prompt_tokens=prompt_tokens)
            except NoReplicaAvailable:  # every replica of that role excluded: any role
                pass
        return router.pick(pool, exclude=exclude, policy=policy, prompt_tokens=prompt_tokens)

    # -- writes ----------------------------------------------------------------------------------
    def set_student_share(self, pool: str, pct: Any, *, actor: str, reason: str = "",
                          clamp: bool = True) -> dict[str, Any]:
        """Move the share toward ``pct`` by at most max_share_step_pct; returns the audit record."""
        if isinstance(pct, bool) or not isinstance(pct, int | float) or not math.isfinite(pct) or not 0 <= pct <= 100:
            raise ValueError(f"student_share_pct: must be a number in [0, 100], got {pct!r}")
        with self._lock:
            pc = self._get(pool)
            before = pc.student_share_pct
            requested = float(pct)
            delta = requested - before
            step = self.max_share_step_pct
            extra = {"requested": requested, "max_step_pct": step}
            outcome = OUTCOME_APPLIED
            if abs(delta) > step + 1e-9:
                if not clamp:
                    self.audit.record(actor=actor, action="set_student_share", target=pool, before=before,
                                      after=before, reason=reason, outcome=OUTCOME_REFUSED, extra=extra)
                    raise StepTooLarge(
                        f"student_share_pct: change {before:g} -> {requested:g} exceeds the max step of "
                        f"{step:g} points per change (control.max_share_step_pct)"
                    )
                outcome = OUTCOME_CLAMPED
                requested = before + math.copysign(step, delta)
            pc.student_share_pct = min(100.0, max(0.0, requested))
            self.metrics.student_share.labels(pool).set(pc.student_share_pct / 100.0)
            self._broadcast(pool, pc)
            return self.audit.record(actor=actor, action="set_student_share", target=pool, before=before,
                                     after=pc.student_share_pct, reason=reason, outcome=outcome, extra=extra)

    def set_schedule(self, pool: str, name: Any, params: Any, *, actor: str, reason: str = "") -> dict[str, Any]:
        """Replace the temperature schedule; refused if a bound moves more than the max step."""
        new = validate_schedule(name, params)
        with self._lock:
            pc = self._get(pool)
            old = pc.schedule
            step = self.max_temperature_step
            for k in TEMPERATURE_BOUND_KEYS:
                a, b = old.params.get(k), new.params.get(k)
                if a is None or b is None:
                    continue
                if abs(b - a) > step + 1e-9:
                    self.audit.record(actor=actor, action="set_temperature_schedule", target=pool,
                                      before=old.to_dict(), after=old.to_dict(), reason=reason,
                                      outcome=OUTCOME_REFUSED, extra={"requested": new.to_dict(),
                                                                      "max_temperature_step": step})
                    raise StepTooLarge(
                        f"schedule.params.{k}: change {a:g} -> {b:g} exceeds the max step of {step:g} "
                        f"per change (control.max_temperature_step); move it in several changes"
                    )
            pc.schedule = new
            self._broadcast(pool, pc)
            return self.audit.record(actor=actor, action="set_temperature_schedule", target=pool,
                                     before=old.to_dict(), after=new.to_dict(), reason=reason,
                                     outcome=OUTCOME_APPLIED)

    def snapshot(self) -> dict[str, Any]:
        return {
            "max_share_step_pct": self.max_share_step_pct,
            "max_temperature_step": self.max_temperature_step,
            "pools": {
                p: {"student_share_pct": pc.student_share_pct, "schedule": pc.schedule.to_dict()}
                for p, pc in self._pools.items()
            },
        }
