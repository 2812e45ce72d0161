"""The online loop on a real store warns before the SLO breaks.

A simulated run with an injected ramp fault (held-out trace time and seed) is windowed into the
embedded PostgreSQL; the forecast service - the HTTP kit serving ``/metrics``, the scorer
stepping beside it - walks through it on a simulated clock like the live loop (each window as
it ends); a strict webhook v4 server receives the alerts. The model is the committed fixture
(``forecaster/pretrained``: the default LSTM, trained deterministically by
``scripts/forecast-fixture.sh``) with its own threshold and the default alarm policy. The alert
for the faulty replica must start after the fault started and no later than the start of the
replica's first SLO-breaching window (at least one step of lead), then resolve after the fault
ended; the receiver's actions are the receiver's tests (issue 11)."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass

import aiohttp
import numpy as np
import psycopg
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmsla import config as config_mod
from llmsla import names
from llmsla.fleet import faults, scenarios
from llmsla.forecaster import alerts, artifact, features, online, store_io, windowing
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.service import ForecastService
from llmsla.store.migrate import migrate

from .webhook_server import WebhookServer

T0 = 1_800_000_000_000
FIXTURE = artifact.PRETRAINED
STEP_MS = features.STEP_MS


def _ms(rfc3339: str) -> int:
    return int(dt.datetime.fromisoformat(rfc3339[:-1] + "+00:00").timestamp() * 1000)


async def _scrape(url: str) -> dict[tuple, float]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    return {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
            for fam in text_string_to_metric_families(text) for smp in fam.samples}


@dataclass
class Ramp:
    """A held-out simulated run with a ramp fault on r1, windowed into the store, and the truth."""

    cfg: config_mod.Config
    art: artifact.Artifact
    n_steps: int
    first_breach_ms: int
    fault_start_ms: int
    fault_end_ms: int


def ramp_in_store(pg_dsn: str) -> Ramp:
    cfg = config_mod.load(env={})  # the default alarm policy: fire after 2, resolve after 6 below 0.8 x
    cfg.store.dsn = pg_dsn
    cfg.forecast.lag_s = 0.0  # the simulated clock reads each window the moment it ends
    with psycopg.connect(pg_dsn) as conn:
        migrate(conn, cfg)
    art = artifact.load(FIXTURE)
    fault = faults.Fault(400.0, 800.0, "ramp", "r1", 4.0)
    # a held-out slice of the stretched trace (test split: its last 30 %) and seed
    sc = scenarios.Scenario("azure_conv", 4242, "6b:5", 5200.0, 1300.0, 2.0, (fault,), 2.0)
    col = windowing.Collector()
    scenarios.run(sc, col, start_ms=T0, engine_sink=col.engine)
    req = windowing.request_windows(col.requests, ttft_slo_ms=cfg.slo.ttft_ms, e2e_slo_ms=cfg.slo.e2e_ms)
    gpu = windowing.gpu_windows(col.gpus)
    eng = windowing.engine_windows(col.engines)
    with psycopg.connect(pg_dsn) as conn:
        store_io.write_frame(conn, names.T_REQUEST_WINDOWS, windowing.REQUEST_KEYS, windowing.REQUEST_VALUES, req)
        store_io.write_frame(conn, names.T_GPU_WINDOWS, windowing.GPU_KEYS, windowing.GPU_VALUES, gpu)
        store_io.write_frame(conn, names.T_ENGINE_WINDOWS, windowing.ENGINE_KEYS, windowing.ENGINE_VALUES, eng)

    # ground truth, independently of the scorer: r1's SLO windows from the same rows
    n_steps = int(sc.duration_s * 1000 // STEP_MS)
    slos = slo_mod.from_config(cfg)
    targets = features.targets_of(req)
    ts = features.build(req, gpu, windowing.empty(windowing.POLICY_KEYS, windowing.POLICY_VALUES),
                        targets=targets, t0_ms=T0, n_steps=n_steps, slos=slos)
    breach = slo_mod.breaches(ts.counts, slos, cfg.forecast.slo_window_steps)
    r1 = targets.index(features.Target(names.DEFAULT_POOL, "r1"))
    steps = np.flatnonzero(breach[r1])
    assert len(steps), "the ramp must break r1's SLO"
    first_breach_ms = T0 + int(steps[0]) * STEP_MS  # start of r1's first breaching window
    fault_start_ms, fault_end_ms = T0 + int(fault.start_s * 1000), T0 + int(fault.end_s * 1000)
    assert fault_start_ms < first_breach_ms < fault_end_ms, "r1 is healthy until the ramp breaks it"
    return Ramp(cfg, art, n_steps, first_breach_ms, fault_start_ms, fault_end_ms)


def test_ramp_fault_warns_before_the_breach_then_resolves(pg_dsn) -> None:
    ramp = ramp_in_store(pg_dsn)
    cfg, art, n_steps = ramp.cfg, ramp.art, ramp.n_steps
    first_breach_ms, fault_start_ms, fault_end_ms = ramp.first_breach_ms, ramp.fault_start_ms, ramp.fault_end_ms

    results: list[online.StepResult] = []
    registry = CollectorRegistry()
    now = [T0 + art.window * STEP_MS]  # the first moment a full input window has ended

    def on_step(n: int, res: online.StepResult) -> None:
        results.append(res)
        now[0] += STEP_MS

    async def main(srv: WebhookServer) -> tuple[str, dict[tuple, float]]:
        svc = ForecastService(cfg, registry, lambda url: online.OnlineScorer(
            art, cfg, pg_dsn, registry=registry, poster=alerts.WebhookPoster(srv.url), external_url=url))
        url = await svc.start("127.0.0.1", 0)
        try:
            await svc.run(asyncio.Event(), steps=n_steps - art.window + 1, interval_s=0.0,
                          clock=lambda: now[0] / 1000, on_step=on_step)
            return url, await _scrape(url)
        finally:
            await svc.close()

    with WebhookServer() as srv:
        url, scraped = asyncio.run(main(srv))
    assert srv.errors == []
    assert all("no request windows" in r.skipped for r in results if r.skipped)
    mine = [(b["status"], b["alerts"][0]) for b in srv.received if b["commonLabels"].get("replica") == "r1"]
    statuses = [s for s, _ in mine]
    risks = {(r.step_ms - T0) // STEP_MS: round(r.risks.get("default/r1", -1), 3) for r in results}
    assert statuses[:1] == ["firing"], (statuses, risks, art.threshold)
    fired_ms = _ms(mine[0][1]["startsAt"])
    # the early warning: raised after the fault started, from windows that all ended no later
    # than the first breaching window began
    assert fault_start_ms <= fired_ms <= first_breach_ms, (
        (fired_ms - T0) // STEP_MS, (first_breach_ms - T0) // STEP_MS, risks, art.threshold)
    assert statuses[-1] == "resolved", statuses  # and it is over once the fault is
    assert _ms(mine[-1][1]["endsAt"]) > fault_end_ms, statuses
    assert mine[0][1]["generatorURL"] == url and srv.received[0]["externalURL"] == url
    # every scored step wrote one forecasts row per target, and /metrics (the HTTP kit) shows
    # the last risk of every target
    with psycopg.connect(pg_dsn) as conn:
        n = conn.execute(f"SELECT count(*), count(DISTINCT ts) FROM {names.T_FORECASTS}").fetchone()
    scored = [r for r in results if r.scored]
    assert n == (sum(r.scored for r in scored), len(scored))
    labels = (("horizon", "25"), ("model", "6b"), ("pool", names.DEFAULT_POOL), ("replica", "r1"), ("target", "replica"))
    assert scraped[(names.FORECAST_RISK, labels)] == scored[-1].risks[f"{names.DEFAULT_POOL}/r1"]
    assert scraped[(names.FORECAST_SCORE_SECONDS + "_count", ())] == len(scored)


def test_forecast_alert_reaches_the_receiver_which_acts_before_the_breach(pg_dsn) -> None:
    """The loop of issue 12 closed for real: the forecast service posts to the real receiver
    (its built-in policy, its store journal), which deweights r1 through a real control API -
    and that action is in ``action_log`` at a step that ended before r1's first breaching window
    began."""
    from llmsla.alerting.engine import Engine
    from llmsla.alerting.journal import PgJournal
    from llmsla.alerting.policy import load as load_policy
    from llmsla.alerting.receiver import make_app as receiver_app
    from llmsla.control import api
    from llmsla.control.audit import AuditLog
    from llmsla.control.distill import DistillControls
    from llmsla.control.router import Replica, Router
    from llmsla.control_client import ControlClient
    from llmsla.httpkit import serve

    ramp = ramp_in_store(pg_dsn)
    cfg, art = ramp.cfg, ramp.art
    token, control_token = "rcv-token-for-online-tests", "ctl-token-for-online-tests"
    router = Router([Replica(f"r{i}", names.DEFAULT_POOL) for i in range(5)], "round_robin")
    audit = AuditLog(pg_dsn)
    distill = DistillControls([names.DEFAULT_POOL], audit=audit)
    now = [T0 + art.window * STEP_MS]
    acted_at: list[int] = []  # simulated ms of the step after which r1's weight was first below 1

    def on_step(n: int, res: online.StepResult) -> None:
        if not acted_at and router.replica("r1").weight < 1.0:
            acted_at.append(now[0])
        now[0] += STEP_MS

    async def main() -> None:
        control = await api.start(api.make_app(router, distill, token=control_token))
        client = ControlClient([control.url], control_token, timeout_s=5.0, retries=2, backoff_s=0.05)
        journal = PgJournal(pg_dsn)
        receiver = await serve(receiver_app(Engine(load_policy(None), client, journal), token=token, tick_s=None),
                               "127.0.0.1", 0)
        registry = CollectorRegistry()
        svc = ForecastService(cfg, registry, lambda url: online.OnlineScorer(
            art, cfg, pg_dsn, registry=registry, external_url=url,
            poster=alerts.WebhookPoster(receiver.url + "/v1/alerts", token=token)))
        await svc.start("127.0.0.1", 0)
        try:  # up to the first breaching window, no further: the action must come before it
            steps = (ramp.first_breach_ms - now[0]) // STEP_MS + 1
            await svc.run(asyncio.Event(), steps=steps, interval_s=0.0, clock=lambda: now[0] / 1000,
                          on_step=on_step)
        finally:
            await svc.close()
            await receiver.stop()
            await client.close()
            await journal.close()
            await control.stop()
            audit.flush(10)

    asyncio.run(main())
    assert acted_at, "the receiver did not act on the forecast before the breach"
    assert ramp.fault_start_ms <= acted_at[0] <= ramp.first_breach_ms
    assert router.replica("r1").weight == 0.5 and not router.is_drained("r1")  # deweighted, never drained
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            f"SELECT source, action, target, decision, outcome, alertname FROM {names.T_ACTION_LOG} "
            "ORDER BY ts, id").fetchall()
    target = f"replica:{names.DEFAULT_POOL}/r1"
    # the receiver's audit: the forecast alert, its decision, and the action it took (the control
    # API audits the same change from its side)
    assert rows[0] == ("alert_receiver", "alert", target, "act", "received", names.FORECAST_ALERTNAME), rows
    assert ("alert_receiver", "set_weight", target, "deweight", "applied", None) in rows, rows
    assert ("control_api", "set_weight", "r1", None, "applied", None) in rows, rows


def test_a_drained_replica_is_not_scored_and_its_alert_resolves(pg_dsn) -> None:
    """The receiver drains r1 on the forecast alert: r1 serves nothing from then on (its windows
    after the drain are deleted here, as a drained replica writes none). The scorer must stop
    scoring r1 after ``forecast.idle_s`` and resolve its alert, or the firing alert would hold the
    receiver's restore of the replica forever (found by ``llmsla demo --real``)."""
    ramp = ramp_in_store(pg_dsn)
    cfg, art = ramp.cfg, ramp.art
    scorer = online.OnlineScorer(art, cfg, pg_dsn)
    now = T0 + art.window * STEP_MS
    fired = None
    while fired is None and now < ramp.fault_end_ms:
        res = scorer.step(now)
        if any(s == "firing" and a["labels"].get("replica") == "r1" for s, a in res.notifications):
            fired = now
        now += STEP_MS
    assert fired is not None, "the ramp fires r1's forecast alert"
    drained = fired + STEP_MS
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f"DELETE FROM {names.T_REQUEST_WINDOWS} WHERE replica = 'r1' AND bucket >= to_timestamp(%s / 1000.0)",
                     (drained - STEP_MS,))
    idle_steps = round(cfg.forecast.idle_s / names.REQUEST_WINDOW_S)
    steps = []
    for _ in range(idle_steps + 3):
        steps.append(scorer.step(now))
        now += STEP_MS
    scorer.close()
    r1 = f"{names.DEFAULT_POOL}/r1"
    resolved = [(res, a) for res in steps for s, a in res.notifications
                if s == "resolved" and a["labels"].get("replica") == "r1"]
    assert len(resolved) == 1, [(r.step_ms, r.notifications) for r in steps]
    res, alert = resolved[0]
    assert "no requests" in alert["annotations"][names.ANN_SUMMARY]
    # scored (and stored) while r1 still had a request in the last idle_s, not after
    assert r1 not in res.risks and r1 in res.idle
    assert all(r1 in r.risks for r in steps if r.step_ms + STEP_MS - cfg.forecast.idle_s * 1000 < drained - STEP_MS)
    assert all(r1 not in r.risks for r in steps[steps.index(res):])
    assert any(r.risks for r in steps[steps.index(res):]), "the other targets are still scored"
    with psycopg.connect(pg_dsn) as conn:
        last = conn.execute(f"SELECT max(ts) FROM {names.T_FORECASTS} WHERE replica = 'r1'").fetchone()[0]
    assert last.timestamp() * 1000 < res.step_ms
