"""A replica that takes no connection (killed, not yet listening): nothing was sent, so the
gateway sends the request to another replica of the pool and marks the dead one down; it takes
traffic again after its first healthy probe. Real workers, a real port with nothing on it that
later gets a worker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla.app import wiring
from llmsla.exporters.gateway import REPLICA_HEADER
from llmsla.services import free_port
from llmsla.worker.server import WorkerThread


def test_refused_connection_goes_to_another_replica_until_a_healthy_probe(tmp_path: Path) -> None:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.worker.max_tokens = 8
    cfg.control.route_policy = "round_robin"
    live = WorkerThread(cfg)
    port = free_port()
    late = WorkerThread(cfg, port=port)
    try:
        cfg.gateway.upstreams = [live.start(), f"http://127.0.0.1:{port}"]  # r1: nothing listens yet

        async def main() -> dict:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry(), spool=None) as gw:
                router = gw.gateway.plane.router
                body = {"model": cfg.worker.model, "prompt": "hello", "max_tokens": 4, "stream": True}
                async with aiohttp.ClientSession() as s:
                    async def one() -> tuple[int, str | None, bool]:
                        async with s.post(gw.url + "/v1/completions", json=body) as r:
                            raw = await r.read()
                            return r.status, r.headers.get(REPLICA_HEADER), raw.rstrip().endswith(b"[DONE]")

                    before = [await one() for _ in range(6)]
                    down = router.is_down("r1")
                    await asyncio.to_thread(late.start)
                    end = time.monotonic() + 10
                    while router.is_down("r1") and time.monotonic() < end:  # the prober's next round
                        await asyncio.sleep(0.05)
                    after = [await one() for _ in range(6)]
                return {"before": before, "down": down, "after": after, "still_down": router.is_down("r1")}

        out = asyncio.run(main())
    finally:
        live.stop()
        late.stop()
    assert all(st == 200 and done and rid == "r0" for st, rid, done in out["before"]), out["before"]
    assert out["down"] is True
    assert out["still_down"] is False
    assert all(st == 200 and done for st, _, done in out["after"]), out["after"]
    assert {rid for _, rid, _ in out["after"]} == {"r0", "r1"}  # round robin over both again
