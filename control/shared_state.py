"""Router stats shared by several gateway processes through Redis, off the pick() hot path.

Each gateway sees only its own requests; without the fleet-wide queue and latency, N gateways
would all pile onto the replica that merely looks idle from where each stands. Redis is never on
the pick path (a syncer thread prepares dicts the router swaps in), and operator actions travel
as one ordered stream of absolute settings, so every gateway converges whichever API took them.
See docs/control.md#shared-state-across-gateway-processes-redis.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import redis

log = logging.getLogger(__name__)

KEY_PREFIX = "llmsla:router:stats:"
OPS_STREAM = "llmsla:router:ops"
OPS_MAXLEN = 10_000


def default_gateway_id() -> str:
    """host:pid:random - unique per gateway process, readable in ``GET /v1/state``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class RedisSharedState:
    """Per-replica router stats in Redis; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        gateway_id: str | None = None,
        ttl_s: float = 1.0,
        interval_s: float = 0.2,
        timeout_s: float = 0.1,
        prefix: str = KEY_PREFIX,
        ops_stream: str = OPS_STREAM,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.gateway_id = gateway_id or default_gateway_id()
        self.ttl_s = ttl_s
        self.interval_s = interval_s
        self.prefix = prefix
        self._wall = wall
        # short timeouts: a dead Redis must cost a sync at most ~2 * timeout_s, never a request
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False
        )
        self._pending: dict[str, dict[str, Any]] = {}
        self.ops_stream = ops_stream
        self.inbox: collections.deque[dict[str, Any]] = collections.deque()  # ops to apply, in order
        self._outbox: collections.deque[dict[str, Any]] = collections.deque(maxlen=OPS_MAXLEN)
        self._last_id = "0-0"
        self._run_id: str | None = None
        self._latest: dict[str, list[dict[str, Any]]] = {}
        self.healthy = False  # becomes True after the first successful sync
        self.syncs = 0
        self.failures = 0
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- router side (no I/O) --------------------------------------------------------------------
    def publish(self, stats: dict[str, dict[str, Any]]) -> None:
        """This gateway's stats per replica id: avg_ms, n, outstanding, age_s."""
        self._pending = stats

    def broadcast(self, op: dict[str, Any]) -> None:
        """Queue an operator action for every gateway (sent by the next sync)."""
        self._outbox.append(op)

    def latest(self) -> dict[str, list[dict[str, Any]]]:
        """Other gateways' fresh entries per replica id, each with ``age_s`` as of the last sync."""
        return self._latest

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "redis",
            "gateway_id": self.gateway_id,
            "healthy": self.healthy,
            "syncs": self.syncs,
            "failures": self.failures,
            "last_error": self.last_error,
            "ops_pending": len(self._outbox),
            "ops_last_id": self._last_id,
            "peers": sorted({e["gateway"] for lst in self._latest.values() for e in lst}),
        }

    # -- I/O -------------------------------------------------------------------------------------
    def sync_once(self) -> bool:
        """Write our stats, read everyone else's; False (and ``healthy`` False) if Redis failed."""
        stats = self._pending
        now = self._wall()
        ttl_ms = max(1, int(self.ttl_s * 1000))
        try:
            self._sync_ops()
            pipe = self.client.pipeline(transaction=False)
            rids = list(stats)
            for rid, st in stats.items():
                age = float(st.get("age_s", 0.0))
                # store when the stats were last refreshed, in wall time, so readers age them
                body = {k: v for k, v in st.items() if k != "age_s"}
                body["seen"] = now - (age if math.isfinite(age) else 1e9)
                body["ts"] = now  # the writer is alive: its outstanding counts are current
                key = self.prefix + rid
                pipe.hset(key, self.gateway_id, json.dumps(body))
                pipe.pexpire(key, ttl_ms)
            for rid in rids:
                pipe.hgetall(self.prefix + rid)
            results = pipe.execute()
        except (redis.RedisError, OSError) as exc:
            self.failures += 1
            if self.healthy or not self.last_error:
                log.warning("router shared state: Redis unavailable (%s); using local stats", exc)
            self.healthy = False
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        latest: dict[str, list[dict[str, Any]]] = {}
        stale_fields: list[tuple[str, str]] = []
        for rid, fields in zip(rids, results[2 * len(rids):], strict=True):
            entries = []
            for gw_raw, raw in (fields or {}).items():
                gw = gw_raw.decode() if isinstance(gw_raw, bytes) else str(gw_raw)
                if gw == self.gateway_id:
                    continue
                try:
                    e = json.loads(raw)
                    age = max(0.0, now - float(e.pop("seen")))
                    write_age = max(0.0, now - float(e.pop("ts")))
                except (ValueError, KeyError, TypeError):
                    stale_fields.append((rid, gw))  # garbage from a foreign writer: drop it
                    continue
                if write_age > 10 * self.ttl_s:
                    stale_fields.append((rid, gw))  # a gateway that went away
                    continue
                if write_age > self.ttl_s:
                    continue  # writer silent for a TTL: its counts are not current any more
                e["age_s"] = age
                e["write_age_s"] = write_age
                e["gateway"] = gw
                entries.append(e)
            if entries:
                latest[rid] = entries
        if stale_fields:
            try:
                pipe = self.client.pipeline(transaction=False)
                for rid, gw in stale_fields:
                    pipe.hdel(self.prefix + rid, gw)
                pipe.execute()
            except (redis.RedisError, OSError):
                pass  # best effort housekeeping; the next sync retries
        self._latest = latest
        if not self.healthy and self.syncs:
            log.info("router shared state: Redis back after %d failed syncs", self.failures)
        self.healthy = True
        self.syncs += 1
        return True

    def _sync_ops(self) -> None:
        """Send queued operator actions, then read the stream past the last id seen."""
        if self._run_id is None or not self.healthy:  # first contact or reconnect
            # redis-py types its commands for the sync and asyncio clients at once; this is the sync one
            info = cast(dict[str, Any], self.client.info("server"))
            run_id = str(info.get("run_id", ""))
            if self._run_id is not None and run_id != self._run_id:
                self._last_id = "0-0"  # a restarted Redis has a new, empty stream
            self._run_id = run_id
        while self._outbox:
            op = self._outbox[0]
            self.client.xadd(self.ops_stream, {"gw": self.gateway_id, "op": json.dumps(op)},
                             maxlen=OPS_MAXLEN, approximate=True)
            self._outbox.popleft()  # only once Redis has it
        while True:
            resp = cast(list[Any], self.client.xread({self.ops_stream: self._last_id}, count=1000))
            if not resp:
                return
            entries = resp[0][1]
            for eid, fields in entries:
                self._last_id = eid.decode() if isinstance(eid, bytes) else str(eid)
                raw = fields.get(b"op", fields.get("op"))
                try:
                    op = json.loads(raw)
                except (TypeError, ValueError):
                    log.warning("router shared state: skipping malformed op %s in %s", self._last_id, self.ops_stream)
                    continue
                if isinstance(op, dict):
                    self.inbox.append(op)
            if len(entries) < 1000:
                return

    # -- background syncer -----------------------------------------------------------------------
    def start(self) -> RedisSharedState:
        """One synchronous sync (so ``healthy`` is real), then a daemon thread every interval_s."""
        self.sync_once()
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="llmsla-router-redis", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync_once()
            except Exception:  # noqa: BLE001 - the syncer must never die silently mid-run
                log.exception("router shared state: unexpected error in sync")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.client.close()

    def __enter__(self) -> RedisSharedState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def from_config(cfg: Any, *, ttl_s: float = 1.0, interval_s: float = 0.2) -> RedisSharedState | None:
    """The shared state ``cfg.control.redis_url`` asks for, started; None when it is empty."""
    url = cfg.control.redis_url
    if not url:
        return None
    return RedisSharedState(url, ttl_s=ttl_s, interval_s=interval_s).start()
