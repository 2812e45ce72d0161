"""The forecaster scores its own accuracy from the store and exports it on /metrics.

An hour of request windows for one replica is written into the embedded PostgreSQL with two
SLO breaches (E2E: 20 of 20 requests slow for three steps), and an hour of ``forecasts`` rows
as the online scorer would have written them: an alarm 45 s before the first breach, one with no
breach after it, none before the second breach. The forecast service then takes one real step
(the live accuracy runs on a service's first step) and its ``/metrics`` must show precision and
recall 0.5, a lead of 45 s, the false alarms per healthy day and the model's validation recall."""

from __future__ import annotations

import asyncio

import numpy as np
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.forecaster import accuracy, artifact, features, online, store_io, windowing
from llmsla.forecaster.service import ForecastService
from llmsla.store.migrate import migrate

from .test_online import _scrape

T0 = 1_800_000_000_000  # on an hour boundary (the shell's chunks)
STEP_MS = features.STEP_MS
N = 720  # one hour of steps
BAD = ((300, 303), (500, 503))  # steps whose requests all miss the E2E objective
HIGH = ((100, 104), (290, 300))  # steps the stored risk is twice the threshold
THRESHOLD = 0.5


def _windows() -> windowing.Frame:
    rows = {k: [] for k in (*windowing.REQUEST_KEYS, *windowing.REQUEST_VALUES)}
    for k in range(N):
        bad = any(a <= k < b for a, b in BAD)
        for col in windowing.REQUEST_VALUES:
            rows[col].append(0.0)
        rows["bucket"].append(T0 + k * STEP_MS)
        for key, v in (("model", "6b"), ("pool", names.DEFAULT_POOL), ("replica", "r0"), ("arm", ""),
                       (names.L_TENANT, names.DEFAULT_TENANT), (names.L_CLASS, names.DEFAULT_CLASS)):
            rows[key].append(v)
        for col, v in (("requests", 20), ("ok", 20), ("ttft_count", 20), ("ttft_within_slo", 20),
                       ("e2e_within_slo", 0 if bad else 20), ("qps", 4.0), ("ttft_slo_ms", 800.0),
                       ("e2e_slo_ms", 8000.0), ("output_tokens", 2000), ("output_tps", 400.0), ("itl_n", 2000),
                       ("itl_sum_ms", 30000.0), ("itl_sumsq_ms2", 500000.0)):
            rows[col][-1] = float(v)
    return {k: np.asarray(v, dtype=np.int64 if k == "bucket" else object if k in windowing.REQUEST_KEYS else float)
            for k, v in rows.items()}


def test_the_service_exports_its_accuracy_scored_from_the_store(pg_dsn) -> None:
    cfg = config_mod.load(env={})
    cfg.store.dsn = pg_dsn
    cfg.forecast.lag_s = 0.0
    cfg.forecast.accuracy_window_s = 3600.0
    art = artifact.load(artifact.PRETRAINED)
    name = f"lstm-{art.version}"
    with psycopg.connect(pg_dsn) as conn:
        migrate(conn, cfg)
        store_io.write_frame(conn, names.T_REQUEST_WINDOWS, windowing.REQUEST_KEYS, windowing.REQUEST_VALUES,
                             _windows())
        store_io.write_forecasts(conn, [
            (T0 + k * STEP_MS, name, names.FORECAST_TARGET_REPLICA, names.DEFAULT_POOL, "r0", 25, None, THRESHOLD,
             2 * THRESHOLD if any(a <= k < b for a, b in HIGH) else 0.1 * THRESHOLD) for k in range(N)])

    registry = CollectorRegistry()
    results: list[online.StepResult] = []

    async def main() -> dict[tuple, float]:
        svc = ForecastService(cfg, registry, lambda url: online.OnlineScorer(art, cfg, pg_dsn, registry=registry,
                                                                              external_url=url))
        url = await svc.start("127.0.0.1", 0)
        try:  # the step scored is the last one written (lag 0)
            await svc.run(asyncio.Event(), steps=1, interval_s=0.0, clock=lambda: (T0 + N * STEP_MS) / 1000,
                          on_step=lambda n, r: results.append(r))
            return await _scrape(url)
        finally:
            await svc.close()

    scraped = asyncio.run(main())
    (res,) = results
    assert res.scored and res.step_ms == T0 + (N - 1) * STEP_MS and res.accuracy is not None
    acc = res.accuracy[25]
    # fires at 291 (2nd step high), the breach begins at 300: warned 9 steps = 45 s ahead; the
    # alarm at 101 has no breach within 2 min after it; nothing warned of the breach at 500
    assert (acc.events, acc.warned, acc.leads_s, acc.notifications, acc.false_alarms) == (2, 1, [45.0], 2, 1)
    # healthy: the 696 steps whose 2 min after have passed, less both breaches' [onset - 2 min, end]
    # (each breach lasts 14 steps: the 60 s SLO window holds the bad steps for 11 more)
    healthy_days = (N - 24 - 2 * (24 + 14)) * 5 / 86400
    assert acc.healthy_days == pytest.approx(healthy_days)
    h = (names.L_HORIZON, "25")
    assert scraped[(names.FORECAST_PRECISION, (h,))] == 0.5
    assert scraped[(names.FORECAST_RECALL, (h,))] == 0.5
    assert scraped[(names.FORECAST_BREACHES, (h,))] == 2
    assert scraped[(names.FORECAST_FALSE_ALARMS_PER_DAY, (h,))] == pytest.approx(1 / healthy_days)
    lead = names.FORECAST_LEAD_SECONDS
    assert scraped[(lead + "_bucket", (h, ("le", "30")))] == 0
    assert scraped[(lead + "_bucket", (h, ("le", "45")))] == 1
    assert scraped[(lead + "_bucket", (h, ("le", "+Inf")))] == 1
    assert scraped[(lead + "_gsum", (h,))] == 45.0
    assert scraped[(names.FORECAST_VALIDATION_RECALL, (h, (names.L_MODEL, name)))] == pytest.approx(
        accuracy.validation_recall(art.meta))
    assert 0 < accuracy.validation_recall(art.meta) < 1
