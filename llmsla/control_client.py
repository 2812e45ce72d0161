"""The one HTTP client of the control API: the receiver acts through it, ``ab report --rollback``
rolls an arm back through it (core, because alerting and control may not import each other).

Each call tries the configured control APIs in order with exponential backoff between attempts
(connection errors, timeouts and 5xx are retried; a 4xx is the control API's considered answer -
unknown replica, last healthy replica, step too large - and is not; a 404, an unknown target, is
``permanent``: the receiver audits it once and stops acting on that target). With several gateways
the client talks to any one of them: the router's Redis operator stream carries the change to all.
Every call returns a :class:`Result` (the server's reason in ``error``) rather than raising,
so the caller audits what happened. The timeout is the caller's: ``receiver.control_timeout_s``
for the receiver, ``ab.control_timeout_s`` for a rollback. See docs/control.md.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp

ACTOR = "alert-receiver"


@dataclass
class Result:
    ok: bool
    status: int  # HTTP status of the last attempt; 0 = no answer
    body: Any
    attempts: int
    latency_ms: float
    url: str = ""
    error: str = ""
    refused: bool = False  # a 4xx: the control API said no (do not retry blindly)
    #: a 404: the control API does not know the replica or pool; retrying cannot change that
    permanent: bool = False

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "attempts": self.attempts, "url": self.url}
        if self.error:
            out["error"] = self.error
        return out


@dataclass
class ControlClient:
    urls: list[str]
    token: str
    timeout_s: float = 2.0
    retries: int = 3
    backoff_s: float = 0.1
    #: who the control API's audit log names for each write
    actor: str = ACTOR
    session: aiohttp.ClientSession | None = None
    calls: int = field(default=0)

    async def start(self) -> None:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                                 connector=aiohttp.TCPConnector(limit=64))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Result:
        await self.start()
        assert self.session is not None
        headers = {"Authorization": f"Bearer {self.token}"} if body is not None else {}
        t0 = time.perf_counter()
        status, payload, error, url = 0, None, "", ""
        for attempt in range(1, self.retries + 1):
            url = self.urls[(attempt - 1) % len(self.urls)].rstrip("/") + path
            self.calls += 1
            try:
                async with self.session.request(method, url, json=body, headers=headers) as resp:
                    status = resp.status
                    try:
                        payload = await resp.json(content_type=None)
                    except (ValueError, aiohttp.ContentTypeError):
                        payload = {"raw": (await resp.text())[:500]}
                if status < 300:
                    return Result(True, status, payload, attempt, (time.perf_counter() - t0) * 1000, url)
                error = str(payload.get("error", payload) if isinstance(payload, dict) else payload)[:500]
                if 400 <= status < 500:
                    return Result(False, status, payload, attempt, (time.perf_counter() - t0) * 1000, url,
                                  error, refused=True, permanent=status == 404)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                status, payload = 0, None
                error = f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
            if attempt < self.retries:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        return Result(False, status, payload, self.retries, (time.perf_counter() - t0) * 1000, url, error)

    # -- the control API's operations ------------------------------------------------------------
    async def state(self) -> Result:
        return await self._call("GET", "/v1/state")

    async def set_weight(self, replica: str, weight: float, reason: str) -> Result:
        return await self._call("POST", f"/v1/replicas/{quote(replica, safe='')}/weight",
                                {"weight": weight, "actor": self.actor, "reason": reason})

    async def drain(self, replica: str, reason: str) -> Result:
        return await self._call("POST", f"/v1/replicas/{quote(replica, safe='')}/drain", {"actor": self.actor, "reason": reason})

    async def undrain(self, replica: str, reason: str) -> Result:
        return await self._call("POST", f"/v1/replicas/{quote(replica, safe='')}/undrain", {"actor": self.actor, "reason": reason})

    async def set_student_share(self, pool: str, pct: float, reason: str) -> Result:
        return await self._call("POST", f"/v1/pools/{quote(pool, safe='')}/student_share",
                                {"pct": pct, "clamp": False, "actor": self.actor, "reason": reason})

    async def set_schedule(self, pool: str, name: str, params: dict[str, Any], reason: str) -> Result:
        return await self._call("POST", f"/v1/pools/{quote(pool, safe='')}/temperature_schedule",
                                {"name": name, "params": params, "actor": self.actor, "reason": reason})

    async def set_shed(self, pool: str, classes: dict[str, float], reason: str) -> Result:
        return await self._call("PUT", f"/v1/pools/{quote(pool, safe='')}/shed",
                                {"classes": classes, "actor": self.actor, "reason": reason})

    async def set_arm_weight(self, experiment: str, arm: str, weight: float, reason: str) -> Result:
        return await self._call("POST", f"/v1/experiments/{quote(experiment, safe='')}/arms/{quote(arm, safe='')}/weight",
                                {"weight": weight, "actor": self.actor, "reason": reason})
