"""Prometheus metrics of the router and the distillation controls, created in one place.

Each :class:`~llmsla.control.router.Router` / :class:`~llmsla.control.distill.DistillControls`
owns one instance. Without a registry they go to a private :class:`CollectorRegistry`, so several
routers in one process (simulator, benchmarks, tests) never collide on metric names; the gateway
passes its own registry (or ``prometheus_client.REGISTRY``) to expose them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from llmsla import names


class RouterMetrics:
    """Counters and gauges of one router; label children are cached by the router."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = (names.L_POOL, names.L_REPLICA)
        self.picks = Counter(names.ROUTER_PICKS, "Requests routed to a replica", labels, registry=self.registry)
        self.score = Gauge(names.ROUTER_SCORE, "LADR score (EMA-smoothed) of a replica", labels, registry=self.registry)
        self.weight = Gauge(names.ROUTER_WEIGHT, "Operator weight of a replica", labels, registry=self.registry)
        self.drained = Gauge(names.ROUTER_DRAINED, "1 if the replica is drained", labels, registry=self.registry)
        self.fallback = Counter(
            names.ROUTER_FALLBACK,
            "Refreshes that used local stats because the shared state (Redis) was unavailable",
            registry=self.registry,
        )


class DistillMetrics:
    """Gauge of the student share per pool."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.student_share = Gauge(
            names.DISTILL_STUDENT_SHARE_RATIO,
            "Share of traffic (0..1) sent to student replicas",
            (names.L_POOL,),
            registry=self.registry,
        )
