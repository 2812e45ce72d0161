"""``llmsla forecast serve`` as a service: the online scorer behind the HTTP kit.

Every llmsla server listens through :func:`llmsla.httpkit.serve` (the slow-client bounds of
``[http]``) and serves ``/metrics`` with :func:`llmsla.httpkit.add_metrics`; the forecaster is
one of them rather than a ``prometheus_client.start_http_server`` thread with no bounds. A
scoring step is blocking work (three SQL queries, one forward pass, the webhook POSTs), so it
runs in a worker thread while the event loop keeps answering scrapes; the clock is a parameter
so a test can drive the same service through simulated time.

Two optional jobs ride along (docs/forecaster.md#model-registry): ``watch`` - asked between two
steps, every ``watch_every_s`` - returns a newly promoted champion to serve from the next step,
and ``retrain`` - the train-and-gate cycle - runs every ``retrain_every_s`` in a worker thread
(a :class:`~llmsla.background.BackgroundTask`), so scoring never waits for it and never stops
when it fails: a failed retrain is logged and the champion kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from llmsla.background import BackgroundTask
from llmsla.config import Config
from llmsla.forecaster.artifact import Artifact
from llmsla.forecaster.online import OnlineScorer, StepResult
from llmsla.httpkit import Limits, Served, add_metrics, serve

log = logging.getLogger(__name__)


class ForecastService:
    """``/metrics`` of ``registry`` on ``forecast.host:port`` and the scorer stepping beside it.

    ``make_scorer(url)`` builds the scorer once the server listens, so alerts carry the URL
    that actually serves their metrics (``externalURL``/``generatorURL``)."""

    def __init__(self, cfg: Config, registry: CollectorRegistry, make_scorer: Callable[[str], OnlineScorer], *,
                 watch: Callable[[], Artifact | None] | None = None, watch_every_s: float = 60.0,
                 retrain: Callable[[], object] | None = None, retrain_every_s: float = 0.0) -> None:
        self.cfg = cfg
        self.registry = registry
        self.make_scorer = make_scorer
        self.served: Served | None = None
        self.scorer: OnlineScorer | None = None
        self.watch, self.watch_every_s = watch, watch_every_s
        self.retrain, self.retrain_every_s = retrain, retrain_every_s
        self._next_watch = time.monotonic() + watch_every_s
        self._retrain_task = BackgroundTask("forecast-retrain")
        self.retrains = 0  # cycles finished, failed or not
        self.retrain_failures = 0

    async def start(self, host: str | None = None, port: int | None = None) -> str:
        app = web.Application()
        add_metrics(app, self.registry)
        fc = self.cfg.forecast
        self.served = await serve(app, host or fc.host, fc.port if port is None else port,
                                  Limits.from_config(self.cfg))
        self.scorer = self.make_scorer(self.served.url)
        if self.retrain is not None and self.retrain_every_s > 0:
            self._retrain_task.start(self._retrain_loop())
        return self.served.url

    async def _retrain_loop(self) -> None:
        retrain = self.retrain
        assert retrain is not None
        while True:
            await asyncio.sleep(self.retrain_every_s)
            try:
                await asyncio.to_thread(retrain)
            except Exception:  # noqa: BLE001 - whatever a retrain raises, scoring goes on with the champion
                self.retrain_failures += 1
                log.exception("forecast retrain failed; serving the champion as before")
            self.retrains += 1

    async def _maybe_swap(self) -> None:
        """Between two steps: a new champion from ``watch`` is served from the next step on."""
        if self.watch is None or time.monotonic() < self._next_watch:
            return
        self._next_watch = time.monotonic() + self.watch_every_s
        art = await asyncio.to_thread(self.watch)
        if art is not None and self.scorer is not None:
            try:
                self.scorer.swap(art)
            except ValueError as exc:
                log.error("model %s not served: %s; serving %s as before", art.version, exc, self.scorer.name)

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
            await self._maybe_swap()
            started = clock()
            res = await self.step(int(started * 1000))
            n += 1
            if on_step is not None:
                on_step(n, res)
            with contextlib.suppress(TimeoutError):  # the interval passed without a stop
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, interval - (clock() - started)))
        return n

    async def close(self) -> None:
        await self._retrain_task.stop()  # a cycle in its worker thread finishes on its own
        if self.scorer is not None:
            await asyncio.to_thread(self.scorer.close)
        if self.served is not None:
            await self.served.stop()
