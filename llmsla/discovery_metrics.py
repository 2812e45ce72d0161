"""The discovery series: replicas known per pool and state, refreshes, failures by reason, the
time of the last answer applied.

Why one class in core: the gateway (through ``control.membership``) and ``llmsla engines`` both
follow a discovery source, and an operator reads both the same way (is discovery answering, and
what does each consumer believe the fleet is?). The replica gauge is set from a full count on
every refresh, so a pool or a state that empties reads 0 and a pool no longer known loses its
series. Gauges are ``livemostrecent`` for a multi-process gateway. See docs/gateway.md#discovery.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from llmsla import names

_MODE: Final = "livemostrecent"  # Final: mypy reads it as the Literal prometheus_client asks for
_lock = threading.Lock()
_of: weakref.WeakKeyDictionary[CollectorRegistry, DiscoveryMetrics] = weakref.WeakKeyDictionary()


class DiscoveryMetrics:
    """One per process and registry; ``source`` is the ``source`` label (static, file, dns or kubernetes)."""

    def __init__(self, source: str, *, registry: CollectorRegistry | None = None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.source = source
        self.replicas = Gauge(names.DISCOVERY_REPLICAS, "Replicas known, by pool and state (probing, serving, draining).",
                              (names.L_POOL, names.L_STATE), registry=reg, multiprocess_mode=_MODE)
        self.refreshes = Counter(names.DISCOVERY_REFRESHES, "Discovery answers received and applied, by source.",
                                 (names.L_SOURCE,), registry=reg)
        self.failures = Counter(names.DISCOVERY_FAILURES, "Discovery rounds that kept the last set, by source and reason.",
                                (names.L_SOURCE, names.L_REASON), registry=reg)
        self.last_success = Gauge(names.DISCOVERY_LAST_SUCCESS, "Unix time of the last discovery answer applied.",
                                  (names.L_SOURCE,), registry=reg, multiprocess_mode=_MODE)
        self._pools: set[str] = set()
        self.refreshes.labels(source)  # 0 from the start: rate() works from the first failure on
        for reason in names.DISCOVERY_FAIL_REASONS:
            self.failures.labels(source, reason)

    @classmethod
    def of(cls, source: str, registry: CollectorRegistry | None = None) -> DiscoveryMetrics:
        """The one instance of ``registry`` (a private registry for None): two consumers in one
        process exposing to one registry share its families rather than clash."""
        if registry is None:
            return cls(source)
        with _lock:
            m = _of.get(registry)
            if m is None or m.source != source:
                if m is not None:  # another source on the same registry (tests): a fresh one
                    for c in (m.replicas, m.refreshes, m.failures, m.last_success):
                        registry.unregister(c)
                m = _of[registry] = cls(source, registry=registry)
            return m

    def refreshed(self, now: float | None = None) -> None:
        """An answer was received and applied."""
        self.refreshes.labels(self.source).inc()
        self.last_success.labels(self.source).set(time.time() if now is None else now)

    def failed(self, reason: str) -> None:
        """A round kept the last set; ``reason`` one of ``names.DISCOVERY_FAIL_REASONS``."""
        if reason not in names.DISCOVERY_FAIL_REASONS:
            reason = names.DISCOVERY_FAIL_ERROR
        self.failures.labels(self.source, reason).inc()

    def set_replicas(self, states: Iterable[tuple[str, str]], declared: Iterable[str] = ()) -> Mapping[tuple[str, str], int]:
        """The full set of (pool, state) of every known replica; returns the counts set. The
        ``declared`` pools (the configuration's) read 0 while they have no replica, so an empty
        pool that requests are sent to shows as 0 serving rather than as no series."""
        counts: dict[tuple[str, str], int] = {}
        for pool, state in states:
            counts[(pool, state)] = counts.get((pool, state), 0) + 1
        pools = {p for p, _ in counts} | set(declared)
        for pool in self._pools - pools:
            for state in names.DISCOVERY_STATES:
                self.replicas.remove(pool, state)
        for pool in pools:
            for state in names.DISCOVERY_STATES:
                self.replicas.labels(pool, state).set(counts.get((pool, state), 0))
        self._pools = pools
        return counts
