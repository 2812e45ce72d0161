"""``llmsla simulate`` end to end: trace with bad rows -> spool events + labels + summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmsla import names
from llmsla.app import cli

from .conftest import read_events
from .test_traces import AZURE_BAD


def test_simulate_writes_events_labels_and_reports_bad_rows(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(AZURE_BAD)
    spool, out = tmp_path / "spool", tmp_path / "summary.json"
    rc = cli.main(["simulate", "--trace", str(trace), "--fleet", "6b:2", "--route-policy", "p2c",
                   "--spool", str(spool), "--json", str(out), "--start-ms", "1790000000000",
                   "--fault", "slowdown:r1:0:5:2", "--seed", "3"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "5 malformed rows skipped" in err and "line 3: expected 3 columns" in err
    summary = json.loads(out.read_text())
    assert summary["trace"]["skipped"] == 5 and [b["line"] for b in summary["trace"]["bad"]] == [3, 4, 5, 6, 8]
    assert summary["requests"] == 3 and summary["status"] == {"ok": 3}
    assert summary["events"]["requests"] == 3
    labels = json.loads(Path(summary["labels"]).read_text())["faults"]
    assert labels == [{"start_ms": 1790000000000, "end_ms": 1790000005000, "kind": "slowdown",
                       "replica": "r1", "factor": 2.0, "start_s": 0.0, "end_s": 5.0}]
    assert Path(summary["labels"]).parent == spool / "labels"
    evs = read_events(spool, names.SPOOL_REQUESTS)
    assert sorted(e.prompt_tokens for e in evs) == [200, 374, 400]
    assert all(e.ts_ms >= 1790000000000 for e in evs)


def test_simulate_synthetic_without_events(tmp_path: Path, capsys) -> None:
    rc = cli.main(["simulate", "--load", "poisson", "--rate", "4", "--duration", "30", "--fleet",
                   "70b/teacher:1,1.3b/student:1", "--student-share", "0.8", "--no-events",
                   "--spool", str(tmp_path / "s"), "--json", "-"])
    assert rc == 0
    text = capsys.readouterr().out
    summary = json.loads(text)
    assert summary["requests"] > 80 and "events" not in summary
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("argv, msg", [
    (["--load", "poisson", "--fault", "nope"], "expected kind:replica"),
    (["--load", "poisson", "--fleet", "9b:2"], "unknown model '9b'"),
    (["--load", "poisson", "--trace", "azure_conv"], "exactly one of"),
    (["--trace", "/nonexistent.csv"], "no such file"),
    (["--load", "poisson", "--fault", "crash:r9:1:2"], "unknown replica 'r9'"),
    (["--load", "poisson", "--tenant-mix", "acme:0"], "weight must be a finite number > 0"),
    (["--load", "poisson", "--tenant-mix", "acme/batch"], "expected TENANT[/CLASS]:WEIGHT"),
    (["--load", "poisson", "--tenant-mix", "acme:1,acme/interactive:2"], "acme/interactive is named twice"),
])
def test_simulate_bad_arguments_exit_2_with_reason(argv: list[str], msg: str, capsys, tmp_path: Path) -> None:
    rc = cli.main(["simulate", "--no-events", "--duration", "5", *argv])
    assert rc == 2
    assert msg in capsys.readouterr().err


def test_simulate_tenant_mix_gives_several_tenants_and_keeps_the_run(tmp_path: Path, capsys) -> None:
    """A replay with a tenant mix: each event's tenant and class drawn with the weights; the
    arrivals, routing and latencies are those of the same run without a mix."""
    def run(spool: Path, *extra: str) -> list:
        rc = cli.main(["simulate", "--load", "poisson", "--rate", "20", "--duration", "60", "--fleet", "6b:2",
                       "--spool", str(spool), "--start-ms", "1790000000000", "--seed", "4", "--json", "-", *extra])
        assert rc == 0
        capsys.readouterr()
        return sorted(read_events(spool, names.SPOOL_REQUESTS), key=lambda e: e.trace_id)

    plain = run(tmp_path / "a")
    mixed = run(tmp_path / "b", "--tenant-mix", "acme/interactive:3,globex/batch:1,default:1")
    assert {(e.tenant, e.class_) for e in plain} == {(names.DEFAULT_TENANT, names.DEFAULT_CLASS)}
    counts: dict[tuple[str, str], int] = {}
    for e in mixed:
        counts[(e.tenant, e.class_)] = counts.get((e.tenant, e.class_), 0) + 1
    assert set(counts) == {("acme", "interactive"), ("globex", "batch"), (names.DEFAULT_TENANT, names.DEFAULT_CLASS)}
    n = len(mixed)
    assert n > 800 and abs(counts[("acme", "interactive")] / n - 0.6) < 0.06  # weight 3 of 5
    strip = [(e.trace_id, e.ts_ms, e.replica, e.e2e_ms, e.status) for e in mixed]
    assert strip == [(e.trace_id, e.ts_ms, e.replica, e.e2e_ms, e.status) for e in plain]


def test_student_share_needs_roles(capsys) -> None:
    rc = cli.main(["simulate", "--load", "poisson", "--duration", "5", "--fleet", "6b:2",
                   "--student-share", "0.5", "--no-events"])
    assert rc == 2 and "needs teacher and student" in capsys.readouterr().err


def test_realtime_run_serves_metrics_while_running(tmp_path: Path) -> None:
    """--realtime paces the run on the wall clock; --metrics-port serves the recorders' series."""
    import threading
    import time
    import urllib.request

    from llmsla.services import free_port

    port = free_port()
    rc: list[int] = []
    argv = ["simulate", "--load", "poisson", "--rate", "20", "--duration", "6", "--fleet", "6b:2",
            "--realtime", "4", "--metrics-port", str(port), "--spool", str(tmp_path / "s")]
    t0 = time.monotonic()
    th = threading.Thread(target=lambda: rc.append(cli.main(argv)))
    th.start()
    body = ""
    for _ in range(200):  # bounded: 200 x 10 ms
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
                body = resp.read().decode()
            if names.REQUESTS + "_total{" in body:
                break
        except OSError:
            pass
        time.sleep(0.01)
    th.join(timeout=30)
    assert rc == [0]
    assert names.REQUESTS + "_total{" in body and names.ROUTER_PICKS in body
    assert time.monotonic() - t0 >= 6 / 4 * 0.9  # paced: 6 simulated s at 4x


def test_simulate_builds_its_router_from_config(tmp_path: Path, monkeypatch, capsys) -> None:
    """control.ladr_* reach the simulator's router, as they reach the gateway's."""
    monkeypatch.setenv("LLMSLA_CONTROL_LADR_SHARPNESS", "2.5")
    monkeypatch.setenv("LLMSLA_CONTROL_LADR_BETA", "0.25")
    out = tmp_path / "s.json"
    rc = cli.main(["simulate", "--load", "poisson", "--duration", "5", "--fleet", "6b:2", "--route-policy", "ladr",
                   "--no-events", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    params = json.loads(out.read_text())["router_params"]
    assert params["sharpness"] == 2.5 and params["beta"] == 0.25 and params["alpha"] == 1.0
