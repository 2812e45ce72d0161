"""A pool named in ``gateway.pools`` without a URL, its replicas found by discovery: an A/B arm
may send its units there, and the pool has distillation and shedding controls like a configured
one. Real reference workers behind a real gateway whose replicas come from a watched file."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import wiring
from llmsla.discovery import replica_id
from llmsla.exporters.gateway import REPLICA_HEADER
from llmsla.worker.server import WorkerThread

INTERVAL_S = 0.2
EXPERIMENT = {"exp": {"seed": 7, "arms": {"base": {"weight": 1}, "canary": {"weight": 1, "pool": "canary"}}}}


def _write(path: Path, lines: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)


async def _ask(s: aiohttp.ClientSession, url: str, model: str, user: str) -> tuple[int, str | None, str | None]:
    body = {"model": model, "prompt": "a canary", "max_tokens": 4, "stream": True, "user": user}
    async with s.post(url + "/v1/completions", json=body) as r:
        await r.read()
        return r.status, r.headers.get(names.ARM_HEADER), r.headers.get(REPLICA_HEADER)


def test_an_arm_sends_its_units_to_a_pool_only_discovery_fills(tmp_path: Path) -> None:
    cfg = config_mod.load(env={"LLMSLA_AB_EXPERIMENTS": json.dumps(EXPERIMENT)})
    cfg.spool.dir = str(tmp_path / "spool")
    f = tmp_path / "replicas"
    cfg.gateway.discovery, cfg.gateway.discovery_file = "file", str(f)
    cfg.gateway.discovery_interval_s = INTERVAL_S
    cfg.gateway.pools = ["canary"]  # the name alone: its replicas come from the file
    config_mod.check_startup(cfg)  # what `llmsla config check` runs: accepted with discovery
    workers = [WorkerThread(cfg) for _ in range(2)]
    try:
        base_url, canary_url = (w.start() for w in workers)
        base_id = replica_id(cfg.gateway.pool, base_url, cfg.gateway.pool)
        canary_id = replica_id("canary", canary_url, cfg.gateway.pool)
        _write(f, [base_url])  # the canary is not deployed yet

        async def main() -> dict:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry(), spool=None) as gw:
                plane = gw.gateway.plane
                # the declared pool has its controls before any replica of it exists
                assert "canary" in plane.distill.pools()
                plane.distill.set_student_share("canary", 0, actor="test")
                plane.shed.set_shares("canary", {"batch": 0.5}, actor="test")
                assert plane.shed.share("canary", "batch") == 0.5
                async with aiohttp.ClientSession() as s:
                    await asyncio.sleep(3 * INTERVAL_S)
                    before = [await _ask(s, gw.url, cfg.worker.model, f"u{i}") for i in range(40)]
                    _write(f, [base_url, f"canary={canary_url}"])  # the canary rolls out
                    deadline = asyncio.get_running_loop().time() + 10
                    # joined, then serving after its first healthy probe
                    while not any(r["id"] == canary_id and not r["pending"] for r in
                                  plane.router.snapshot()["pools"].get("canary", [])):
                        assert asyncio.get_running_loop().time() < deadline, plane.router.snapshot()
                        await asyncio.sleep(0.05)
                    after = [await _ask(s, gw.url, cfg.worker.model, f"u{i}") for i in range(40)]
                return {"before": before, "after": after}

        got = asyncio.run(main())
    finally:
        for w in workers:
            w.stop()
    arms = {arm for _, arm, _ in got["after"]}
    assert arms == {"exp:base", "exp:canary"}, got["after"]
    # once the canary is found, every unit of its arm is served there, every other unit by the base pool
    for status, arm, rep in got["after"]:
        assert status == 200, got["after"]
        assert rep == (canary_id if arm == "exp:canary" else base_id), (arm, rep)
    # before it was found, the canary arm's units had no replica (503); the others were served
    for (status, arm, rep), (_, arm_after, _) in zip(got["before"], got["after"], strict=True):
        assert arm == arm_after  # a unit keeps its arm
        assert (status, rep) == ((503, None) if arm == "exp:canary" else (200, base_id)), (status, arm, rep)


def test_a_pool_name_alone_needs_discovery() -> None:
    cfg = config_mod.load(env={})
    cfg.gateway.upstreams = ["http://127.0.0.1:9"]
    cfg.gateway.pools = ["canary"]
    try:
        config_mod.check_startup(cfg)
    except config_mod.ConfigError as exc:
        assert "gateway.pools: 'canary' names no replica: write canary=http://host:port" in str(exc)
    else:
        raise AssertionError("a pool name alone was accepted with static discovery")
