"""The CLI as a user runs it: real subprocesses, real exit codes and messages."""

from __future__ import annotations

import os
import subprocess
import sys
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
    for component in ("python: apache-flink", "java", "store", "prometheus", "promtool", "alertmanager", "amtool", "nvml/gpu"):
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
