"""Streaming job throughput and freshness: spool -> Flink windows -> PostgreSQL.

Anchor: the identical job SQL into Flink's ``blackhole`` sink, measured in the same run (the
engine's floor on this machine). Each job runs as ``llmsla stream --once`` in its own process
(JVM mini-cluster + Python workers), on N/2 and on N events: events/s is the slope between the
two (the sustained rate; start-up, JIT warm-up and shutdown cancel out). The whole-run average
(N over the wall time minus the start-up measured on an empty spool) is reported as well, since
a short backfill pays the warm-up. Freshness runs the continuous job against
live traffic: for every published segment and every 5 s window it contributes to, the time from
the segment's publish (atomic rename) to the window row being visible in the store.

    python bench/streaming.py                 # 5M events (about 10 minutes on 2 busy cores)
    python bench/streaming.py --events 500000 --fallback-events 200000 --fresh-s 20   # quick look

Paths: ``java`` (default: the llmsla-json format parses each line once, the Percentiles aggregate,
both outputs planned together) and ``sql`` (the pure-SQL fallback without javac: one JSON_VALUE
per field, Flink's PERCENTILE), each against its own blackhole run; optionally the Java path
at ``--parallel`` with that many interleaved segment files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla import names  # noqa: E402
from llmsla.store import open_store  # noqa: E402
from llmsla.streaming import synth  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: `python -m llmsla.cli` would import the CLI twice (as __main__ and as llmsla.cli), and a
#: component's CliError would then escape main() as a traceback; this runs it like the script.
LLMSLA_MAIN = "import sys; from llmsla.app.cli import main; sys.exit(main())"
KEYS = synth.Keys(models=("llama-8b", "qwen-7b", "mistral-7b", "phi-3"), pools=("east", "west", "north", "south"),
                  replicas=8, arms=("control", "treatment"))  # 256 label combinations


def child_env(cfg: config_mod.Config, **stream: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    env.update(LLMSLA_STORE_DSN=cfg.store.dsn, LLMSLA_SPOOL_DIR=str(cfg.spool_dir()),
               LLMSLA_STREAM_CHECKPOINT_DIR=str(cfg.checkpoint_dir()))
    env.update({f"LLMSLA_STREAM_{k.upper()}": str(v) for k, v in stream.items()})
    return env


class PeakRss:
    """Samples the summed RSS of a process tree (client, JVM, Python workers) every 0.25 s."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.peak_jvm, self.peak_py = pid, 0, 0, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            jvm = py = 0
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    if "java" in p.name():
                        jvm += rss
                    else:
                        py += rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, jvm + py)
            self.peak_jvm, self.peak_py = max(self.peak_jvm, jvm), max(self.peak_py, py)

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def run_job(cfg: config_mod.Config, *args: str, log: Path, **stream: object) -> dict:
    t0 = time.monotonic()
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-c", LLMSLA_MAIN, "stream", "--once", "--fresh", "--kinds", "requests", *args],
                                env=child_env(cfg, **stream), stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True)
        mem = PeakRss(proc.pid)
        rc = proc.wait()
        mem.stop()
    if rc != 0:
        raise SystemExit(f"stream job failed (rc {rc}); see {log}")
    return {"wall_s": time.monotonic() - t0, "peak_rss_mib": mem.peak / 2**20,
            "peak_jvm_mib": mem.peak_jvm / 2**20, "peak_python_mib": mem.peak_py / 2**20}


def write_spool(spool: Path, n: int, start_ms: int, rate: int, files: int = 1) -> tuple[int, float]:
    """``files`` in-order segments dealt round robin, each spanning the whole event-time range (a
    bounded run reads a directory's files in no set order, and each reader must not go back in
    time by more than the watermark delay)."""
    d = spool / names.SPOOL_REQUESTS
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    size, chunk = 0, 500_000
    fhs = [open(d / f"{k + 1:013d}-bench.jsonl", "w") for k in range(files)]  # noqa: SIM115
    try:
        for i in range(0, n, chunk):
            m = min(chunk, n - i)
            cols = synth.request_columns(m, start_ms=start_ms + i * 1000 // rate, span_ms=max(1, m * 1000 // rate),
                                         seed=i, keys=KEYS, jitter_ms=1000)
            lines = list(synth.request_lines(cols, KEYS))
            for k, fh in enumerate(fhs):
                text = "\n".join(lines[k::files]) + "\n"
                size += len(text)
                fh.write(text)
    finally:
        for fh in fhs:
            fh.close()
    return size, time.monotonic() - t0


def counts(dsn: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            f"SELECT count(*), coalesce(sum(requests), 0) FROM {names.T_REQUEST_WINDOWS}").fetchone()


def freshness(cfg: config_mod.Config, seconds: float, rate: int, log: Path) -> dict:
    """Live traffic into the continuous job; segment publish -> window row visible."""
    spool = cfg.spool_dir() / names.SPOOL_REQUESTS
    shutil.rmtree(spool, ignore_errors=True)
    (spool / ".inprogress").mkdir(parents=True)
    with psycopg.connect(cfg.store.dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {names.T_REQUEST_WINDOWS}")
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-c", LLMSLA_MAIN, "stream", "--fresh", "--kinds", "requests"],
                                env=child_env(cfg, monitor_interval_s=0.5, sink_flush_s=0.2),
                                stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        ckpt = cfg.checkpoint_dir()
        deadline = time.monotonic() + 180
        while not any(ckpt.glob("*/chk-*/_metadata")):  # running: files published from now on count
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"continuous job did not start; see {log}")
            time.sleep(0.5)
        published: list[tuple[float, set[int]]] = []
        seen: dict[int, float] = {}
        stop = threading.Event()

        def poll() -> None:
            with psycopg.connect(cfg.store.dsn, autocommit=True) as conn:
                while not stop.wait(0.1):
                    for (b,) in conn.execute(f"SELECT DISTINCT (extract(epoch FROM bucket) * 1000)::bigint FROM {names.T_REQUEST_WINDOWS}"):
                        seen.setdefault(int(b), time.time())

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        seq, t_end = 0, time.time() + seconds
        while time.time() < t_end:
            t = time.time()
            now_ms = int(t * 1000)
            cols = synth.request_columns(rate, start_ms=now_ms - 1000, span_ms=1000, seed=seq, keys=KEYS, jitter_ms=300)
            name = f"{now_ms:013d}-bench-{seq:06d}.jsonl"
            (spool / ".inprogress" / name).write_text("\n".join(synth.request_lines(cols, KEYS)) + "\n")
            os.rename(spool / ".inprogress" / name, spool / name)
            published.append((time.time(), {int(x) - int(x) % 5000 for x in np.unique(cols["ts_ms"] - cols["ts_ms"] % 5000)}))
            seq += 1
            time.sleep(max(0.0, 1.0 - (time.time() - t)))
        time.sleep(12)  # let the windows of the last full buckets close
        stop.set()
        poller.join()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    last_bucket = max(b for _, bs in published for b in bs)
    lat = [seen[b] - t for t, bs in published for b in bs if b != last_bucket and b in seen]
    missing = sorted({b for _, bs in published for b in bs if b != last_bucket and b not in seen})
    arr = np.array(lat)
    return {"segments": len(published), "pairs": len(lat), "windows_missing": len(missing),
            "p50_s": float(np.percentile(arr, 50)), "p99_s": float(np.percentile(arr, 99)),
            "max_s": float(arr.max()), "budget_s": names.REQUEST_WINDOW_S + cfg.stream.watermark_delay_s + 5}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--fallback-events", type=int, default=1_000_000,
                    help="events for the pure-SQL fallback, ~8x slower; its rate is steady-state too")
    ap.add_argument("--parallel", type=int, default=0,
                    help="also run the Java path at this parallelism with as many interleaved files (0 = skip; "
                         "on 2 cores parallelism 1 already keeps both busy)")
    ap.add_argument("--rate", type=int, default=5_000, help="event-time rate of the generated traffic, events/s")
    ap.add_argument("--fresh-s", type=float, default=40.0, help="seconds of live traffic for freshness")
    ap.add_argument("--fresh-rate", type=int, default=2_000)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="llmsla-bench-stream-"))
    cfg = config_mod.load(env={})
    cfg.stream.checkpoint_dir = str(work / "ckpt")
    cfg.store.data_dir = str(work / "pg")
    handle = open_store(cfg, keep_running=False)
    cfg.store.dsn = handle.dsn
    log = work / "stream.log"
    load_before = os.getloadavg()
    start_ms = int(time.time() * 1000) - 2 * 3600 * 1000
    # (label, parse path, parallelism, spool, events); the anchor of each is its own blackhole run
    runs = [("java", True, 1, "main", args.events), ("sql", False, 1, "fallback", args.fallback_events)]
    if args.parallel > 1:
        runs.append(("java", True, args.parallel, "parallel", args.events))
    results: list[dict] = []
    gen: dict[str, float] = {}
    nbytes = 0
    try:
        (work / "spool-empty" / names.SPOOL_REQUESTS).mkdir(parents=True)
        startup: dict[tuple[bool, str], float] = {}
        cfg.spool.dir = str(work / "spool-empty")
        for java in (True, False):
            for sink in ("blackhole", "store"):
                flag = ("--blackhole",) if sink == "blackhole" else ()
                startup[(java, sink)] = run_job(cfg, *flag, log=log, java_parser=java)["wall_s"]
        for label, java, par, spool, n in runs:
            # Each sink runs on n/2 and on n events (the first half is the same traffic): the
            # sustained rate is the slope between them, so start-up, JIT warm-up and shutdown,
            # which every run pays once, cancel out. The whole-run average is reported too.
            half = n // 2
            spool_of = {m: work / f"spool-{spool}-{m}" for m in (half, n)}
            for m, d in spool_of.items():
                size, gen[f"{spool}-{m}"] = write_spool(d, m, start_ms, args.rate, files=par)
                nbytes = max(nbytes, size)
            walls: dict[tuple[str, int], dict] = {}
            rows = summed = 0
            for sink in ("blackhole", "store"):
                flag = ("--blackhole",) if sink == "blackhole" else ()
                for m, d in spool_of.items():
                    cfg.spool.dir = str(d)
                    with psycopg.connect(cfg.store.dsn, autocommit=True) as conn:
                        conn.execute(f"TRUNCATE {names.T_REQUEST_WINDOWS}")
                    walls[(sink, m)] = run_job(cfg, *flag, log=log, java_parser=java, parallelism=par)
                    if sink == "store" and m == n:
                        rows, summed = counts(cfg.store.dsn)
            for d in spool_of.values():
                shutil.rmtree(d, ignore_errors=True)
            rate = {sink: (n - half) / max(1e-9, walls[(sink, n)]["wall_s"] - walls[(sink, half)]["wall_s"])
                    for sink in ("blackhole", "store")}
            for sink in ("blackhole", "store"):
                r = walls[(sink, n)]
                results.append({
                    "path": label, "parallelism": par, "sink": sink, "events": n,
                    "wall_half_s": walls[(sink, half)]["wall_s"], "wall_s": r["wall_s"],
                    "startup_s": startup[(java, sink)], "events_per_s": rate[sink],
                    "avg_events_per_s": n / max(1e-9, r["wall_s"] - startup[(java, sink)]),
                    "vs_own_blackhole": rate[sink] / rate["blackhole"],
                    "peak_rss_mib": r["peak_rss_mib"], "jvm_mib": r["peak_jvm_mib"], "python_mib": r["peak_python_mib"],
                    "window_rows": rows if sink == "store" else None,
                    "requests_in_windows": int(summed) if sink == "store" else None,
                })
        cfg.spool.dir = str(work / "spool-live")
        fresh = freshness(cfg, args.fresh_s, args.fresh_rate, log)
    finally:
        handle.close()
    load_after = os.getloadavg()

    sql_bh = next(r["events_per_s"] for r in results if r["path"] == "sql" and r["sink"] == "blackhole")
    for r in results:
        r["vs_sql_blackhole"] = r["events_per_s"] / sql_bh
    print_table(results, "spool -> 5 s request windows; anchor: the same SQL into blackhole, same path, same run")
    print_table([fresh], "freshness: segment published -> window row visible (continuous job, Java path, live traffic)")
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} CPUs")
    write_result("streaming", {
        "inputs": {"events": args.events, "fallback_events": args.fallback_events, "bytes_largest_spool": nbytes,
                   "event_rate": args.rate, "label_combinations": len(KEYS.combos()), "generate_s": gen,
                   "parallel": args.parallel, "freshness_s": args.fresh_s, "freshness_rate": args.fresh_rate},
        "anchor": "blackhole sink, same path and parallelism, same run",
        "rate": "events_per_s = (events - events/2) / (wall(events) - wall(events/2)); avg_events_per_s = events / (wall - startup on an empty spool)",
        "results": results, "freshness": fresh,
        "loadavg_before": load_before, "loadavg_after": load_after,
        "targets": {"events_per_s": 200_000, "vs_blackhole": 0.7, "freshness_p99_s": fresh["budget_s"]},
    })
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
