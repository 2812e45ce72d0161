"""End to end: real workers behind the gateway, a real Prometheus scraping it every 0.5 s.

A few thousand requests of mixed lengths (completions and chat, streamed and not); then the
counts Prometheus holds must equal the spool's ``RequestEvent`` counts exactly, PromQL's
``histogram_quantile(0.99, ...)`` of TTFT and E2E must land in the same bucket as the exact P99
computed from the spooled events with numpy, and for every request TTFT <= E2E and gateway TTFT
>= the worker's own first-token time (worker timing extension, matched by trace id).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import random
import secrets
import time
import urllib.parse
import urllib.request
from pathlib import Path

import aiohttp
import numpy as np
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names, slo_catalog
from llmsla.app import wiring
from llmsla.spool import published_segments, read_segment
from llmsla.worker.server import WorkerThread

N_REQUESTS = 2500
CONCURRENCY = 32


def promql(url: str, query: str, at: float | None = None) -> list[dict]:
    """An instant query, evaluated at ``at`` (epoch s) when given: after the exporter stops,
    its series are marked stale at the next failed scrape, so later queries pin the time."""
    q = urllib.parse.urlencode({"query": query, **({"time": f"{at:.3f}"} if at is not None else {})})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
        data = json.load(r)
    assert data["status"] == "success", data
    return data["data"]["result"]


def scalar(url: str, query: str, at: float | None = None) -> float | None:
    res = promql(url, query, at)
    return float(res[0]["value"][1]) if res else None


def bucket_index(bounds: list[float], value_s: float) -> int:
    """Index of the histogram bucket (lo, hi] holding ``value_s``; len(bounds) is +Inf."""
    return bisect.bisect_left(bounds, value_s)


def _worker_ext(body: bytes, stream: bool) -> dict | None:
    if not stream:
        return json.loads(body).get("llmsla")
    ext = None
    for line in body.split(b"\n"):
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            obj = json.loads(line[6:])
            # the gateway asked the replica for usage; the client did not, so it gets none
            assert "usage" not in obj and obj["choices"], obj
            ext = obj.get("llmsla", ext)
    return ext


async def _drive(gw_url: str, model: str) -> dict[str, dict]:
    """Send the mixed load; trace id -> the worker extension the client received."""
    rng = random.Random(7)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "llm", "serving", "fleets", "keep", "their", "slo"]
    got: dict[str, dict] = {}
    sem = asyncio.Semaphore(CONCURRENCY)
    conn = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=conn) as s:

        async def one(i: int) -> None:
            prompt = " ".join(rng.choice(words) for _ in range(rng.choice((1, 3, 8, 20, 60))))
            stream = i % 5 != 0
            chat = i % 7 == 0
            body: dict = {"model": model, "max_tokens": rng.randint(1, 6), "stream": stream, "seed": i}
            if chat:
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
            trace_id = secrets.token_hex(16)
            headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
            path = "/v1/chat/completions" if chat else "/v1/completions"
            async with sem, s.post(gw_url + path, json=body, headers=headers) as r:
                data = await r.read()
                assert r.status == 200, data[:300]
            got[trace_id] = {**(_worker_ext(data, stream) or {}), "stream": stream}

        await asyncio.gather(*(one(i) for i in range(N_REQUESTS)))
    return got


def test_prometheus_agrees_with_spool(tmp_path: Path, start_prometheus) -> None:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    assert cfg.control.route_policy == "ladr"  # the default policy routes this run
    reg = CollectorRegistry()
    workers = [WorkerThread(cfg) for _ in range(2)]
    try:
        cfg.gateway.upstreams = [w.start() for w in workers]

        async def main() -> tuple[dict[str, dict], str, float]:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=reg) as gw:
                prom = start_prometheus({"gateway": [f"127.0.0.1:{gw.port}"]}, interval_s=0.5)
                ext = await _drive(gw.url, cfg.worker.model)
                # wait until a scrape has seen every request, then stop (flushes the spool)
                deadline = time.monotonic() + 20
                at = time.time()
                while time.monotonic() < deadline:
                    at = time.time()
                    if await asyncio.to_thread(scalar, prom.url, f"sum({names.REQUESTS}_total)", at) == N_REQUESTS:
                        break
                    await asyncio.sleep(0.25)
                return ext, prom.url, at

        t0 = time.monotonic()
        ext, prom_url, at = asyncio.run(main())
        drive_s = time.monotonic() - t0
    finally:
        for w in workers:
            w.stop()

    events = [e for seg in published_segments(cfg.spool_dir(), names.SPOOL_REQUESTS)
              for e in read_segment(seg, names.SPOOL_REQUESTS)]
    assert len(events) == N_REQUESTS, f"{len(events)} events for {N_REQUESTS} requests"
    assert {e.trace_id for e in events} == set(ext)
    assert {e.replica for e in events} == {"r0", "r1"}

    # exact counts: requests by status, histogram _count, tokens
    by_status = {r["metric"]["status"]: float(r["value"][1])
                 for r in promql(prom_url, f"sum by (status) ({names.REQUESTS}_total)", at)}
    spool_status = {s: float(sum(e.status == s for e in events)) for s in names.STATUSES}
    assert {k: v for k, v in by_status.items() if v} == {k: v for k, v in spool_status.items() if v}
    assert spool_status["ok"] == N_REQUESTS
    per_replica = {r["metric"]["replica"]: float(r["value"][1])
                   for r in promql(prom_url, f"sum by (replica) ({names.REQUESTS}_total)", at)}
    assert per_replica == {r: float(sum(e.replica == r for e in events)) for r in ("r0", "r1")}
    # TTFT: streamed requests that produced a first token (a whole JSON body has no first token)
    ttft = [e for e in events if e.ttft_ms is not None and ext[e.trace_id]["stream"]]
    assert 0 < len(ttft) < len(events)
    assert scalar(prom_url, f"sum({names.REQUEST_TTFT_SECONDS}_count)", at) == len(ttft)
    # TPOT: once per successful streamed request with >= 2 tokens, (E2E - TTFT) / (tokens - 1)
    tpot = [(e.e2e_ms - e.ttft_ms) / 1000.0 / (e.output_tokens - 1) for e in ttft if e.output_tokens >= 2]
    assert scalar(prom_url, f"sum({names.REQUEST_TPOT_SECONDS}_count)", at) == len(tpot) > 0
    assert math.isclose(scalar(prom_url, f"sum({names.REQUEST_TPOT_SECONDS}_sum)", at), sum(tpot), rel_tol=1e-6)
    assert scalar(prom_url, f"sum({names.REQUEST_E2E_SECONDS}_count)", at) == len(events)
    # goodput: ok, and within every latency objective of the specs at once (TTFT = E2E unstreamed)
    cat = slo_catalog.load(cfg)
    good = [e for e in events if e.status == "ok" and e.e2e_ms <= cat.e2e_ms
            and (e.e2e_ms if e.ttft_ms is None else e.ttft_ms) <= cat.ttft_ms]
    assert scalar(prom_url, f"sum({names.REQUEST_GOODPUT}_total)", at) == len(good)
    assert scalar(prom_url, f"sum({names.REQUEST_QUEUE_SECONDS}_count)", at) == len(events)
    assert scalar(prom_url, f"sum({names.REQUEST_INTER_CHUNK_SECONDS}_count)", at) == sum(e.itl_ms.n for e in events)
    out_tokens = scalar(prom_url, f'sum({names.TOKENS}_total{{kind="{names.TOKEN_KIND_OUTPUT}"}})', at)
    assert out_tokens == sum(e.output_tokens for e in events)
    prompt_tokens = scalar(prom_url, f'sum({names.TOKENS}_total{{kind="{names.TOKEN_KIND_PROMPT}"}})', at)
    assert prompt_tokens == sum(e.prompt_tokens for e in events)

    # P99: PromQL's estimate and the exact order statistic share a bucket
    for metric, values_ms, bounds in (
        (names.REQUEST_TTFT_SECONDS, [e.ttft_ms for e in ttft], cfg.metrics.ttft_buckets),
        (names.REQUEST_E2E_SECONDS, [e.e2e_ms for e in events], cfg.metrics.e2e_buckets),
    ):
        exact_s = float(np.quantile(np.array(values_ms) / 1000.0, 0.99, method="inverted_cdf"))
        est_s = scalar(prom_url, f"histogram_quantile(0.99, sum by (le) ({metric}_bucket))", at)
        assert est_s is not None
        assert bucket_index(bounds, est_s) == bucket_index(bounds, exact_s), (metric, est_s, exact_s)

    # per request: TTFT <= E2E, gateway TTFT >= worker-side first-token time
    checked = 0
    for e in events:
        if e.ttft_ms is None:  # no token at all (EOS first): nothing to compare
            assert e.output_tokens == 0 == ext[e.trace_id]["output_tokens"]
            continue
        assert e.queue_ms <= e.ttft_ms <= e.e2e_ms
        w = ext[e.trace_id]
        assert w.get("worker_ttft_ms") is not None
        assert e.ttft_ms >= w["worker_ttft_ms"], (e, w)
        assert e.output_tokens == w["output_tokens"] and e.prompt_tokens == w["prompt_tokens"]
        checked += 1
    assert checked >= N_REQUESTS // 2
    print(f"{N_REQUESTS} requests in {drive_s:.1f} s")
