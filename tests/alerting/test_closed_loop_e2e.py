"""The closed loop with real processes: reference workers behind latency proxies, the gateway and
its control API, a real Prometheus evaluating the generated rules (every window scaled by 1/240,
so 1h is 15 s), a real Alertmanager with the committed config, the receiver, the store.

1. Replica fault: r1 gets +1 s latency. The replica page fires, the receiver deweights then drains
   r1, r1's traffic goes to zero; the fault is removed, the alert resolves, r1 is restored in steps.
2. Pool fault: both replicas slow. The pool page fires, the student share rises in bounded steps
   to the policy's maximum with the cooler schedule, and falls back after the alert resolves.

Sequences are asserted from ``action_log`` (the receiver's rows and the control API's own rows)
and from the gateway's and control API's metrics; timings are printed (see docs/alerting.md).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.alerting import generate as G
from llmsla.alerting.engine import Engine
from llmsla.alerting.journal import PgJournal
from llmsla.alerting.receiver import make_app
from llmsla.app import wiring
from llmsla.control import api
from llmsla.control.audit import AuditLog
from llmsla.control.distill import DistillControls
from llmsla.control_client import ControlClient
from llmsla.httpkit import serve as start
from llmsla.worker.server import WorkerThread

from .faultproxy import LatencyProxy
from .harness import CONTROL_TOKEN, RECEIVER_TOKEN, load_policy, migrated
from .test_alertmanager import test_config as am_config

ROOT = Path(__file__).resolve().parents[2]
SCALE = 1 / 240
SCRAPE_S = 0.25
RATE = 30.0  # requests per second into the gateway
FAULT_S = 1.0
POLICY = """\
apiVersion: llmsla/v1
kind: ReceiverPolicy
timing: {hold_down_s: 2, max_hold_down_s: 8, backoff_reset_s: 60}
safety:
  max_drained_fraction: 0.5
  rate_limit: {actions: 20, per_s: 10}
rules:
  - name: replica-page
    match: {scope: replica, severity: page, source: burn_rate}
    target: replica
    deweight_to: 0.25
    drain_after_s: 1
    restore_weights: [0.25, 0.5, 1.0]
    restore_step_s: 1
  - name: pool-burn
    match: {scope: pool, severity: page, source: burn_rate}
    target: pool
    student_share: {step_pct: 10, max_pct: 20, step_s: 1}
    temperature_schedule: {name: exponential, params: {decay: 0.95}}
"""


def _q(url: str, query: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=5) as r:
        return json.load(r)["data"]["result"]


def _replica_requests(text: str, replica: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"{names.REQUESTS}_total{{") and f'replica="{replica}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.slow
def test_closed_loop_replica_drain_and_pool_shift(pg_dsn: str, tmp_path: Path, start_prometheus,
                                                 start_alertmanager) -> None:
    dsn = migrated(pg_dsn)
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.control.route_policy = "round_robin"  # the drain's effect is exact; LADR would already route around r1
    rules = {p.name: text for p, text in G.generate(cfg, specs_dir=ROOT / G.SPECS_DIR, rules_dir=Path("rules"),
                                                    tests_dir=None, window_scale=SCALE,
                                                    scrape_interval_s=SCRAPE_S).files.items()}
    token_file = tmp_path / "receiver-token"
    token_file.write_text(RECEIVER_TOKEN)
    workers = [WorkerThread(cfg) for _ in range(2)]
    marks: dict[str, float] = {}
    try:
        worker_urls = [w.start() for w in workers]

        async def main() -> None:
            proxies = [await LatencyProxy("127.0.0.1", int(u.rsplit(":", 1)[1])).start() for u in worker_urls]
            cfg.gateway.upstreams = [p.url for p in proxies]
            reg = CollectorRegistry()
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=reg, spool=None) as gw:
                router = gw.gateway.router
                audit = AuditLog(dsn)
                # the gateway's registry: its router's metrics carry the distillation gauge too, and the
                # control API renders the router's registry with the controls' (one gauge, not two)
                distill = DistillControls.from_config(cfg, router.pools(), audit=audit, router=router, registry=reg)
                crunner = await api.start(api.make_app(router, distill, token=CONTROL_TOKEN))
                cport = crunner.port
                journal = PgJournal(dsn)
                control = ControlClient([f"http://127.0.0.1:{cport}"], CONTROL_TOKEN, timeout_s=2, retries=3,
                                        backoff_s=0.05)
                engine = Engine(load_policy(POLICY), control, journal)
                rrunner = await start(make_app(engine, token=RECEIVER_TOKEN, tick_s=0.2), "127.0.0.1", 0)
                rport = rrunner.port
                am = await asyncio.to_thread(start_alertmanager, am_config(f"http://127.0.0.1:{rport}", token_file))
                prom = await asyncio.to_thread(
                    start_prometheus, {"gateway": [f"127.0.0.1:{gw.port}"], "control": [f"127.0.0.1:{cport}"]},
                    interval_s=SCRAPE_S, extra_files=rules, alertmanagers=[f"127.0.0.1:{am.port}"])
                session = aiohttp.ClientSession()
                stop = asyncio.Event()
                sem = asyncio.Semaphore(64)

                async def one(i: int) -> None:
                    async with sem:
                        body = {"model": cfg.worker.model, "prompt": "the quick brown fox", "max_tokens": 2,
                                "stream": True, "seed": i}
                        async with session.post(gw.url + "/v1/completions", json=body) as r:
                            await r.read()

                async def load() -> None:
                    i, t_next = 0, time.monotonic()
                    tasks = set()
                    while not stop.is_set():
                        t = asyncio.create_task(one(i))
                        tasks.add(t)
                        t.add_done_callback(tasks.discard)
                        i += 1
                        t_next += 1 / RATE
                        await asyncio.sleep(max(0.0, t_next - time.monotonic()))
                    await asyncio.gather(*tasks, return_exceptions=True)

                async def gateway_r1() -> float:
                    async with session.get(gw.url + "/metrics") as r:
                        return _replica_requests(await r.text(), "r1")

                async def until(pred, timeout_s: float, what: str) -> float:
                    deadline = time.monotonic() + timeout_s
                    while time.monotonic() < deadline:
                        if await pred():
                            return time.monotonic()
                        await asyncio.sleep(0.05)
                    raise AssertionError(f"timed out waiting for {what}; receiver rows: "
                                         f"{[(r['action'], r['decision'], r['outcome']) for r in journal.recent]}")

                def acted(action: str, decision: str, target: str) -> object:
                    async def pred() -> bool:
                        return any(r["action"] == action and r["decision"] == decision and r["target"] == target
                                   and r["outcome"] == "applied" for r in journal.recent)
                    return pred

                loader = asyncio.create_task(load())
                try:
                    await asyncio.sleep(8)  # healthy history in every window up to the scaled 30m
                    # -- 1. replica fault --------------------------------------------------------
                    marks["fault_on"] = time.monotonic()
                    proxies[1].delay_s = FAULT_S
                    marks["deweight"] = await until(acted("set_weight", "deweight", "replica:default/r1"), 30, "deweight")
                    marks["drain"] = await until(acted("drain", "drain", "replica:default/r1"), 10, "drain")
                    assert router.is_drained("r1")
                    await asyncio.sleep(FAULT_S + 0.5)  # requests already on r1 finish
                    before = await gateway_r1()
                    await asyncio.sleep(2.0)
                    assert await gateway_r1() == before, "a drained replica still got traffic"
                    proxies[1].delay_s = 0.0
                    marks["fault_off"] = time.monotonic()

                    async def normal() -> bool:
                        st = (await journal.states("replica:")).get("replica:default/r1", {})
                        return st.get("stage") == "normal" and not router.is_drained("r1")
                    marks["restored"] = await until(normal, 40, "r1 restored")
                    assert router.replica("r1").weight == 1.0
                    after = await gateway_r1()
                    await asyncio.sleep(1.0)
                    assert await gateway_r1() > after, "r1 gets traffic again"
                    # -- 2. pool fault -----------------------------------------------------------
                    await asyncio.sleep(2)
                    marks["pool_fault_on"] = time.monotonic()
                    for p in proxies:
                        p.delay_s = FAULT_S
                    marks["shift"] = await until(acted("set_student_share", "shift", "pool:default"), 30, "shift")

                    async def at_max() -> bool:
                        return distill.student_share_pct("default") == 20.0
                    marks["share_max"] = await until(at_max, 10, "share at its maximum")
                    assert distill.schedule("default").name == "exponential"
                    for p in proxies:
                        p.delay_s = 0.0
                    marks["pool_fault_off"] = time.monotonic()

                    async def back() -> bool:
                        return distill.student_share_pct("default") == 0.0 and distill.schedule("default").name == "constant"
                    # the pool alert resolves once its longest window (6h at 1/240: 90 s) has cooled;
                    # with the replica fault inside that window too, that can take most of it
                    marks["share_back"] = await until(back, 120, "share back to 0")
                    # Prometheus saw the share move through the control API's gauge, within its bound
                    # the range covers the whole shift: going back to 0 may take most of a minute
                    since_shift = int(time.monotonic() - marks["shift"]) + 10
                    peak = _q(prom.url, f'max_over_time({names.DISTILL_STUDENT_SHARE_RATIO}{{job="control"}}[{since_shift}s])')
                    assert float(peak[0]["value"][1]) == pytest.approx(0.2)
                    assert not router.is_drained("r0") and not router.is_drained("r1")
                finally:
                    stop.set()
                    await loader
                    await session.close()
                    await rrunner.stop()
                    await control.close()
                    await journal.close()
                    await crunner.stop()
                    audit.flush(5)
            for p in proxies:
                await p.stop()

        asyncio.run(main())
    finally:
        for w in workers:
            w.stop()

    # -- the audit log: the receiver's sequence, and the control API's own record of it ----------
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT source, action, target, decision, outcome, alertname, alert_status, latency_ms "
                            f"FROM {names.T_ACTION_LOG} ORDER BY ts, id").fetchall()
    recv = [(a, t, d) for s, a, t, d, o, *_ in rows if s == "alert_receiver" and a != "alert" and o == "applied"]
    # r1: the designed sequence first; later, while r1's earlier fault is still inside the longest
    # burn-rate window (90 s here), the pool fault may page r1 again: a deweight and its restore,
    # never a drain of a replica that is no worse than its pool
    r1 = [(a, d) for a, t, d in recv if t == "replica:default/r1"]
    designed = [("set_weight", "deweight"), ("drain", "drain"), ("undrain", "restore"), ("set_weight", "restore"),
                ("set_weight", "restore")]
    assert r1[:5] == designed, r1
    assert set(r1[5:]) <= {("set_weight", "deweight"), ("set_weight", "restore")} and (not r1[5:] or r1[-1][1] == "restore"), r1
    # the pool: every step up came down again, the schedule was switched and restored; under load
    # the pool's own page may also come during the replica fault (r1 is half of it), a cycle more
    pool = [(a, d) for a, t, d in recv if t == "pool:default"]
    assert pool[0] == ("set_temperature_schedule", "schedule") and pool[-1] == ("set_student_share", "unshift"), pool
    assert pool.count(("set_student_share", "shift")) == pool.count(("set_student_share", "unshift")) >= 2, pool
    assert pool.count(("set_temperature_schedule", "schedule")) == pool.count(
        ("set_temperature_schedule", "schedule_restore")) >= 1, pool
    # r0 was never drained; in the pool fault (both replicas slow) the replica rule may page it
    # when, by chance, it runs 1.5x its pool's error ratio: then a deweight and its restore
    r0 = [(a, d) for a, t, d in recv if t == "replica:default/r0"]
    assert set(r0) <= {("set_weight", "deweight"), ("set_weight", "restore")} and (not r0 or r0[-1][1] == "restore"), r0
    # the control API's own record: the same changes, one row each, in the same order
    ctl = [(a, t) for s, a, t, *_ in rows if s == "control_api"]
    assert [a for a, t in ctl if t == "r1"] == [a for a, _ in r1]
    assert [a for a, t in ctl if t == "r0"] == [a for a, _ in r0]
    assert [a for a, t in ctl if t == "default"] == [a for a, _ in pool]
    alerts = [(n, st, d) for s, a, t, d, o, n, st, _ in rows if s == "alert_receiver" and a == "alert"]
    assert ("TtftReplicaErrorBudgetBurn", "firing", "act") in alerts
    assert ("TtftReplicaErrorBudgetBurn", "resolved", "resolved") in alerts
    # the pool page acted (the pool's actions above), or was deferred while a replica of the pool was
    # being acted on and acted on a later notification
    assert any(n == "TtftErrorBudgetBurn" and st == "firing" and d in ("act", "deferred") for n, st, d in alerts), alerts
    timings = {
        "fault_to_deweight_s": marks["deweight"] - marks["fault_on"],
        "fault_to_drain_s": marks["drain"] - marks["fault_on"],
        "fault_off_to_restored_s": marks["restored"] - marks["fault_off"],
        "pool_fault_to_shift_s": marks["shift"] - marks["pool_fault_on"],
        "pool_fault_to_max_share_s": marks["share_max"] - marks["pool_fault_on"],
        "pool_fault_off_to_share_back_s": marks["share_back"] - marks["pool_fault_off"],
    }
    print("closed loop timings (window scale 1/240):", json.dumps({k: round(v, 2) for k, v in timings.items()}))
