"""Dashboard store queries on 7 days of history: each panel's query at 6 h and 7 d ranges.

Loads 7 days of 5 s request windows for 64 replicas (7.7M rows with their TTFT and E2E
histograms, through the roll-up trigger like the streaming job's writes), 60 s policy windows,
per-replica forecasts every 5 s (7.7M rows, the online scorer's cadence, through their roll-up
trigger), A/B results and an action log into a fresh embedded PostgreSQL, then runs every
registered store query of the dashboards as Grafana would (macros expanded, variables "All",
``$__interval`` for a 1000-point panel) and reports p50/p95. Anchor, measured in the same run:
the same request-window query forced onto the 5 s table (what a panel costs without roll-ups).
Target: p95 <= 500 ms.

With ``--timescale-dsn`` the same data also goes into that (empty) TimescaleDB database, whose
chunks older than ``store.compress_after_days`` are converted to the columnstore as its policy
would have by then; every panel query then runs on both stores in paired rounds (the order
alternates), giving the ratio TimescaleDB / PostgreSQL per panel with its 95 % interval, the
columnstore's compression ratio and each store's disk per day per replica.

    python bench/dashboards.py                      # 7 days x 64 replicas (loading takes minutes)
    python bench/dashboards.py --timescale-dsn "$LLMSLA_TEST_DSN"    # both flavours, one run
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
from _common import paired_interval, print_table, write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla import histogram as H  # noqa: E402
from llmsla import names  # noqa: E402
from llmsla.dashboards import runner, storesql  # noqa: E402
from llmsla.dashboards.macros import TimeRange, Variable, calculate_interval_ms  # noqa: E402
from llmsla.dashboards.query import REGISTRY, SqlQuery  # noqa: E402
from llmsla.store import connect  # noqa: E402
from llmsla.store.connection import start_embedded  # noqa: E402
from llmsla.store.maintenance import ALL_ROLLUPS, compress_chunks, materialize_rollups  # noqa: E402
from llmsla.store.migrate import migrate, recorded_flavor  # noqa: E402

TARGET_MS = 500.0
MAX_POINTS = 1000
COLS = ("bucket", "model", "pool", "replica", "arm", "requests", "ok", "errors", "timeouts", "cancelled", "rejected",
        "qps", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms", "itl_mean_ms",
        "itl_jitter_ms", "queue_p99_ms", "prompt_tokens", "output_tokens", "output_tps", "ttft_slo_ms", "e2e_slo_ms",
        "ttft_within_slo", "e2e_within_slo", "ttft_count", "ttft_sum_ms", "e2e_sum_ms", "itl_n", "itl_sum_ms",
        "itl_sumsq_ms2", names.C_TTFT_HIST, names.C_E2E_HIST)
MODELS, POOLS, ARMS = ("llama-8b", "qwen-7b"), ("east", "west"), ("control", "treatment")


def series(replicas: int) -> list[tuple[str, str, str, str]]:
    return [(MODELS[i % 2], POOLS[(i // 2) % 2], f"r{i}", ARMS[(i // 4) % 2]) for i in range(replicas)]


def histograms(rng: np.random.Generator, requests: np.ndarray, scale_ms: np.ndarray, sigma: float) -> list[str]:
    """One histogram literal per window, of ``requests[i]`` lognormal latencies around
    ``scale_ms[i]``: what the stream job writes (sparse arrays between a window's smallest and
    largest bucket), so the tables, the roll-ups and the columnstore hold realistic arrays."""
    rows = np.repeat(np.arange(requests.size), requests)
    idx = H.bucket_indices(np.repeat(scale_ms, requests) * rng.lognormal(0.0, sigma, rows.size))
    dense = np.bincount(rows * H.SIZE + idx, minlength=requests.size * H.SIZE).reshape(requests.size, H.SIZE)
    nz = dense > 0
    lo, hi = nz.argmax(axis=1), H.SIZE - 1 - nz[:, ::-1].argmax(axis=1)
    return [f"[{a}:{b}]={{{','.join(map(str, dense[i, a:b + 1].tolist()))}}}"
            for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True))]


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
            ttft_h, e2e_h = histograms(rng, req, p99 / 2.5, 0.4), histograms(rng, req, p99 * 5 / 1.6, 0.2)
            with conn.cursor() as cur, cur.copy(f"COPY {names.T_REQUEST_WINDOWS} ({', '.join(COLS)}) FROM STDIN") as cp:
                k = 0
                for w in range(720):
                    bucket = hour + dt.timedelta(seconds=5 * w)
                    for model, pool, rep, arm in keys:
                        r, p = int(req[k]), float(p99[k])
                        cp.write_row((bucket, model, pool, rep, arm, r, r, 0, 0, 0, 0, r / 5, p / 4, p / 2, p, p * 3, p * 5,
                                      p * 8, 20.0, 2.0, 1.0, r * 100, r * 20, r * 4.0, 800.0, 10000.0, int(within[k]),
                                      int(within[k]), r, r * p / 3, r * p, r * 19, r * 380.0, r * 7676.0, ttft_h[k], e2e_h[k]))
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
                rows = ["\t".join(bucket.isoformat() if c == "bucket" else str(
                    {"model": k[0], "pool": k[1], "replica": k[2], "arm": k[3]}.get(c, row[c])) for c in cols)
                    for k in keys]  # lines of COPY text, as the job hands them to the writer
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


def timed_paired(conns: dict[str, psycopg.Connection], sql: str, repeats: int) -> dict[str, list[float]]:
    """``repeats`` rounds of the same query on every store, back to back, the order rotating each
    round, so drift of a shared machine falls on both sides of each round's ratio."""
    names_ = list(conns)
    for c in conns.values():
        c.execute(sql).fetchall()  # warm
    out: dict[str, list[float]] = {n: [] for n in names_}
    for r in range(repeats):
        for n in names_[r % len(names_):] + names_[:r % len(names_)]:
            t = time.perf_counter()
            conns[n].execute(sql).fetchall()
            out[n].append((time.perf_counter() - t) * 1000)
    return out


def prepare(dsn: str, end: dt.datetime, args: argparse.Namespace) -> tuple[str, dict]:
    """Migrate an empty store, load the history and, on TimescaleDB, convert the chunks its
    columnstore policy would have converted by ``end``."""
    cfg = config_mod.load(env={})
    cfg.store.dsn = dsn
    with connect(dsn) as conn:
        flavor = migrate(conn, cfg).flavor
    print(f"{flavor}: loading {args.days} days x {args.replicas} replicas of 5 s windows ...", flush=True)
    inputs = load(dsn, end, args.days, args.replicas)
    with connect(dsn) as conn:
        t = time.perf_counter()
        inputs["chunks_converted"] = compress_chunks(conn, end - dt.timedelta(days=cfg.store.compress_after_days))
        conn.commit()
        inputs["columnstore_s"] = round(time.perf_counter() - t, 1)
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
        inputs["columnstore"] = columnstore(conn, args.replicas) if flavor == "timescale" else None
        inputs["disk"] = disk(conn, flavor, args.days, args.replicas)
    return flavor, inputs


def columnstore(conn: psycopg.Connection, replicas: int) -> dict[str, dict]:
    """Bytes of each window table's converted chunks before and after, the ratio, and what a
    converted day of one replica's 5 s windows takes."""
    out = {}
    for table in (names.T_REQUEST_WINDOWS, names.T_POLICY_WINDOWS):
        chunks, before, after = conn.execute(
            "SELECT count(*), sum(before_compression_total_bytes), sum(after_compression_total_bytes) "
            "FROM chunk_columnstore_stats(%s) WHERE compression_status = 'Compressed'", (table,)).fetchone()
        days = conn.execute(
            "SELECT extract(epoch FROM sum(range_end - range_start)) / 86400 FROM timescaledb_information.chunks "
            "WHERE hypertable_name = %s AND is_compressed", (table,)).fetchone()[0]
        out[table] = {"chunks": chunks, "days": float(days or 0), "before_bytes": before, "after_bytes": after,
                      "ratio": float(before) / float(after) if after else None,
                      "after_bytes_per_replica_day": float(after) / (float(days) * replicas) if after and days else None}
    return out


def disk(conn: psycopg.Connection, flavor: str, days: int, replicas: int) -> dict[str, float]:
    """On-disk bytes (tables, indexes, TOAST) per day of history per replica: the 5 s tables,
    the roll-ups and everything the store holds."""
    def size(rel: str) -> int:
        if flavor == "timescale":
            ht = conn.execute(
                "SELECT format('%%I.%%I', materialization_hypertable_schema, materialization_hypertable_name) "
                "FROM timescaledb_information.continuous_aggregates WHERE view_name = %s", (rel,)).fetchone()
            return int(conn.execute("SELECT hypertable_size(%s)", (ht[0] if ht else rel,)).fetchone()[0] or 0)
        return int(conn.execute(
            "SELECT pg_total_relation_size(%s::regclass) + coalesce((SELECT sum(pg_total_relation_size(inhrelid)) "
            "FROM pg_inherits WHERE inhparent = %s::regclass), 0)", (rel, rel)).fetchone()[0])
    per = days * replicas
    windows = size(names.T_REQUEST_WINDOWS)
    rollups = sum(size(r) for r in ALL_ROLLUPS)
    database = int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])
    return {"request_windows_bytes_per_replica_day": windows / per, "rollups_bytes_per_replica_day": rollups / per,
            "database_bytes_per_replica_day": database / per, "database_bytes": database}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--anchor-repeats", type=int, default=3, help="repeats of the 5 s-table anchor at 7 d (slow)")
    ap.add_argument("--dsn", help="instead of a fresh embedded PostgreSQL, this empty PostgreSQL database")
    ap.add_argument("--timescale-dsn", help="also this empty TimescaleDB database: both flavours, paired, one run")
    args = ap.parse_args()

    tmp = None
    server = None
    if args.dsn:
        dsn = args.dsn
    else:
        tmp = Path(tempfile.mkdtemp(prefix="llmsla-bench-dash-"))
        dsn, server = start_embedded(tmp / "pg", keep_running=False)
    try:
        end = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0)
        dsns = {"postgres": dsn} | ({"timescale": args.timescale_dsn} if args.timescale_dsn else {})
        stores: dict[str, dict] = {}
        for label, d in dsns.items():
            flavor, inputs = prepare(d, end, args)
            if flavor != {"postgres": "plain"}.get(label, label):
                raise SystemExit(f"{label} DSN is a {flavor} store: give --dsn a plain PostgreSQL database and "
                                 "--timescale-dsn a TimescaleDB one")
            stores[label] = inputs
        keys = series(args.replicas)
        variables = {
            "model": Variable(MODELS), "pool": Variable(POOLS), "replica": Variable(tuple(k[2] for k in keys)),
            "arm": Variable(ARMS), "zone": Variable(("eu", "us", "ap", "sa")), "policy_id": Variable(("p1", "p2")),
            "experiment": Variable(("e1",)),
        }
        rows, results = [], {}
        conns = {label: connect(d, autocommit=True) for label, d in dsns.items()}
        try:
            for span_name, span in (("6h", dt.timedelta(hours=6)), ("7d", dt.timedelta(days=args.days))):
                rng = TimeRange(end - span, end)
                interval = calculate_interval_ms(rng, MAX_POINTS)
                for key, q in REGISTRY.items():
                    if not isinstance(q, SqlQuery):
                        continue
                    sql = runner.expanded_sql(q, rng, interval, variables)
                    ms = timed_paired(conns, sql, args.repeats)
                    res: dict = {"rows": {label: len(c.execute(sql).fetchall()) for label, c in conns.items()}}
                    row = {"range": span_name, "query": key}
                    for label in conns:
                        p50, p95 = float(np.percentile(ms[label], 50)), float(np.percentile(ms[label], 95))
                        res[label] = {"p50_ms": p50, "p95_ms": p95, "meets_target": p95 <= TARGET_MS}
                        row[f"{label} p95 ms"] = p95
                    row["rows"] = res["rows"]["postgres"]
                    if "timescale" in conns:
                        ratio = paired_interval([t / p for t, p in zip(ms["timescale"], ms["postgres"], strict=True)])
                        res["ratio_timescale_vs_postgres"] = ratio
                        row |= {"tsdb/pg": ratio["geomean"], "95% interval": f"{ratio['low']:.2f}-{ratio['high']:.2f}"}
                    if key in storesql.TIERED:  # anchor: the same panel query on the 5 s table only
                        raw = SqlQuery(key + ".raw", storesql.TIERED[key](True), q.columns)
                        raw_sql = runner.expanded_sql(raw, rng, interval, variables)
                        raw_ms = timed(conns["postgres"], raw_sql, args.repeats if span_name == "6h" else args.anchor_repeats)
                        res["anchor_5s_p50_ms"] = float(np.percentile(raw_ms, 50))
                        res["ratio_p50_vs_anchor"] = res["postgres"]["p50_ms"] / res["anchor_5s_p50_ms"]
                        row |= {"pg 5s-table p50 ms": res["anchor_5s_p50_ms"], "pg vs 5s": res["ratio_p50_vs_anchor"]}
                    row["<=500ms"] = "yes" if all(res[label]["meets_target"] for label in conns) else "NO"
                    rows.append(row)
                    results[f"{span_name}/{key}"] = res
                    print(f"  {span_name} {key}: " + ", ".join(f"{label} p95 {res[label]['p95_ms']:.1f} ms" for label in conns),
                          flush=True)
        finally:
            for c in conns.values():
                c.close()
        cols = ["range", "query", *(f"{label} p95 ms" for label in conns), "rows", "tsdb/pg", "95% interval",
                "pg 5s-table p50 ms", "pg vs 5s", "<=500ms"]
        cols = [c for c in cols if any(c in r for r in rows)]
        rows = [{c: r.get(c, "") for c in cols} for r in rows]
        print_table(rows, f"dashboard store queries, {args.days} d x {args.replicas} replicas ({', '.join(conns)}); "
                          "tsdb/pg = paired rounds' geometric mean ratio; anchor = same query on the 5 s table")
        print_table([{"store": label, "load s": s_["load_s"], "columnstore s": s_["columnstore_s"],
                      "5s windows B/replica/day": s_["disk"]["request_windows_bytes_per_replica_day"],
                      "roll-ups B/replica/day": s_["disk"]["rollups_bytes_per_replica_day"],
                      "database B/replica/day": s_["disk"]["database_bytes_per_replica_day"],
                      "5s columnstore ratio": (s_["columnstore"] or {}).get(names.T_REQUEST_WINDOWS, {}).get("ratio", ""),
                      "5s converted B/replica/day": (s_["columnstore"] or {}).get(names.T_REQUEST_WINDOWS, {}).get(
                          "after_bytes_per_replica_day", "")}
                     for label, s_ in stores.items()], "disk per replica per day, and the columnstore's compression")
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
            "inputs": {"days": args.days, "replicas": args.replicas, "repeats": args.repeats,
                       "max_data_points": MAX_POINTS, "target_p95_ms": TARGET_MS},
            "stores": stores,
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
