"""Prometheus metrics of the router and the distillation controls, created in one place.

Without a registry they go to a private :class:`CollectorRegistry`, so several routers in one
process (simulator, benchmarks, tests) never collide on metric names; the gateway passes its own
registry (or ``prometheus_client.REGISTRY``) to expose them. One instance per registry
(:meth:`RouterMetrics.of`), so two routers exposing to the same registry share its families
rather than clash. Gauges are ``livemostrecent`` in multi-process mode (``llmsla gateway
--workers N``): each process holds the same operator state, the newest value is the truth.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from llmsla import names

_MODE: Final = "livemostrecent"  # Final: mypy reads it as the Literal prometheus_client asks for
_lock = threading.Lock()


class _PerRegistry:
    """``Cls.of(registry)``: one instance per registry (a private registry for None)."""

    _of: weakref.WeakKeyDictionary[CollectorRegistry, Any]

    def __init_subclass__(cls) -> None:
        cls._of = weakref.WeakKeyDictionary()

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    @classmethod
    def of(cls, registry: CollectorRegistry | None = None) -> Any:
        if registry is None:
            return cls(CollectorRegistry())
        with _lock:
            m = cls._of.get(registry)
            if m is None:
                m = cls._of[registry] = cls(registry)
            return m


class RouterMetrics(_PerRegistry):
    """Counters and gauges of the routers of one registry; label children are cached by each
    router."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        labels = (names.L_POOL, names.L_REPLICA)
        self.picks = Counter(names.ROUTER_PICKS, "Requests routed to a replica", labels, registry=self.registry)
        self.score = Gauge(names.ROUTER_SCORE, "LADR score (EMA-smoothed) of a replica", labels,
                           registry=self.registry, multiprocess_mode=_MODE)
        self.weight = Gauge(names.ROUTER_WEIGHT, "Operator weight of a replica", labels, registry=self.registry,
                            multiprocess_mode=_MODE)
        self.drained = Gauge(names.ROUTER_DRAINED, "1 if the replica is drained", labels, registry=self.registry,
                             multiprocess_mode=_MODE)
        self.fallback = Counter(
            names.ROUTER_FALLBACK,
            "Refreshes that used local stats because the shared state (Redis) was unavailable",
            registry=self.registry,
        )


class DistillMetrics(_PerRegistry):
    """Gauge of the student share per pool."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.student_share = Gauge(
            names.DISTILL_STUDENT_SHARE_RATIO,
            "Share of traffic (0..1) sent to student replicas",
            (names.L_POOL,),
            registry=self.registry,
            multiprocess_mode=_MODE,
        )


class RolloutMetrics(_PerRegistry):
    """Gauges of the A/B rollout: each arm's weight and each experiment's coverage in force."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.weight = Gauge(names.ROLLOUT_ARM_WEIGHT, "Weight in force of an experiment's arm (0 = rolled back)",
                            (names.L_EXPERIMENT, names.L_ARM), registry=registry, multiprocess_mode=_MODE)
        self.coverage = Gauge(names.ROLLOUT_COVERAGE_RATIO, "Share of units (0..1) in an experiment",
                              (names.L_EXPERIMENT,), registry=registry, multiprocess_mode=_MODE)


class ShedMetrics(_PerRegistry):
    """Gauge of the share of each class shed per pool (control/shed.py)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.share = Gauge(names.SHED_SHARE_RATIO, "Share (0..1) of a class's requests refused in a pool by shedding",
                           (names.L_POOL, names.L_CLASS), registry=registry, multiprocess_mode=_MODE)
