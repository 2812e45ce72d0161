"""``llmsla forecast serve`` as a service: the online scorer behind the HTTP kit.

Every llmsla server listens through :func:`llmsla.httpkit.serve` (the slow-client bounds of
``[http]``) and serves ``/metrics`` with :func:`llmsla.httpkit.add_metrics`; the forecaster is
one of them rather than a ``prometheus_client.start_http_server`` thread with no bounds. A
scoring step is blocking work (three SQL queries, one forward pass, the webhook POSTs), so it
runs in a worker thread while the event loop keeps answering scrapes; the clock is a parameter
so a test can drive the same service through simulated time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from llmsla.config import Config
from llmsla.forecaster.online import OnlineScorer, StepResult
from llmsla.httpkit import Limits, Served, add_metrics, serve


class ForecastService:
    """``/metrics`` of ``registry`` on ``forecast.host:port`` and the scorer stepping beside it.

    ``make_scorer(url)`` builds the scorer once the server listens, so alerts carry the URL
    that actually serves their metrics (``externalURL``/``generatorURL``)."""

    def __init__(self, cfg: Config, registry: CollectorRegistry, make_scorer: Callable[[str], OnlineScorer]) -> None:
        self.cfg = cfg
        self.registry = registry
        self.make_scorer = make_scorer
        self.served: Served | None = None
        self.scorer: OnlineScorer | None = None

    async def start(self, host: str | None = None, port: int | None = None) -> str:
        app = web.Application()
        add_metrics(app, self.registry)
        fc = self.cfg.forecast
        self.served = await serve(app, host or fc.host, fc.port if port is None else port,
                                  Limits.from_config(self.cfg))
        self.scorer = self.make_scorer(self.served.url)
        return self.served.url

    async def step(self, now_ms: int) -> StepResult:
        assert self.scorer is not None, "start() first"
        return await asyncio.to_thread(self.scorer.step, now_ms)

    async def run(self, stop: asyncio.Event, *, steps: int = 0, interval_s: float | None = None,
                  clock: Callable[[], float] = time.time,
                  on_step: Callable[[int, StepResult], None] | None = None) -> int:
        """Step every ``interval_s`` (default ``forecast.interval_s``) until ``stop`` is set or
        ``steps`` steps (0 = no limit) are done; returns the number of steps."""
        interval = self.cfg.forecast.interval_s if interval_s is None else interval_s
        n = 0
        while not stop.is_set() and (steps == 0 or n < steps):
            started = clock()
            res = await self.step(int(started * 1000))
            n += 1
            if on_step is not None:
                on_step(n, res)
            with contextlib.suppress(TimeoutError):  # the interval passed without a stop
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, interval - (clock() - started)))
        return n

    async def close(self) -> None:
        if self.scorer is not None:
            await asyncio.to_thread(self.scorer.close)
        if self.served is not None:
            await self.served.stop()
