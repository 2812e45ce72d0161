"""Dashboard store queries on 7 days of history: each panel's query at 6 h and 7 d ranges.

Loads 7 days of 5 s request windows for 64 replicas (7.7M rows, through the roll-up trigger like
the streaming job's writes), 60 s policy windows, per-replica forecasts every 5 s (7.7M rows, the
online scorer's cadence, through their roll-up trigger), A/B results
and an action log into a fresh embedded PostgreSQL (or ``--dsn``), then runs every registered store
query of the dashboards as Grafana would (macros expanded, variables "All", ``$__interval`` for a
1000-point panel) and reports p50/p95. Anchor, measured in the same run: the same request-window
query forced onto the 5 s table (what a panel costs without roll-ups). Target: p95 <= 500 ms.

    python bench/dashboards.py                      # 7 days x 64 replicas (loading takes minutes)
    python bench/dashboards.py --days 1 --replicas 16 --repeats 5    # quick look
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla import histogram as H  # noqa: E402
from llmsla import names  # noqa: E402
from llmsla.dashboards import runner, storesql  # noqa: E402
from llmsla.dashboards.macros import TimeRange, Variable, calculate_interval_ms  # noqa: E402
from llmsla.dashboards.query import REGISTRY, SqlQuery  # noqa: E402
from llmsla.store import connect  # noqa: E402
from llmsla.store.connection import start_embedded  # noqa: E402
from llmsla.store.maintenance import materialize_rollups  # noqa: E402
from llmsla.store.migrate import migrate, recorded_flavor  # noqa: E402

TARGET_MS = 500.0
MAX_POINTS = 1000
COLS = ("bucket", "model", "pool", "replica", "arm", "requests", "ok", "errors", "timeouts", "cancelled", "rejected",
        "qps", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms", "itl_mean_ms",
        "itl_jitter_ms", "queue_p99_ms", "prompt_tokens", "output_tokens", "output_tps", "ttft_slo_ms", "e2e_slo_ms",
        "ttft_within_slo", "e2e_within_slo", "ttft_count", "ttft_sum_ms", "e2e_sum_ms", "itl_n", "itl_sum_ms",
        "itl_sumsq_ms2")
MODELS, POOLS, ARMS = ("llama-8b", "qwen-7b"), ("east", "west"), ("control", "treatment")


def series(replicas: int) -> list[tuple[str, str, str, str]]:
    return [(MODELS[i % 2], POOLS[(i // 2) % 2], f"r{i}", ARMS[(i // 4) % 2]) for i in range(replicas)]


def load(dsn: str, end: dt.datetime, days: int, replicas: int) -> dict[str, int]:
    """COPY one hour of windows per statement (the trigger rolls each statement up)."""
    rng = np.random.default_rng(7)
    keys = series(replicas)
    start = end - dt.timedelta(days=days)
    rows = 0
    with connect(dsn) as conn:
        if recorded_flavor(conn) == "plain":  # daily partitions for the loaded days (TimescaleDB: chunks)
            for table, col in names.TIME_TABLES.items():
                conn.execute("SELECT llmsla_ensure_partitions(%s, %s, %s, %s)", (table, col, start.date(), end.date()))
        conn.commit()
        t0 = time.perf_counter()
        for h in range(days * 24):
            hour = start + dt.timedelta(hours=h)
            n = 720 * len(keys)
            req = rng.integers(5, 60, n)
            p99 = rng.lognormal(np.log(300), 0.5, n)
            within = (req * rng.uniform(0.95, 1.0, n)).astype(int)
            with conn.cursor() as cur, cur.copy(f"COPY {names.T_REQUEST_WINDOWS} ({', '.join(COLS)}) FROM STDIN") as cp:
                k = 0
                for w in range(720):
                    bucket = hour + dt.timedelta(seconds=5 * w)
                    for model, pool, rep, arm in keys:
                        r, p = int(req[k]), float(p99[k])
                        cp.write_row((bucket, model, pool, rep, arm, r, r, 0, 0, 0, 0, r / 5, p / 4, p / 2, p, p * 3, p * 5,
                                      p * 8, 20.0, 2.0, 1.0, r * 100, r * 20, r * 4.0, 800.0, 10000.0, int(within[k]),
                                      int(within[k]), r, r * p / 3, r * p, r * 19, r * 380.0, r * 7676.0))
                        k += 1
            conn.commit()
            rows += n
            if h % 24 == 23:
                print(f"  loaded day {h // 24 + 1}/{days}: {rows:,} windows, {time.perf_counter() - t0:.0f} s", flush=True)
        load_s = time.perf_counter() - t0
        r = random.Random(7)
        with conn.cursor() as cur:
            pol = [(start + dt.timedelta(minutes=m), z, p, d, d // 2 + 1, r.uniform(0.3, 1.0), r.uniform(0, 0.2),
                    r.uniform(1, 3), r.uniform(3, 9), r.uniform(0.1, 1))
                   for m in range(days * 1440) for z in ("eu", "us", "ap", "sa") for p in ("p1", "p2") if (d := r.randint(5, 50))]
            with cur.copy(f"COPY {names.T_POLICY_WINDOWS} (bucket, zone, policy_id, decisions, traces, temperature_mean, "
                          "temperature_jitter, latency_p50_ms, latency_p99_ms, decide_p99_ms) FROM STDIN") as cp:
                for row in pol:
                    cp.write_row(row)
            # the online scorer's cadence: every target every 5 s; one statement per hour, like the
            # scorer's writes each statement fires the roll-up trigger
            nf = 0
            for h in range(days * 24):
                risk = rng.beta(1, 8, 720 * len(keys))
                with cur.copy(f"COPY {names.T_FORECASTS} (ts, forecaster, target, pool, replica, horizon_s, predicted, "
                              "threshold, risk) FROM STDIN") as cp:
                    k = 0
                    for w in range(720):
                        ts = start + dt.timedelta(hours=h, seconds=5 * w)
                        for _model, pool, rep, _arm in keys:
                            cp.write_row((ts, "lstm-bench", "replica", pool, rep, 25, None, 0.5, float(risk[k])))
                            k += 1
                nf += k
                conn.commit()
            for hh in range(days * 24):
                for arm in ARMS[1:]:
                    for metric in (names.AB_METRIC_TTFT_P95, names.AB_METRIC_E2E_P95, names.AB_METRIC_TTFT_ATTAINMENT, names.AB_METRIC_SRM):
                        cur.execute(f"INSERT INTO {names.T_AB_RESULTS} VALUES (%s, 'e1', %s, %s, 1000, 1, 1, 0.1, -1, 1, 0.2)",
                                    (start + dt.timedelta(hours=hh), arm, metric))
            for i in range(500):
                cur.execute(f"INSERT INTO {names.T_ACTION_LOG} (ts, source, actor, action, target, params, reason, alertname, outcome) "
                            "VALUES (%s, 'receiver', 'alertmanager', 'set_weight', %s, %s, 'burn rate', %s, 'applied')",
                            (start + dt.timedelta(minutes=i * days * 1440 // 500), f"east/r{i % replicas}",
                             json.dumps({"weight": 0.5}), "TTFTBurnRate" if i % 2 else None))
        conn.commit()
        materialize_rollups(conn)  # TimescaleDB: what its refresh policies hold by now (plain: no-op)
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
    return {"request_windows": rows, "policy_windows": len(pol), "forecasts": nf, "load_s": round(load_s, 1)}


def write_cost(dsn: str, end: dt.datetime, replicas: int, windows: int = 120) -> dict[str, float]:
    """The streaming sink's flush (COPY into a staging table + one upsert) of one 5 s window for
    every replica: with today's incremental roll-up triggers, with the re-aggregating trigger they
    replaced (migration 0005's, installed for the measurement) and, as the anchor, with none;
    each into its own fresh hour (the hour fills from 0 to 10 minutes; re-aggregation costs more
    the fuller the hour, so its figure here is a lower bound)."""
    from llmsla.store.rollups import ROLLUP_FUNCTION, rollup_function_ddl, rollup_increments_ddl
    from llmsla.streaming import sql as stream_sql
    from llmsla.streaming.store_sink import StoreWriter

    cols = stream_sql.TABLE_COLUMNS[names.T_REQUEST_WINDOWS]
    keys = series(replicas)
    rng = np.random.default_rng(3)  # a window's histograms: 40 requests' TTFT and E2E
    hists = {names.C_TTFT_HIST: H.Hist.of(rng.lognormal(np.log(300), 0.5, 40)).literal(),
             names.C_E2E_HIST: H.Hist.of(rng.lognormal(np.log(3000), 0.5, 40)).literal()}
    out: dict[str, float] = {}
    with connect(dsn) as conn:
        table = names.T_REQUEST_WINDOWS
        for mode, base in (("trigger", end + dt.timedelta(hours=1)), ("reaggregate", end + dt.timedelta(hours=3)),
                           ("no_trigger", end + dt.timedelta(hours=5))):
            if mode == "reaggregate":
                conn.execute(rollup_function_ddl(hist=True))
                for event in ("insert", "update"):
                    conn.execute(f"DROP TRIGGER {table}_rollup_{event} ON {table}")
                    conn.execute(f"CREATE TRIGGER {table}_rollup_{event} AFTER {event.upper()} ON {table} REFERENCING NEW TABLE "
                                 f"AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION {ROLLUP_FUNCTION}()")
                conn.commit()
            if mode == "no_trigger":
                conn.execute(rollup_increments_ddl())  # today's triggers back, then all off
                conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
                conn.commit()
            ms = []
            for w in range(windows):
                bucket = base + dt.timedelta(seconds=5 * w)
                row = {c: 1 for c in cols} | {"ttft_slo_ms": 800.0, "e2e_slo_ms": 10000.0, **hists}
                rows = [[bucket if c == "bucket" else {"model": k[0], "pool": k[1], "replica": k[2], "arm": k[3]}.get(c, row[c])
                         for c in cols] for k in keys]
                t = time.perf_counter()
                with conn.transaction(), conn.cursor() as cur:
                    StoreWriter._flush_windows(cur, names.T_REQUEST_WINDOWS, rows)
                ms.append((time.perf_counter() - t) * 1000)
            out[f"{mode}_p50_ms"] = float(np.percentile(ms, 50))
            out[f"{mode}_p95_ms"] = float(np.percentile(ms, 95))
        conn.execute(f"ALTER TABLE {names.T_REQUEST_WINDOWS} ENABLE TRIGGER USER")
        conn.commit()
    out["ratio_p50_vs_anchor"] = out["trigger_p50_ms"] / out["no_trigger_p50_ms"]
    out["reaggregate_ratio_p50_vs_anchor"] = out["reaggregate_p50_ms"] / out["no_trigger_p50_ms"]
    return out


def forecast_write_cost(dsn: str, end: dt.datetime, replicas: int, steps: int = 120) -> dict[str, float]:
    """The online scorer's write of one step (``store_io.write_forecasts``: one upsert statement
    for every target) with the forecast roll-up trigger and, as the anchor in the same run,
    with it disabled."""
    from llmsla.forecaster.store_io import write_forecasts

    keys = series(replicas)
    out: dict[str, float] = {}
    with connect(dsn) as conn:
        for mode, base in (("trigger", end + dt.timedelta(hours=1)), ("no_trigger", end + dt.timedelta(hours=3))):
            if mode == "no_trigger":
                conn.execute(f"ALTER TABLE {names.T_FORECASTS} DISABLE TRIGGER USER")
                conn.commit()
            ms = []
            for w in range(steps):
                ts_ms = int((base + dt.timedelta(seconds=5 * w)).timestamp() * 1000)
                rows = [(ts_ms, "lstm-bench", "replica", k[1], k[2], 25, None, 0.5, 0.1) for k in keys]
                t = time.perf_counter()
                write_forecasts(conn, rows)
                ms.append((time.perf_counter() - t) * 1000)
            out[f"{mode}_p50_ms"] = float(np.percentile(ms, 50))
            out[f"{mode}_p95_ms"] = float(np.percentile(ms, 95))
        conn.execute(f"ALTER TABLE {names.T_FORECASTS} ENABLE TRIGGER USER")
        conn.commit()
    out["ratio_p50_vs_anchor"] = out["trigger_p50_ms"] / out["no_trigger_p50_ms"]
    return out


def timed(conn: psycopg.Connection, sql: str, repeats: int) -> list[float]:
    conn.execute(sql).fetchall()  # warm: plan cache and buffers, as a dashboard refresh finds them
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        conn.execute(sql).fetchall()
        out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--anchor-repeats", type=int, default=3, help="repeats of the 5 s-table anchor at 7 d (slow)")
    ap.add_argument("--dsn", help="an empty PostgreSQL/TimescaleDB database (default: a fresh embedded one)")
    args = ap.parse_args()

    tmp = None
    server = None
    if args.dsn:
        dsn = args.dsn
    else:
        tmp = Path(tempfile.mkdtemp(prefix="llmsla-bench-dash-"))
        dsn, server = start_embedded(tmp / "pg", keep_running=False)
    try:
        cfg = config_mod.load(env={})
        cfg.store.dsn = dsn
        with connect(dsn) as conn:
            flavor = migrate(conn, cfg).flavor
        end = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
        print(f"loading {args.days} days x {args.replicas} replicas of 5 s windows ...", flush=True)
        inputs = load(dsn, end, args.days, args.replicas)
        keys = series(args.replicas)
        variables = {
            "model": Variable(MODELS), "pool": Variable(POOLS), "replica": Variable(tuple(k[2] for k in keys)),
            "arm": Variable(ARMS), "zone": Variable(("eu", "us", "ap", "sa")), "policy_id": Variable(("p1", "p2")),
            "experiment": Variable(("e1",)),
        }
        rows, results = [], {}
        with connect(dsn, autocommit=True) as conn:
            for span_name, span in (("6h", dt.timedelta(hours=6)), ("7d", dt.timedelta(days=args.days))):
                rng = TimeRange(end - span, end)
                interval = calculate_interval_ms(rng, MAX_POINTS)
                for key, q in REGISTRY.items():
                    if not isinstance(q, SqlQuery):
                        continue
                    sql = runner.expanded_sql(q, rng, interval, variables)
                    ms = timed(conn, sql, args.repeats)
                    n_rows = len(conn.execute(sql).fetchall())
                    res = {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)), "rows": n_rows,
                           "meets_target": float(np.percentile(ms, 95)) <= TARGET_MS}
                    row = {"range": span_name, "query": key, "p50 ms": res["p50_ms"], "p95 ms": res["p95_ms"], "rows": n_rows}
                    if key in storesql.TIERED:  # anchor: the same panel query on the 5 s table only
                        raw = SqlQuery(key + ".raw", storesql.TIERED[key](True), q.columns)
                        raw_sql = runner.expanded_sql(raw, rng, interval, variables)
                        raw_ms = timed(conn, raw_sql, args.repeats if span_name == "6h" else args.anchor_repeats)
                        res["anchor_5s_p50_ms"] = float(np.percentile(raw_ms, 50))
                        res["anchor_5s_p95_ms"] = float(np.percentile(raw_ms, 95))
                        res["ratio_p50_vs_anchor"] = res["p50_ms"] / res["anchor_5s_p50_ms"]
                        row |= {"5s-table p50 ms": res["anchor_5s_p50_ms"], "ratio": res["ratio_p50_vs_anchor"]}
                    row["<=500ms"] = "yes" if res["meets_target"] else "NO"
                    rows.append(row)
                    results[f"{span_name}/{key}"] = res
                    print(f"  {span_name} {key}: p95 {res['p95_ms']:.1f} ms", flush=True)
        cols = ["range", "query", "p50 ms", "p95 ms", "rows", "5s-table p50 ms", "ratio", "<=500ms"]
        rows = [{c: r.get(c, "") for c in cols} for r in rows]
        print_table(rows, f"dashboard store queries, {args.days} d x {args.replicas} replicas ({flavor}); "
                          "anchor = same query on the 5 s table")
        if flavor == "timescale":  # the write costs below measure plain PostgreSQL's roll-up triggers
            write_result("dashboards_timescale", {
                "inputs": {"days": args.days, "replicas": args.replicas, "repeats": args.repeats, "flavor": flavor,
                           "max_data_points": MAX_POINTS, "target_p95_ms": TARGET_MS, **inputs},
                "results": results})
            return
        flush = write_cost(dsn, end, args.replicas)
        print_table([{"flush of one 5 s window x replicas": f"{args.replicas} rows",
                      "incremental triggers p50 ms": flush["trigger_p50_ms"], "ratio": flush["ratio_p50_vs_anchor"],
                      "re-aggregating trigger (before 0007) p50 ms": flush["reaggregate_p50_ms"],
                      "ratio ": flush["reaggregate_ratio_p50_vs_anchor"], "no trigger p50 ms": flush["no_trigger_p50_ms"]}],
                    "write cost of the plain-PostgreSQL roll-up triggers (the streaming sink's flush); ratios vs no trigger")
        fc = forecast_write_cost(dsn, end, args.replicas)
        print_table([{"scorer write of one step": f"{args.replicas} forecasts", "with roll-up trigger p50 ms": fc["trigger_p50_ms"],
                      "trigger disabled p50 ms": fc["no_trigger_p50_ms"], "ratio": fc["ratio_p50_vs_anchor"]}],
                    "write cost of the plain-PostgreSQL forecast roll-up trigger (the online scorer's upsert)")
        write_result("dashboards", {
            "inputs": {"days": args.days, "replicas": args.replicas, "repeats": args.repeats, "flavor": flavor,
                       "max_data_points": MAX_POINTS, "target_p95_ms": TARGET_MS, **inputs},
            "results": results,
            "sink_flush_one_window": flush,
            "scorer_write_one_step": fc,
        })
    finally:
        if server is not None:
            server.cleanup()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
