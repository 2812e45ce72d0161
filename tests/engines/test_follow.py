"""``llmsla engines`` follows the gateway's discovery source: real loopback engines (one path per
replica), a real discovery file edited 2 -> 3 -> 2, then removed and emptied. A replica that
leaves loses every series (absent, not 0), one that joins is scraped at once under the gateway's
id, and a source that cannot answer keeps the last set and is counted by reason."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import choose_encoder

from llmsla import config as config_mod
from llmsla import names
from llmsla.discovery import FileSource, replica_id
from llmsla.discovery_metrics import DiscoveryMetrics
from llmsla.engines.follow import Follow, from_source
from llmsla.engines.recorder import EngineRecorder
from llmsla.engines.scrape import Scraper

from . import expositions as ex

INTERVAL = 0.1


def _write(path: Path, lines: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(u + "\n" for u in lines))
    os.replace(tmp, path)


def _value(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    for metric in reg.collect():
        for s in metric.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def _until(cond, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.02)


def test_engines_follow_the_discovery_file(tmp_path: Path) -> None:
    asyncio.run(_follow(tmp_path))


async def _follow(tmp_path: Path) -> None:
    body = ex.vllm()

    async def metrics(request: web.Request) -> web.StreamResponse:
        encoder, ctype = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(body.registry), headers={"Content-Type": ctype})

    app = web.Application()
    app.router.add_get("/r/{n}/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # started: it has one
    urls = [f"http://127.0.0.1:{port}/r/{i}" for i in range(3)]
    ids = [replica_id("default", u, "default") for u in urls]  # what the gateway's membership names them

    cfg = config_mod.Config()
    cfg.engine.scrape_interval_s = INTERVAL
    f = tmp_path / "replicas"
    _write(f, urls[:2])
    reg = CollectorRegistry()
    rec = EngineRecorder(registry=reg)
    scraper = Scraper(cfg, [], on_sample=rec.sample, on_failure=rec.failure)
    scraper.on_remove = rec.forget
    dm = DiscoveryMetrics("file", registry=reg)
    follow = Follow(scraper, from_source(FileSource(f, "default"), default_pool="default", path="/metrics",
                                        engine_of=lambda _f: names.ENGINE_AUTO),
                    interval_s=INTERVAL, metrics=dm, describe=f"file {f}")
    stop = asyncio.Event()
    task = asyncio.create_task(follow.serve(stop))
    up = names.ENGINE_UP
    serving = {"pool": "default", "state": names.DISCOVERY_SERVING}
    try:
        await _until(lambda: all(_value(reg, up, replica=r) == 1 for r in ids[:2]))
        await _until(lambda: _value(reg, names.DISCOVERY_REPLICAS, **serving) == 2)
        assert _value(reg, names.ENGINE_REQUESTS_WAITING, replica=ids[0]) is not None
        assert _value(reg, up, replica=ids[2]) is None

        _write(f, urls[1:])  # r0 leaves, r2 joins
        await _until(lambda: _value(reg, up, replica=ids[2]) == 1)
        await _until(lambda: _value(reg, up, replica=ids[0]) is None)
        text = generate_latest(reg).decode()
        assert f'replica="{ids[0]}"' not in text  # every series of the one that left: gone, not 0
        assert f'{names.ENGINE_REQUESTS_WAITING}{{engine="vllm",pool="default",replica="{ids[2]}"}}' in text
        assert sorted(t.replica for t in scraper.targets) == sorted(ids[1:])
        await _until(lambda: _value(reg, names.DISCOVERY_REPLICAS, **serving) == 2)
        ok_before = _value(reg, names.DISCOVERY_REFRESHES + "_total", source="file") or 0
        assert ok_before >= 2 and (_value(reg, names.DISCOVERY_LAST_SUCCESS, source="file") or 0) > 0

        f.unlink()  # the source cannot answer: the last set is kept, the failure counted
        await _until(lambda: (_value(reg, names.DISCOVERY_FAILURES + "_total", source="file",
                                     reason=names.DISCOVERY_FAIL_MISSING) or 0) >= 1)
        _write(f, ["# nothing here"])  # an answer naming no replica: kept as well
        await _until(lambda: (_value(reg, names.DISCOVERY_FAILURES + "_total", source="file",
                                     reason=names.DISCOVERY_FAIL_EMPTY) or 0) >= 1)
        await asyncio.sleep(3 * INTERVAL)
        assert sorted(t.replica for t in scraper.targets) == sorted(ids[1:])
        assert all(_value(reg, up, replica=r) == 1 for r in ids[1:])
    finally:
        stop.set()
        await task
        await runner.cleanup()
