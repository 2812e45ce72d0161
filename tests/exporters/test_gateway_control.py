"""`llmsla gateway --control-port`: the control API acts on the gateway's own router.

A real gateway process in front of two real reference workers; operator actions go through the
token-guarded loopback API and change where the gateway routes real requests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

from llmsla import services
from llmsla.worker.server import WorkerThread

TOKEN = "test-token-123-gateway-control"


def call(url: str, body: dict | None = None, token: str | None = TOKEN) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def wait_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} not up")


def test_control_api_drives_the_gateway_router(cfg, tmp_path) -> None:
    workers = [WorkerThread(cfg) for _ in range(2)]
    urls = [w.start() for w in workers]
    gw_port, ctl_port = services.free_port(), services.free_port()
    env = {**os.environ, "LLMSLA_CONTROL_TOKEN": TOKEN, "LLMSLA_SPOOL_DIR": str(tmp_path / "spool"),
           "LLMSLA_DSN": cfg.store.dsn, "LLMSLA_CONTROL_ROUTE_POLICY": "round_robin"}
    cmd = [sys.executable, "-m", "llmsla", "gateway", "--port", str(gw_port), "--control-port", str(ctl_port)]
    for url in urls:
        cmd += ["--upstream", url]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ctl = f"http://127.0.0.1:{ctl_port}"
        wait_up(f"{ctl}/healthz", proc)
        wait_up(f"http://127.0.0.1:{gw_port}/healthz", proc)
        assert call(f"{ctl}/v1/replicas/r0/drain", {}, token=None)[0] == 401
        assert call(f"{ctl}/v1/replicas/r0/drain", {}, token="wrong")[0] == 401
        status, _ = call(f"{ctl}/v1/replicas/r0/drain", {"reason": "test"})
        assert status == 200
        status, body = call(f"{ctl}/v1/replicas/r1/drain", {})
        assert status == 409, body  # the last healthy replica of the pool
        # every request now goes to r1, as the gateway's own metrics and events show
        for _ in range(6):
            status, body = call(f"http://127.0.0.1:{gw_port}/v1/completions",
                                {"model": cfg.worker.model, "prompt": "hi", "max_tokens": 2}, token=None)
            assert status == 200, body
        with urllib.request.urlopen(f"http://127.0.0.1:{gw_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        ok_lines = [line for line in text.splitlines()
                    if line.startswith("llmsla_requests_total{") and 'status="ok"' in line]
        assert ok_lines and all('replica="r1"' in line for line in ok_lines), ok_lines
        assert sum(float(line.rsplit(" ", 1)[1]) for line in ok_lines) == 6
        state = call(f"{ctl}/v1/state")[1]
        drained = {r["id"]: r["drained"] for r in state["router"]["pools"]["default"]}
        assert drained == {"r0": True, "r1": False}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for w in workers:
            w.stop()
