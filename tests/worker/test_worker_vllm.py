"""The vLLM adapter against a real reference worker: what the scraper reads is what the worker's
engine holds (queue and batch under a burst of real requests, KV usage while busy and idle,
prefix-cache hits for a repeated prompt, one TTFT observation per request served), through the
scraper and through ``llmsla engines --once``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp

from llmsla import config as config_mod
from llmsla import names
from llmsla.engines.record import EngineSnapshot, ReplicaState
from llmsla.engines.scrape import ScrapeError, Scraper, Target
from llmsla.worker.engine import Engine
from llmsla.worker.server import WorkerThread

from ._worker_util import MODEL, post, worker_cfg

N = 8
OUT = 40
PROMPT = "We hold these truths to be self-evident, that all"  # 49 chars + BOS: 3 full blocks, 48 hit


async def _scrape(scraper: Scraper) -> EngineSnapshot:
    got = (await scraper.scrape_all_once())["w0"]
    assert not isinstance(got, ScrapeError), got
    return got[0]


def test_the_vllm_adapter_reads_what_the_worker_engine_holds(tmp_path: Path) -> None:
    with WorkerThread(worker_cfg(tmp_path, max_batch=2)) as wt:
        assert wt.running is not None
        engine: Engine = wt.running.engine
        target = Target("w0", names.DEFAULT_POOL, wt.url + "/metrics", names.ENGINE_VLLM)
        scraper = Scraper(config_mod.Config(), [target])

        async def go() -> tuple[EngineSnapshot, list[EngineSnapshot], EngineSnapshot]:
            idle = await _scrape(scraper)
            engine.set_slowdown(4.0)  # iterations last long enough to be seen mid-burst
            async with aiohttp.ClientSession() as s:
                burst = asyncio.gather(*(post(s, wt.url, "/v1/completions", {
                    "model": MODEL, "prompt": PROMPT, "max_tokens": OUT, "temperature": 0, "ignore_eos": True,
                }) for _ in range(N)))
                busy: list[EngineSnapshot] = []
                while not burst.done():
                    busy.append(await _scrape(scraper))
                    await asyncio.sleep(0.02)
                for status, body in await burst:
                    assert status == 200, body
            engine.set_slowdown(1.0)
            return idle, busy, await _scrape(scraper)

        idle, busy, after = asyncio.run(go())
        stats = engine.stats()

    assert (idle.engine, idle.waiting, idle.running, idle.kv_usage) == ("vllm", 0, 0, 0)
    assert (idle.kv_blocks_total, idle.kv_block_size) == (stats["kv_blocks_total"], 16)
    assert idle.kv_capacity_tokens == stats["kv_blocks_total"] * 16
    assert idle.histograms["ttft"] is not None and idle.histograms["ttft"].count == 0
    # mid-burst: a full batch of two, the rest queued, blocks held
    queued = [b for b in busy if (b.waiting or 0) >= 1 and b.running == 2]
    assert queued, [(b.waiting, b.running) for b in busy]
    assert all(b.running is not None and 0 <= b.running <= 2 for b in busy)
    assert all(b.waiting is not None and b.running is not None and b.waiting + b.running <= N for b in busy)
    assert max(b.kv_usage or 0 for b in busy) > 0
    blocks_per_req = -(-(len(PROMPT) + 1 + OUT) // 16)
    assert max(b.kv_usage or 0 for b in busy) <= 2 * blocks_per_req / stats["kv_blocks_total"] + 1e-9
    # idle again: every block back, every request observed once
    assert (after.waiting, after.running, after.kv_usage) == (0, 0, 0)
    h = after.histograms
    assert h["ttft"] is not None and h["e2e"] is not None and h["queue"] is not None and h["itl"] is not None
    assert h["ttft"].count == h["e2e"].count == h["queue"].count == N
    assert h["itl"].count == N * (OUT - 1)
    assert h["ttft"].le[:3] == (0.001, 0.005, 0.01) and h["itl"].le[0] == 0.01
    assert h["queue"].sum > 0  # with a batch of two, six requests waited
    # the repeated prompt: every request after the first finds its 3 full blocks (48 tokens)
    assert after.prefix_cache_queries_total == stats["prefix_cache_queries"] == N * (len(PROMPT) + 1)
    assert after.prefix_cache_hits_total == stats["prefix_cache_hits"] == (N - 1) * 48
    state = ReplicaState()  # the hit rate over idle -> after, as the scraper derives it between two scrapes
    state.update(idle)
    rate = state.update(after)[0].prefix_cache_hit_rate
    assert rate == stats["prefix_cache_hits"] / stats["prefix_cache_queries"] == (N - 1) * 48 / (N * 50)
    assert after.preemptions_total == stats["preemptions"] == 0


def test_llmsla_engines_once_detects_the_worker_as_vllm(tmp_path: Path) -> None:
    with WorkerThread(worker_cfg(tmp_path)) as wt:
        async def one() -> None:
            async with aiohttp.ClientSession() as s:
                status, body = await post(s, wt.url, "/v1/completions", {"model": MODEL, "prompt": PROMPT,
                                                                         "max_tokens": 5, "temperature": 0})
                assert status == 200, body

        asyncio.run(one())
        env = {**os.environ, "LLMSLA_SPOOL_DIR": str(tmp_path / "spool")}
        run = subprocess.run([sys.executable, "-m", "llmsla", "engines", "--once", "--upstream", wt.url],
                             capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    sample = json.loads(run.stdout)["r0"]["sample"]
    assert (sample["engine"], sample["waiting"], sample["running"], sample["kv_usage"]) == ("vllm", 0, 0, 0)
    assert sample["ttft"]["count"] == 1 and sample["e2e"]["count"] == 1 and sample["kv_block_size"] == 16
