"""``gateway.engine_signals``: the gateway scrapes its replicas' own /metrics (the reference
worker exposes vLLM's names) and the router sees each engine's queue. Real workers with one slot
each; one of them is given a queue directly, behind the gateway's back, and the router learns
it from the engine within a few scrape intervals, while the idle one reads 0; with the option
off the router has no engine record at all."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla.app import wiring
from llmsla.worker.server import WorkerThread

QUEUED = 4


def _engine(router, rid: str) -> dict | None:  # type: ignore[no-untyped-def]
    for rows in router.snapshot()["pools"].values():
        for row in rows:
            if row["id"] == rid:
                return row["engine"]
    raise AssertionError(rid)


async def _load(url: str, model: str, n: int) -> None:
    body = {"model": model, "prompt": "a long wait in the queue", "max_tokens": 200, "ignore_eos": True}
    async with aiohttp.ClientSession() as s:
        async def one() -> None:
            async with s.post(url + "/v1/completions", json=body) as r:
                await r.read()
        await asyncio.gather(*(one() for _ in range(n)))


def _run(tmp_path: Path, on: bool) -> tuple[list, list]:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.worker.max_batch = 1
    cfg.worker.max_tokens = 200
    cfg.engine.scrape_interval_s = 0.1
    cfg.gateway.engine_signals = on
    workers = [WorkerThread(cfg) for _ in range(2)]
    try:
        urls = [w.start() for w in workers]
        cfg.gateway.upstreams = urls

        async def main() -> tuple[list, list]:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry(), spool=None) as gw:
                router = gw.gateway.plane.router
                load = asyncio.create_task(_load(urls[0], cfg.worker.model, QUEUED + 1))  # r0: 1 running, 4 waiting
                seen: list = []
                idle: list = []
                end = time.monotonic() + (8 if on else 1.5)  # off: ample time for 15 scrapes
                while time.monotonic() < end and not load.done():
                    e0, e1 = _engine(router, "r0"), _engine(router, "r1")
                    if e0 is not None:
                        seen.append(e0["waiting"])
                    if e1 is not None:
                        idle.append(e1["waiting"])
                    if seen and max(seen) >= QUEUED - 1 and idle:
                        break
                    await asyncio.sleep(0.05)
                load.cancel()
                return seen, idle

        return asyncio.run(main())
    finally:
        for w in workers:
            w.stop()


def test_router_sees_the_engine_queue_of_each_replica(tmp_path: Path) -> None:
    seen, idle = _run(tmp_path, on=True)
    assert seen and max(seen) >= QUEUED - 1, seen  # the queue the worker's own /metrics reports
    assert idle and max(idle) == 0, idle  # the other engine: nothing waiting


def test_off_by_default_the_router_has_no_engine_record(tmp_path: Path) -> None:
    seen, idle = _run(tmp_path, on=False)
    assert seen == [] and idle == []
