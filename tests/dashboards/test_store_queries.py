"""Every store query of the dashboards, expanded as Grafana's PostgreSQL datasource expands it and
run on the store with data: the columns its panel expects, in order, and values equal to an
independent reference computed here in Python from the rows inserted (roll-ups included). Request
queries run at three ranges, one per tier; EXPLAIN shows each range reads its tier only, and a
7-day query no 5 s partition. Hostile variable values stay data.

``forecasts``, ``action_log`` and ``ab_results`` get rows here in their documented schema (their
producers are other issues); the request and policy windows are what the streaming job writes.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from collections import defaultdict

import numpy as np
import psycopg
import pytest

from llmsla import histogram as H
from llmsla import names
from llmsla.dashboards import runner, storesql
from llmsla.dashboards.macros import TimeRange, Variable
from llmsla.dashboards.query import REGISTRY, SqlQuery
from llmsla.store import connect
from llmsla.store.maintenance import materialize_rollups
from llmsla.store.migrate import migrate, recorded_flavor

UTC = dt.UTC
REPLICAS = ("r0", "r1")
ARMS = ("control", "treatment")
ZONES = ("eu", "us")
STEP_S = 30  # one 5 s window every 30 s: sparse, and every tier still has rows to merge
HOURS = 50
HOSTILE = "x'); DROP TABLE request_windows; --"
WINDOW_COLS = ("bucket", "model", "pool", "replica", "arm", "requests", "ok", "errors", "timeouts", "cancelled",
               "rejected", "qps", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms",
               "itl_mean_ms", "itl_jitter_ms", "queue_p99_ms", "prompt_tokens", "output_tokens", "output_tps",
               "ttft_slo_ms", "e2e_slo_ms", "ttft_within_slo", "e2e_within_slo", "ttft_count", "ttft_sum_ms",
               "e2e_sum_ms", "itl_n", "itl_sum_ms", "itl_sumsq_ms2", "tenant", "class", "goodput", "ttft_hist")
#: Each arm's traffic is one tenant's; the class alternates by window; goodput is unknown (NULL)
#: in the first tenth of the windows, as in a store written before it counted goodput.
TENANT_OF_ARM = {"control": "acme", "treatment": "globex"}
CLASSES = names.DEFAULT_CLASSES[:2]


def epoch(ts: dt.datetime) -> float:
    return ts.timestamp()


class Data:
    """The rows inserted, kept for the references."""

    def __init__(self, end: dt.datetime) -> None:
        rng = random.Random(11)
        nrng = np.random.default_rng(11)
        self.end = end
        self.windows: list[dict] = []
        start = end - dt.timedelta(hours=HOURS)
        n = HOURS * 3600 // STEP_S
        for i in range(n):
            bucket = start + dt.timedelta(seconds=STEP_S * i)
            for rep in REPLICAS:
                for arm in ARMS:
                    req = rng.randint(1, 40)
                    slow = 4.0 if (rep == "r1" and n - 150 <= i < n - 50) else 1.0  # 75-25 min before the end
                    p99 = rng.uniform(100, 900) * slow
                    self.windows.append({
                        "bucket": bucket, "model": "m", "pool": "p", "replica": rep, "arm": arm, "requests": req,
                        "ok": req - (e := rng.randint(0, 2)), "errors": e, "timeouts": 0, "cancelled": 0, "rejected": 0,
                        "qps": req / 5, "ttft_p50_ms": p99 / 4, "ttft_p95_ms": p99 / 2, "ttft_p99_ms": p99,
                        "e2e_p50_ms": p99 * 3, "e2e_p95_ms": p99 * 5, "e2e_p99_ms": p99 * 8, "itl_mean_ms": 20.0,
                        "itl_jitter_ms": 2.0, "queue_p99_ms": rng.uniform(0, 5), "prompt_tokens": req * 100,
                        "output_tokens": req * 20, "output_tps": req * 4.0, "ttft_slo_ms": 800.0, "e2e_slo_ms": 10000.0,
                        "ttft_within_slo": rng.randint(0, req), "e2e_within_slo": rng.randint(0, req), "ttft_count": req,
                        "ttft_sum_ms": req * p99 / 3, "e2e_sum_ms": req * p99, "itl_n": req * 19,
                        "itl_sum_ms": req * 19 * 20.0, "itl_sumsq_ms2": req * 19 * 404.0,
                        "tenant": TENANT_OF_ARM[arm], "class": CLASSES[i % 2],
                    })
                    w = self.windows[-1]
                    w["goodput"] = None if i < n // 10 else min(w["ok"], w["ttft_within_slo"])
                    # TTFT histograms in the last 90 minutes (the engine windows' span): the
                    # percentiles of the engine-vs-gateway panel
                    w["ttft_hist"] = (H.Hist.of(rng.uniform(0, 2 * p99 / 3) for _ in range(req)).literal()
                                      if i >= n - 180 else None)
        # policy: raw temperatures per 60 s window (the reference pools them directly)
        self.policy: list[dict] = []
        self.raw_temps: dict[tuple, np.ndarray] = {}
        for i in range(6 * 60):
            bucket = end - dt.timedelta(hours=6) + dt.timedelta(minutes=i)
            for z in ZONES:
                temps = nrng.uniform(0.2, 1.2, size=int(nrng.integers(3, 20))) * (1.5 if z == "us" else 1.0)
                self.raw_temps[(bucket, z)] = temps
                self.policy.append({"bucket": bucket, "zone": z, "policy_id": "p1", "decisions": len(temps),
                                    "traces": len(temps) // 2 + 1, "temperature_mean": float(temps.mean()),
                                    "temperature_jitter": float(temps.std()), "latency_p50_ms": rng.uniform(1, 3),
                                    "latency_p99_ms": rng.uniform(3, 9), "decide_p99_ms": rng.uniform(0.1, 1)})
        t = end - dt.timedelta(minutes=50)
        self.forecasts = [
            {"ts": t + dt.timedelta(minutes=k), "forecaster": "lstm", "target": tgt, "pool": "p", "replica": rep,
             "horizon_s": 300, "predicted": 700.0 + k, "threshold": 800.0, "risk": rng.random()}
            for k in range(0, 40, 2) for tgt, rep in (("ttft_p99", "r1"), ("e2e_p99", ""))
        ]
        self.actions = [
            {"ts": t + dt.timedelta(minutes=10), "source": "receiver", "actor": "alertmanager", "action": "set_weight",
             "target": "p/r1", "params": {"weight": 0.2}, "reason": "burn rate 14x", "alertname": "TTFTBurnRate", "fingerprint": "f1", "outcome": "applied"},
            {"ts": t + dt.timedelta(minutes=25), "source": "receiver", "actor": "alertmanager", "action": "undrain",
             "target": "p/r1", "params": {}, "reason": "", "alertname": "TTFTBurnRate", "fingerprint": "f1", "outcome": "skipped: cooldown"},
            {"ts": t + dt.timedelta(minutes=30), "source": "api", "actor": "alice", "action": "set_student_share",
             "target": "p", "params": {"share": 0.3}, "reason": "canary", "alertname": None, "fingerprint": None, "outcome": "applied"},
        ]
        ab = []
        for k, (ci, p) in enumerate(((-5.0, 30.0), (-30.0, -10.0))):  # the later row wins: 'better'
            ab.append({"ts": t + dt.timedelta(minutes=k), "experiment": "e1", "arm": "treatment", "metric": names.AB_METRIC_TTFT_P95,
                       "n": 1000, "value": 400.0, "baseline": 420.0, "effect": (ci + p) / 2, "ci_low": ci, "ci_high": p, "p_value": 0.01})
        ab.append({"ts": t, "experiment": "e1", "arm": "treatment", "metric": names.AB_METRIC_E2E_P95, "n": 1000,
                   "value": 3000.0, "baseline": 2900.0, "effect": 100.0, "ci_low": 20.0, "ci_high": 180.0, "p_value": 0.02})
        # lower is better for every quantile and the mean ITL, not only the P95s the diff panel shows
        ab.append({"ts": t, "experiment": "e1", "arm": "treatment", "metric": names.AB_METRIC_E2E_P50, "n": 1000,
                   "value": 900.0, "baseline": 1000.0, "effect": -100.0, "ci_low": -150.0, "ci_high": -50.0, "p_value": 0.01})
        ab.append({"ts": t, "experiment": "e1", "arm": "treatment", "metric": names.AB_METRIC_ITL_MEAN, "n": 1000,
                   "value": 33.0, "baseline": 30.0, "effect": 3.0, "ci_low": 2.0, "ci_high": 4.0, "p_value": 0.001})
        ab.append({"ts": t, "experiment": "e1", "arm": "treatment", "metric": names.AB_METRIC_TTFT_ATTAINMENT, "n": 1000,
                   "value": 0.991, "baseline": 0.99, "effect": 0.001, "ci_low": -0.002, "ci_high": 0.004, "p_value": 0.5})
        ab.append({"ts": t, "experiment": "e1", "arm": "treatment", "metric": names.AB_METRIC_SRM, "n": 2000,
                   "value": 0.55, "baseline": 0.5, "effect": 0.05, "ci_low": None, "ci_high": None, "p_value": 1e-6})
        self.ab = ab
        # engine windows (what the stream job writes from EngineSample lines) for the last 90 min,
        # on the request windows' buckets: the engine's own mean TTFT a bit under the gateway's;
        # every 7th window without the engine's TTFT (null, an engine that exposes none), and a
        # replica the gateway never saw (no request windows: the join leaves it out)
        self.engine: list[dict] = []
        gateway_mean: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for w in self.windows:
            acc = gateway_mean[(w["bucket"], w["replica"])]
            acc[0] += w["ttft_sum_ms"]
            acc[1] += w["ttft_count"]
        for (bucket, rep), (sum_ms, count) in sorted(gateway_mean.items()):
            if bucket < end - dt.timedelta(minutes=90):
                continue
            for replica in (rep, "r9") if rep == "r0" else (rep,):
                k = len(self.engine)
                n = None if k % 7 == 0 else float(rng.randint(1, 40))
                mean = sum_ms / count * rng.uniform(0.6, 0.95)
                self.engine.append({
                    "bucket": bucket, "pool": "p", "replica": replica, "engine": names.ENGINE_VLLM, "samples": 5,
                    "waiting_mean": rng.uniform(0, 8), "waiting_max": 9.0, "running_mean": rng.uniform(1, 16),
                    "running_max": 16.0, "kv_usage_mean": rng.random(), "kv_usage_max": 1.0,
                    "preemptions": float(rng.randint(0, 2)), "prefix_cache_hit_rate_mean": rng.random(),
                    "engine_ttft_count": n, "engine_ttft_sum_ms": None if n is None else n * mean,
                    "engine_ttft_mean_ms": None if n is None else mean, "counter_resets": 0,
                    "engine_ttft_hist": None if n is None else H.Hist.of(
                        rng.uniform(0, 2 * mean) for _ in range(int(n))).literal(),
                })

    def insert(self, conn: psycopg.Connection) -> None:
        with conn.cursor() as cur:
            with cur.copy(f"COPY {names.T_REQUEST_WINDOWS} ({', '.join(WINDOW_COLS)}) FROM STDIN") as cp:
                for w in self.windows:
                    cp.write_row([w[c] for c in WINDOW_COLS])
            for table, rows in ((names.T_POLICY_WINDOWS, self.policy), (names.T_FORECASTS, self.forecasts),
                                (names.T_ACTION_LOG, self.actions), (names.T_AB_RESULTS, self.ab), (names.T_ENGINE_WINDOWS, self.engine)):
                cols = list(rows[0])
                cur.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('%s' for _ in cols)})",
                                [tuple(json.dumps(r[c]) if c == "params" else r[c] for c in cols) for r in rows])
        conn.commit()
        materialize_rollups(conn)


# -- reference: the tier a range reads, computed in Python -----------------------------------------
def tier_width(rng: TimeRange) -> int:
    return 5 if rng.seconds <= 3600 else 60 if rng.seconds <= 86400 else 3600


def tier_rows(data: Data, rng: TimeRange) -> list[dict]:
    """The rows of the tier the range picks: raw 5 s rows, or roll-ups computed here."""
    width = tier_width(rng)
    groups: dict[tuple, dict] = {}
    for w in data.windows:
        b = math.floor(epoch(w["bucket"]) / width) * width
        key = (b, w["replica"], w["arm"], w["pool"])
        g = groups.setdefault(key, {"bucket": b, "replica": w["replica"], "arm": w["arm"], "pool": w["pool"],
                                    "requests": 0, "ttft_within_slo": 0, "e2e_within_slo": 0, "errors": 0, "timeouts": 0,
                                    "ttft_p99_ms": -1.0, "e2e_p99_ms": -1.0})
        for c in ("requests", "ttft_within_slo", "e2e_within_slo", "errors", "timeouts"):
            g[c] += w[c]
        g["ttft_p99_ms"] = max(g["ttft_p99_ms"], w["ttft_p99_ms"])
        g["e2e_p99_ms"] = max(g["e2e_p99_ms"], w["e2e_p99_ms"])
    return [g for g in groups.values() if epoch(rng.start) <= g["bucket"] <= epoch(rng.end)]


def grouped(rows: list[dict], interval_s: float, by: str) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        out[(math.floor(r["bucket"] / interval_s) * interval_s, r[by])].append(r)
    return out


def ref_p99(data: Data, rng: TimeRange, interval_s: float, col: str) -> dict[tuple, float]:
    return {k: max(r[col] for r in rs) / 1000 for k, rs in grouped(tier_rows(data, rng), interval_s, "replica").items()}


def ref_qps(data: Data, rng: TimeRange, interval_s: float) -> dict[tuple, float]:
    return {k: sum(r["requests"] for r in rs) / max(interval_s, tier_width(rng))
            for k, rs in grouped(tier_rows(data, rng), interval_s, "pool").items()}


def ref_tenancy(data: Data, rng: TimeRange, interval_s: float, by: str | tuple[str, str]) -> dict[tuple, tuple]:
    """Per interval (or, with two columns, over the range) and tenant or class: TTFT attainment,
    E2E attainment and goodput over the rows that count it, from the tier's rows summed here (a
    roll-up row that mixes windows with and without goodput counts all its requests: the one
    bucket per series that straddles the upgrade reads low, docs/store.md)."""
    width = tier_width(rng)
    rows: dict[tuple, dict] = {}  # the tier's rows: a roll-up row's goodput is NULL only if all its windows' are
    for w in data.windows:
        b = math.floor(epoch(w["bucket"]) / width) * width
        if not epoch(rng.start) <= b <= epoch(rng.end):
            continue
        k = (b, w["replica"], w["arm"], w["tenant"], w["class"])
        g = rows.setdefault(k, {"b": b, "tenant": w["tenant"], "class": w["class"], "requests": 0,
                                "ttft_within_slo": 0, "e2e_within_slo": 0, "goodput": None})
        for c in ("requests", "ttft_within_slo", "e2e_within_slo"):
            g[c] += w[c]
        if w["goodput"] is not None:
            g["goodput"] = (g["goodput"] or 0) + w["goodput"]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for g in rows.values():
        key = tuple(g[c] for c in by) if isinstance(by, tuple) else (math.floor(g["b"] / interval_s) * interval_s, g[by])
        groups[key].append(g)
    out = {}
    for k, ws in groups.items():
        n = sum(w["requests"] for w in ws)
        counted = [w for w in ws if w["goodput"] is not None]
        good = sum(w["goodput"] for w in counted) / sum(w["requests"] for w in counted) if counted else None
        out[k] = (sum(w["ttft_within_slo"] for w in ws) / n, sum(w["e2e_within_slo"] for w in ws) / n, good, n)
    return out


def ref_attainment(data: Data, rng: TimeRange, interval_s: float, by: str) -> dict[tuple, tuple[float, float]]:
    out = {}
    for k, rs in grouped(tier_rows(data, rng), interval_s, by).items():
        n = sum(r["requests"] for r in rs)
        out[k] = (sum(r["ttft_within_slo"] for r in rs) / n, sum(r["e2e_within_slo"] for r in rs) / n)
    return out


RANGES = {  # one range per tier, ending at the data's end
    "30m": (dt.timedelta(minutes=30), 5000),
    "6h": (dt.timedelta(hours=6), 60000),
    "2d": (dt.timedelta(days=2), 3600000),
}


@pytest.fixture(scope="module")
def store(pg_server_dsn: str, tmp_path_factory) -> tuple[str, Data, bool]:
    """One database with the data for the whole module (the queries only read)."""
    from llmsla import config as config_mod

    dbname = "t_dash_queries"
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{dbname}"')
    info = psycopg.conninfo.conninfo_to_dict(pg_server_dsn)
    info["dbname"] = dbname
    dsn = psycopg.conninfo.make_conninfo(**info)
    cfg = config_mod.load(env={})
    cfg.store.dsn = dsn
    end = dt.datetime.now(UTC).replace(second=0, microsecond=0)
    data = Data(end)
    with connect(dsn) as conn:
        migrate(conn, cfg)
        data.insert(conn)
        timescale = recorded_flavor(conn) == "timescale"
    yield dsn, data, timescale
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def variables(**over: tuple[str, ...]) -> dict[str, Variable]:
    base = {"model": ("m",), "pool": ("p",), "replica": REPLICAS, "arm": ARMS, "zone": ZONES, "policy_id": ("p1",),
            "experiment": ("e1",), "tenant": tuple(TENANT_OF_ARM.values()), "class": CLASSES}
    base.update(over)
    return {k: Variable(v) for k, v in base.items()}


def run(dsn: str, q: SqlQuery, rng: TimeRange, interval_ms: int, vars_: dict | None = None, timescale: bool = False) -> runner.Table:
    with connect(dsn) as conn:
        t = runner.sql(conn, q, rng, interval_ms, vars_ or variables(), timescaledb=False)
    assert t.columns == list(q.columns), q.key
    return t


def as_map(t: runner.Table, ncols: int = 1) -> dict[tuple, tuple]:
    return {(float(r[0]), r[1]): tuple(float(x) for x in r[2:2 + ncols]) for r in t.rows}


def close(a: dict, b: dict) -> None:
    assert a and a.keys() == b.keys(), (sorted(set(a) ^ set(b))[:5])
    for k in a:
        av, bv = a[k], b[k] if isinstance(b[k], tuple) else (b[k],)
        assert all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(av, bv, strict=True)), (k, av, bv)


@pytest.mark.parametrize("span", list(RANGES))
def test_request_queries_equal_the_reference_in_every_tier(store, span: str) -> None:
    dsn, data, timescale = store
    length, interval_ms = RANGES[span]
    rng = TimeRange(data.end - length, data.end)
    interval_s = interval_ms / 1000
    for q, col in ((storesql.TTFT_P99_HISTORY, "ttft_p99_ms"), (storesql.E2E_P99_HISTORY, "e2e_p99_ms")):
        t = run(dsn, q, rng, interval_ms)
        assert t.rows
        close(as_map(t), ref_p99(data, rng, interval_s, col))
    close(as_map(run(dsn, storesql.QPS_HISTORY, rng, interval_ms)), ref_qps(data, rng, interval_s))
    close(as_map(run(dsn, storesql.ATTAINMENT_BY_POOL, rng, interval_ms), 2), ref_attainment(data, rng, interval_s, "pool"))
    close(as_map(run(dsn, storesql.ATTAINMENT_BY_ARM, rng, interval_ms), 2), ref_attainment(data, rng, interval_s, "arm"))
    summary = run(dsn, storesql.ARM_SUMMARY, rng, interval_ms)
    rows = tier_rows(data, rng)
    total = sum(r["requests"] for r in rows)
    for arm, n, share, ttft, e2e, err in summary.rows:
        mine = [r for r in rows if r["arm"] == arm]
        n_ref = sum(r["requests"] for r in mine)
        assert float(n) == n_ref and math.isclose(share, n_ref / total)
        assert math.isclose(ttft, sum(r["ttft_within_slo"] for r in mine) / n_ref)
        assert math.isclose(e2e, sum(r["e2e_within_slo"] for r in mine) / n_ref)
        assert math.isclose(err, sum(r["errors"] + r["timeouts"] for r in mine) / n_ref)
    assert [r[0] for r in summary.rows] == list(ARMS)


@pytest.mark.parametrize("span", list(RANGES))
def test_tenancy_queries_equal_the_reference_in_every_tier(store, span: str) -> None:
    """Per tenant and per class: TTFT attainment and goodput; the summary per (tenant, class).
    The 2-day range includes the windows without goodput: its ratio leaves them out."""
    dsn, data, _ = store
    length, interval_ms = RANGES[span]
    rng = TimeRange(data.end - length, data.end)
    interval_s = interval_ms / 1000
    for q, by in ((storesql.ATTAINMENT_BY_TENANT, names.L_TENANT), (storesql.ATTAINMENT_BY_CLASS, names.L_CLASS)):
        got = {(float(r[0]), r[1]): (r[2], r[3]) for r in run(dsn, q, rng, interval_ms).rows}
        want = {k: (v[0], v[2]) for k, v in ref_tenancy(data, rng, interval_s, by).items()}
        assert got and got.keys() == want.keys()
        for k, (ttft, good) in got.items():  # goodput NULL where no window of the interval counted it
            assert math.isclose(ttft, want[k][0]) and (good is None if want[k][1] is None
                                                       else math.isclose(good, want[k][1])), (k, ttft, good, want[k])
        assert {k[1] for k in got} == set(TENANT_OF_ARM.values() if by == names.L_TENANT else CLASSES)
        assert any(g is None for _, g in got.values()) == (span == "2d")
    summary = run(dsn, storesql.TENANCY_SUMMARY, rng, interval_ms)
    want = ref_tenancy(data, rng, interval_s, (names.L_TENANT, names.L_CLASS))
    assert [tuple(r[:2]) for r in summary.rows] == sorted(want)
    for tenant, class_, n, ttft, e2e, good in summary.rows:
        w = want[(tenant, class_)]
        assert float(n) == w[3] and math.isclose(ttft, w[0]) and math.isclose(e2e, w[1]) and math.isclose(good, w[2])
    # one tenant and class selected: only that group
    only = run(dsn, storesql.TENANCY_SUMMARY, rng, interval_ms, variables(tenant=("acme",), **{"class": (CLASSES[1],)}))
    assert [tuple(r[:2]) for r in only.rows] == [("acme", CLASSES[1])]


def test_variables_filter_and_hostile_values_stay_data(store) -> None:
    dsn, data, _ = store
    rng = TimeRange(data.end - dt.timedelta(hours=6), data.end)
    only_r1 = run(dsn, storesql.TTFT_P99_HISTORY, rng, 60000, variables(replica=("r1", HOSTILE)))
    assert {r[1] for r in only_r1.rows} == {"r1"}
    assert run(dsn, storesql.QPS_HISTORY, rng, 60000, variables(pool=(HOSTILE,))).rows == []
    with connect(dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {names.T_REQUEST_WINDOWS}").fetchone()[0] == len(data.windows)


def ref_engine_gateway_ttft(data: Data, rng: TimeRange, interval_s: float,
                            replicas: tuple[str, ...] = (*REPLICAS, "r9")) -> dict[tuple, tuple]:
    """Mean gateway and engine TTFT (s) per interval and pool/replica, from the rows inserted:
    every arm on the gateway side, only where both sides have rows; None where the engine
    exposed no TTFT in the whole interval."""
    def sums(rows: list[dict], s_col: str, n_col: str) -> dict[tuple, list]:
        out: dict[tuple, list] = {}
        for r in rows:
            if not (rng.start <= r["bucket"] <= rng.end) or r["replica"] not in replicas:
                continue
            acc = out.setdefault((math.floor(epoch(r["bucket"]) / interval_s) * interval_s, f"{r['pool']}/{r['replica']}"),
                                 [None, None])
            if r[n_col] is not None:
                acc[0] = (acc[0] or 0.0) + r[s_col]
                acc[1] = (acc[1] or 0.0) + r[n_col]
        return out

    def quantiles(rows: list[dict], hist: str) -> dict[tuple, tuple]:
        """P50 and P99 (s) of the interval's summed histograms; None without any."""
        merged: dict[tuple, list] = {}
        for r in rows:
            if rng.start <= r["bucket"] <= rng.end and r["replica"] in replicas:
                merged.setdefault((math.floor(epoch(r["bucket"]) / interval_s) * interval_s,
                                   f"{r['pool']}/{r['replica']}"), []).append(H.Hist.parse(r[hist]))
        out = {}
        for k, hs in merged.items():
            h = H.merge(hs)
            out[k] = (None, None) if h == H.EMPTY else (h.quantile(0.5) / 1000, h.quantile(0.99) / 1000)
        return out

    gw = sums(data.windows, "ttft_sum_ms", "ttft_count")
    en = sums(data.engine, "engine_ttft_sum_ms", "engine_ttft_count")
    gq, eq = quantiles(data.windows, "ttft_hist"), quantiles(data.engine, "engine_ttft_hist")
    out = {}
    for k in gw.keys() & en.keys():
        g = gw[k][0] / gw[k][1] / 1000
        e = None if en[k][1] is None else en[k][0] / en[k][1] / 1000
        out[k] = (g, e, None if e is None else g - e, *gq[k], *eq[k])
    return out


def as_nullable_map(t: runner.Table) -> dict[tuple, tuple]:
    return {(float(r[0]), r[1]): tuple(None if x is None else float(x) for x in r[2:]) for r in t.rows}


def close_nullable(got: dict, want: dict) -> None:
    assert got and got.keys() == want.keys(), sorted(set(got) ^ set(want))[:5]
    for k, w in want.items():
        g = got[k]
        assert [x is None for x in g] == [x is None for x in w], (k, g, w)
        assert all(math.isclose(x, y, rel_tol=1e-9) for x, y in zip(g, w, strict=True) if x is not None), (k, g, w)


@pytest.mark.parametrize(("span", "interval_ms"), [("10m", 5000), ("30m", 60000), ("6h", 600000)])
def test_engine_vs_gateway_ttft_equals_the_reference(store, span: str, interval_ms: int) -> None:
    """The engine's and the gateway's mean TTFT per replica and interval, and their gap, equal
    the sums of the rows inserted; a window without the engine's TTFT leaves its interval's
    engine side and gap empty (never 0), and a replica without request windows has no series."""
    dsn, data, _ = store
    length = {"10m": dt.timedelta(minutes=10), "30m": dt.timedelta(minutes=30), "6h": dt.timedelta(hours=6)}[span]
    rng = TimeRange(data.end - length, data.end)
    got = as_nullable_map(run(dsn, storesql.ENGINE_GATEWAY_TTFT, rng, interval_ms,
                              variables(replica=(*REPLICAS, "r9"))))
    want = ref_engine_gateway_ttft(data, rng, interval_ms / 1000)
    close_nullable(got, want)
    assert {k[1] for k in got} == {"p/r0", "p/r1"}
    # percentiles on both sides where histograms exist, the engine's under the gateway's at P50
    # in most intervals (the data's engine TTFT is 60-95 % of the gateway's)
    both = [v for v in got.values() if v[3] is not None and v[5] is not None]
    assert len(both) >= len(got) // 2 and sum(v[5] < v[3] for v in both) > len(both) // 2
    if interval_ms == 5000:  # one 5 s window per interval: null-TTFT windows show as gaps, the
        assert any(v[1] is None and v[2] is None for v in got.values())  # engine's mean is under the gateway's
        assert all(v[2] is None or v[2] > 0 for v in got.values())
    # the replica variable filters both sides; a hostile value stays data
    only_r1 = as_nullable_map(run(dsn, storesql.ENGINE_GATEWAY_TTFT, rng, interval_ms, variables(replica=("r1", HOSTILE))))
    close_nullable(only_r1, ref_engine_gateway_ttft(data, rng, interval_ms / 1000, ("r1",)))
    with connect(dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {names.T_ENGINE_WINDOWS}").fetchone()[0] == len(data.engine)


def test_store_variable_queries(store) -> None:
    dsn, data, _ = store
    rng = TimeRange(data.end - dt.timedelta(hours=6), data.end)
    assert [r[0] for r in run(dsn, storesql.VAR_ARM, rng, 60000).rows] == list(ARMS)
    assert [r[0] for r in run(dsn, storesql.VAR_MODEL, rng, 60000).rows] == ["m"]
    assert [r[0] for r in run(dsn, storesql.VAR_POOL, rng, 60000).rows] == ["p"]
    assert [r[0] for r in run(dsn, storesql.VAR_REPLICA, rng, 60000).rows] == list(REPLICAS)
    assert [r[0] for r in run(dsn, storesql.VAR_ARM, TimeRange(data.end - dt.timedelta(minutes=5), data.end), 1000).rows] == list(ARMS)
    assert [r[0] for r in run(dsn, storesql.VAR_ZONE, rng, 60000).rows] == list(ZONES)
    assert [r[0] for r in run(dsn, storesql.VAR_POLICY_ID, rng, 60000).rows] == ["p1"]
    assert [r[0] for r in run(dsn, storesql.VAR_EXPERIMENT, rng, 60000).rows] == ["e1"]
    assert [r[0] for r in run(dsn, storesql.VAR_TENANT, rng, 60000).rows] == sorted(TENANT_OF_ARM.values())
    assert [r[0] for r in run(dsn, storesql.VAR_CLASS, rng, 60000).rows] == sorted(CLASSES)


def test_policy_queries_pool_windows_exactly(store) -> None:
    """Temperature mean and jitter per interval equal numpy over the raw decisions of the windows."""
    dsn, data, _ = store
    rng = TimeRange(data.end - dt.timedelta(hours=6), data.end)
    interval_ms = 600000
    raw: dict[tuple, list[np.ndarray]] = defaultdict(list)
    for (bucket, zone), temps in data.raw_temps.items():
        if rng.start <= bucket <= rng.end:
            raw[(math.floor(epoch(bucket) / 600) * 600, f"{zone}/p1")].append(temps)
    temp = as_map(run(dsn, storesql.POLICY_TEMPERATURE, rng, interval_ms))
    jitter = as_map(run(dsn, storesql.POLICY_JITTER, rng, interval_ms))
    close(temp, {k: float(np.concatenate(v).mean()) for k, v in raw.items()})
    close(jitter, {k: float(np.concatenate(v).std()) for k, v in raw.items()})
    decisions = as_map(run(dsn, storesql.POLICY_DECISIONS, rng, interval_ms))
    close(decisions, {(k[0], k[1].split("/")[0]): float(sum(len(x) for x in v)) for k, v in raw.items()})
    lat = as_map(run(dsn, storesql.POLICY_LATENCY, rng, interval_ms))
    want: dict[tuple, float] = {}
    for p in data.policy:
        if rng.start <= p["bucket"] <= rng.end:
            k = (math.floor(epoch(p["bucket"]) / 600) * 600, p["zone"])
            want[k] = max(want.get(k, 0.0), p["latency_p99_ms"])
    close(lat, want)
    assert run(dsn, storesql.POLICY_DECIDE, rng, interval_ms).rows


def test_ab_forecast_and_action_queries(store) -> None:
    dsn, data, _ = store
    rng = TimeRange(data.end - dt.timedelta(hours=1), data.end)
    verdicts = {(r[3]): r[-1] for r in run(dsn, storesql.VERDICTS, rng, 10000).rows}
    assert verdicts == {names.AB_METRIC_TTFT_P95: "better", names.AB_METRIC_E2E_P95: "worse",
                        names.AB_METRIC_E2E_P50: "better", names.AB_METRIC_ITL_MEAN: "worse",
                        names.AB_METRIC_TTFT_ATTAINMENT: "no difference", names.AB_METRIC_SRM: "sample ratio mismatch"}
    diff = run(dsn, storesql.P95_DIFF, rng, 10000)
    assert {r[1] for r in diff.rows} == {f"treatment {names.AB_METRIC_TTFT_P95}", f"treatment {names.AB_METRIC_E2E_P95}"}
    assert [r[2] for r in run(dsn, storesql.SRM, rng, 10000).rows] == [1e-6]
    # the highest risk per target and interval: from the forecasts (1 h), the 1 m roll-up (6 h)
    # and the 1 h roll-up (2 d) alike
    for span, interval_s in ((dt.timedelta(hours=1), 600), (dt.timedelta(hours=6), 600), (dt.timedelta(days=2), 3600)):
        risk = as_map(run(dsn, storesql.RISK_HISTORY, TimeRange(data.end - span, data.end), interval_s * 1000))
        want: dict[tuple, float] = {}
        for f in data.forecasts:
            k = (math.floor(epoch(f["ts"]) / interval_s) * interval_s, f"{f['pool']}/{f['replica']} ({f['target']})")
            want[k] = max(want.get(k, 0.0), f["risk"])
        close(risk, want)
    latest = run(dsn, storesql.LATEST_FORECASTS, rng, 10000).rows
    assert sorted((r[2], r[0]) for r in latest) == sorted(
        (tgt, max(f["ts"] for f in data.forecasts if f["target"] == tgt)) for tgt in ("e2e_p99", "ttft_p99"))
    actions = run(dsn, storesql.ACTIONS, rng, 10000).rows
    assert [r[3] for r in actions] == ["set_student_share", "undrain", "set_weight"]  # newest first
    alerts = run(dsn, storesql.ALERT_ANNOTATIONS, rng, 10000).rows
    assert [r[1] for r in alerts] == ["TTFTBurnRate: set_weight p/r1 -> applied: burn rate 14x",
                                      "TTFTBurnRate: undrain p/r1 -> skipped: cooldown"]
    other = run(dsn, storesql.ACTION_ANNOTATIONS, rng, 10000).rows
    assert [(r[1], r[2]) for r in other] == [("alice: set_student_share p -> applied: canary", "api,alice,applied")]


def test_every_store_query_ran_here() -> None:
    """The tests above call each registered SQL query at least once (read from their source)."""
    import inspect
    import sys

    src = inspect.getsource(sys.modules[__name__])
    for q in REGISTRY.values():
        if isinstance(q, SqlQuery):
            const = next(k for k, v in vars(storesql).items() if v is q)
            assert f"storesql.{const}" in src, f"{q.key} ({const}) is not run by a test"


# -- the plan: a range reads its tier only -------------------------------------------------------
def plan_relations(conn: psycopg.Connection, sql: str) -> set[str]:
    """The relations a plan scans, schema-qualified (a TimescaleDB chunk lives in its own schema)."""
    plan = conn.execute("EXPLAIN (FORMAT JSON, VERBOSE) " + sql).fetchone()[0][0]["Plan"]
    rels: set[str] = set()

    def walk(node: dict) -> None:
        if "Relation Name" in node:
            rels.add(f'"{node["Schema"]}"."{node["Relation Name"]}"')
        for child in node.get("Plans", []):
            walk(child)

    walk(plan)
    return rels


def top_parent(conn: psycopg.Connection, rel: str) -> str:
    """A partition's or chunk's root table (or a continuous aggregate's view), unqualified."""
    while True:
        row = conn.execute("SELECT inhparent::regclass::text FROM pg_inherits WHERE inhrelid = %s::regclass", (rel,)).fetchone()
        if row is None:
            break
        rel = row[0]
    rel = conn.execute("SELECT relname FROM pg_class WHERE oid = %s::regclass", (rel,)).fetchone()[0]
    if recorded_flavor(conn) == "timescale":
        view = conn.execute("SELECT view_name FROM timescaledb_information.continuous_aggregates "
                            "WHERE materialization_hypertable_name = %s", (rel,)).fetchone()
        if view:
            return view[0]
    return rel


@pytest.mark.parametrize(("span", "tier"), [("30m", 0), ("6h", 1), ("2d", 2), ("7d", 2)])
def test_explain_reads_only_the_tier_of_the_range(store, span: str, tier: int) -> None:
    """Plain PostgreSQL: exactly the tier's table (request windows and forecasts alike).
    TimescaleDB (LLMSLA_TEST_DSN): the continuous aggregate, plus, for its real-time part, only
    raw chunks that end after the aggregate was refreshed (no chunk older than a day: the data
    ends now)."""
    dsn, data, timescale = store
    length = {"30m": dt.timedelta(minutes=30), "6h": dt.timedelta(hours=6), "2d": dt.timedelta(days=2), "7d": dt.timedelta(days=7)}[span]
    rng = TimeRange(data.end - length, data.end)
    assert {fam[0] for families in storesql.TIER_TABLES.values() for fam in families} == {
        names.T_REQUEST_WINDOWS, names.T_FORECASTS, names.T_ENGINE_WINDOWS}
    with connect(dsn) as conn:
        for key in storesql.TIERED:
            families = storesql.TIER_TABLES[key]  # a query over two families reads the tier of each
            tables, raw_tables = {f[tier] for f in families}, {f[0] for f in families}
            rels = plan_relations(conn, runner.expanded_sql(REGISTRY[key], rng, 60000, variables()))
            got = {top_parent(conn, r) for r in rels}
            if not timescale or tier == 0:
                assert got == tables, (span, key, got)
                continue
            assert tables <= got <= tables | raw_tables, (span, key, got)
            for raw_table in raw_tables:
                raw = {conn.execute("SELECT %s::regclass::text", (r,)).fetchone()[0] for r in rels if top_parent(conn, r) == raw_table}
                old = conn.execute("SELECT format('%%I.%%I', chunk_schema, chunk_name)::regclass::text FROM timescaledb_information.chunks WHERE hypertable_name = %s "
                                   "AND range_end < %s", (raw_table, data.end - dt.timedelta(days=1))).fetchall()
                assert not raw & {r[0] for r in old}, (span, key, raw)
        # the method sees a 5 s scan when there is one: the bench's anchor (5 s table only)
        anchor = SqlQuery("anchor", storesql.TIERED[storesql.TTFT_P99_HISTORY.key](True), storesql.TTFT_P99_HISTORY.columns)
        assert {top_parent(conn, r) for r in plan_relations(conn, runner.expanded_sql(anchor, rng, 60000, variables()))} == {
            names.T_REQUEST_WINDOWS}
