"""Scrape targets that come and go: keep a :class:`~llmsla.engines.scrape.Scraper` equal to a
list of replicas that changes at run time.

Why: the gateway follows a discovery source (``gateway.discovery`` static, file, dns or kubernetes); the
engine adapters must scrape the same replicas under the same ids, or an ``EngineSample`` cannot
be joined to the ``RequestEvent`` of the replica it describes. A discovered replica's id is its
address (``discovery.replica_id``), exactly the gateway's. A source that cannot answer, or
answers with no replica, leaves the targets as they were (as the gateway's membership does).
See docs/engines.md#discovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

from llmsla import names
from llmsla.discovery import DiscoveryError, Found, replica_id
from llmsla.discovery_metrics import DiscoveryMetrics
from llmsla.seams import ReplicaSource

from .scrape import Scraper, Target

log = logging.getLogger(__name__)

Resolve = Callable[[], Awaitable[list[Target]]]


def metrics_url(base_url: str, path: str | None, engine: str = names.ENGINE_AUTO) -> str:
    """``base_url`` + the metrics path: ``path`` when told, else where ``engine`` serves its
    exposition (``names.ENGINE_METRICS_PATHS``, ``/metrics`` for the others and ``auto``)."""
    if path is None:
        path = names.ENGINE_METRICS_PATHS.get(engine, names.METRICS_PATH)
    return base_url.rstrip("/") + (path if path.startswith("/") else "/" + path)


def targets_of(found: Iterable[Found], *, default_pool: str, path: str | None,
               engine_of: Callable[[Found], str]) -> list[Target]:
    """A discovery answer as scrape targets, with the gateway's ids (first of a duplicate id
    wins); ``engine_of`` says how to read each (its own label, else its pool's type)."""
    out: dict[str, Target] = {}
    for f in found:
        rid = replica_id(f.pool, f.url, default_pool)
        engine = engine_of(f)
        out.setdefault(rid, Target(rid, f.pool, metrics_url(f.url, path, engine), engine))
    return list(out.values())


def from_source(source: ReplicaSource, *, default_pool: str, path: str | None,
                engine_of: Callable[[Found], str]) -> Resolve:
    """A :data:`Resolve` asking a discovery source (file, dns or kubernetes)."""
    async def resolve() -> list[Target]:
        return targets_of(await source.resolve(), default_pool=default_pool, path=path, engine_of=engine_of)
    return resolve


def fixed(targets: list[Target]) -> Resolve:
    """A :data:`Resolve` that always answers ``targets`` (static replicas, ids r0, r1, ...)."""
    async def resolve() -> list[Target]:
        return list(targets)
    return resolve


class Follow:
    """Asks ``resolve`` every ``interval_s`` and applies the answer to ``scraper``; with
    ``metrics``, counts the refreshes and failures and publishes the replicas known per pool
    (serving: the last scrape worked; probing: not yet, or failing)."""

    def __init__(self, scraper: Scraper, resolve: Resolve, *, interval_s: float,
                 metrics: DiscoveryMetrics | None = None, describe: str = "discovery") -> None:
        self.scraper = scraper
        self.resolve = resolve
        self.interval_s = interval_s
        self.metrics = metrics
        self.describe = describe
        self._warned: str | None = None

    async def sync_once(self) -> tuple[list[str], list[str]] | None:
        """One round: (added, removed) ids, or None when the last set was kept."""
        try:
            targets = await self.resolve()
        except DiscoveryError as exc:
            self._fail(f"{self.describe}: {exc}; keeping the last {len(self.scraper.targets)} replicas", exc.reason)
            return None
        if not targets:
            self._fail(f"{self.describe} names no replica; keeping the last {len(self.scraper.targets)}",
                       names.DISCOVERY_FAIL_EMPTY)
            return None
        self._warned = None
        if self.metrics is not None:
            self.metrics.refreshed()
        added, removed = self.scraper.sync(targets)
        if added or removed:
            log.info("engines: %s: scraping %d replicas (+%s, -%s)", self.describe, len(targets),
                     ",".join(added) or "0", ",".join(removed) or "0")
        self.publish()
        return added, removed

    def publish(self) -> None:
        if self.metrics is not None:
            st = self.scraper.status
            self.metrics.set_replicas(
                (t.pool, names.DISCOVERY_SERVING if st[t.replica].up else names.DISCOVERY_PROBING)
                for t in self.scraper.targets if t.replica in st)

    def _fail(self, msg: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.failed(reason)
        if msg != self._warned:
            log.warning("engines: %s", msg)
            self._warned = msg

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: a round every ``interval_s``, the replica gauge every scrape interval."""
        loop = asyncio.get_running_loop()
        tick = min(self.interval_s, self.scraper.cfg.engine.scrape_interval_s)
        due = loop.time() + self.interval_s
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), tick)
            if stop.is_set():
                return
            try:
                if loop.time() >= due:
                    due = loop.time() + self.interval_s
                    await self.sync_once()
                else:
                    self.publish()
            except Exception:  # noqa: BLE001 - one bad round must not stop following
                log.exception("engines: discovery round failed")
                if self.metrics is not None:
                    self.metrics.failed(names.DISCOVERY_FAIL_ERROR)

    async def serve(self, stop: asyncio.Event) -> None:
        """The first round, then scrape and follow together until ``stop``."""
        await self.sync_once()
        await asyncio.gather(self.scraper.run(stop), self.run(stop))
