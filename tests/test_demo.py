"""`llmsla demo` end to end, as a user runs it: real worker, gateway, Prometheus, simulator,
PyFlink job and store; the facts it reports are checked against what the store holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

from llmsla import names


def test_demo_runs_end_to_end(pg_dsn: str, tmp_path: Path) -> None:
    facts_file = tmp_path / "facts.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    out = subprocess.run(
        [sys.executable, "-m", "llmsla", "--dsn", pg_dsn, "demo", "--workdir", str(tmp_path / "work"),
         "--minutes", "4", "--live-requests", "40", "--json", str(facts_file)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "demo finished" in out.stdout
    facts = json.loads(facts_file.read_text())
    assert facts["live"]["requests"] == 40
    assert 0 < facts["live"]["ttft_p99_s"] < 60
    sim = facts["simulation"]
    with psycopg.connect(pg_dsn) as conn:
        in_windows = conn.execute(
            f"SELECT sum(requests) FROM {names.T_REQUEST_WINDOWS} WHERE pool = %s", (names.DEFAULT_POOL,)
        ).fetchone()[0]
        live_windows = conn.execute(
            f"SELECT sum(requests) FROM {names.T_REQUEST_WINDOWS} WHERE pool = 'live'"
        ).fetchone()[0]
        dead = conn.execute(f"SELECT count(*) FROM {names.T_DEAD_LETTERS}").fetchone()[0]
        policy = conn.execute(f"SELECT sum(decisions) FROM {names.T_POLICY_WINDOWS}").fetchone()[0]
    # every simulated and every live request is in exactly one window; nothing was dead-lettered
    assert in_windows == sim["events"]["requests"] > 0
    assert live_windows == 40
    assert dead == 0
    assert policy and policy > 0  # the live workers' temperature decisions were windowed too
    during, outside = facts["fault_effect"]["during"], facts["fault_effect"]["outside"]
    assert during[0] > outside[0]  # the injected slowdown is visible where the label says
