"""The gateway gives LADR's completion-time estimate what it learns from: each successful
response's output tokens and TTFT reach ``Router.end``. A real reference worker behind a real
gateway; after a few streamed and non-streamed requests the router knows the pool's output
length (all four) and the replica's speed (the two streamed ones; docs/control.md#expected-completion-time-learnt-replica-speed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla.app import wiring
from llmsla.worker.server import WorkerThread

TOKENS = 12


async def _requests(url: str, model: str) -> None:
    async with aiohttp.ClientSession() as s:
        for stream in (False, True, False, True):
            body = {"model": model, "prompt": "count with me", "max_tokens": TOKENS, "ignore_eos": True,
                    "stream": stream}
            async with s.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                await r.read()


def test_gateway_feeds_output_tokens_to_the_router(tmp_path: Path) -> None:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.worker.max_tokens = 64
    worker = WorkerThread(cfg)
    try:
        cfg.gateway.upstreams = [worker.start()]

        async def main() -> dict:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry(), spool=None) as gw:
                await _requests(gw.url, cfg.worker.model)
                return gw.gateway.plane.router.snapshot()

        snap = asyncio.run(main())
    finally:
        worker.stop()
    pool, rows = next(iter(snap["pools"].items()))
    assert snap["output_tokens_mean"][pool] == TOKENS  # every response had exactly TOKENS tokens
    ect = rows[0]["ect"]
    # a non-streamed response has no TTFT: it teaches the output length, not the replica's speed
    assert ect["observations"] == 2
    assert ect["tpot_per_load_s"] is not None and ect["tpot_per_load_s"] > 0
    assert ect["ttft_s"] is not None and ect["ttft_s"] > 0
