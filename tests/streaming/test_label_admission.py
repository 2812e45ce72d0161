"""The store admits model labels by the rule ``/metrics`` uses: a flood of made-up model names,
which the replica refuses, reaches the store's windows as ``other`` (one series), not as one row
per name. Real reference worker, real gateway, real stream job, real PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import psycopg
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import wiring
from llmsla.events import RequestEvent
from llmsla.spool import published_segments, read_segment
from llmsla.worker import server as worker_mod
from tests.worker._worker_util import MODEL

from .conftest import start_stream

JUNK = 3000


def test_a_flood_of_junk_model_names_is_one_series_in_the_store(cfg: config_mod.Config, tmp_path: Path) -> None:
    cfg.worker.max_tokens = 4
    cfg.metrics.label_top_n = 50
    cfg.spool.segment_max_age_s = 0.5

    async def flood() -> tuple[list[int], int]:
        async with worker_mod.serve(cfg, "127.0.0.1", 0) as worker:
            cfg.gateway.upstreams = [worker.url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry()) as gw, \
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as s:
                async def post(model: str) -> int:
                    async with s.post(gw.url + "/v1/completions",
                                      json={"model": model, "prompt": "hi", "max_tokens": 2}) as r:
                        await r.read()
                        return r.status

                good = await post(MODEL)  # served first: its name holds a slot
                junk = await asyncio.gather(*(post(f"junk-{i}-\u00e9\u4e2d") for i in range(JUNK)))
                return junk, good

    junk, good = asyncio.run(flood())  # the gateway's spool is flushed when it stops
    assert set(junk) == {404} and good == 200

    # the spool already carries the folded label: the raw names never reach the disk
    events = [x for seg in published_segments(cfg.spool_dir(), names.SPOOL_REQUESTS)
              for x in read_segment(seg, names.SPOOL_REQUESTS)]
    assert all(isinstance(e, RequestEvent) for e in events) and len(events) == JUNK + 1
    by_model = {m: sum(1 for e in events if e.model == m) for m in {e.model for e in events}}
    assert by_model == {MODEL: 1, names.LABEL_OVERFLOW_VALUE: JUNK}

    log = tmp_path / "stream.log"
    proc = start_stream(cfg, "--once", "--kinds", names.SPOOL_REQUESTS, log=log, watermark_delay_s=1)
    assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
    with psycopg.connect(cfg.store.dsn) as conn:
        for table in (names.T_REQUEST_WINDOWS, names.T_REQUEST_WINDOWS_1M):
            rows = conn.execute(f"SELECT model, sum(requests)::bigint, count(*) FROM {table} GROUP BY model").fetchall()
            got = {model: requests for model, requests, _ in rows}
            assert got == {MODEL: 1, names.LABEL_OVERFLOW_VALUE: JUNK}, (table, got)  # nothing lost, only folded
            buckets = conn.execute(f"SELECT count(DISTINCT bucket) FROM {table}").fetchone()[0]
            assert sum(n for *_, n in rows) <= 2 * buckets, table  # at most one row per label per bucket
