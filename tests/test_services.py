"""The harness starts real Prometheus, Alertmanager and Redis, and they really work."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from llmsla import services


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def test_prometheus_scrapes_a_real_exporter(start_prometheus) -> None:
    registry = CollectorRegistry()
    counter = Counter("llmsla_harness_probe", "harness probe", registry=registry)
    counter.inc(7)
    port = services.free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        prom = start_prometheus({"probe": [f"127.0.0.1:{port}"]}, interval_s=0.2)
        deadline = time.monotonic() + 20
        value = None
        while time.monotonic() < deadline:
            data = get_json(f"{prom.url}/api/v1/query?query=llmsla_harness_probe_total")
            if data["data"]["result"]:
                value = float(data["data"]["result"][0]["value"][1])
                break
            time.sleep(0.2)
        assert value == 7.0
    finally:
        server.shutdown()


def test_alertmanager_accepts_and_lists_alerts(start_alertmanager) -> None:
    am = start_alertmanager(
        "route:\n  receiver: none\nreceivers:\n  - name: none\n"
    )
    body = json.dumps([{"labels": {"alertname": "HarnessProbe", "severity": "page"}}]).encode()
    req = urllib.request.Request(f"{am.url}/api/v2/alerts", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200
    deadline = time.monotonic() + 10
    names_seen: list[str] = []
    while time.monotonic() < deadline and "HarnessProbe" not in names_seen:
        names_seen = [a["labels"]["alertname"] for a in json.loads(urllib.request.urlopen(f"{am.url}/api/v2/alerts", timeout=5).read())]
        time.sleep(0.1)
    assert "HarnessProbe" in names_seen


def test_redis_answers(redis_service) -> None:
    with socket.create_connection((redis_service.host, redis_service.port), timeout=2) as s:
        s.sendall(b"SET k v\r\nGET k\r\n")
        time.sleep(0.1)
        assert s.recv(64) == b"+OK\r\n$1\r\nv\r\n"


def test_missing_binary_is_an_error_with_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(services.MissingBinary, match="fix: apt-get install prometheus"):
        services.start_prometheus(tmp_path / "p", config_yaml="")


def test_service_that_dies_reports_its_log(tmp_path: Path) -> None:
    with pytest.raises(services.ServiceFailed, match="log tail"):
        services.start_prometheus(tmp_path / "bad", config_yaml="global: [this is: not valid\n")


_PARENT = """
import subprocess, sys, time
from llmsla import services
child = subprocess.Popen(["sleep", "120"], start_new_session=True,
                         preexec_fn=services.die_with_parent() if sys.argv[1] == "on" else None)
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("mode", ["on", "off"])
def test_children_die_with_a_parent_killed_outright(mode: str) -> None:
    """A parent SIGKILLed (no handler runs) leaves no child that was started with
    ``die_with_parent``; without it the child, in its own session, lives on (the demo's defect)."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, mode], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(child) == (mode == "off")
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
