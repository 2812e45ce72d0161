"""A real control API (router + distillation controls, audited to the store) and a real receiver
on loopback, both in this process's event loop, with a clock the test moves."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import psycopg

from llmsla import config as config_mod
from llmsla import names
from llmsla.alerting import policy as policy_mod
from llmsla.alerting.engine import Engine
from llmsla.alerting.journal import Journal, PgJournal
from llmsla.alerting.receiver import make_app
from llmsla.alerting.webhook import fingerprint_of
from llmsla.control import api
from llmsla.control.audit import AuditLog
from llmsla.control.distill import DistillControls
from llmsla.control.router import Replica, Router
from llmsla.control.shed import ShedControls
from llmsla.control_client import ControlClient
from llmsla.httpkit import serve as start
from llmsla.store.connection import connect
from llmsla.store.migrate import migrate
from llmsla.yamlsrc import load_docs

RECEIVER_TOKEN = "receiver-s3cret-for-tests"
CONTROL_TOKEN = "control-s3cret-for-tests"
AUTH = {"Authorization": f"Bearer {RECEIVER_TOKEN}"}
POOL = names.DEFAULT_POOL

POLICY = """\
apiVersion: llmsla/v1
kind: ReceiverPolicy
timing:
  hold_down_s: 10
  max_hold_down_s: 40
  backoff_reset_s: 100
safety:
  max_drained_fraction: 0.5
  rate_limit: {actions: 20, per_s: 60}
rules:
  - name: replica-page
    match: {scope: replica, severity: page, source: burn_rate}
    target: replica
    deweight_to: 0.25
    drain_after_s: 5
    restore_weights: [0.25, 0.5, 1.0]
    restore_step_s: 5
  - name: pool-burn
    match: {scope: pool, severity: [page, ticket], source: [burn_rate, forecaster]}
    target: pool
    student_share: {step_pct: 10, max_pct: 20, step_s: 5}
    temperature_schedule: {name: exponential, params: {decay: 0.95}}
"""


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def migrated(dsn: str) -> str:
    cfg = config_mod.load(env={})
    with connect(dsn) as conn:
        migrate(conn, cfg)
    return dsn


def load_policy(text: str = POLICY) -> policy_mod.Policy:
    return policy_mod.parse(next(load_docs(text, "test-policy.yaml")))


T0 = dt.datetime(2025, 5, 1, 12, 0, tzinfo=dt.UTC)


def alert(status: str = "firing", *, replica: str | None = "r1", scope: str = "replica", severity: str = "page",
          slo: str = "ttft", starts_min: float = 0, fp: str | None = None, source: str = "burn_rate",
          pool: str = POOL, **labels: str) -> dict[str, Any]:
    lab = {"alertname": "TtftReplicaErrorBudgetBurn" if scope == "replica" else "TtftErrorBudgetBurn",
           "severity": severity, "slo": slo, "scope": scope, "source": source, "model": "llmsla-tiny", "pool": pool,
           **labels}
    if replica is not None:
        lab["replica"] = replica
    starts = T0 + dt.timedelta(minutes=starts_min)
    out = {"status": status, "labels": lab, "annotations": {"summary": "x"},
           "startsAt": starts.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z",  # nanoseconds, as Go writes them
           "endsAt": (starts + dt.timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ") if status == "resolved"
           else "0001-01-01T00:00:00Z",
           "generatorURL": "http://prometheus/graph", "fingerprint": fp or fingerprint_of(lab)}
    return out


def note(*alerts: dict[str, Any], group_key: str = '{}:{slo="ttft"}') -> dict[str, Any]:
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return {"version": "4", "groupKey": group_key, "truncatedAlerts": 0, "status": status,
            "receiver": "llmsla-receiver", "groupLabels": {"slo": "ttft"}, "commonLabels": {},
            "commonAnnotations": {}, "externalURL": "http://alertmanager:9093", "alerts": list(alerts)}


@dataclass
class Harness:
    router: Router
    distill: DistillControls
    engine: Engine
    clock: Clock
    url: str
    control_url: str
    session: aiohttp.ClientSession
    dsn: str
    shed: ShedControls

    async def post(self, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with self.session.post(self.url + "/v1/alerts", data=data,
                                     headers={"Content-Type": "application/json", **AUTH, **(headers or {})}) as r:
            return r.status, await r.json(content_type=None)

    async def tick(self, advance_s: float = 0.0) -> int:
        self.clock.t += advance_s
        return await self.engine.tick()

    def weight(self, rid: str) -> float:
        return self.router.replica(rid).weight

    def rows(self, where: str = "source = 'alert_receiver'") -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn) as conn:
            cur = conn.execute(f"SELECT action, target, decision, outcome, alertname, fingerprint, alert_status, "
                               f"dedupe_key, latency_ms, params, reason, actor, source FROM {names.T_ACTION_LOG} "
                               f"WHERE {where} ORDER BY ts, id")
            cols = [d.name for d in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


@contextlib.asynccontextmanager
async def harness(dsn: str, *, replicas: tuple[str, ...] = ("r0", "r1"), policy_text: str = POLICY,
                  journal: Journal | None = None, control_urls: list[str] | None = None,
                  clock: Clock | None = None) -> AsyncIterator[Harness]:
    router = Router([Replica(r, POOL) for r in replicas], "round_robin")
    audit = AuditLog(dsn)
    distill = DistillControls([POOL], max_share_step_pct=10, audit=audit)
    shed = ShedControls(names.DEFAULT_CLASSES, [POOL], audit=audit, router=router)
    crunner = await api.start(api.make_app(router, distill, token=CONTROL_TOKEN, shed=shed), "127.0.0.1", 0)
    control_url = crunner.url
    clock = clock or Clock()
    journal = journal or PgJournal(dsn)
    control = ControlClient(control_urls or [control_url], CONTROL_TOKEN, timeout_s=1.0, retries=2, backoff_s=0.01)
    engine = Engine(load_policy(policy_text), control, journal, clock=clock)
    runner = await start(make_app(engine, token=RECEIVER_TOKEN, tick_s=None), "127.0.0.1", 0)
    session = aiohttp.ClientSession()
    try:
        yield Harness(router, distill, engine, clock, runner.url, control_url, session, dsn, shed)
    finally:
        await session.close()
        await runner.stop()
        await control.close()
        await journal.close()
        await crunner.stop()
        audit.flush(5)
