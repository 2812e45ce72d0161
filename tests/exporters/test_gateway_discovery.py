"""Churn end to end: real reference workers behind a real gateway whose replicas come from a
watched file, scaled 2 -> 4 -> 1 while streaming requests run. No request fails (the replicas
that leave drain), new replicas take traffic after their probe within two discovery intervals,
and the routers' series of the replicas that left are gone from /metrics (stale, not 0)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import wiring
from llmsla.discovery import replica_id
from llmsla.exporters.gateway import REPLICA_HEADER
from llmsla.worker.server import WorkerThread

INTERVAL_S = 0.25
CLIENTS = 8


def write(path: Path, urls: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(u + "\n" for u in urls))
    os.replace(tmp, path)  # atomically, as docs/gateway.md#discovery asks


async def _client(url: str, model: str, stop: asyncio.Event, log: list[dict]) -> None:
    body = {"model": model, "prompt": "the fleet changes", "max_tokens": 24, "stream": True}
    async with aiohttp.ClientSession() as s:
        while not stop.is_set():
            t0 = time.monotonic()
            async with s.post(url + "/v1/completions", json=body) as r:
                raw = await r.read()
            log.append({"t0": t0, "t1": time.monotonic(), "status": r.status, "replica": r.headers.get(REPLICA_HEADER),
                        "done": raw.rstrip().endswith(b"data: [DONE]") and b"event: error" not in raw,
                        "body": raw[-300:]})


@pytest.mark.slow
def test_scale_2_4_1_by_editing_the_discovery_file(tmp_path: Path) -> None:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.worker.max_tokens = 32
    cfg.control.route_policy = "round_robin"  # even shares: what "the share follows" means here
    f = tmp_path / "replicas"
    cfg.gateway.discovery, cfg.gateway.discovery_file = "file", str(f)
    cfg.gateway.discovery_interval_s = INTERVAL_S
    workers = [WorkerThread(cfg) for _ in range(4)]
    try:
        urls = [w.start() for w in workers]
        ids = [replica_id("default", u, "default") for u in urls]
        write(f, urls[:2])

        async def main() -> dict:
            reg = CollectorRegistry()
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=reg, spool=None) as gw:
                stop, log = asyncio.Event(), []
                clients = [asyncio.create_task(_client(gw.url, cfg.worker.model, stop, log)) for _ in range(CLIENTS)]
                router = gw.gateway.plane.router
                await asyncio.sleep(1.5)
                t_up = time.monotonic()
                write(f, urls)  # 2 -> 4
                first_pick: dict[str, float] = {}
                while len(first_pick) < 2 and time.monotonic() - t_up < 10:
                    for rid in ids[2:]:
                        if rid not in first_pick and any(
                                x["id"] == rid and x["picks"] for x in router.snapshot()["pools"]["default"]):
                            first_pick[rid] = time.monotonic() - t_up
                    await asyncio.sleep(0.01)
                await asyncio.sleep(2.0)
                t_down = time.monotonic()
                write(f, urls[2:3])  # 4 -> 1: ids[0], ids[1], ids[3] leave and drain
                gone_at: float | None = None
                while time.monotonic() - t_down < 10:
                    if {r.id for r in router.replicas()} == {ids[2]}:
                        gone_at = time.monotonic() - t_down
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(1.0)
                stop.set()
                await asyncio.gather(*clients)
                async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
                    metrics = await r.text()
                return {"log": log, "t_up": t_up, "t_down": t_down, "first_pick": first_pick,
                        "gone_at": gone_at, "metrics": metrics}

        out = asyncio.run(main())
    finally:
        for w in workers:
            w.stop()

    log, t_up, t_down = out["log"], out["t_up"], out["t_down"]
    bad = [x for x in log if x["status"] != 200 or not x["done"]]
    assert not bad, bad[:3]  # no request failed through the churn
    lag = 2 * INTERVAL_S
    # the new replicas take traffic within two discovery intervals (plus the probe's round trip)
    assert set(out["first_pick"]) == set(ids[2:]) and max(out["first_pick"].values()) < lag + 0.5, out["first_pick"]
    steady4 = [x["replica"] for x in log if t_up + lag + 0.5 < x["t0"] and x["t1"] < t_down]
    share = {rid: steady4.count(rid) / len(steady4) for rid in ids}
    assert all(0.15 < v < 0.35 for v in share.values()), share  # round robin over four
    # the replicas that left: their in-flight requests finished (drained), then no new request
    drained = [x for x in log if x["replica"] in (ids[0], ids[1], ids[3]) and x["t0"] < t_down < x["t1"]]
    assert drained, "no request was in flight on a leaving replica: the drain went untested"
    late = [x for x in log if x["t0"] > t_down + lag + 0.5 and x["replica"] != ids[2]]
    assert not late, late[:3]
    assert out["gone_at"] is not None
    text = out["metrics"]
    for rid in (ids[0], ids[1], ids[3]):
        assert f'replica="{rid}"' not in "\n".join(
            ln for ln in text.splitlines() if ln.startswith(("llmsla_router_",))), rid
    assert f'{names.ROUTER_WEIGHT}{{pool="default",replica="{ids[2]}"}} 1.0' in text
    print(json.dumps({"requests": len(log), "first_pick_s": out["first_pick"], "drained_in_flight": len(drained),
                      "removed_after_s": out["gone_at"], "share_at_4": share}, indent=1))
