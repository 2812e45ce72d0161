"""Per-core rates for the capacity plan (docs/scaling.md) that no other benchmark measures.

1. **Store rows/s**: the stream sink's own write path (``StoreWriter._flush_windows``: COPY into
   a staging table, one upsert, the roll-up trigger on plain PostgreSQL) writing 5 s request
   windows for ``--replicas`` series, one flush per window (what a live job does: each window
   closes once) and, for a backlog, ``stream.sink_batch_rows`` rows per flush. Anchor in the same
   run: a bare COPY of the same rows into an unindexed, trigger-less copy of the table; and the
   sink's flush with the roll-up trigger disabled (the 5 s table alone).
2. **Forecaster targets/s**: ``OnlineScorer.step`` -- the online loop's three store reads of the
   last W windows, the features, the scaling, one LSTM forward pass and the forecasts write --
   for ``--replicas`` replicas (plus one target per pool) with one torch thread. The model is the
   default architecture with untrained weights (the cost does not depend on the weights).
   Anchor in the same run: the bare forward pass on the same batch.
3. **Bytes per stored request-window row** (heap, indexes, TOAST of every partition).
4. **Prometheus series per replica**: the request and router metrics a gateway exposes for one
   more upstream replica (every status seen once), the GPU gauges per GPU; counted in the
   exposition the gateway serves (a count: no anchor).

    python bench/capacity.py [--replicas 64,256,1024] [--windows 120] [--steps 9] [--dsn DSN]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla import names  # noqa: E402
from llmsla.store import connect  # noqa: E402
from llmsla.store.connection import start_embedded  # noqa: E402
from llmsla.store.migrate import migrate  # noqa: E402
from llmsla.streaming import sql as stream_sql  # noqa: E402
from llmsla.streaming.store_sink import StoreWriter  # noqa: E402

POOLS = 8
MASKS = 3  # presence masks appended to the features (request, GPU, policy windows: forecaster/model.py)
STEP = dt.timedelta(seconds=names.REQUEST_WINDOW_S)


def column_types(dsn: str, table: str) -> dict[str, str]:
    with connect(dsn) as conn:
        return dict(conn.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
                                 (table,)).fetchall())


def window_rows(bucket: dt.datetime, replicas: int, rng: np.random.Generator, types: dict[str, str]) -> list[list]:
    """One 5 s request window per replica: plausible values, latencies lognormal around 300 ms."""
    cols = stream_sql.TABLE_COLUMNS[names.T_REQUEST_WINDOWS]
    labels = {"model": "llama-8b", "arm": "default"}
    rows = []
    for i in range(replicas):
        req = int(rng.integers(5, 60))
        p = float(rng.lognormal(np.log(300), 0.5))
        row = []
        for c in cols:
            if c == "bucket":
                row.append(bucket)
            elif c in labels or c in ("pool", "replica"):
                row.append(labels.get(c) or (f"p{i % POOLS}" if c == "pool" else f"r{i}"))
            elif c in ("errors", "timeouts", "cancelled", "rejected"):
                row.append(0)
            elif types[c] in ("bigint", "integer"):
                row.append(req)
            else:
                row.append(p if c.endswith("_ms") else float(req))
        rows.append(row)
    return rows


def store_rates(dsn: str, replicas: int, windows: int, batch_rows: int, start: dt.datetime) -> list[dict]:
    rng = np.random.default_rng(replicas)
    table = names.T_REQUEST_WINDOWS
    types = column_types(dsn, table)
    per_window = [window_rows(start + STEP * w, replicas, rng, types) for w in range(windows)]
    out = []
    with connect(dsn) as conn:
        conn.execute(f"CREATE UNLOGGED TABLE IF NOT EXISTS bench_copy_floor (LIKE {table} INCLUDING DEFAULTS)")
        conn.execute("TRUNCATE bench_copy_floor")
        conn.commit()
        cols = ", ".join(stream_sql.TABLE_COLUMNS[table])
        t = time.perf_counter()
        for rows in per_window:
            with conn.transaction(), conn.cursor() as cur, cur.copy(f"COPY bench_copy_floor ({cols}) FROM STDIN") as cp:
                for r in rows:
                    cp.write_row(r)
        floor_s = time.perf_counter() - t
        n = replicas * windows
        out.append({"what": "bare COPY, one window per statement (anchor)", "replicas": replicas, "rows_per_flush": replicas,
                    "rows": n, "rows_per_s": n / floor_s, "vs_anchor": 1.0})
        t = time.perf_counter()
        for rows in per_window:
            with conn.transaction(), conn.cursor() as cur:
                StoreWriter._flush_windows(cur, table, rows)
        live_s = time.perf_counter() - t
        out.append({"what": "sink flush, one window per flush (live)", "replicas": replicas, "rows_per_flush": replicas,
                    "rows": n, "rows_per_s": n / live_s, "vs_anchor": floor_s / live_s})
        # the same write path without the plain-PostgreSQL roll-up trigger: what the 5 s table
        # alone costs (TimescaleDB refreshes its continuous aggregates in the background instead)
        conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        conn.commit()
        later = [[start + STEP * (2 * windows + 2000) + (r[0] - start) if j == 0 else v for j, v in enumerate(r)]
                 for r in (row for rows in per_window for row in rows)]
        t = time.perf_counter()
        for i in range(0, len(later), replicas):
            with conn.transaction(), conn.cursor() as cur:
                StoreWriter._flush_windows(cur, table, later[i:i + replicas])
        bare_s = time.perf_counter() - t
        conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
        conn.commit()
        out.append({"what": "sink flush, one window per flush, roll-up trigger off", "replicas": replicas,
                    "rows_per_flush": replicas, "rows": n, "rows_per_s": n / bare_s, "vs_anchor": floor_s / bare_s})
        # a backlog: the same windows again, later in time, batch_rows rows per flush
        flat = [[start + STEP * (windows + 1000) + (r[0] - start) if j == 0 else v for j, v in enumerate(r)]
                for rows in per_window for r in rows]
        t = time.perf_counter()
        for i in range(0, len(flat), batch_rows):
            with conn.transaction(), conn.cursor() as cur:
                StoreWriter._flush_windows(cur, table, flat[i:i + batch_rows])
        backlog_s = time.perf_counter() - t
        out.append({"what": f"sink flush, {batch_rows} rows per flush (backlog)", "replicas": replicas,
                    "rows_per_flush": batch_rows, "rows": n, "rows_per_s": n / backlog_s, "vs_anchor": floor_s / backlog_s})
        conn.execute("DROP TABLE bench_copy_floor")
        conn.commit()
    return out


def bytes_per_row(dsn: str, table: str) -> dict:
    """Heap + indexes + TOAST of every partition, over the rows stored (plain PostgreSQL)."""
    with connect(dsn, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {table}")
        size = conn.execute("SELECT COALESCE(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree(%s)",
                            (table,)).fetchone()[0]
        rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    return {"table": table, "rows": rows, "bytes": int(size), "bytes_per_row": size / max(1, rows)}


def forecaster_rates(dsn: str, cfg: config_mod.Config, replicas: int, steps: int, now: dt.datetime) -> list[dict]:
    import torch

    from llmsla.forecaster import features
    from llmsla.forecaster.artifact import Artifact
    from llmsla.forecaster.model import LstmForecaster, ModelConfig
    from llmsla.forecaster.online import OnlineScorer
    from llmsla.forecaster.scaler import RobustScaler

    torch.set_num_threads(1)
    torch.manual_seed(0)
    window = cfg.forecast.window_steps
    n_features = len(features.FEATURES)
    n_inputs = n_features + MASKS
    model = LstmForecaster(ModelConfig(inputs=n_inputs, hidden=cfg.forecast.hidden, layers=cfg.forecast.layers,
                                       dropout=cfg.forecast.dropout, dense=cfg.forecast.dense)).eval()
    scaler = RobustScaler.fit(np.random.default_rng(0).normal(size=(1000, n_features)))
    art = Artifact(model=model, scaler=scaler, meta={"mode": "fleet", "version": "bench", "threshold": 0.9,
                                                     "window": window, "horizon": cfg.forecast.horizon_steps})
    scorer = OnlineScorer(art, cfg, dsn)
    now_ms = int(now.timestamp() * 1000)
    scorer.step(now_ms)  # warm: connection, plans, torch
    step_s, fwd_s, scored = [], [], 0
    for _ in range(steps):
        t = time.perf_counter()
        res = scorer.step(now_ms)
        step_s.append(time.perf_counter() - t)
        scored = res.scored
    assert scored == replicas + POOLS, (scored, res.skipped)
    x = np.random.default_rng(1).normal(size=(scored, window, n_inputs)).astype(np.float32)
    for _ in range(steps):
        t = time.perf_counter()
        scorer.scorer.score(x)
        fwd_s.append(time.perf_counter() - t)
    scorer.close()
    med, fwd = float(np.median(step_s)), float(np.median(fwd_s))
    return [{"what": "online step: 3 store reads + features + forward + forecasts write", "targets": scored,
             "step_ms": med * 1000, "targets_per_s": scored / med, "vs_anchor": fwd / med},
            {"what": "bare LSTM forward, same batch (anchor)", "targets": scored, "step_ms": fwd * 1000,
             "targets_per_s": scored / fwd, "vs_anchor": 1.0}]


def series_counts(cfg: config_mod.Config) -> list[dict]:
    """Samples in the exposition (no ``_created``) for 1 and 2 replicas / GPUs: the difference is
    what one more adds."""
    from prometheus_client import CollectorRegistry

    from llmsla.control.metrics import RouterMetrics
    from llmsla.events import GpuSample, ItlSummary, RequestEvent
    from llmsla.exporters.recorder import GpuRecorder, RequestRecorder
    from llmsla.exposition import exposition

    def samples(reg: CollectorRegistry, prefix: str) -> int:
        text = exposition(reg)[0].decode()
        return sum(1 for line in text.splitlines() if line.startswith(prefix) and "_created" not in line.split("{")[0])

    out = []
    counts = []
    for replicas in (1, 2):
        reg = CollectorRegistry()
        rec = RequestRecorder(cfg, registry=reg)
        router = RouterMetrics(reg)
        for r in range(replicas):
            for status in names.STATUSES:
                rec.record(RequestEvent(ts_ms=1_700_000_000_000, trace_id="a" * 32, model="m", pool="p", replica=f"r{r}",
                                        arm=names.DEFAULT_ARM, policy=names.DEFAULT_POLICY, prompt_tokens=5, output_tokens=3,
                                        queue_ms=1.0, ttft_ms=30.0, itl_ms=ItlSummary.from_gaps([10.0, 20.0]), e2e_ms=60.0,
                                        status=status))
            router.picks.labels("p", f"r{r}").inc()
            router.score.labels("p", f"r{r}").set(1)
            router.weight.labels("p", f"r{r}").set(1)
            router.drained.labels("p", f"r{r}").set(0)
        counts.append(samples(reg, "llmsla_"))
    out.append({"what": "gateway: request + router series per upstream replica (model, pool, arm fixed)",
                "series": counts[1] - counts[0]})
    gcounts = []
    for gpus in (1, 2):
        reg = CollectorRegistry()
        grec = GpuRecorder(cfg, registry=reg)
        for g in range(gpus):
            grec.record(GpuSample(ts_ms=1_700_000_000_000, node="n", gpu=g, uuid=f"GPU-{g}", mem_used_bytes=1, mem_total_bytes=2,
                                  util=0.5, temp_c=50.0, power_w=100.0), model_name="H100")
        gcounts.append(samples(reg, "llmsla_gpu_"))
    out.append({"what": "GPU collector: series per GPU", "series": gcounts[1] - gcounts[0]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", default="64,256,1024", help="comma-separated fleet sizes")
    ap.add_argument("--windows", type=int, default=120, help="5 s windows written per fleet size (store part)")
    ap.add_argument("--steps", type=int, default=9, help="timed online steps per fleet size (forecaster part)")
    ap.add_argument("--dsn", help="an empty PostgreSQL/TimescaleDB database (default: a fresh embedded one)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.replicas.split(",")]
    tmp, server = None, None
    if args.dsn:
        dsn = args.dsn
    else:
        tmp = Path(tempfile.mkdtemp(prefix="llmsla-bench-capacity-"))
        dsn, server = start_embedded(tmp / "pg", keep_running=False)
    try:
        cfg = config_mod.load(env={})
        cfg.store.dsn = dsn
        with connect(dsn) as conn:
            flavor = migrate(conn, cfg).flavor
        store_rows, fc_rows = [], []
        # 4 h of event time per fleet size: its live, trigger-off and backlog stretches never overlap another's
        base = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=4 * len(sizes) + 1)
        base -= dt.timedelta(seconds=base.second % names.REQUEST_WINDOW_S)
        for k, n in enumerate(sizes):
            start = base + dt.timedelta(hours=4 * k)
            store_rows += store_rates(dsn, n, args.windows, cfg.stream.sink_batch_rows, start)
            # the forecaster scores the newest W windows of this stretch
            now = start + STEP * args.windows + dt.timedelta(seconds=cfg.forecast.lag_s)
            fc_rows += forecaster_rates(dsn, cfg, n, args.steps, now)
        print_table(store_rows, f"store writes ({flavor} PostgreSQL, request windows; anchor: bare COPY)")
        print_table(fc_rows, "forecaster online step, 1 torch thread (anchor: bare forward pass)")
        sizes_on_disk = [bytes_per_row(dsn, names.T_REQUEST_WINDOWS)]
        print_table(sizes_on_disk, "bytes per stored row (plain PostgreSQL, uncompressed, roll-up rows not included)")
        series = series_counts(cfg)
        print_table(series, "Prometheus series (samples in one scrape)")
        write_result("capacity", {
            "inputs": {"replicas": sizes, "windows": args.windows, "steps": args.steps, "flavor": flavor,
                       "sink_batch_rows": cfg.stream.sink_batch_rows, "pools": POOLS,
                       "forecast_window_steps": cfg.forecast.window_steps, "torch_threads": 1},
            "anchors": {"store": "bare COPY of the same rows into an unindexed, trigger-less table, same run",
                        "forecaster": "bare LSTM forward on the same batch, same run"},
            "store": store_rows, "forecaster": fc_rows, "series": series,
            "on_disk": sizes_on_disk,
        })
    finally:
        if server is not None:
            server.cleanup()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
