"""A/B rollouts: assignment cost, report time, histogram storage and write cost.

Sections (each against an anchor measured in the same run, on this shared machine):

* ``assign``  ``Rollout.assign`` per call (target <= 2 us) against the bare hash call it makes
  (``blake2b(unit, digest_size=8)``), median of rounds over 10,000 distinct units;
* ``report``  ``llmsla ab report``'s work on a store holding 1M requests (one hour, 16 replicas x
  2 arms, the 1-minute roll-up kept by the trigger): read the roll-up + audited weights, the
  fixed-horizon report (grouped jackknife) and the always-valid one (target <= 5 s); anchor: a
  pandas groupby over the same 1M request rows (per minute and arm: count, errors, TTFT/E2E P95),
  the least any report over raw requests must do; for reference also the same report computed
  from the 1M requests in memory (``ab_data.from_arrays``);
* ``storage`` bytes per row of the histogram columns (5 s windows and the roll-ups), and the
  streaming sink's flush of one 5 s window for 64 series with histograms against the same flush
  without them (the roll-up trigger sums them).

The streaming job's throughput with histograms is measured by ``bench/streaming.py`` (its JSON
holds the ratio to the blackhole sink; ``--compare`` here reads both files).

    python bench/rollout.py [--only assign report storage] [--requests 1000000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from hashlib import blake2b
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla import experiments as E  # noqa: E402
from llmsla import histogram as H  # noqa: E402
from llmsla import names  # noqa: E402
from llmsla.control import ab_data, ab_report  # noqa: E402
from llmsla.control.rollout import Rollout  # noqa: E402
from llmsla.store import connect  # noqa: E402
from llmsla.store.connection import start_embedded  # noqa: E402
from llmsla.store.migrate import migrate  # noqa: E402

SPEC = {"exp": {"seed": 1, "coverage": 0.5, "arms": {"control": {"weight": 1}, "treat": {"weight": 1, "route_policy": "p2c"}}}}


def bench_assign(rounds: int = 15, n: int = 10_000) -> dict[str, Any]:
    r = Rollout(E.parse(SPEC))
    units = [f"user-{i:08d}" for i in range(n)]
    assign, pool = r.assign, names.DEFAULT_POOL

    def run_assign() -> float:
        t = time.perf_counter()
        for u in units:
            assign(pool, u)
        return (time.perf_counter() - t) / n * 1e6

    def run_bare() -> float:
        t = time.perf_counter()
        for u in units:
            blake2b(u.encode(), digest_size=8).digest()
        return (time.perf_counter() - t) / n * 1e6

    a, b = [], []
    for i in range(rounds):  # interleaved, order alternating
        for f, out in ((run_assign, a), (run_bare, b)) if i % 2 == 0 else ((run_bare, b), (run_assign, a)):
            out.append(f())
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return {"assign_us": statistics.median(a), "bare_hash_us": statistics.median(b),
            "ratio_vs_bare": statistics.median(ratios), "target_us": 2.0, "meets_target": statistics.median(a) <= 2.0}


def _requests(n: int, start_ms: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """n requests over one hour: 16 replicas, arms by a rollout of their sessions."""
    ts = np.sort(rng.integers(start_ms, start_ms + 3_600_000, n))
    unit = rng.integers(0, n // 6, n)
    r = Rollout(E.parse(SPEC))
    labels = np.array([r.assign(names.DEFAULT_POOL, f"s{u}").label for u in range(n // 6)])[unit]
    replica = rng.integers(0, 16, n)
    ttft = rng.lognormal(np.log(120), 0.7, n)
    e2e = ttft + rng.lognormal(np.log(2500), 0.9, n)
    bad = rng.random(n) < 0.002
    return {"ts": ts, "labels": labels, "replica": replica, "ttft": np.where(bad, np.nan, ttft), "e2e": e2e, "bad": bad}


def _windows(req: dict[str, np.ndarray], slo_ttft: float, slo_e2e: float) -> list[list[Any]]:
    """5 s window rows (the columns the roll-ups read) as the streaming job writes them."""
    from llmsla.streaming import sql as stream_sql

    cols = [*stream_sql.REQUEST_COLUMNS, names.C_TTFT_HIST, names.C_E2E_HIST]
    bucket = req["ts"] - req["ts"] % 5000
    key = np.stack([bucket, req["replica"], np.unique(req["labels"], return_inverse=True)[1]], axis=1)
    order = np.lexsort(key.T[::-1])
    key = key[order]
    cuts = np.flatnonzero(np.any(np.diff(key, axis=0) != 0, axis=1)) + 1
    rows = []
    labels = req["labels"][order]
    ttft, e2e, bad = req["ttft"][order], req["e2e"][order], req["bad"][order]
    for s, e in zip(np.r_[0, cuts], np.r_[cuts, len(key)], strict=True):
        t, x = ttft[s:e], e2e[s:e]
        t = t[np.isfinite(t)]
        n = e - s
        v = {"bucket": dt.datetime.fromtimestamp(key[s, 0] / 1000, dt.UTC), "model": "m", "pool": names.DEFAULT_POOL,
             "replica": f"r{key[s, 1]}", "arm": labels[s], names.L_TENANT: names.DEFAULT_TENANT,
             names.L_CLASS: names.DEFAULT_CLASS, "goodput": None, "requests": n, "ok": n - int(bad[s:e].sum()),
             "errors": int(bad[s:e].sum()), "ttft_slo_ms": slo_ttft, "e2e_slo_ms": slo_e2e,
             "ttft_within_slo": int((t <= slo_ttft).sum()), "e2e_within_slo": int((x <= slo_e2e).sum()),
             "ttft_count": len(t), names.C_TTFT_HIST: H.Hist.of(t).literal(), names.C_E2E_HIST: H.Hist.of(x).literal()}
        rows.append([v.get(c, 0) for c in cols])
    return rows


def bench_report(dsn: str, n: int, repeats: int = 3) -> dict[str, Any]:
    from llmsla.streaming import sql as stream_sql

    cfg = config_mod.load(env={})
    exp = E.parse(SPEC)["exp"]
    s = ab_report.Settings.from_config(cfg)
    end = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)
    start = end - dt.timedelta(hours=1)
    rng = np.random.default_rng(3)
    req = _requests(n, int(start.timestamp() * 1000), rng)
    t = time.perf_counter()
    rows = _windows(req, cfg.slo.ttft_ms, cfg.slo.e2e_ms)
    prep_s = time.perf_counter() - t
    cols = [*stream_sql.REQUEST_COLUMNS, names.C_TTFT_HIST, names.C_E2E_HIST]
    with connect(dsn) as conn:
        t = time.perf_counter()
        for i in range(0, len(rows), 5000):  # the sink's batches: the trigger rolls each up
            with conn.cursor() as cur, cur.copy(f"COPY {names.T_REQUEST_WINDOWS} ({', '.join(cols)}) FROM STDIN") as cp:
                for row in rows[i:i + 5000]:
                    cp.write_row(row)
            conn.commit()
        load_s = time.perf_counter() - t
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
        conn.autocommit = False

        def store_report(sequential: bool) -> float:
            t = time.perf_counter()
            d = ab_data.from_store(conn, exp, start, end, failed=s.failed)
            w, stable = ab_data.weights_timeline(conn, exp, d.start, d.minutes)
            ab_report.analyze(d, s, shares=ab_data.expected_shares(exp, w), srm_minutes=stable, sequential=sequential)
            return time.perf_counter() - t

        fixed = [store_report(False) for _ in range(repeats)]
        seq = [store_report(True) for _ in range(repeats)]
        got = ab_data.from_store(conn, exp, start, end, failed=s.failed)
    anchor = []
    for _ in range(repeats):
        t = time.perf_counter()
        d = ab_data.from_arrays(exp, start, end, ts_ms=req["ts"], labels=req["labels"], bad=req["bad"], ttft_ms=req["ttft"],
                                e2e_ms=req["e2e"], slo_ttft_ms=cfg.slo.ttft_ms, slo_e2e_ms=cfg.slo.e2e_ms)
        ab_report.analyze(d, s)
        anchor.append(time.perf_counter() - t)
    assert int(got.requests.sum()) == n, (int(got.requests.sum()), n)  # every request in the report
    pandas_s = statistics.median(_pandas_anchor(req, start) for _ in range(repeats))
    return {"requests": n, "window_rows": len(rows), "rollup_minutes": got.minutes, "prepare_windows_s": prep_s,
            "load_with_trigger_s": load_s, "report_fixed_s": statistics.median(fixed),
            "report_sequential_s": statistics.median(seq), "anchor_from_requests_s": statistics.median(anchor),
            "pandas_groupby_anchor_s": pandas_s, "ratio_fixed_vs_pandas": statistics.median(fixed) / pandas_s,
            "ratio_fixed_vs_from_requests": statistics.median(fixed) / statistics.median(anchor),
            "target_s": 5.0, "meets_target": statistics.median(fixed) <= 5.0}


def _pandas_anchor(req: dict[str, np.ndarray], start: dt.datetime) -> float:
    """A pandas groupby over the raw rows: per minute and arm, count, errors, TTFT/E2E P95."""
    import pandas as pd

    t = time.perf_counter()
    df = pd.DataFrame({"minute": (req["ts"] - int(start.timestamp() * 1000)) // 60_000, "arm": req["labels"],
                       "bad": req["bad"], "ttft": req["ttft"], "e2e": req["e2e"]})
    g = df.groupby(["minute", "arm"], sort=True)
    out = g.agg(requests=("bad", "size"), errors=("bad", "sum"))
    out["ttft_p95"] = g["ttft"].quantile(0.95)
    out["e2e_p95"] = g["e2e"].quantile(0.95)
    assert int(out["requests"].sum()) == len(df)
    return time.perf_counter() - t


def bench_storage(dsn: str, series: int = 64, windows: int = 60) -> dict[str, Any]:
    """Bytes of the histogram columns per row, and the sink's flush with them vs without."""
    from llmsla.streaming import sql as stream_sql
    from llmsla.streaming.store_sink import StoreWriter

    out: dict[str, Any] = {}
    with connect(dsn) as conn:
        for table in (names.T_REQUEST_WINDOWS, names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H):
            b = conn.execute(f"SELECT avg(pg_column_size(ttft_hist) + pg_column_size(e2e_hist)), avg(pg_column_size(t.*)), "
                             f"avg(requests::float8 / windows) FROM {table} t, LATERAL (SELECT 1 AS windows) w"
                             if table == names.T_REQUEST_WINDOWS else
                             f"SELECT avg(pg_column_size(ttft_hist) + pg_column_size(e2e_hist)), avg(pg_column_size(t.*)), "
                             f"avg(requests::float8 / windows) FROM {table} t").fetchone()
            out[table] = {"hist_bytes_per_row": float(b[0] or 0), "row_bytes": float(b[1] or 0),
                          "requests_per_5s_window": float(b[2] or 0)}
        cols = list(stream_sql.TABLE_COLUMNS[names.T_REQUEST_WINDOWS])
        if names.C_TTFT_HIST not in cols:
            out["flush"] = "the streaming job does not write histograms yet"
            return out
        rng = np.random.default_rng(5)
        base = dt.datetime.now(dt.UTC).replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=2)
        for mode in ("with_hist", "without_hist"):
            ms = []
            for w in range(windows):
                bucket = base + dt.timedelta(seconds=5 * w) + (dt.timedelta(hours=1) if mode == "without_hist" else dt.timedelta())
                rows = []
                for k in range(series):
                    th = H.Hist.of(rng.lognormal(np.log(120), 0.7, 30)).literal() if mode == "with_hist" else None
                    eh = H.Hist.of(rng.lognormal(np.log(2500), 0.9, 30)).literal() if mode == "with_hist" else None
                    v = {"bucket": bucket, "model": "m", "pool": "p", "replica": f"r{k}", "arm": "exp:control", "requests": 30,
                         "ttft_slo_ms": 800.0, "e2e_slo_ms": 10000.0, names.C_TTFT_HIST: th, names.C_E2E_HIST: eh}
                    rows.append([v.get(c, 1) for c in cols])
                t = time.perf_counter()
                with conn.transaction(), conn.cursor() as cur:
                    StoreWriter._flush_windows(cur, names.T_REQUEST_WINDOWS, rows)
                ms.append((time.perf_counter() - t) * 1000)
            out[f"flush_{mode}_p50_ms"] = float(np.percentile(ms, 50))
        out["flush_ratio_vs_without"] = out["flush_with_hist_p50_ms"] / out["flush_without_hist_p50_ms"]
    return out


def _verdict(what: str, got: float, target: float, unit: str) -> None:
    ok = got <= target
    print(f"{what}: {got:.3g} {unit}, target <= {target:g} {unit}: {'met' if ok else 'MISSED'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=["assign", "report", "storage"])
    ap.add_argument("--requests", type=int, default=1_000_000)
    args = ap.parse_args()
    results: dict[str, Any] = {}
    if "assign" in args.only:
        results["assign"] = bench_assign()
        print_table([{k: v for k, v in results["assign"].items()}], "assignment per call")
        _verdict("assignment", results["assign"]["assign_us"], 2.0, "us per call")
    server = tmp = None
    if {"report", "storage"} & set(args.only):
        tmp = Path(tempfile.mkdtemp(prefix="llmsla-bench-ab-"))
        dsn, server = start_embedded(tmp / "pg", keep_running=False)
        try:
            cfg = config_mod.load(env={})
            cfg.store.dsn = dsn
            with connect(dsn) as conn:
                migrate(conn, cfg)
            if "report" in args.only:
                results["report"] = bench_report(dsn, args.requests)
                print_table([results["report"]], f"report over {args.requests:,} requests")
                _verdict("report (fixed horizon, from the store)", results["report"]["report_fixed_s"], 5.0, "s")
            if "storage" in args.only:
                results["storage"] = bench_storage(dsn)
                print_table([{"table": k, **v} for k, v in results["storage"].items() if isinstance(v, dict)], "histogram storage")
                print_table([{k: v for k, v in results["storage"].items() if not isinstance(v, dict)}], "sink flush, 64 series")
        finally:
            server.cleanup()
    name = "rollout" if set(args.only) == {"assign", "report", "storage"} else "rollout-" + "-".join(sorted(args.only))
    write_result(name, {"inputs": {"requests": args.requests, "sections": args.only}, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
