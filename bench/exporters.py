"""Exporters bench: what the gateway's instrumentation costs, against anchors from the same run.

1. Instrumentation cost per request: ``RequestRecorder.record`` (guarded labels, cached
   children, validation, optional spool line) and the SSE ``StreamTimer`` vs the bare
   prometheus-client ``observe``/``inc`` calls one request needs (pre-resolved children).
2. Gateway overhead at 50 concurrent streams: client-side TTFT direct to an upstream vs through
   ``llmsla gateway`` (a separate process, as deployed). The upstream is a trivial fast SSE
   server (its own process), so the model does not dominate: what is left is the proxy.
3. ``/metrics`` scrape time with 2,000 label sets: HTTP GET on the gateway vs
   prometheus-client's ``generate_latest`` on the same registry.
4. Reference worker tokens/s at batch 1 and batch 16 (``worker_load.measure_tokens_per_second``).

``python bench/exporters.py [--quick]`` prints a table and writes bench/results/exporters.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla import names  # noqa: E402
from llmsla.services import free_port, wait_http  # noqa: E402


# -- 1. instrumentation cost ---------------------------------------------------------------------
def bench_instrumentation(n: int, gaps: int) -> list[dict]:
    from llmsla.exporters.recorder import RequestRecorder, StreamTimer
    from prometheus_client import CollectorRegistry, Counter, Histogram

    from llmsla.events import ItlSummary, RequestEvent
    from llmsla.spool import SpoolWriter

    cfg = config_mod.load(env={})
    gap_list = [12.5 + i for i in range(gaps)]
    ev = RequestEvent(ts_ms=1_700_000_000_000, trace_id="a" * 32, model="m", pool="p", replica="r0", arm="default",
                      policy="default", prompt_tokens=20, output_tokens=gaps + 1, queue_ms=0.4, ttft_ms=35.0,
                      itl_ms=ItlSummary.from_gaps(gap_list), e2e_ms=35.0 + sum(gap_list), status="ok")

    # anchor: the bare client calls one request needs, children resolved beforehand
    reg0 = CollectorRegistry()
    lbl = names.REQUEST_LABELS
    h = {k: Histogram(f"bare_{k}", "", lbl, buckets=b, registry=reg0).labels("m", "p", "r0", "default")
         for k, b in (("ttft", cfg.metrics.ttft_buckets), ("itl", cfg.metrics.itl_buckets),
                      ("e2e", cfg.metrics.e2e_buckets), ("queue", cfg.metrics.queue_buckets))}
    req = Counter("bare_requests", "", (*lbl, "status"), registry=reg0).labels("m", "p", "r0", "default", "ok")
    tok = Counter("bare_tokens", "", (*lbl, "kind"), registry=reg0)
    tp, to = tok.labels("m", "p", "r0", "default", "prompt"), tok.labels("m", "p", "r0", "default", "output")
    gaps_s = [g / 1000 for g in gap_list]

    def bare() -> None:
        req.inc()
        h["queue"].observe(0.0004)
        h["e2e"].observe(0.2)
        h["ttft"].observe(0.035)
        for g in gaps_s:
            h["itl"].observe(g)
        tp.inc(20)
        to.inc(gaps + 1)

    rec = RequestRecorder(cfg, registry=CollectorRegistry())
    tmp = tempfile.mkdtemp(prefix="llmsla-bench-")
    spool = SpoolWriter(tmp, names.SPOOL_REQUESTS, background=False, max_total_bytes=1 << 34)
    rec_spool = RequestRecorder(cfg, registry=CollectorRegistry(), spool=spool)
    sse = b"".join(b'data: {"id":"c","choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
                   for _ in range(gaps + 1)) + b"data: [DONE]\n\n"
    chunks = [sse[i:i + 80] for i in range(0, len(sse), 80)]

    def timer() -> None:
        t = StreamTimer(0.0, streaming=True)
        now = 0.001
        for c in chunks:
            now += 0.01
            t.feed(c, now)
        t.event(end=now, ts_ms=1_700_000_000_000, trace_id="a" * 32, model="m", pool="p", replica="r0",
                arm="default", policy="default", status="ok", prompt_estimate=5)

    cases = {
        "bare prometheus-client calls (anchor)": bare,
        "record(): metrics, no validation": lambda: rec.record(ev, itl_gaps_ms=gap_list, validate=False),
        "record(): metrics + validation": lambda: rec.record(ev, itl_gaps_ms=gap_list),
        "record(): metrics + validation + spool line": lambda: rec_spool.record(ev, itl_gaps_ms=gap_list),
        "StreamTimer: SSE parse + event build": timer,
    }
    rows = []
    anchor = None
    for name, fn in cases.items():
        for _ in range(min(n, 2000)):  # warm up
            fn()
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best.append((time.perf_counter() - t0) / n * 1e6)
        us = min(best)
        anchor = anchor or us
        rows.append({"case": name, "us_per_request": round(us, 2), "ratio_vs_bare": round(us / anchor, 2)})
    spool.close()
    return rows


# -- 2. gateway overhead --------------------------------------------------------------------------
def serve_upstream(port: int, tokens: int, gap_s: float) -> None:
    """The trivial fast upstream: streams ``tokens`` one-token SSE chunks ``gap_s`` apart."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(tokens):
            if i:
                await asyncio.sleep(gap_s)
            chunk = {"choices": [{"index": 0, "text": "x"}]}
            if i == tokens - 1:
                chunk["usage"] = {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": tokens + 4}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/healthz", health)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


async def _ttft_round(url: str, concurrency: int, session, per_stream: int = 1) -> list[float]:
    """``concurrency`` closed-loop streams, each sending ``per_stream`` requests back to back;
    client-side TTFT (send -> first data chunk) of each, ms."""
    body = {"model": "bench", "prompt": "hello", "max_tokens": 8, "stream": True}

    async def one() -> float:
        t0 = time.perf_counter()
        async with session.post(url + "/v1/completions", json=body) as r:
            ttft = None
            async for line in r.content:
                if ttft is None and line.startswith(b"data: {"):
                    ttft = time.perf_counter() - t0
            assert r.status == 200
            return ttft * 1000.0

    async def stream() -> list[float]:
        return [await one() for _ in range(per_stream)]

    return [t for ts in await asyncio.gather(*(stream() for _ in range(concurrency))) for t in ts]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _pct(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.quantile(np.array(values), q))


def bench_overhead(rounds: int, concurrency: int, tmp: Path, gap_s: float,
                   per_stream: int = 10, workers: int = 1) -> tuple[list[dict], dict]:
    import aiohttp

    up_port, gw_port = free_port(), free_port()
    env = {**os.environ, "LLMSLA_SPOOL_DIR": str(tmp / "spool"), "LLMSLA_CONTROL_ROUTE_POLICY": "round_robin"}
    procs = [subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(up_port), "--gap-s", str(gap_s)],
                              env=env),
             subprocess.Popen([sys.executable, "-m", "llmsla.cli", "gateway", "--port", str(gw_port),
                               "--workers", str(workers), "--upstream", f"http://127.0.0.1:{up_port}"], env=env,
                              stdout=subprocess.DEVNULL)]
    try:
        wait_http(f"http://127.0.0.1:{up_port}/healthz", proc=procs[0])
        wait_http(f"http://127.0.0.1:{gw_port}/healthz", proc=procs[1])
        direct_url, gw_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{gw_port}"

        async def main() -> tuple[list[float], list[float]]:
            direct: list[float] = []
            via: list[float] = []
            conn = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=conn) as s:
                for url in (direct_url, gw_url):  # warm the pools
                    await _ttft_round(url, concurrency, s)
                for i in range(rounds):  # interleaved, so drift on a shared machine hits both
                    order = (direct_url, gw_url) if i % 2 == 0 else (gw_url, direct_url)
                    for url in order:
                        (direct if url == direct_url else via).extend(await _ttft_round(url, concurrency, s, per_stream))
            return direct, via

        gw_pids = [procs[1].pid] if workers == 1 else _children(procs[1].pid)
        cpu0 = sum(_cpu_s(p) for p in gw_pids)
        direct, via = asyncio.run(main())
        gw_cpu_ms = (sum(_cpu_s(p) for p in gw_pids) - cpu0) * 1000.0 / (len(via) + concurrency)  # + warm-up
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)
    d50, d99, g50, g99 = _pct(direct, 0.5), _pct(direct, 0.99), _pct(via, 0.5), _pct(via, 0.99)
    gap = f"{gap_s * 1000:g} ms/token" + (f", gateway --workers {workers}" if workers > 1 else "")
    rows = [
        {"upstream": gap, "streams": concurrency, "path": "direct to upstream (anchor)", "ttft_p50_ms": round(d50, 3),
         "ttft_p99_ms": round(d99, 3), "requests": len(direct)},
        {"upstream": gap, "streams": concurrency, "path": "through llmsla gateway", "ttft_p50_ms": round(g50, 3),
         "ttft_p99_ms": round(g99, 3), "requests": len(via)},
    ]
    added = {"upstream": gap, "streams": concurrency, "added_ttft_p50_ms": round(g50 - d50, 3), "added_ttft_p99_ms": round(g99 - d99, 3),
             "gateway_cpu_ms_per_request": round(gw_cpu_ms, 3),
             "target_p50_ms": 1.0, "target_p99_ms": 5.0, "p50_ratio": round(g50 / d50, 3), "p99_ratio": round(g99 / d99, 3)}
    return rows, added


# -- 3. /metrics scrape ---------------------------------------------------------------------------
def bench_scrape(label_sets: int, scrapes: int) -> list[dict]:
    import urllib.request

    from llmsla.exporters import gateway as gw_mod
    from prometheus_client import CollectorRegistry, generate_latest

    from llmsla.events import ItlSummary, RequestEvent

    cfg = config_mod.load(env={})
    cfg.metrics.label_top_n = label_sets
    cfg.gateway.upstreams = ["http://127.0.0.1:9"]
    reg = CollectorRegistry()
    result: dict = {}

    async def main() -> None:
        async with gw_mod.serve(cfg, "127.0.0.1", 0, registry=reg, spool=None) as gw:
            rec = gw.gateway.recorder
            for i in range(label_sets):
                ev = RequestEvent(ts_ms=1_700_000_000_000, trace_id="a" * 32, model=f"model-{i % 20}", pool="p",
                                  replica=f"r{(i // 20) % 10}", arm=f"arm-{i // 200}", policy="default",
                                  prompt_tokens=3, output_tokens=3, queue_ms=0.1, ttft_ms=20.0,
                                  itl_ms=ItlSummary.from_gaps([10.0, 12.0]), e2e_ms=50.0, status="ok")
                rec.record(ev, itl_gaps_ms=[10.0, 12.0])
            url = gw.url + "/metrics"

            def scrape() -> tuple[float, int]:
                t0 = time.perf_counter()
                with urllib.request.urlopen(url, timeout=30) as r:
                    size = len(r.read())
                return time.perf_counter() - t0, size

            def direct() -> tuple[float, int]:
                t0 = time.perf_counter()
                size = len(generate_latest(reg))
                return time.perf_counter() - t0, size

            await asyncio.to_thread(scrape)
            d, g = [], []
            for _ in range(scrapes):
                d.append(await asyncio.to_thread(direct))
                g.append(await asyncio.to_thread(scrape))
            result["direct"], result["http"] = d, g

    asyncio.run(main())
    d_ms = statistics.median(x[0] for x in result["direct"]) * 1000
    g_ms = statistics.median(x[0] for x in result["http"]) * 1000
    return [
        {"case": "prometheus_client.generate_latest (anchor)", "label_sets": label_sets,
         "median_ms": round(d_ms, 1), "bytes": result["direct"][0][1], "ratio": 1.0},
        {"case": "GET /metrics on the gateway", "label_sets": label_sets, "median_ms": round(g_ms, 1),
         "bytes": result["http"][0][1], "ratio": round(g_ms / d_ms, 3)},
    ]


# -- 4. worker throughput -------------------------------------------------------------------------
def bench_worker(max_tokens: int, rounds: int) -> list[dict]:
    from llmsla.exporters.worker import WorkerThread
    from llmsla.exporters.worker_load import measure_tokens_per_second

    cfg = config_mod.load(env={})
    cfg.spool.dir = tempfile.mkdtemp(prefix="llmsla-bench-")
    rows = []
    with WorkerThread(cfg) as wt:
        for conc in (1, 16):
            r = asyncio.run(measure_tokens_per_second(wt.url, concurrency=conc, max_tokens=max_tokens,
                                                      rounds=rounds, model=cfg.worker.model))
            rows.append({"batch": conc, "requests": r["requests"], "output_tokens": r["output_tokens"],
                         "wall_s": round(r["wall_s"], 2), "tokens_per_s": round(r["tokens_per_s"], 1)})
    rows[1]["speedup_vs_batch1"] = round(rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"], 2)
    rows[0]["speedup_vs_batch1"] = 1.0
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run while developing")
    ap.add_argument("--serve-upstream", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--gap-s", type=float, default=0.002, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream, tokens=8, gap_s=args.gap_s)
        return 0
    q = args.quick
    inputs = {"quick": q, "instr_requests": 2000 if q else 20000, "itl_gaps_per_request": [8, 64],
              "overhead_rounds": 2 if q else 6, "concurrency": 50, "upstream": "trivial SSE server, 8 one-token chunks, first at once, then 2 ms or 20 ms apart",
              "label_sets": 2000, "scrapes": 3 if q else 10, "worker_max_tokens": 16 if q else 64,
              "worker_rounds": 1 if q else 2}
    out: dict = {"inputs": inputs}
    instr = []
    for gaps in inputs["itl_gaps_per_request"]:
        rows = bench_instrumentation(inputs["instr_requests"], gaps)
        instr += [{"itl_gaps": gaps, **r} for r in rows]
    print_table(instr, "1. instrumentation cost per request")
    out["instrumentation"] = instr
    rows, added = [], []
    # 50 streams at a realistic token pace, then at a pace that saturates one proxy process;
    # then 1 stream: the per-request cost of the extra hop without any queueing
    # and 50 streams on two gateway processes (--workers 2, SO_REUSEPORT)
    for conc, gap_s, per_stream, workers in ((inputs["concurrency"], 0.02, 10, 1), (inputs["concurrency"], 0.002, 10, 1),
                                             (1, 0.002, 50, 1), (inputs["concurrency"], 0.02, 10, 2)):
        with tempfile.TemporaryDirectory() as tmp:
            r, a = bench_overhead(inputs["overhead_rounds"], conc, Path(tmp), gap_s, per_stream, workers)
        rows += r
        added.append(a)
    print_table(rows, "2. client TTFT, closed-loop concurrent streams (trivial fast upstream)")
    print_table(added, "   added by the gateway")
    out["gateway_overhead"] = {"rows": rows, "added": added}
    scrape = bench_scrape(inputs["label_sets"], inputs["scrapes"])
    print_table(scrape, "3. /metrics with 2,000 label sets")
    out["scrape"] = scrape
    worker = bench_worker(inputs["worker_max_tokens"], inputs["worker_rounds"])
    print_table(worker, "4. reference worker tokens/s (non-streaming, ignore_eos)")
    out["worker"] = worker
    write_result("exporters", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
