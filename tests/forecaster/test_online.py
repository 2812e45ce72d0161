"""The online loop on a real store: a simulated run with an injected ramp fault is windowed into
PostgreSQL, the scorer steps through it like the live loop (reading only windows that had ended),
and a strict webhook v4 server receives firing, then resolved, for the faulty replica."""

from __future__ import annotations

import datetime as dt

import numpy as np
import psycopg
from prometheus_client import CollectorRegistry

from llmsla import names
from llmsla.fleet import faults, scenarios
from llmsla.forecaster import alerts, artifact, features, online, windowing
from llmsla.forecaster import slo as slo_mod
from llmsla.store.migrate import migrate

from .webhook_server import WebhookServer

T0 = 1_800_000_000_000


def insert(conn: psycopg.Connection, table: str, keys: tuple, values: tuple, frame: windowing.Frame) -> None:
    cols = [*keys, *values]
    rows = []
    for i in range(len(frame["bucket"])):
        row = [dt.datetime.fromtimestamp(int(frame["bucket"][i]) / 1000, dt.UTC)]
        row += [str(frame[k][i]) if k != "gpu" else int(frame[k][i]) for k in keys[1:]]
        row += [None if np.isnan(frame[v][i]) else float(frame[v][i]) for v in values]
        rows.append(row)
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))})", rows)
    conn.commit()


def test_ramp_fault_fires_then_resolves_before_the_breach(tiny_cfg, tiny_trained, pg_dsn) -> None:
    cfg = tiny_cfg
    cfg.store.dsn = pg_dsn
    cfg.forecast.lag_s = 0.0
    # the tiny model's healthy risk sits just under its threshold: resolve without a band
    cfg.forecast.resolve_ratio, cfg.forecast.resolve_steps = 1.0, 3
    with psycopg.connect(pg_dsn) as conn:
        migrate(conn, cfg)
    fault = faults.Fault(400.0, 800.0, "ramp", "r1", 4.0)
    sc = scenarios.Scenario("azure_conv", 4242, "6b:5", 5200.0, 1300.0, 2.0, (fault,), 2.0)
    col = windowing.Collector()
    scenarios.run(sc, col, start_ms=T0)
    req = windowing.request_windows(col.requests, ttft_slo_ms=cfg.slo.ttft_ms, e2e_slo_ms=cfg.slo.e2e_ms)
    gpu = windowing.gpu_windows(col.gpus)
    with psycopg.connect(pg_dsn) as conn:
        insert(conn, names.T_REQUEST_WINDOWS, windowing.REQUEST_KEYS, windowing.REQUEST_VALUES, req)
        insert(conn, names.T_GPU_WINDOWS, windowing.GPU_KEYS, windowing.GPU_VALUES, gpu)
    # ground truth: r1's SLO breaches from the same windows
    n_steps = 260
    targets = features.targets_of(req)
    ts = features.build(req, gpu, windowing.empty(windowing.POLICY_KEYS, windowing.POLICY_VALUES),
                        targets=targets, t0_ms=T0, n_steps=n_steps, slos=slo_mod.from_config(cfg))
    breach = slo_mod.breaches(ts.counts, slo_mod.from_config(cfg), cfg.forecast.slo_window_steps)
    r1 = targets.index(features.Target(names.DEFAULT_POOL, "r1"))
    fault_breaches = [s for s in np.flatnonzero(breach[r1]) if s >= 80]
    assert fault_breaches, "the ramp must break the SLO"
    first_breach_ms = T0 + fault_breaches[0] * 5000

    art = artifact.load(tiny_trained[2])
    registry = CollectorRegistry()
    with WebhookServer() as srv:
        scorer = online.OnlineScorer(art, cfg, pg_dsn, registry=registry, poster=alerts.WebhookPoster(srv.url),
                                     external_url="http://127.0.0.1:9465")
        results = []
        for step in range(art.window, n_steps):  # the live loop's clock: each window as it ends
            results.append(scorer.step(T0 + (step + 1) * 5000))
        scorer.close()
    assert srv.errors == []
    skipped = [r for r in results if r.skipped]
    assert all("no request windows" in r.skipped for r in skipped)
    mine = [(b["status"], b["alerts"][0]) for b in srv.received if b["commonLabels"].get("replica") == "r1"]
    statuses = [s for s, _ in mine]
    risks = [round(r.risks.get("default/r1", -1), 2) for r in results]
    assert statuses[:1] == ["firing"] and "resolved" in statuses, (statuses, risks, art.threshold)
    fired_ms = int(dt.datetime.fromisoformat(mine[0][1]["startsAt"][:-1] + "+00:00").timestamp() * 1000)
    # fires while the fault is on. The tiny test model (W = 16, 4 epochs) fires after the first
    # breach here (E2E, ~11 steps into the ramp); lead times of the real model are measured by
    # `llmsla forecast eval` (docs/forecaster-eval.md), not asserted in a test.
    assert T0 + fault.start_s * 1000 <= fired_ms < T0 + fault.end_s * 1000, (fired_ms - T0, first_breach_ms - T0)
    assert statuses[-1] == "resolved", statuses  # and it ends resolved once the fault is over
    resolved_ms = int(dt.datetime.fromisoformat(mine[-1][1]["endsAt"][:-1] + "+00:00").timestamp() * 1000)
    assert resolved_ms > T0 + fault.end_s * 1000, (resolved_ms - T0, statuses)
    # every scored step wrote one forecasts row per target and set the gauge
    with psycopg.connect(pg_dsn) as conn:
        n = conn.execute(f"SELECT count(*), count(DISTINCT ts) FROM {names.T_FORECASTS}").fetchone()
    scored = [r for r in results if r.scored]
    assert n == (sum(r.scored for r in scored), len(scored))
    last = scored[-1].risks[f"{names.DEFAULT_POOL}/r1"]
    assert registry.get_sample_value(names.FORECAST_RISK, {"target": "replica", "model": "6b",
                                                            "pool": names.DEFAULT_POOL, "replica": "r1"}) == last
