"""Is the gateway itself the bottleneck? Its event loop's lag and its listening socket's accept
queue, exported so a saturated gateway pages for itself (``LlmslaGatewaySaturated``).

A gateway whose loop is busy reads sockets late and runs handlers late; the requests' clocks
start when their heads are read (``httpkit.HEAD_READ``), so that wait is in their TTFT, but a
loop that is late to *read* sees how long the bytes sat in the kernel only to a tick or two
(``llmsla.tcpinfo.waited_s``). The lag of a timer (asked to wake every ``interval_s``, how late
it woke) measures how late the loop is, and the kernel tells how many connections wait to be
accepted (:func:`llmsla.tcpinfo.accept_queue`).
"""

from __future__ import annotations

import asyncio
import socket
import time
import weakref
from typing import Any

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Gauge, Histogram

from llmsla import names
from llmsla.background import BackgroundTask
from llmsla.tcpinfo import accept_queue

#: Loop lag bounds, seconds: from a healthy loop's sub-millisecond to a stalled one's seconds.
LAG_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lag = Histogram(names.GATEWAY_LOOP_LAG_SECONDS, "How late the gateway's event loop ran a timer it "
                             "asked for (sampled every 100 ms): its time to get to a ready socket or task.",
                             buckets=LAG_BUCKETS, registry=registry)
        self.backlog = Gauge(names.GATEWAY_ACCEPT_BACKLOG, "Connections waiting in the kernel's accept queue of "
                             "the gateway's listening socket (Linux).", registry=registry, multiprocess_mode="livesum")
        self.backlog_max = Gauge(names.GATEWAY_ACCEPT_BACKLOG_MAX, "The accept queue's bound (listen backlog, "
                                 "capped by net.core.somaxconn).", registry=registry, multiprocess_mode="livemax")


_metrics: weakref.WeakKeyDictionary[Any, _Metrics] = weakref.WeakKeyDictionary()


def metrics(registry: CollectorRegistry | None) -> _Metrics:
    """The saturation metrics of ``registry``, created once per registry."""
    reg = DEFAULT_REGISTRY if registry is None else registry
    m = _metrics.get(reg)
    if m is None:
        m = _metrics[reg] = _Metrics(reg)
    return m


class SaturationMonitor:
    """Samples the loop's lag and the accept queue every ``interval_s`` while the gateway runs."""

    def __init__(self, registry: CollectorRegistry | None, sockets: list[socket.socket], interval_s: float = 0.1) -> None:
        self.m = metrics(registry)
        self.sockets = [s for s in sockets if s.family in (socket.AF_INET, socket.AF_INET6)]
        self.interval_s = interval_s
        self._task = BackgroundTask("llmsla-gateway-saturation")

    def start(self) -> None:
        self._task.start(self._run())

    async def stop(self) -> None:
        await self._task.stop()

    def sample_backlog(self) -> None:
        waiting = bound = 0
        seen = False
        for s in self.sockets:
            q = accept_queue(s)
            if q is not None:
                seen = True
                waiting += q[0]
                bound = max(bound, q[1])
        if seen:
            self.m.backlog.set(waiting)
            self.m.backlog_max.set(bound)

    async def _run(self) -> None:
        observe = self.m.lag.observe
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            observe(max(0.0, time.perf_counter() - t0 - self.interval_s))
            self.sample_backlog()
