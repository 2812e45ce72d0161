"""Health probes that keep LADR's per-replica stats fresh between requests.

Why: LADR drops replicas whose stats are older than ``ttl_s``; at low traffic an idle (healthy)
replica would drop out just for lack of requests, and a dead one would keep its last good score
until the TTL ran out. A prober that GETs every replica's ``/healthz`` about twice per TTL fixes
both: a 200 answer is an observation (``Router.observe``, with the replica's own queue length
when the body carries the reference worker's ``waiting`` / ``running`` counts), and a replica that
stops answering goes stale within one TTL and leaves LADR's choice. Drained replicas are probed too,
so they are fresh the moment they are undrained. A discovered replica takes no traffic until its
first 200 (docs/gateway.md#discovery).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from typing import Any

import aiohttp

from llmsla.background import BackgroundTask
from llmsla.control.router import Router

log = logging.getLogger(__name__)


class HealthProber:
    """Probe every replica with a URL; see the module docstring. One per router (per gateway)."""

    def __init__(self, router: Router, *, interval_s: float | None = None, path: str = "/healthz",
                 timeout_s: float | None = None) -> None:
        self.router = router
        self.interval_s = interval_s if interval_s is not None else router.params["ttl_s"] / 2
        self.timeout_s = timeout_s if timeout_s is not None else max(0.05, self.interval_s)
        self.path = path
        self.ok = 0
        self.failed = 0
        self._task = BackgroundTask("llmsla-health-probe")

    async def probe_once(self, session: aiohttp.ClientSession, only: Collection[str] | None = None) -> dict[str, bool]:
        """Probe all replicas (or those of ``only``) concurrently; returns replica id -> answered
        200. A discovered replica's first 200 lets it take traffic (``Router.mark_healthy``)."""
        reps = [r for r in self.router.replicas() if r.url and (only is None or r.id in only)]
        results = await asyncio.gather(*(self._one(session, r.id, r.url) for r in reps))
        return dict(zip([r.id for r in reps], results, strict=True))

    async def _one(self, session: aiohttp.ClientSession, rid: str, url: str) -> bool:
        try:
            async with asyncio.timeout(self.timeout_s), session.get(url.rstrip("/") + self.path) as resp:
                if resp.status != 200:
                    self.failed += 1
                    return False
                body: Any = None
                with contextlib.suppress(ValueError, aiohttp.ContentTypeError):
                    body = await resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError):
            self.failed += 1
            return False
        queue = None
        if isinstance(body, dict):
            parts = [body.get(k) for k in ("waiting", "running")]
            if all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts):
                queue = sum(parts)  # type: ignore[arg-type]  # all ints: checked above
        try:
            self.router.observe(rid, queue_length=queue)
            if self.router.mark_healthy(rid):
                log.info("replica %s answered its first health probe: it takes traffic now", rid)
            if self.router.is_down(rid):  # the gateway marked it down when it refused a connection
                self.router.set_down(rid, False)
                log.info("replica %s answers its health probe again: it takes traffic now", rid)
        except LookupError:  # removed meanwhile
            return False
        self.ok += 1
        return True

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Probe forever (until cancelled), every ``interval_s``."""
        while True:
            try:
                await self.probe_once(session)
            except Exception:  # noqa: BLE001 - a probe bug must not stop future probes
                log.exception("health probe round failed")
            await asyncio.sleep(self.interval_s)

    def start(self, session: aiohttp.ClientSession) -> asyncio.Task[None]:
        """Run in the current event loop; ``await prober.stop()`` ends it."""
        return self._task.start(self.run(session))

    async def stop(self) -> None:
        await self._task.stop()
