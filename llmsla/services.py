"""Start and stop the external daemons llmsla runs beside it: Prometheus, Alertmanager, Redis.

Used by ``llmsla demo`` and by the test harness alike, so tests exercise exactly what users run.
Each service gets a free loopback port and a private working directory, and is stopped (TERM,
then KILL) on ``stop``. A missing binary raises :class:`MissingBinary` with the install hint.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINTS = {
    "prometheus": "apt-get install prometheus   (Debian/Ubuntu; or a release tarball on PATH)",
    "promtool": "apt-get install prometheus   (promtool ships with it)",
    "prometheus-alertmanager": "apt-get install prometheus-alertmanager",
    "alertmanager": "apt-get install prometheus-alertmanager",
    "amtool": "apt-get install prometheus-alertmanager   (amtool ships with it)",
    "redis-server": "apt-get install redis-server",
}


class MissingBinary(RuntimeError):
    """A required program is not on PATH; the message carries the install command."""


class ServiceFailed(RuntimeError):
    """A service exited or never became ready; the message carries the end of its log."""


def find_binary(*candidates: str) -> str:
    """The first of ``candidates`` found on PATH, else :class:`MissingBinary` with a hint."""
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    hint = INSTALL_HINTS.get(candidates[0], f"install {candidates[0]}")
    raise MissingBinary(f"{' or '.join(candidates)} not found on PATH; fix: {hint}")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, 0))
        except OSError as exc:  # unresolvable, not an address here: one line, as httpkit.serve says it
            from llmsla.httpkit import BindError, bind_problem

            raise BindError(bind_problem(host, 0, exc), exc.errno) from None
        return s.getsockname()[1]


def wait_http(url: str, *, timeout_s: float = 30.0, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServiceFailed(f"process exited with {proc.returncode} before {url} was ready{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise ServiceFailed(f"{url} not ready after {timeout_s:.0f}s{_tail(log)}")


def _tail(log: Path | None, n: int = 2000) -> str:
    if log is None or not log.exists():
        return ""
    return "\n--- log tail ---\n" + log.read_text(errors="replace")[-n:]


@dataclass
class Service:
    """A running daemon: its process, address and working directory."""

    name: str
    proc: subprocess.Popen
    host: str
    port: int
    workdir: Path
    log: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the forked child
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when the process that started it dies,
    even by SIGKILL (Linux ``PR_SET_PDEATHSIG``; ``None`` elsewhere). Children start in their own
    session so that a terminal's Ctrl-C reaches only the parent, which stops them in order; without
    this, a parent killed outright would leave them running (Prometheus, Alertmanager, the demo's
    components), writing into the next run's store and holding its ports."""
    if _PRCTL is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the prctl: nobody will signal us
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _spawn(name: str, argv: list[str], workdir: Path) -> tuple[subprocess.Popen, Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.log"
    fh = open(log, "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True,
                            preexec_fn=die_with_parent())
    fh.close()
    return proc, log


def _start_http_service(name: str, argv: list[str], workdir: Path, host: str, port: int) -> Service:
    """Spawn a Prometheus-family daemon and wait for its ``/-/ready``; stop it if that fails."""
    proc, log = _spawn(name, argv, workdir)
    svc = Service(name, proc, host, port, workdir, log)
    try:
        wait_http(f"{svc.url}/-/ready", proc=proc, log=log)
    except BaseException:
        svc.stop()
        raise
    return svc


def start_prometheus(
    workdir: Path,
    *,
    config_yaml: str,
    port: int | None = None,
    host: str = "127.0.0.1",
    extra_files: dict[str, str] | None = None,
) -> Service:
    """Prometheus with ``config_yaml`` (and rule files in ``extra_files``) in ``workdir``.

    The lifecycle API is on so tests and ``demo`` can ``POST /-/reload`` after rewriting files.
    """
    binary = find_binary("prometheus")
    port = port or free_port(host)
    workdir.mkdir(parents=True, exist_ok=True)
    for fname, text in (extra_files or {}).items():
        (workdir / fname).write_text(text)
    (workdir / "prometheus.yml").write_text(config_yaml)
    return _start_http_service("prometheus", [
        binary,
        f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address={host}:{port}",
        "--web.enable-lifecycle",
        "--web.enable-admin-api",
        "--storage.tsdb.retention.time=2d",
    ], workdir, host, port)


def start_alertmanager(workdir: Path, *, config_yaml: str, port: int | None = None, host: str = "127.0.0.1") -> Service:
    """Alertmanager (Debian names it ``prometheus-alertmanager``) with clustering off."""
    binary = find_binary("prometheus-alertmanager", "alertmanager")
    port = port or free_port(host)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "alertmanager.yml").write_text(config_yaml)
    return _start_http_service("alertmanager", [
        binary,
        f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address={host}:{port}",
        "--cluster.listen-address=",
    ], workdir, host, port)


def start_redis(workdir: Path, *, port: int | None = None, host: str = "127.0.0.1") -> Service:
    """A throw-away Redis without persistence."""
    binary = find_binary("redis-server")
    port = port or free_port(host)
    proc, log = _spawn(
        "redis",
        [binary, "--port", str(port), "--bind", host, "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        workdir,
    )
    svc = Service("redis", proc, host, port, workdir, log, extra={"url": f"redis://{host}:{port}/0"})
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceFailed(f"redis-server exited with {proc.returncode}{_tail(log)}")
        try:
            with socket.create_connection((host, port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return svc
        except OSError:
            time.sleep(0.05)
    svc.stop()
    raise ServiceFailed(f"redis-server not ready on {host}:{port}{_tail(log)}")


def prom_duration(seconds: float) -> str:
    """Prometheus duration syntax: whole milliseconds below a second ("200ms"), else seconds."""
    return f"{round(seconds * 1000)}ms" if seconds < 1 or seconds != int(seconds) else f"{int(seconds)}s"


def scrape_config(jobs: dict[str, list[str]], *, interval_s: float = 1.0, rule_files: list[str] | None = None,
                  alertmanagers: list[str] | None = None) -> str:
    """A minimal prometheus.yml: one static job per entry of ``jobs`` (name -> host:port list)."""
    lines = [
        "global:",
        f"  scrape_interval: {prom_duration(interval_s)}",
        f"  evaluation_interval: {prom_duration(interval_s)}",
    ]
    if rule_files:
        lines.append("rule_files:")
        lines += [f"  - {f}" for f in rule_files]
    if alertmanagers:
        lines += ["alerting:", "  alertmanagers:", "    - static_configs:", "        - targets:"]
        lines += [f"            - {t}" for t in alertmanagers]
    lines.append("scrape_configs:")
    for job, targets in jobs.items():
        lines += [f"  - job_name: {job}", "    static_configs:", "      - targets:"]
        lines += [f"          - {t}" for t in targets]
    return "\n".join(lines) + "\n"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
