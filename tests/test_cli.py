"""The CLI as a user runs it: real subprocesses, real exit codes and messages."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def llmsla(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "llmsla", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=120)


def test_help_lists_commands() -> None:
    out = llmsla("--help")
    assert out.returncode == 0
    for cmd in ("doctor", "demo", "migrate", "store", "config", "schemas", "spool"):
        assert cmd in out.stdout


def test_migrate_and_status_against_dsn(pg_dsn: str) -> None:
    first = llmsla("--dsn", pg_dsn, "migrate")
    assert first.returncode == 0, first.stderr
    assert "applied: 0001_core" in first.stdout
    second = llmsla("--dsn", pg_dsn, "migrate")
    assert "applied: nothing (up to date)" in second.stdout
    status = llmsla("--dsn", pg_dsn, "store", "status")
    assert status.returncode == 0
    assert '"request_windows"' in status.stdout


def test_config_error_names_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[store]\nretention = 3\n")
    out = llmsla("--config", str(cfg), "config", "check")
    assert out.returncode == 2
    assert f"llmsla: error: {cfg}: unknown key 'store.retention'" in out.stderr


def test_env_error_names_variable() -> None:
    out = llmsla("config", "check", env={"LLMSLA_SLO_TTFT_MS": "750"})
    assert out.returncode == 2
    assert "slo.ttft_ms = 750 ms is not a bucket bound" in out.stderr


def test_config_show_hides_secrets() -> None:
    out = llmsla("config", "show", env={"LLMSLA_DSN": "postgresql://u:hunter2@h/db", "LLMSLA_CONTROL_TOKEN": "tok-123-config-show"})
    assert out.returncode == 0
    assert "hunter2" not in out.stdout and "tok-123" not in out.stdout
    assert "postgresql://u:***@h/db" in out.stdout


def test_doctor_reports_every_component(pg_dsn: str) -> None:
    out = llmsla("--dsn", pg_dsn, "migrate")
    assert out.returncode == 0
    out = llmsla("--dsn", pg_dsn, "doctor")
    text = out.stdout
    for component in ("python: apache-flink", "java", "store", "spool", "prometheus", "promtool", "alertmanager",
                      "amtool", "nvml/gpu"):
        assert component in text, component
    assert out.returncode == 0, text  # everything required is installed on the test machine


def test_doctor_gives_fix_for_unreachable_store() -> None:
    out = llmsla("--dsn", "postgresql://x:pw@127.0.0.1:1/none", "doctor", env={"LLMSLA_STORE_CONNECT_TIMEOUT_S": "0.5"})
    assert out.returncode == 1
    assert "FAIL" in out.stdout and "LLMSLA_DSN" in out.stdout
    assert "pw@" not in out.stdout


def test_spool_check_reports_file_and_line(tmp_path: Path) -> None:
    d = tmp_path / "spool" / "requests"
    d.mkdir(parents=True)
    (d / "0000000000001-h-1-a-000000.jsonl").write_text('{"v":1}\n')
    out = llmsla("spool", "check", env={"LLMSLA_SPOOL_DIR": str(tmp_path / "spool")})
    assert out.returncode == 1
    assert "0000000000001-h-1-a-000000.jsonl:1: RequestEvent.ts_ms: missing" in out.stdout


def test_unwritable_spool_dir_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = llmsla("gateway", "--port", "0", "--upstream", "http://127.0.0.1:9",
                 env={"LLMSLA_SPOOL_DIR": str(blocker / "spool")})
    assert out.returncode == 2
    assert out.stderr.strip() == f"llmsla: error: spool.dir: cannot create {blocker}/spool/requests/.inprogress: Not a directory"


def test_doctor_shows_spool_drops_and_an_unusable_spool(tmp_path: Path) -> None:
    """A writer that dropped events (the kind over spool.max_total_bytes) leaves a drop record:
    doctor shows a WARN with the count per kind and reason; a kind directory past its bound is
    a FAIL (every writer would refuse to start there)."""
    from prometheus_client import CollectorRegistry

    from llmsla import config as config_mod
    from llmsla import names, spool
    from llmsla.app.doctor import check_spool
    from tests.test_spool import make_event

    root = tmp_path / "spool"
    w = spool.SpoolWriter(root, names.SPOOL_REQUESTS, max_segment_bytes=4096, max_total_bytes=20_000, retry_s=0,
                          registry=CollectorRegistry())
    for i in range(200):
        w.write(make_event(0, i))
    time.sleep(0.1)
    w.close()
    n = w.dropped[names.SPOOL_DROP_LIMIT]
    assert n > 0
    env = {"LLMSLA_SPOOL_DIR": str(root), "LLMSLA_DSN": "postgresql://x@127.0.0.1:1/none",
           "LLMSLA_STORE_CONNECT_TIMEOUT_S": "0.5"}
    out = llmsla("doctor", env=env)
    row = next(line for line in out.stdout.splitlines() if "│ spool" in line)
    assert "WARN" in row, out.stdout
    # the detail's words, read from the check itself: the table wraps them where the path's
    # length puts them, so the printed text is no place to look for a phrase
    check = check_spool(config_mod.load(env=env))
    assert check.status == "WARN" and f"{n} events" in check.detail, check
    assert f"requests/{names.SPOOL_DROP_LIMIT}: {n}" in check.detail, check
    out = llmsla("doctor", env={**env, "LLMSLA_SPOOL_MAX_TOTAL_BYTES": str(1 << 20)})
    assert "WARN" in next(line for line in out.stdout.splitlines() if "│ spool" in line)
    (root / names.SPOOL_REQUESTS / "0000000000002-h-1-a-000000.jsonl").write_bytes(b"\n" * (1 << 20))
    out = llmsla("doctor", env={**env, "LLMSLA_SPOOL_MAX_TOTAL_BYTES": str(1 << 20)})
    row = next(line for line in out.stdout.splitlines() if "│ spool" in line)
    assert "FAIL" in row and out.returncode == 1, out.stdout


def test_doctor_creates_no_spool_directory(tmp_path: Path) -> None:
    from llmsla import config as config_mod
    from llmsla.app.doctor import check_spool

    cfg = config_mod.load(env={"LLMSLA_SPOOL_DIR": str(tmp_path / "not" / "yet")})
    check = check_spool(cfg)
    assert check.status == "OK" and "not created yet" in check.detail, check
    assert not (tmp_path / "not").exists()
