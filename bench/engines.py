"""Adapter cost: CPU of ``llmsla engines`` scraping 256 vLLM replicas every second (target: < 5 %
of one core).

The replicas are one local HTTP server in another process (its CPU is not counted), one path
per replica, each a realistic vLLM V1 exposition: the families the reference worker exposes
(what vLLM's ``PrometheusStatLogger`` names, ``exporters/vllm_metrics.py``) plus the ones vLLM
adds that no adapter reads (token-count and phase-time histograms, request outcomes, the
process and GC collectors), ``--engines`` engine cores each (data parallelism), values
different per replica. The
scraping process runs the real :class:`~llmsla.engines.scrape.Scraper` with the recorder
(series, and EngineSample lines into a spool in a temporary folder) on the event loop
``llmsla engines`` runs (uvloop where installed) for ``--window`` seconds per round, against
replicas whose body never changes (``unchanged``: a reference point, not a real engine: a
serving process's own collectors move), idle ones (no traffic: the engine's families the same,
the process's CPU seconds and memory moved every scrape) and busy ones (every scrape reads moved
values: another of 8 successive bodies); its CPU (user + system, every thread) over the wall
time is the figure. The target holds when it holds for idle and busy replicas.

Anchor, in the same run on the same texts: the bare ``prometheus_client`` text parser
(``text_string_to_metric_families``, consumed to the last sample), 256 texts per second, as %
of one core; and llmsla's parse + adapt alone (no HTTP). Rounds are paired (scraper, then both
parsers, per round), so machine noise hits them all alike.

``--vs-ref REV``: instead, the scraper of revision ``REV`` (from git history, the anchor) and
today's, each in its own process against the same replicas, alternating which goes first, idle
then busy in every round: today's CPU over the revision's, per round, and the geometric mean
with its 95 % interval (``bench/results/engines-vs.json``).

    python bench/engines.py [--replicas 256] [--rounds 5] [--window 5] [--engines 1] [--vs-ref REV]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, paired_interval, print_table, write_result  # noqa: E402

TARGET_PCT = 5.0
#: Bodies a busy replica cycles through (bench/engines.py ``/busy/``).
VERSIONS = 8
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
_ITER_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def exposition(i: int, engines: int = 1) -> bytes:
    """Replica ``i``'s /metrics body (Prometheus text format), as a vLLM V1 server answers."""
    return expositions(i, engines, 1)[0]


def expositions(i: int, engines: int = 1, versions: int = 1) -> list[bytes]:
    """``versions`` successive bodies of replica ``i``: between two, each engine serves more
    requests (every histogram, counter and gauge moves), as a busy replica's do second to second."""
    from prometheus_client import (
        CollectorRegistry,
        Counter,
        Histogram,
        gc_collector,
        generate_latest,
        platform_collector,
        process_collector,
    )

    from llmsla.exporters.vllm_metrics import VllmMetrics

    rng = random.Random(i)
    reg = CollectorRegistry()
    process_collector.ProcessCollector(registry=reg)
    platform_collector.PlatformCollector(registry=reg)
    gc_collector.GCCollector(registry=reg)
    vm = VllmMetrics(reg)
    ln = ["model_name", "engine"]
    extra = {
        "vllm:request_prompt_tokens": _TOKEN_BUCKETS, "vllm:request_generation_tokens": _TOKEN_BUCKETS,
        "vllm:request_max_num_generation_tokens": _TOKEN_BUCKETS, "vllm:request_params_max_tokens": _TOKEN_BUCKETS,
        "vllm:request_params_n": (1, 2, 5, 10, 20), "vllm:iteration_tokens_total": _ITER_BUCKETS,
        "vllm:request_prefill_time_seconds": _TIME_BUCKETS, "vllm:request_decode_time_seconds": _TIME_BUCKETS,
        "vllm:request_inference_time_seconds": _TIME_BUCKETS,
    }
    hists = {n: Histogram(n, n, ln, buckets=b, registry=reg) for n, b in extra.items()}
    success = Counter("vllm:request_success", "Count of successfully processed requests.",
                      ["model_name", "engine", "finished_reason"], registry=reg)
    series = {}
    for engine in [str(e) for e in range(engines)]:
        s = series[engine] = vm.engine(MODEL, num_blocks=rng.randrange(20000, 40000), engine=engine)
        s.waiting.set(rng.randrange(0, 20))
        s.running.set(rng.randrange(0, 64))
        s.kv_usage.set(rng.random())
        s.preemptions.inc(rng.randrange(0, 50))
        q = rng.randrange(10**5, 10**7)
        s.prefix_queries.inc(q)
        s.prefix_hits.inc(rng.randrange(0, q))
        s.prompt_tokens.inc(q)
        s.generation_tokens.inc(rng.randrange(10**5, 10**7))
        for _ in range(200):
            s.ttft.observe(rng.lognormvariate(-2, 1))
            s.itl.observe(rng.lognormvariate(-4, 0.5))
            s.e2e.observe(rng.lognormvariate(1, 1))
            s.queue.observe(rng.lognormvariate(-3, 1.5))
            for n, h in hists.items():
                h.labels(MODEL, engine).observe(rng.lognormvariate(5 if "tokens" in n else 0, 1))
        for reason in ("stop", "length", "abort"):
            success.labels(MODEL, engine, reason).inc(rng.randrange(0, 10**5))
    out = [generate_latest(reg)]
    while len(out) < versions:
        for s in series.values():
            s.waiting.set(rng.randrange(0, 20))
            s.running.set(rng.randrange(0, 64))
            s.kv_usage.set(rng.random())
            s.prefix_queries.inc(1000)
            s.prefix_hits.inc(rng.randrange(0, 1000))
            for _ in range(10):
                s.ttft.observe(rng.lognormvariate(-2, 1))
                s.itl.observe(rng.lognormvariate(-4, 0.5))
                s.e2e.observe(rng.lognormvariate(1, 1))
                s.queue.observe(rng.lognormvariate(-3, 1.5))
        out.append(generate_latest(reg))
    return out


def idle_versions(body: bytes, versions: int) -> list[bytes]:
    """``versions`` successive bodies of an idle replica: no request served, so every engine
    family is the same, but the server process's own collectors move (CPU seconds, memory), as
    an idle ``vllm serve`` answers second to second."""
    out = []
    for k in range(versions):
        lines = []
        for line in body.split(b"\n"):
            name, _, value = line.partition(b" ")
            if name in (b"process_cpu_seconds_total", b"process_resident_memory_bytes"):
                step = 0.01 if name == b"process_cpu_seconds_total" else 4096.0
                line = b"%s %r" % (name, float(value) + k * step)
            lines.append(line)
        out.append(b"\n".join(lines))
    return out


def _serve(n: int, engines: int, port_q: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """Replica ``i`` at ``/r/{i}/metrics`` (unchanged: the same body every time), at
    ``/idle/{i}/metrics`` (idle: the engine's families the same, the process collector's values
    moved at every request) and at ``/busy/{i}/metrics`` (busy: the next of VERSIONS bodies at
    every request, so every scrape reads moved values; a counter reset once per cycle)."""
    from aiohttp import web

    bodies = [expositions(i, engines, VERSIONS) for i in range(n)]
    idle = [idle_versions(b[0], VERSIONS) for b in bodies]
    served = [0] * n
    headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=bodies[int(request.match_info["i"])][0], headers=headers)

    async def idling(request: web.Request) -> web.Response:
        i = int(request.match_info["i"])
        served[i] += 1
        return web.Response(body=idle[i][served[i] % VERSIONS], headers=headers)

    async def busy(request: web.Request) -> web.Response:
        i = int(request.match_info["i"])
        served[i] += 1
        return web.Response(body=bodies[i][served[i] % VERSIONS], headers=headers)

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/r/{i}/metrics", metrics)
        app.router.add_get("/idle/{i}/metrics", idling)
        app.router.add_get("/busy/{i}/metrics", busy)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_q.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


def _cpu() -> float:
    return time.process_time()  # user + system of every thread of this process


async def _scrape_window(base: str, n: int, window_s: float, path: str = "r") -> dict[str, float]:
    from prometheus_client import CollectorRegistry

    from llmsla import config as config_mod
    from llmsla import names
    from llmsla.engines.recorder import EngineRecorder
    from llmsla.engines.scrape import Scraper, Target
    from llmsla.spool import SpoolWriter

    cfg = config_mod.Config()
    cfg.engine.scrape_interval_s = 1.0
    tmp = tempfile.TemporaryDirectory(prefix="llmsla-bench-engines-")
    registry = CollectorRegistry()
    spool = SpoolWriter.from_config(cfg, names.SPOOL_ENGINE, root=tmp.name, registry=registry)  # as `llmsla engines`
    rec = EngineRecorder(registry=registry, spool=spool)
    scraper = Scraper(cfg, [Target(f"r{i}", "default", f"{base}/{path}/{i}/metrics", "vllm") for i in range(n)],
                      on_sample=rec.sample, on_failure=rec.failure)
    stop = asyncio.Event()
    task = asyncio.create_task(scraper.run(stop))
    await asyncio.sleep(1.5)  # every replica scraped once: connections open, first-scrape state set
    before = {rid: st.scrapes for rid, st in scraper.status.items()}
    c0, t0 = _cpu(), time.perf_counter()
    await asyncio.sleep(window_s)
    cpu, wall = _cpu() - c0, time.perf_counter() - t0
    scrapes = sum(st.scrapes - before[rid] for rid, st in scraper.status.items())
    failed = sum(1 for st in scraper.status.values() if not st.up)
    stop.set()
    await task
    spool.close()
    tmp.cleanup()
    return {"cpu_pct": 100 * cpu / wall, "scrapes_per_s": scrapes / wall, "down": failed}


def _parse_cost(texts: list[str], which: str) -> float:
    """CPU seconds to parse every text once (one second's worth at 1 Hz)."""
    from prometheus_client.parser import text_string_to_metric_families

    from llmsla.engines.adapt import READS, snapshot
    from llmsla.engines.parse import parse

    c0 = _cpu()
    if which == "prometheus_client":
        for t in texts:
            for fam in text_string_to_metric_families(t):
                for _ in fam.samples:
                    pass
    else:
        for i, t in enumerate(texts):
            snapshot(parse(t, "text/plain; version=0.0.4", READS), "vllm", replica=f"r{i}", pool="default", ts=0.0)
    return _cpu() - c0


def _window_in(env: dict[str, str], base: str, n: int, window_s: float, path: str) -> dict[str, float]:
    """:func:`_scrape_window` in a process of its own (``env``: the revision's ``PYTHONPATH``)."""
    out = subprocess.run([sys.executable, __file__, "--window-json", base, "--replicas", str(n), "--window",
                          str(window_s), "--path", path], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=300)
    if out.returncode:
        raise RuntimeError(f"scrape window failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def vs_ref(base: str, args: argparse.Namespace) -> int:
    """Today's scraper against revision ``args.vs_ref``'s, paired round by round."""
    from exporters import legacy_tree

    trees = {args.vs_ref: {"PYTHONPATH": str(legacy_tree(args.vs_ref))}, "today": {}}
    rows = []
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        got: dict[str, dict[str, float]] = {}
        for path in ("idle", "busy"):
            for name in order:
                got[f"{name} {path}"] = _window_in(trees[name], base, args.replicas, args.window, path)
        ref = args.vs_ref
        rows.append({"round": r, "first": order[0],
                     f"{ref}_idle_pct": got[f"{ref} idle"]["cpu_pct"], "today_idle_pct": got["today idle"]["cpu_pct"],
                     f"{ref}_busy_pct": got[f"{ref} busy"]["cpu_pct"], "today_busy_pct": got["today busy"]["cpu_pct"],
                     "idle_today_over_ref": got["today idle"]["cpu_pct"] / got[f"{ref} idle"]["cpu_pct"],
                     "busy_today_over_ref": got["today busy"]["cpu_pct"] / got[f"{ref} busy"]["cpu_pct"],
                     "scrapes_per_s_min": min(g["scrapes_per_s"] for g in got.values()),
                     "down_max": max(g["down"] for g in got.values())})
    print_table(rows, f"{args.replicas} vLLM replicas at 1 s: today's scraper against {args.vs_ref}'s "
                      "(% of one core, each in its own process)")
    verdicts = {kind: paired_interval([row[f"{kind}_today_over_ref"] for row in rows]) for kind in ("idle", "busy")}
    for kind, v in verdicts.items():
        print(f"{kind}: today / {args.vs_ref} {v.get('geomean', float('nan')):.3f}, 95 % interval "
              f"[{v.get('low', float('nan')):.3f}, {v.get('high', float('nan')):.3f}] over {v['rounds']} rounds")
    write_result("engines-vs", {"ref": args.vs_ref, "replicas": args.replicas, "interval_s": 1.0,
                                "window_s": args.window, "rounds": rows, "today_over_ref": verdicts})
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=5.0, help="seconds of scraping per round")
    ap.add_argument("--engines", type=int, default=1,
                    help="engine cores per replica (vLLM data parallelism; 1 = vllm serve's default)")
    ap.add_argument("--asyncio", action="store_true",
                    help="scrape on asyncio's own loop instead of llmsla engines' (uvloop where installed)")
    ap.add_argument("--vs-ref", metavar="REV", help="measure today's scraper against revision REV's, paired")
    ap.add_argument("--window-json", metavar="BASE", help=argparse.SUPPRESS)
    ap.add_argument("--path", default="r", choices=["r", "idle", "busy"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    from llmsla.exporters.cli import run_loop

    if args.asyncio:
        run_loop = asyncio.run  # noqa: F811 - the plain loop, to compare
    if args.window_json:  # one scrape window in this process (--vs-ref's)
        print(json.dumps(run_loop(_scrape_window(args.window_json, args.replicas, args.window, args.path))))
        return 0

    ctx = multiprocessing.get_context("spawn")
    port_q = ctx.Queue()
    server = ctx.Process(target=_serve, args=(args.replicas, args.engines, port_q), daemon=True)
    server.start()
    try:
        port = port_q.get(timeout=300)
        base = f"http://127.0.0.1:{port}"
        if args.vs_ref:
            return vs_ref(base, args)
        import urllib.request

        texts = [urllib.request.urlopen(f"{base}/r/{i}/metrics").read().decode() for i in range(args.replicas)]
        sizes = [len(t) for t in texts]
        rows = []
        for r in range(args.rounds):
            u = run_loop(_scrape_window(base, args.replicas, args.window))  # `llmsla engines`' loop
            s = run_loop(_scrape_window(base, args.replicas, args.window, "idle"))
            b = run_loop(_scrape_window(base, args.replicas, args.window, "busy"))
            anchor = _parse_cost(texts, "prometheus_client")
            ours = _parse_cost(texts, "llmsla")
            rows.append({"round": r, "unchanged_scraper_cpu_pct": u["cpu_pct"], "scraper_cpu_pct": s["cpu_pct"],
                         "scrapes_per_s": s["scrapes_per_s"], "down": s["down"] + u["down"],
                         "busy_scraper_cpu_pct": b["cpu_pct"], "busy_scrapes_per_s": b["scrapes_per_s"],
                         "busy_down": b["down"], "prom_parser_pct": 100 * anchor, "llmsla_parse_adapt_pct": 100 * ours,
                         "scraper_over_prom": s["cpu_pct"] / (100 * anchor),
                         "busy_scraper_over_prom": b["cpu_pct"] / (100 * anchor)})
    finally:
        server.terminate()
        server.join(10)

    print_table(rows, f"{args.replicas} vLLM replicas at 1 s, {statistics.mean(sizes) / 1024:.1f} KiB each "
                      f"(% of one core; target scraper < {TARGET_PCT} %)")
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "round"}
    print(f"median: scraper {med['unchanged_scraper_cpu_pct']:.2f} % on unchanged bodies, {med['scraper_cpu_pct']:.2f} % idle, "
          f"{med['busy_scraper_cpu_pct']:.2f} % busy, bare prometheus_client parser "
          f"{med['prom_parser_pct']:.2f} %, llmsla parse+adapt {med['llmsla_parse_adapt_pct']:.2f} % of one core")
    verdict = {kind: med[key] < TARGET_PCT for kind, key in (("idle", "scraper_cpu_pct"), ("busy", "busy_scraper_cpu_pct"))}
    # the target holds only when both hold: a fleet under load is the busy case
    told = ", ".join(f"{kind} {'meets it' if ok else 'MISSES it'}" for kind, ok in verdict.items())
    print(f"target < {TARGET_PCT} % of one core: {told}")
    path = write_result("engines", {"machine": machine_info(), "replicas": args.replicas, "interval_s": 1.0,
                                    "engines_per_replica": args.engines,
                                    "window_s": args.window, "exposition_bytes_mean": statistics.mean(sizes),
                                    "target_pct": TARGET_PCT, "rounds": rows, "median": med,
                                    "meets_target": verdict, "meets_target_all": all(verdict.values())})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
