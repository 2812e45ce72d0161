"""Shedding by the error budget, end to end with real processes: the reference worker (two batch
slots), the gateway and its control API, a real Prometheus evaluating the generated TTFT rules
(windows scaled by 1/240) of the interactive class's spec, a real Alertmanager with the
committed config, the receiver with a class rule, the store.

A batch tenant floods the pool; the interactive TTFT page fires; the receiver sheds batch in
steps; interactive TTFT attainment recovers; the flood stops, the page resolves and shedding
steps back down to 0. Interactive attainment is measured client-side in the same run, during
the flood before any shedding and during the flood with batch shed.

The rules are generated from the shipped per-class example spec
(``deploy/slo/examples/ttft-interactive.yaml``), its threshold delegated to ``slo.ttft_ms`` so the
client-side attainment below is measured against the objective the page fires on.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import psycopg
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
from llmsla.control_client import ControlClient
from llmsla.httpkit import serve as start
from llmsla.worker.server import WorkerThread

from .harness import CONTROL_TOKEN, RECEIVER_TOKEN, load_policy, migrated
from .test_alertmanager import test_config as am_config

ROOT = Path(__file__).resolve().parents[2]
SCALE = 1 / 240
SCRAPE_S = 0.25
INTERACTIVE_RATE = 4.0  # requests per second
BATCH_CLIENTS = 16  # closed loop: each sends its next request when the last one ends
POLICY = """\
apiVersion: llmsla/v1
kind: ReceiverPolicy
timing: {hold_down_s: 2, max_hold_down_s: 8, backoff_reset_s: 60}
safety:
  rate_limit: {actions: 40, per_s: 10}
rules:
  - name: class-burn
    match: {scope: pool, severity: page, source: burn_rate, class: "*"}
    target: class
    shed: {step: 0.5, max_share: 1.0, step_s: 1}
"""


def _interactive_rules(cfg: config_mod.Config, specs: Path) -> dict[str, str]:
    """The rules of the shipped interactive-class TTFT spec (threshold: ``slo.ttft_ms``)."""
    example = (ROOT / G.SPECS_DIR / "examples" / "ttft-interactive.yaml").read_text()
    assert "value: 0.5\n" in example
    specs.mkdir()
    (specs / "ttft-interactive.yaml").write_text(example.replace("value: 0.5\n", "value: slo.ttft_ms\n"))
    files = G.generate(cfg, specs_dir=specs, rules_dir=Path("rules"), tests_dir=None,
                       window_scale=SCALE, scrape_interval_s=SCRAPE_S).files
    (name, text), = [(p.name, t) for p, t in files.items() if p.name == "slo-ttft-interactive.yml"]
    # the page the receiver's class rule matches: scoped to the pool, labelled with its class
    assert 'class="interactive"' in text and "class: interactive" in text, text
    return {name: text}


def _attainment(samples: list[tuple[float, float | None]], t0: float, t1: float, slo_s: float) -> tuple[float, int]:
    window = [ttft for t, ttft in samples if t0 <= t < t1]
    assert window, (t0, t1)
    return sum(ttft is not None and ttft <= slo_s for ttft in window) / len(window), len(window)


@pytest.mark.slow
@pytest.mark.exclusive  # interactive TTFT attainment is what the worker's core gives it
def test_batch_flood_is_shed_and_interactive_recovers(pg_dsn: str, tmp_path: Path, start_prometheus,
                                                      start_alertmanager) -> None:
    dsn = migrated(pg_dsn)
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.worker.max_batch = 2
    cfg.worker.max_tokens = 256
    slo_s = cfg.slo.ttft_ms / 1000.0
    rules = _interactive_rules(cfg, tmp_path / "slo")
    token_file = tmp_path / "receiver-token"
    token_file.write_text(RECEIVER_TOKEN)
    worker = WorkerThread(cfg)
    marks: dict[str, float] = {}
    samples: list[tuple[float, float | None]] = []  # interactive: (sent at, TTFT or None)
    batch_status: dict[int, int] = {}
    try:
        worker_url = worker.start()

        async def main() -> None:
            cfg.gateway.upstreams = [worker_url]
            reg = CollectorRegistry()
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=reg, spool=None,
                                            audit=AuditLog(dsn)) as gw:
                plane = gw.gateway.plane
                crunner = await api.start(api.make_app(plane.router, plane.distill, token=CONTROL_TOKEN,
                                                       rollout=plane.rollout, shed=plane.shed))
                journal = PgJournal(dsn)
                control = ControlClient([crunner.url], CONTROL_TOKEN, timeout_s=2, retries=3, backoff_s=0.05)
                engine = Engine(load_policy(POLICY), control, journal)
                rrunner = await start(make_app(engine, token=RECEIVER_TOKEN, tick_s=0.2), "127.0.0.1", 0)
                am = await asyncio.to_thread(start_alertmanager, am_config(rrunner.url, token_file))
                await asyncio.to_thread(
                    start_prometheus, {"gateway": [f"127.0.0.1:{gw.port}"]}, interval_s=SCRAPE_S,
                    extra_files=rules, alertmanagers=[f"127.0.0.1:{am.port}"])
                session = aiohttp.ClientSession()
                stop, flood = asyncio.Event(), asyncio.Event()

                async def interactive(i: int) -> None:
                    sent = time.monotonic()
                    body = {"model": cfg.worker.model, "prompt": "the quick brown fox", "max_tokens": 2,
                            "stream": True, "seed": i}
                    ttft = None
                    try:
                        async with session.post(gw.url + "/v1/completions", json=body,
                                                headers={names.CLASS_HEADER: "interactive"}) as r:
                            async for _ in r.content.iter_any():
                                if ttft is None and r.status == 200:
                                    ttft = time.monotonic() - sent
                    except aiohttp.ClientError:
                        pass
                    samples.append((sent, ttft))

                async def interactive_load() -> None:
                    tasks: set[asyncio.Task] = set()
                    i, t_next = 0, time.monotonic()
                    while not stop.is_set():
                        t = asyncio.create_task(interactive(i))
                        tasks.add(t)
                        t.add_done_callback(tasks.discard)
                        i += 1
                        t_next += 1 / INTERACTIVE_RATE
                        await asyncio.sleep(max(0.0, t_next - time.monotonic()))
                    await asyncio.gather(*tasks, return_exceptions=True)

                async def batch_client(c: int) -> None:
                    while not stop.is_set():
                        if not flood.is_set():
                            await asyncio.sleep(0.05)
                            continue
                        body = {"model": cfg.worker.model, "prompt": "a long report " * 20, "max_tokens": 256,
                                "stream": True, "seed": c}
                        try:
                            async with session.post(gw.url + "/v1/completions", json=body,
                                                    headers={names.CLASS_HEADER: "batch"}) as r:
                                await r.read()
                                batch_status[r.status] = batch_status.get(r.status, 0) + 1
                                if r.status == 429:
                                    await asyncio.sleep(0.2)  # a well-behaved client waits Retry-After
                        except aiohttp.ClientError:
                            await asyncio.sleep(0.1)

                async def until(pred, timeout_s: float, what: str) -> float:
                    deadline = time.monotonic() + timeout_s
                    while time.monotonic() < deadline:
                        if await pred():
                            return time.monotonic()
                        await asyncio.sleep(0.05)
                    raise AssertionError(f"timed out waiting for {what}; receiver rows: "
                                         f"{[(r['action'], r['decision'], r['outcome']) for r in journal.recent]}")

                def share(v: float):  # noqa: ANN202
                    async def pred() -> bool:
                        return plane.shed.share("default", "batch") == v
                    return pred

                loads = [asyncio.create_task(interactive_load()),
                         *(asyncio.create_task(batch_client(c)) for c in range(BATCH_CLIENTS))]
                try:
                    await asyncio.sleep(8)  # healthy history in every window up to the scaled 30m
                    marks["flood_on"] = time.monotonic()
                    flood.set()
                    marks["shed"] = await until(share(0.5), 180, "the first shedding step")
                    marks["shed_max"] = await until(share(1.0), 10, "batch fully shed")
                    assert plane.shed.share("default", "interactive") == 0.0
                    await asyncio.sleep(8)  # interactive served while batch is shed
                    marks["flood_off"] = time.monotonic()
                    flood.clear()
                    marks["unshed"] = await until(share(0.0), 120, "shedding back to 0")
                finally:
                    stop.set()
                    flood.set()
                    await asyncio.gather(*loads, return_exceptions=True)
                    await session.close()
                    await rrunner.stop()
                    await control.close()
                    await journal.close()
                    await crunner.stop()
                    plane.audit.flush(5)
        asyncio.run(main())
    finally:
        worker.stop()

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT source, action, target, decision, outcome, params FROM {names.T_ACTION_LOG} "
                            "WHERE action = 'set_shed' ORDER BY ts, id").fetchall()
    recv = [(t, d) for s, a, t, d, o, p in rows if s == "alert_receiver" and o == "applied"]
    assert recv[:2] == [("class:default/interactive", "shed")] * 2, recv
    assert recv[-1] == ("class:default/interactive", "unshed"), recv
    ctl = [p for s, *_, p in rows if s == "control_api"]
    assert len(ctl) == len(recv) and all("interactive" not in p["after"] for p in ctl)  # never shed
    healthy = _attainment(samples, marks["flood_on"] - 6, marks["flood_on"], slo_s)
    flooded = _attainment(samples, marks["flood_on"] + 2, marks["shed"], slo_s)
    shed = _attainment(samples, marks["shed_max"] + 2, marks["flood_off"], slo_s)
    figures = {
        "interactive_ttft_attainment": {"healthy": healthy, "flood_no_shedding": flooded, "flood_batch_shed": shed},
        "flood_to_first_shed_s": round(marks["shed"] - marks["flood_on"], 2),
        "flood_to_full_shed_s": round(marks["shed_max"] - marks["flood_on"], 2),
        "flood_off_to_unshed_s": round(marks["unshed"] - marks["flood_off"], 2),
        "batch_statuses": batch_status,
    }
    print(f"shedding e2e (window scale 1/240, TTFT objective {slo_s:.1f} s):", json.dumps(figures))
    assert flooded[0] < 0.9, figures  # the flood hurt interactive (why the page fired)
    assert shed[0] >= 0.95 and shed[0] > flooded[0], figures
    assert batch_status.get(429, 0) > 0 and batch_status.get(200, 0) > 0
