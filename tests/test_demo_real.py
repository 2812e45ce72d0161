"""`llmsla demo --real` as a user runs it: two reference workers behind the gateway instead of the
simulator, the Azure conversation trace sent as real streaming requests, r1 slowed then crashed
over the worker's fault endpoint. Checked against what the run wrote: the gateway's RequestEvents
for both replicas, windows in the store, a burn-rate alert and the receiver's action on r1
through the gateway's control API, the fault label, the report - and nothing left running."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import chromium
import psycopg
import pytest

from llmsla import names, spool
from tests.test_demo import _db, _env, _left_behind


@pytest.mark.slow
@pytest.mark.exclusive  # r1's P99 in its ramp against before it: what the CPU workers' cores give them
def test_demo_real_closes_the_loop_on_real_workers(pg_dsn: str, tmp_path: Path) -> None:
    work, facts_file = tmp_path / "work", tmp_path / "facts.json"
    out = subprocess.run([sys.executable, "-m", "llmsla", "--dsn", pg_dsn, "demo", "--real", "--workdir", str(work),
                          "--minutes", "2", "--json", str(facts_file)],
                         capture_output=True, text=True, env=_env(), timeout=400)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    assert "demo finished" in out.stdout and "Traceback" not in out.stdout + out.stderr
    assert "Warning" not in out.stdout + out.stderr, out.stdout[-3000:]
    assert not _left_behind(_db(pg_dsn)), _left_behind(_db(pg_dsn))
    facts = json.loads(facts_file.read_text())
    s, tl, real = facts["summary"], facts["timeline"], facts["real"]
    assert facts["mode"] == "real"

    # the gateway's events: both replicas served, r1 slower in its ramp than before it
    events = [ev for seg in spool.published_segments(work / "spool", names.SPOOL_REQUESTS)
              for ev in spool.read_segment(seg, names.SPOOL_REQUESTS) if not isinstance(ev, spool.BadLine)]
    assert len(events) == s["requests"] > 200
    by = collections.Counter((ev.replica, ev.status) for ev in events)
    assert by[("r0", "ok")] > 50 and by[("r1", "ok")] > 20, by
    crash = next(f for f in real["faults"] if f["kind"] == "crash")
    ramp = next(f for f in real["faults"] if f["kind"] == "ramp")
    assert ramp["replica"] == crash["replica"] == "r1" and ramp["end_ms"] == crash["start_ms"]
    assert tl["fault_start_ms"] == ramp["start_ms"] and tl["fault_end_ms"] == crash["end_ms"]
    # r1's requests failed only while it was down (none at all if it was drained before and
    # nothing was in flight then)
    failed = [ev for ev in events if ev.replica == "r1" and ev.status == "error"]
    assert all(crash["start_ms"] <= ev.ts_ms <= crash["end_ms"] + 2000 for ev in failed), failed
    drained = [a["ts_ms"] for a in s["actions"] if a["action"] == "drain" and a["target"].endswith("/r1")]
    assert failed or (drained and drained[0] < crash["start_ms"]), by
    assert s["latency"]["r1"]["during"]["e2e_p99_ms"] > 2 * s["latency"]["r1"]["before"]["e2e_p99_ms"]
    # every request the replay sent ended in one event
    assert real["replay"]["sent"] == len(events)

    with psycopg.connect(pg_dsn) as conn:
        windowed, newest = conn.execute(f"""SELECT sum(requests), extract(epoch FROM max(bucket)) * 1000
                                            FROM {names.T_REQUEST_WINDOWS}""").fetchone()
        replicas = {r[0] for r in conn.execute(f"SELECT DISTINCT replica FROM {names.T_REQUEST_WINDOWS}")}
        policy = conn.execute(f"SELECT sum(decisions) FROM {names.T_POLICY_WINDOWS}").fetchone()[0]
        dead = conn.execute(f"SELECT count(*) FROM {names.T_DEAD_LETTERS}").fetchone()[0]
        rows = conn.execute(f"""SELECT action, target, alertname, alert_status, decision, outcome, params, source
                                FROM {names.T_ACTION_LOG} ORDER BY ts, id""").fetchall()
    # every event is in its window, bar the newest windows a continuous job keeps open until
    # later events (at ~3 requests/s, the last few seconds of the run)
    closed = sum(ev.ts_ms < newest + names.REQUEST_WINDOW_S * 1000 for ev in events)
    assert 0.99 * closed <= windowed <= closed and closed > 0.85 * len(events), (windowed, closed, len(events))
    assert {"r0", "r1"} <= replicas
    assert policy and policy > 1000  # real workers decide a temperature per token
    assert dead == 0
    receiver = [r for r in rows if r[7] == "alert_receiver"]
    burn = [r for r in receiver if r[0] == "alert" and r[3] == "firing"
            and r[6]["labels"].get(names.L_SOURCE) == "burn_rate" and r[1] == "replica:default/r1"]
    assert burn, receiver
    target = f"replica:{names.DEFAULT_POOL}/r1"
    acted = {(r[0], r[4]) for r in receiver if r[1] == target and r[5] == "applied"}
    assert acted & {("set_weight", "deweight"), ("drain", "drain")}, receiver
    # the gateway's control API applied them: its own audit rows name the replica
    assert {r[0] for r in rows if r[7] != "alert_receiver" and r[1] == "r1"} & {"set_weight", "drain"}, rows
    assert {r[2] for r in burn} <= {a["alertname"] for a in s["alerts"]}
    assert s["share"]["before the fault"] > 0.2

    ab = facts["ab"]
    assert {a["arm"] for a in ab["arms"]} == {"ladr", "round-robin"}
    images = chromium.image_report(Path(facts["outputs"]["report"]))
    assert images and all(i["complete"] and i["width"] > 0 for i in images), images
    assert sum(i["colors"] > 20 for i in images) >= len(images) // 2, images  # drawn, not blank
    assert len(list(Path(facts["outputs"]["dashboards"]).glob("dashboards/*.json"))) >= 5
