"""Who stops the embedded PostgreSQL: real ``llmsla`` processes on a real pgserver in a data dir
of their own. A command that starts it stops it when it exits (normally, on SIGTERM); a service
stops the one it started; ``store start`` keeps one until ``store stop``; a server llmsla did not
start is left alone; a crashed holder does not pin it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from llmsla.store import embedded


def llmsla(data_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    env["LLMSLA_STORE_DATA_DIR"] = str(data_dir)
    return subprocess.run([sys.executable, "-m", "llmsla", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def postmasters(data_dir: Path) -> list[int]:
    """Every live postgres process serving ``data_dir``, by its command line: not only what
    postmaster.pid claims (a server whose pid file is gone would still count)."""
    want = str(data_dir.resolve())
    out = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if (proc.info["name"] or "").startswith("postgres") and "-D" in cmd[:-1] and cmd[cmd.index("-D") + 1] == want:
            out.append(proc.pid)
    return out


def holder(data_dir: Path, *, keep: bool = False, foreign: bool = False) -> subprocess.Popen:
    """A process holding the server open until its stdin closes; ``foreign``: started through
    pgserver directly, as a program other than llmsla would, leaving no owner record."""
    if foreign:
        body = (f"import pgserver; s = pgserver.get_server({str(data_dir)!r}, cleanup_mode=None); "
                "print(s.get_uri(), flush=True); sys.stdin.read()")
    else:
        body = (f"from llmsla.store.connection import start_embedded; "
                f"dsn, s = start_embedded(Path({str(data_dir)!r}), keep_running={keep}); "
                "print(dsn, flush=True); sys.stdin.read(); s.close()")
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; from pathlib import Path; {body}"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("postgresql://")
    return proc


def wait_gone(data_dir: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while postmasters(data_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert postmasters(data_dir) == [], f"a postmaster still serves {data_dir}"


def test_short_commands_stop_the_server_they_started(pg_root: Path) -> None:
    data = pg_root / "pg"
    fresh = llmsla(data, "store", "status")
    assert fresh.returncode == 1 and "not created yet" in fresh.stdout, fresh.stdout + fresh.stderr
    assert not data.exists()  # asking never initialises a cluster
    out = llmsla(data, "migrate")
    assert out.returncode == 0, out.stderr
    assert "applied: 0001_core" in out.stdout
    assert postmasters(data) == [] and embedded.running(data) is None
    status = llmsla(data, "store", "status")
    assert status.returncode == 0, status.stderr
    assert "server: not running (started for this status and stopped again)" in status.stdout
    assert '"request_windows"' in status.stdout
    assert postmasters(data) == []


def test_store_start_keeps_it_for_other_commands_until_store_stop(pg_root: Path) -> None:
    data = pg_root / "pg"
    try:
        started = llmsla(data, "store", "start")
        assert started.returncode == 0, started.stderr
        pid = embedded.running(data).pid
        assert f"server: started (pid {pid}); kept running until `llmsla store stop`" in started.stdout
        assert f"postgresql://postgres:@/postgres?host={data.resolve()}" in started.stdout
        assert postmasters(data) == [pid]
        assert llmsla(data, "migrate").returncode == 0  # a second command uses it ...
        status = llmsla(data, "store", "status")
        assert f"server: running (pid {pid}, kept until `llmsla store stop`)" in status.stdout, status.stdout
        assert postmasters(data) == [pid]  # ... and leaves it running
        again = llmsla(data, "store", "start")
        assert f"server: already running (pid {pid})" in again.stdout
        stopped = llmsla(data, "store", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert f"store: stopped the embedded PostgreSQL in {data.resolve()} (pid {pid})" in stopped.stdout
        assert postmasters(data) == []
        none = llmsla(data, "store", "stop")
        assert none.returncode == 0 and f"store: no embedded PostgreSQL running in {data.resolve()}" in none.stdout
    finally:
        embedded.stop(data)


def test_receiver_stops_its_own_server_on_sigterm_and_leaves_a_kept_one(pg_root: Path) -> None:
    data = pg_root / "pg"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    env["LLMSLA_STORE_DATA_DIR"] = str(data)
    argv = [sys.executable, "-m", "llmsla", "receiver", "--port", "0", "--control-url", "http://127.0.0.1:9"]

    def run_receiver() -> int:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("llmsla receiver on "):
                    break
            else:
                pytest.fail(f"receiver exited with {proc.wait()} before listening")
            assert len(postmasters(data)) == 1
            proc.send_signal(signal.SIGTERM)
            return proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    try:
        assert run_receiver() == 0
        assert postmasters(data) == []  # it started the server, so it stopped it
        assert llmsla(data, "store", "start").returncode == 0
        kept = embedded.running(data).pid
        assert run_receiver() == 0
        assert postmasters(data) == [kept]  # found running and kept: left as it was
    finally:
        embedded.stop(data)
    assert postmasters(data) == []


def test_sigterm_of_a_command_stops_the_server_it_started(pg_root: Path) -> None:
    data = pg_root / "pg"
    proc = holder(data)
    assert len(postmasters(data)) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM  # it still dies of the signal
    assert postmasters(data) == []


def test_the_last_user_stops_it_and_a_crashed_one_does_not_pin_it(pg_root: Path) -> None:
    data = pg_root / "pg"
    first = holder(data)
    pid = embedded.running(data).pid
    out = llmsla(data, "migrate")  # joins the running server, leaves first's server up
    assert out.returncode == 0, out.stderr
    assert postmasters(data) == [pid]
    busy = llmsla(data, "store", "stop")
    assert busy.returncode == 1 and f"is in use by llmsla process {first.pid}" in busy.stdout, busy.stdout
    assert postmasters(data) == [pid]
    first.communicate("")  # the last user goes: it stops the server
    assert first.returncode == 0
    assert postmasters(data) == []

    crashed = holder(data)
    crashed.kill()  # SIGKILL: no exit hook runs, its pid stays in pgserver's list
    crashed.wait()
    assert len(postmasters(data)) == 1
    out = llmsla(data, "migrate")
    assert out.returncode == 0, out.stderr
    assert postmasters(data) == []  # the dead holder was dropped, so migrate was the last


def test_a_server_llmsla_did_not_start_is_left_running(pg_root: Path) -> None:
    data = pg_root / "pg"
    proc = holder(data, foreign=True)
    proc.communicate("")
    try:
        pid = embedded.running(data).pid
        assert llmsla(data, "migrate").returncode == 0
        status = llmsla(data, "store", "status")
        assert f"server: running (pid {pid}, not started by llmsla)" in status.stdout, status.stdout
        assert postmasters(data) == [pid]
        stopped = llmsla(data, "store", "stop")  # asked for by name: stopped
        assert stopped.returncode == 0 and "stopped" in stopped.stdout
        assert postmasters(data) == []
    finally:
        embedded.stop(data)


def test_store_start_and_stop_refuse_an_external_dsn() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    for action in ("start", "stop"):
        out = subprocess.run([sys.executable, "-m", "llmsla", "--dsn", "postgresql://u:pw-9@127.0.0.1:1/db",
                              "store", action], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 2
        assert out.stderr.startswith(f"llmsla: error: llmsla store {action} manages the embedded PostgreSQL")
        assert "store.dsn (from --dsn)" in out.stderr and "pw-9" not in out.stderr


INNER_TEST = """
import subprocess, sys

def test_leaves_a_server_behind():
    subprocess.run([sys.executable, "-c", "from llmsla.store import embedded; embedded.start({data!r}, keep=True)"],
                   check=True)

def test_passes():
    assert True
"""


def test_session_check_fails_a_run_that_leaves_a_postmaster(tmp_path: Path, pg_root: Path) -> None:
    """The end-of-session check of conftest.py, run on an inner session that leaks one kept
    server; a server of this (outer) session under way meanwhile is neither flagged nor stopped."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    leaked = pg_root / "leaked"
    (inner / "test_leak.py").write_text(textwrap.dedent(INNER_TEST.format(data=str(leaked))))
    (inner / "test_clean.py").write_text("def test_passes():\n    assert True\n")
    mine = holder(pg_root / "mine")
    try:
        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                                  cwd=inner, capture_output=True, text=True, timeout=180)

        out = run("test_leak.py")
        assert out.returncode == 1, out.stdout + out.stderr
        assert "2 passed" in out.stdout
        assert "1 embedded PostgreSQL server(s) started by this test session outlived it" in out.stdout, out.stdout
        assert f"data dir {leaked.resolve()}" in out.stdout
        assert postmasters(leaked) == []  # reported, then stopped
        assert len(postmasters(pg_root / "mine")) == 1  # the outer session's server: untouched
        clean = run("test_clean.py")
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert "outlived" not in clean.stdout
    finally:
        mine.communicate("")
    wait_gone(pg_root / "mine")
