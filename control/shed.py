"""Load shedding per pool and request class: which classes a pool refuses, and what share of them.

Why here: the alert receiver sheds the less protected classes of a pool whose more protected
class burns its error budget, and every gateway of the pool must refuse the same share. The state
is a small absolute map (pool -> class -> share in 0..1) that rides the router's shared operator
stream like the distillation controls, so N gateways converge whichever control API took the
change. The most protected class (the first of ``tenants.classes``) can never be shed: shedding
exists to protect it. A share is applied by a counter per (pool, class), not a coin flip: 0.5
refuses exactly every second request of that class, so the share the operator set is the share
clients see over any run of requests. See docs/control.md#load-shedding.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from llmsla import names
from llmsla.control.audit import OUTCOME_APPLIED, OUTCOME_REFUSED, AuditLog
from llmsla.control.distill import UnknownPool
from llmsla.control.metrics import ShedMetrics
from llmsla.events import shown_name
from llmsla.seams import SharedOpsHost


class ProtectedClass(ValueError):
    """A change asks to shed the most protected class (refused: 409)."""


def check_shares(classes: Sequence[str], shares: Any) -> dict[str, float]:
    """``shares`` as ``{class: share}`` or a ValueError naming the bad class or value; the first
    of ``classes`` (the protected one) is a :class:`ProtectedClass` unless its share is 0."""
    if not isinstance(shares, dict):
        raise ValueError(f"classes: expected an object of class -> share in [0, 1], got {type(shares).__name__}")
    out: dict[str, float] = {}
    for cls, share in shares.items():
        if cls not in classes:
            raise ValueError(f"classes: unknown class {shown_name(cls)!r}; known (tenants.classes): {', '.join(classes)}")
        if isinstance(share, bool) or not isinstance(share, int | float) or not math.isfinite(share) or not 0 <= share <= 1:
            raise ValueError(f"classes.{cls}: expected a share in [0, 1], got {share!r}")
        if cls == classes[0] and share > 0:
            raise ProtectedClass(f"classes.{cls}: {cls!r} is the most protected class (first of tenants.classes) "
                                 "and is never shed")
        out[cls] = float(share)
    return out


class ShedControls:
    """Per pool, the share of each class refused before its body is read; see the module doc."""

    def __init__(self, classes: Sequence[str] = names.DEFAULT_CLASSES, pools: list[str] | None = None, *,
                 audit: AuditLog | None = None, registry: CollectorRegistry | None = None,
                 router: SharedOpsHost | None = None) -> None:
        if not classes:
            raise ValueError("shedding needs at least one class")
        self.classes = tuple(classes)
        self.protected = self.classes[0]
        self.audit = audit or AuditLog()
        self.metrics = ShedMetrics.of(registry)
        self._lock = threading.Lock()
        self._pools: dict[str, dict[str, float]] = {p: {} for p in pools or ()}
        self._fixed = pools is not None
        #: anything shed anywhere: the gateway's hot path looks no further while False
        self.active = False
        #: (pool, class) -> accumulated share; a request is shed each time it passes 1
        self._acc: dict[tuple[str, str], float] = {}
        self._shared = getattr(router, "shared", None)
        if router is not None:
            router.op_handlers["shed"] = self._apply_shared_op

    def _pool(self, pool: str) -> dict[str, float]:
        found = self._pools.get(pool)
        if found is None:
            if self._fixed:
                raise UnknownPool(f"unknown pool {pool!r} (known: {', '.join(self._pools)})")
            if not isinstance(pool, str) or not pool:
                raise ValueError(f"pool: expected a non-empty string, got {pool!r}")
            found = self._pools[pool] = {}
        return found

    # -- the hot path ----------------------------------------------------------------------------
    def sheds(self, pool: str, cls: str) -> bool:
        """Shed this request of ``cls`` in ``pool``? Exactly ``share`` of them over any run."""
        shares = self._pools.get(pool)
        if not shares:
            return False
        share = shares.get(cls, 0.0)
        if share <= 0.0:
            return False
        if share >= 1.0:
            return True
        key = (pool, cls)
        acc = self._acc.get(key, 0.0) + share
        if acc >= 1.0 - 1e-12:
            self._acc[key] = acc - 1.0
            return True
        self._acc[key] = acc
        return False

    def share(self, pool: str, cls: str) -> float:
        return self._pools.get(pool, {}).get(cls, 0.0)

    # -- writes ----------------------------------------------------------------------------------
    def _set(self, pool: str, shares: Mapping[str, float]) -> dict[str, float]:
        current = self._pool(pool)
        for cls, share in shares.items():
            if share > 0:
                current[cls] = share
            else:
                current.pop(cls, None)
                self._acc.pop((pool, cls), None)
            self.metrics.share.labels(pool, cls).set(share)
        self.active = any(self._pools.values())
        return dict(current)

    def set_shares(self, pool: str, shares: Any, *, actor: str, reason: str = "") -> dict[str, Any]:
        """Set the named classes' shares in ``pool`` (others keep theirs; 0 stops shedding a
        class); returns the audit record. Refusals (unknown class, protected class, bad share)
        raise before anything changes; a protected-class refusal is audited."""
        try:
            wanted = check_shares(self.classes, shares)
        except ProtectedClass:
            with self._lock:
                before = dict(self._pool(pool))
            self.audit.record(actor=actor, action="set_shed", target=pool, before=before, after=before,
                              reason=reason, outcome=OUTCOME_REFUSED, extra={"requested": shares})
            raise
        with self._lock:
            before = dict(self._pool(pool))
            after = self._set(pool, wanted)
            if self._shared is not None:
                self._shared.broadcast({"op": "shed", "pool": pool, "classes": after})
        return self.audit.record(actor=actor, action="set_shed", target=pool, before=before, after=after,
                                 reason=reason, outcome=OUTCOME_APPLIED, extra={"requested": wanted})

    def _apply_shared_op(self, op: dict[str, Any]) -> None:
        """The pool's whole map as set on some gateway (absolute: classes not named are not shed)."""
        wanted = check_shares(self.classes, op["classes"])
        with self._lock:
            current = self._pool(op["pool"])  # UnknownPool (a LookupError) -> skipped by the router
            self._set(op["pool"], {**{c: 0.0 for c in current if c not in wanted}, **wanted})

    def snapshot(self) -> dict[str, Any]:
        return {"classes": list(self.classes), "protected": self.protected,
                "pools": {p: dict(s) for p, s in self._pools.items()}}
