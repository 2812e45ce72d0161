"""The A/B report end to end on the store: simulated traffic -> 5 s windows with histograms ->
roll-ups (trigger / continuous aggregates) -> ``llmsla ab report``. The store path must give exactly
the aggregates computed from the requests themselves, so the calibration (which skips the store)
judges the same statistics; the CLI writes ab_results, prints the table, names bad options, and
rolls a failing arm back through a real control API, audited in action_log."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import random
import threading
from pathlib import Path

import numpy as np
import psycopg
import pytest

from llmsla import experiments as E
from llmsla import histogram as H
from llmsla import names
from llmsla.app import cli
from llmsla.control import ab_data, ab_report, api
from llmsla.control.audit import AuditLog
from llmsla.control.distill import DistillControls
from llmsla.control.rollout import Rollout
from llmsla.control.router import Replica, Router
from llmsla.events import RequestEvent
from llmsla.fleet import engine, faults, traces, workload
from llmsla.store import connect
from llmsla.store.maintenance import materialize_rollups
from llmsla.store.migrate import migrate

SPEC = {"exp": {"seed": 11, "coverage": 0.9, "arms": {"control": {}, "treat": {"pool": "canary"}},
                "forced": {"s3": "treat"}}}
MINUTES = 20
TOKEN = "ab-report-token-for-tests"


class Events:
    def __init__(self) -> None:
        self.requests: list[RequestEvent] = []

    def request(self, ev: RequestEvent) -> None:
        self.requests.append(ev)

    def gpu(self, sample, model_name) -> None:  # noqa: ANN001
        pass


@pytest.fixture(scope="module")
def traffic() -> tuple[list[RequestEvent], int]:
    """20 minutes of the conversation trace in sessions, the treatment pool 30 % slower."""
    arrivals, _ = traces.load("azure_conv")
    rng = random.Random(7)
    arrivals = workload.sessions(workload.window(arrivals, start_s=300, duration_s=MINUTES * 60), rng, mean_turns=4)
    exp = E.parse(SPEC)
    sim = engine.SimConfig(replicas=engine.fleet("6b:4,canary=6b:4"), policy="ladr", rollout=Rollout(exp), seed=3,
                           gpu_interval_s=0, entry_pools=[names.DEFAULT_POOL])
    sink = Events()
    start_ms = (int(dt.datetime.now(dt.UTC).timestamp()) // 3600 - 3) * 3_600_000  # on an hour, 3 h ago
    slow = [faults.Fault(0, MINUTES * 60 + 600, "slowdown", f"r{i}", 1.3) for i in range(4, 8)]
    engine.Simulator(sim).run(arrivals, faults=slow, sink=sink, start_ms=start_ms)
    return sink.requests, start_ms


def window_rows(events: list[RequestEvent], slo_ttft: float, slo_e2e: float) -> list[dict]:
    """5 s windows as the streaming job writes them (the columns the roll-ups and the report use)."""
    groups: dict[tuple, list[RequestEvent]] = {}
    for e in events:
        groups.setdefault((e.ts_ms - e.ts_ms % 5000, e.model, e.pool, e.replica, e.arm, e.tenant, e.class_), []).append(e)
    rows = []
    for (b, model, pool, replica, arm, tenant, class_), evs in sorted(groups.items()):
        ttft = [e.ttft_ms for e in evs if e.ttft_ms is not None]
        n = len(evs)
        rows.append({
            "bucket": dt.datetime.fromtimestamp(b / 1000, dt.UTC), "model": model, "pool": pool, "replica": replica,
            "arm": arm, "tenant": tenant, "class": class_, "requests": n, "ok": sum(e.status == "ok" for e in evs), "errors": sum(e.status == "error" for e in evs),
            "timeouts": sum(e.status == "timeout" for e in evs), "cancelled": 0, "rejected": sum(e.status == "rejected" for e in evs),
            "qps": n / 5, "prompt_tokens": 0, "output_tokens": 0, "output_tps": 0.0,
            "ttft_slo_ms": slo_ttft, "e2e_slo_ms": slo_e2e,
            "ttft_within_slo": sum(t <= slo_ttft for t in ttft), "e2e_within_slo": sum(e.e2e_ms <= slo_e2e for e in evs),
            "ttft_count": len(ttft), "ttft_sum_ms": float(sum(ttft)), "e2e_sum_ms": float(sum(e.e2e_ms for e in evs)),
            "itl_n": sum(e.itl_ms.n for e in evs), "itl_sum_ms": float(sum(e.itl_ms.n * e.itl_ms.mean for e in evs)),
            "itl_sumsq_ms2": float(sum(e.itl_ms.n * (e.itl_ms.std**2 + e.itl_ms.mean**2) for e in evs)),
            "ttft_hist": H.Hist.of(ttft).literal(), "e2e_hist": H.Hist.of([e.e2e_ms for e in evs]).literal(),
        })
    return rows


def assert_same(a: object, b: object, where: str = "report") -> None:
    """Equal JSON, floats within 1e-9 relative: the ITL sums are added in another order by
    PostgreSQL than by numpy; everything else (counts, histograms) is exact."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


def _full(x: np.ndarray, lo: int) -> np.ndarray:
    out = np.zeros((*x.shape[:2], H.SIZE), dtype=np.int64)
    out[..., lo:lo + x.shape[2]] = x
    return out


def load(conn: psycopg.Connection, rows: list[dict]) -> None:
    cols = list(rows[0])
    with conn.cursor() as cur, cur.copy(f"COPY {names.T_REQUEST_WINDOWS} ({', '.join(cols)}) FROM STDIN") as cp:
        for r in rows:
            cp.write_row([r[c] for c in cols])
    conn.commit()
    materialize_rollups(conn)


def test_store_path_equals_the_requests_and_the_report_sees_the_slow_arm(pg_dsn: str, cfg, traffic) -> None:
    events, start_ms = traffic
    exp = E.parse(SPEC)["exp"]
    settings = ab_report.Settings.from_config(cfg)
    start = dt.datetime.fromtimestamp(start_ms / 1000, dt.UTC)
    end = start + dt.timedelta(minutes=MINUTES)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        load(conn, window_rows(events, cfg.slo.ttft_ms, cfg.slo.e2e_ms))
        stored = ab_data.from_store(conn, exp, start, end, failed=settings.failed)
    direct = ab_data.from_events(exp, events, start, end, slo_ttft_ms=settings.slo_ttft_ms,
                                 slo_e2e_ms=settings.slo_e2e_ms, failed=settings.failed)
    assert stored.groups == direct.groups == ["control", "treat", "default", "forced"]
    for field in ("requests", "bad", "ttft_within", "e2e_within", "itl_n"):
        assert np.array_equal(getattr(stored, field), getattr(direct, field)), field
    assert direct.itl_n.sum() > 0
    assert np.allclose(stored.itl_sum_ms, direct.itl_sum_ms, rtol=1e-9, atol=0)
    for field in ("ttft_hist", "e2e_hist"):  # the same counts, whatever the window of buckets kept
        assert np.array_equal(_full(getattr(stored, field), stored.hist_lo), _full(getattr(direct, field), direct.hist_lo)), field
    assert stored.requests[stored.index("forced")].sum() > 0  # the forced unit's requests, kept apart
    # 20 minutes are 2 blocks of the default 10: too few for a fixed-horizon interval, and said so
    short = ab_report.analyze(stored, ab_report.Settings(**{**settings.__dict__, "min_requests": 1000}))
    assert {c.verdict for c in short.comparisons} == {"inconclusive"}
    assert all("fewer than 4 blocks" in c.reason for c in short.comparisons)
    settings = ab_report.Settings(**{**settings.__dict__, "min_requests": 1000, "fixed_block_minutes": 5})
    a, b = ab_report.analyze(stored, settings), ab_report.analyze(direct, settings)
    assert_same(a.to_json(), b.to_json())
    by = {(c.arm, c.metric): c for c in a.comparisons}
    e2e = by[("treat", names.AB_METRIC_E2E_P50)]
    assert e2e.verdict == "fail" and e2e.relative > 0.15 and e2e.ci_low > 0  # 30 % slower iterations
    assert e2e.effect_size > 0.1  # Cliff's delta: treatment slower
    # exact quantiles of the raw values, within the layout's 1 %
    treat = [e.e2e_ms for e in events if e.arm == "exp:treat" and start_ms <= e.ts_ms < start_ms + MINUTES * 60_000]
    assert abs(e2e.value / np.quantile(treat, 0.5, method="inverted_cdf") - 1) <= names.HIST_REL_ERROR
    # the mean inter-token latency: the token-weighted mean of every gap, ~30 % slower, and significant
    itl = by[("treat", names.AB_METRIC_ITL_MEAN)]
    in_range = [e for e in events if start_ms <= e.ts_ms < start_ms + MINUTES * 60_000]
    gaps = {arm: (sum(e.itl_ms.n * e.itl_ms.mean for e in in_range if e.arm == arm),
                  sum(e.itl_ms.n for e in in_range if e.arm == arm)) for arm in ("exp:treat", "exp:control")}
    assert itl.value == pytest.approx(gaps["exp:treat"][0] / gaps["exp:treat"][1], rel=1e-9)
    assert itl.baseline == pytest.approx(gaps["exp:control"][0] / gaps["exp:control"][1], rel=1e-9)
    # its interval is always-valid in both modes: at 4 blocks wide, tight enough at 10 (below)
    assert 0.2 < itl.relative < 0.4 and itl.ci_low < itl.effect < itl.ci_high
    # 20 minutes are 4 blocks of 5: the always-valid mode, valid from its first blocks on, is too
    # wide there for this effect; 2-minute blocks give it 10
    seq = ab_report.analyze(stored, ab_report.Settings(**{**settings.__dict__, "block_minutes": 2}), sequential=True)
    assert {c.metric: c.verdict for c in seq.comparisons}[names.AB_METRIC_E2E_P50] == "fail"
    assert {c.metric: c.verdict for c in seq.comparisons}[names.AB_METRIC_ITL_MEAN] == "fail"
    assert not a.srm["flagged"]


def _tenanted(events: list[RequestEvent]) -> list[RequestEvent]:
    """The traffic spread over two tenants and two classes (by arrival order: arm-independent)."""
    return [dataclasses.replace(e, tenant=("acme", "globex")[i % 2], class_=names.DEFAULT_CLASSES[i // 2 % 2])
            for i, e in enumerate(events)]


def test_report_cut_by_tenant_and_class_equals_each_groups_requests(pg_dsn: str, cfg, traffic) -> None:
    events, start_ms = traffic
    events = _tenanted(events)
    exp = E.parse(SPEC)["exp"]
    settings = ab_report.Settings.from_config(cfg)
    start = dt.datetime.fromtimestamp(start_ms / 1000, dt.UTC)
    end = start + dt.timedelta(minutes=MINUTES)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        load(conn, window_rows(events, cfg.slo.ttft_ms, cfg.slo.e2e_ms))
        whole = ab_data.from_store(conn, exp, start, end, failed=settings.failed)
        for by, attr in ((names.L_TENANT, "tenant"), (names.L_CLASS, "class_")):
            values = ab_data.cut_values(conn, exp, start, end, by)
            assert values == sorted({getattr(e, attr) for e in events}) and len(values) == 2
            parts = []
            for v in values:
                got = ab_data.from_store(conn, exp, start, end, failed=settings.failed, cut=(by, v))
                want = ab_data.from_events(exp, [e for e in events if getattr(e, attr) == v], start, end,
                                           slo_ttft_ms=settings.slo_ttft_ms, slo_e2e_ms=settings.slo_e2e_ms,
                                           failed=settings.failed)
                for field in ("requests", "bad", "ttft_within", "e2e_within", "itl_n"):
                    assert np.array_equal(getattr(got, field), getattr(want, field)), (by, v, field)
                assert got.requests.sum() > 0
                assert_same(ab_report.analyze(got, settings).to_json(), ab_report.analyze(want, settings).to_json())
                parts.append(got)
            # the groups add up to the whole experiment
            assert np.array_equal(sum(p.requests for p in parts), whole.requests), by
        with pytest.raises(ValueError, match="cannot cut a report by 'replica'"):
            ab_data.from_store(conn, exp, start, end, failed=settings.failed, cut=("replica", "r0"))


def _report(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = cli.main(args)
    except SystemExit as exc:  # argparse refused an argument (its message is on stderr)
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_report_results_rows_errors_and_rollback(pg_dsn: str, cfg, traffic, tmp_path: Path, monkeypatch, capsys) -> None:
    events, start_ms = traffic
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        load(conn, window_rows(events, cfg.slo.ttft_ms, cfg.slo.e2e_ms))
    monkeypatch.setenv("LLMSLA_AB_EXPERIMENTS", json.dumps(SPEC))
    monkeypatch.setenv("LLMSLA_AB_MIN_REQUESTS", "1000")
    monkeypatch.setenv("LLMSLA_AB_FIXED_BLOCK_MINUTES", "5")  # the fixture's 20 minutes: 4 blocks
    start = dt.datetime.fromtimestamp(start_ms / 1000, dt.UTC)
    rng = ["--from", start.isoformat(), "--to", (start + dt.timedelta(minutes=MINUTES)).isoformat()]
    base = ["--dsn", pg_dsn, "ab", "report", "--experiment", "exp", *rng]
    rc, out, _ = _report(base, capsys)
    assert rc == 0
    assert "A/B report exp" in out and "e2e_p50_ms" in out and "fail" in out and "split ok" in out
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT arm, metric, value, baseline, effect, ci_low, ci_high, p_value FROM {names.T_AB_RESULTS}").fetchall()
    metrics = {(r[0], r[1]) for r in rows}
    assert ("exp:treat", names.AB_METRIC_E2E_P95) in metrics and ("exp:control", names.AB_METRIC_SRM) in metrics
    assert all(arm != "exp:control" for arm, m in metrics if m != names.AB_METRIC_SRM)
    p95 = next(r for r in rows if r[:2] == ("exp:treat", names.AB_METRIC_E2E_P95))
    assert p95[4] == pytest.approx(p95[2] - p95[3]) and p95[5] <= p95[4] <= p95[6]
    rc, out, _ = _report([*base, "--json", "-", "--no-results"], capsys)
    report = json.loads(out)
    assert report["mode"] == "fixed" and {a["arm"] for a in report["arms"]} == {"control", "treat"}
    # cut by tenant: these windows are all the default tenant's, so one group, the same arms
    rc, out, _ = _report([*base, "--by", "tenant", "--json", "-"], capsys)
    cut = json.loads(out)
    assert rc == 0 and cut["by"] == "tenant" and [g["tenant"] for g in cut["groups"]] == [names.DEFAULT_TENANT]
    assert_same(cut["groups"][0]["arms"], report["arms"])
    rc, out, _ = _report([*base, "--by", "class", "--no-results"], capsys)
    assert rc == 0 and f"class = {names.DEFAULT_CLASS}" in out and "each arm by class" in out
    # bad input names the option
    for args, msg in [
        (["--dsn", pg_dsn, "ab", "report", "--experiment", "nope"], "--experiment: unknown experiment 'nope'"),
        ([*base[:-4], "--from", "yesterday"], "argument --from: cannot read 'yesterday' as a time"),
        ([*base, "--rollback"], "--rollback (or ab.auto_rollback) needs --sequential"),
        ([*base, "--sequential", "--rollback", "--by", "tenant"], "--by: a report cut by tenant or class never rolls back"),
        ([*base, "--by", "replica"], "argument --by: invalid choice: 'replica'"),
        ([*base[:-4], "--from=-1h", "--to=-2h"], "--from/--to: the range is empty"),
    ]:
        rc, _, err = _report(args, capsys)
        assert rc == 2 and msg in err, (args, err)
    # rollback through a real control API: the failing arm's weight -> 0, audited in action_log
    exps = E.parse(SPEC)
    audit = AuditLog(pg_dsn)
    router = Router([Replica("r0", "default")])
    rollout = Rollout(exps, audit=audit)
    loop = asyncio.new_event_loop()
    served = loop.run_until_complete(api.start(api.make_app(router, DistillControls(["default"]), token=TOKEN, rollout=rollout)))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("LLMSLA_CONTROL_TOKEN", TOKEN)
        monkeypatch.setenv("LLMSLA_CONTROL_URLS", served.url)
        monkeypatch.setenv("LLMSLA_AB_BLOCK_MINUTES", "2")  # 10 blocks in 20 minutes for the always-valid mode
        rc, out, err = _report([*base, "--sequential", "--rollback", "--json", str(tmp_path / "r.json")], capsys)
        assert rc == 0, err
        rep = json.loads((tmp_path / "r.json").read_text())
        assert rep["rollbacks"] and rep["rollbacks"][0]["arm"] == "treat" and rep["rollbacks"][0]["ok"]
        assert "rollback of treat: done" in out
        assert rollout.weights("exp") == {"control": 1.0, "treat": 0.0}
        assert audit.flush(10)
    finally:
        asyncio.run_coroutine_threadsafe(served.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    with psycopg.connect(pg_dsn) as conn:
        rec = conn.execute(f"SELECT actor, target, outcome, reason FROM {names.T_ACTION_LOG} WHERE action = 'set_arm_weight'").fetchone()
        assert rec[:3] == ("llmsla ab report", "exp/treat", "applied") and "always-valid test failed" in rec[3]
        exp = exps["exp"]
        weights, stable = ab_data.weights_timeline(conn, exp, dt.datetime.now(dt.UTC) - dt.timedelta(minutes=2), 4)
    assert weights[0].tolist() == [1.0, 1.0] and weights[-1].tolist() == [1.0, 0.0] and not stable.all()
    assert ab_data.expected_shares(exp, weights)[-1].tolist() == [1.0, 0.0]
