"""`llmsla demo` as a user runs it: every component a real process (simulator with its control
API, PyFlink job, Prometheus with the generated rules, Alertmanager, receiver, forecaster), a
short run checked against the store it wrote - windows, a forecast and a burn-rate alert, the
actions they caused in action_log, a report Chromium renders - and nothing left running, also
after Ctrl-C mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import chromium
import psycopg

from llmsla import names


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}


def _windows(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        try:
            return conn.execute(f"SELECT count(*) FROM {names.T_REQUEST_WINDOWS}").fetchone()[0]
        except psycopg.errors.UndefinedTable:  # not migrated yet
            return 0


def _db(dsn: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]


def _left_behind(marker: str) -> list[str]:
    """Processes whose environment carries ``marker`` (the test's database name, which every
    child and grandchild of the demo inherits through LLMSLA_DSN), zombies excluded."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() not in Path(f"/proc/{pid}/environ").read_bytes():
                continue
            status = Path(f"/proc/{pid}/status").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "\nState:\tZ" not in status and int(pid) != os.getpid():
            found.append(f"{pid}: {cmd[:150]}")
    return found


def test_demo_closes_the_loop_and_leaves_nothing_running(pg_dsn: str, tmp_path: Path) -> None:
    work, facts_file = tmp_path / "work", tmp_path / "facts.json"
    out = subprocess.run([sys.executable, "-m", "llmsla", "--dsn", pg_dsn, "demo", "--workdir", str(work),
                          "--minutes", "2", "--json", str(facts_file)],
                         capture_output=True, text=True, env=_env(), timeout=400)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    assert "demo finished" in out.stdout and "Traceback" not in out.stdout + out.stderr
    assert "Warning" not in out.stdout + out.stderr, out.stdout[-3000:]  # library noise goes to the log
    assert not _left_behind(_db(pg_dsn)), _left_behind(_db(pg_dsn))
    assert_closed_loop(pg_dsn, json.loads(facts_file.read_text()))


def assert_closed_loop(pg_dsn: str, facts: dict) -> None:
    """What a demo run must have done, read from the store it wrote and its ``--json`` facts
    (the checkout's run above and the installed wheel's in test_wheel.py)."""
    s, tl = facts["summary"], facts["timeline"]

    with psycopg.connect(pg_dsn) as conn:
        windowed = conn.execute(f"SELECT sum(requests) FROM {names.T_REQUEST_WINDOWS}").fetchone()[0]
        dead = conn.execute(f"SELECT count(*) FROM {names.T_DEAD_LETTERS}").fetchone()[0]
        rows = conn.execute(f"""SELECT action, target, alertname, alert_status, decision, outcome, params
                                FROM {names.T_ACTION_LOG} WHERE source = 'alert_receiver' ORDER BY ts, id""").fetchall()
    # the spool's events (the summary's reference count) are in windows, bar the newest window a
    # continuous job keeps open until later events arrive; nothing was dead-lettered
    assert s["requests"] > 2000
    assert 0.97 * s["requests"] <= windowed <= s["requests"], (windowed, s["requests"])
    assert dead == 0

    def fired(source: str) -> list[tuple]:
        return [r for r in rows if r[0] == "alert" and r[3] == "firing" and r[6]["labels"].get(names.L_SOURCE) == source]

    forecast, burn = fired(names.SOURCE_FORECASTER), fired("burn_rate")
    assert forecast, rows
    assert burn, rows
    # the faulty replica's alerts were acted on: a weight change and the drain, applied through
    # the simulator's control API, audited with the alert's target
    target = f"replica:{names.DEFAULT_POOL}/r1"
    acted = {(r[0], r[4]) for r in rows if r[1] == target and r[5] == "applied"}
    assert ("set_weight", "deweight") in acted, rows
    assert ("drain", "drain") in acted, rows
    assert any(r[1] == target for r in forecast) and any(r[1] == target for r in burn), rows
    # the summary reports those same rows, and the fault's effect where the label puts it
    # (after it, the simulator's exit takes its /metrics away: a LlmslaTargetDown may follow)
    assert {a["alertname"] for a in s["alerts"]} <= {r[2] for r in rows if r[0] == "alert"}
    assert {r[2] for r in forecast + burn} <= {a["alertname"] for a in s["alerts"]}
    assert s["latency"]["r1"]["during"]["e2e_p99_ms"] > 2 * s["latency"]["r1"]["before"]["e2e_p99_ms"]
    assert s["share"]["before the fault"] > s["share"]["fault, before any action"]
    assert tl["fault_start_ms"] < min(a["ts_ms"] for a in s["alerts"] if a["source"] != names.SOURCE_STATIC)

    # the A/B experiment: both arms got about half the sessions' requests, the report ran over
    # the whole run and wrote its rows for the dashboards
    ab = facts["ab"]
    arms = {a["arm"]: a["requests"] for a in ab["arms"]}
    assert set(arms) == {"ladr", "round-robin"}, arms
    assert all(n > 0.3 * s["requests"] for n in arms.values()) and sum(arms.values()) <= windowed, arms
    assert {c["verdict"] for c in ab["comparisons"]} <= {"pass", "fail", "inconclusive"}
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {names.T_AB_RESULTS} WHERE experiment = 'routing'").fetchone()[0] > 0

    report = Path(facts["outputs"]["report"])
    images = chromium.image_report(report)
    assert images and all(i["complete"] and i["width"] > 0 for i in images), images
    assert sum(i["colors"] > 20 for i in images) >= len(images) // 2, images  # drawn, not blank
    assert len(list(Path(facts["outputs"]["dashboards"]).glob("dashboards/*.json"))) >= 5


def test_ctrl_c_mid_run_stops_everything_and_keeps_the_data(pg_dsn: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    # Ctrl-C at a terminal: SIGINT at its default disposition in the demo, however the test run
    # was started (a shell without job control starts background jobs with SIGINT ignored, and
    # an ignored SIGINT is inherited: Python then never raises KeyboardInterrupt)
    proc = subprocess.Popen([sys.executable, "-m", "llmsla", "--dsn", pg_dsn, "demo", "--workdir", str(work),
                             "--minutes", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 150
        while not (stored := _windows(pg_dsn)):  # mid-run: the stream job has stored the history
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:] if proc.stdout else ""
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-3000:]
    assert "interrupted" in output and "Traceback" not in output, output[-3000:]
    assert not _left_behind(_db(pg_dsn)), _left_behind(_db(pg_dsn))
    # data kept: the spool and what the stream job stored before the interrupt
    assert any((work / "spool" / names.SPOOL_REQUESTS).glob("*.jsonl"))
    assert _windows(pg_dsn) >= stored
