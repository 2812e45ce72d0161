"""``llmsla simulate --realtime --live-from --control-port``: history replayed at once, then a
live part in real time whose router and distillation controls a real control API changes - the
demo's closed loop, with the simulator in place of real replicas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg

from llmsla import names, services

from .conftest import read_events

TOKEN = "sim-control-token"


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def test_history_then_live_part_driven_through_the_control_api(tmp_path: Path, pg_dsn: str) -> None:
    port, spool, out = services.free_port(), tmp_path / "spool", tmp_path / "s.json"
    env = {**os.environ, "LLMSLA_CONTROL_TOKEN": TOKEN, "LLMSLA_DSN": pg_dsn, "LLMSLA_CONTROL_ROUTE_POLICY": "round_robin"}
    t_start = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmsla", "simulate", "--load", "poisson", "--rate", "12", "--duration", "30",
         "--fleet", "6b:3", "--route-policy", "round_robin", "--realtime", "1", "--live-from", "20",
         "--control-port", str(port), "--spool", str(spool), "--json", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        services.wait_http(base + "/healthz", timeout_s=60, proc=proc)
        time.sleep(3)  # into the live part (the 20 s of history took well under a second)
        drained_at_ms = int(time.time() * 1000)
        assert _post(base + "/v1/replicas/r1/drain", {"reason": "test"})["audit"]["outcome"] == "applied"
        assert _post(base + "/v1/pools/default/temperature_schedule", {"name": "cosine"})["ok"]
        assert proc.wait(timeout=60) == 0, proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall_s = time.time() - t_start
    assert wall_s >= 10  # the live 10 s were paced; the 20 s of history were not
    summary = json.loads(out.read_text())
    start_ms = summary["start_ms"]
    assert t_start * 1000 <= start_ms + 20_000 <= drained_at_ms  # the live part began when the run did
    events = read_events(spool, names.SPOOL_REQUESTS)
    arrived_after = [e for e in events if e.ts_ms - e.e2e_ms > drained_at_ms + 100]
    assert arrived_after and all(e.replica != "r1" for e in arrived_after)  # drained: no new requests
    assert any(e.replica == "r1" for e in events)  # it served before the drain
    assert {e.policy for e in arrived_after} == {"cosine"}  # the pool's schedule names the policy
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT action, target, outcome FROM {names.T_ACTION_LOG} ORDER BY id").fetchall()
    assert rows == [("drain", "r1", "applied"), ("set_temperature_schedule", "default", "applied")]
