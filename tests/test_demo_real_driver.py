"""The pieces of ``llmsla demo --real`` that run in the demo itself, fast: the fault driver
against a real HTTP endpoint (what it sends when, the label it makes of it) and the config the
children share (valid, objectives on bucket bounds)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from aiohttp import web

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import demo_real
from llmsla.app.demo import demo_config
from llmsla.app.demo_stack import DemoError, Scale, Stack
from llmsla.httpkit import BackgroundServer


def test_fault_driver_ramps_crashes_recovers_and_labels_what_it_applied() -> None:
    posts: list[tuple[float, dict, str]] = []

    async def fault(request: web.Request) -> web.Response:
        posts.append((time.time(), await request.json(), request.headers.get("Authorization", "")))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/admin/fault", fault)
    with BackgroundServer() as bg:
        served = bg.serve(app, "127.0.0.1", 0)
        start = time.time() + 0.2
        d = demo_real.FaultDriver(served.url, "tok", start, ramp_s=0.2, crash_s=1.2, end_s=1.6, factor=16.0,
                                  tick_s=0.1)
        d.start_thread()
        assert d._thread is not None
        d._thread.join(10)
        d.stop()
    assert all(auth == "Bearer tok" for _, _, auth in posts)
    bodies = [b for _, b, _ in posts]
    ramp = [b["slowdown"] for b in bodies if "down" not in b]
    assert len(ramp) >= 5 and ramp == sorted(ramp) and 1.0 <= ramp[0] < 4 and 10 < ramp[-1] <= 16.0
    assert bodies[-2:] == [{"down": True, "slowdown": 1.0}, {"down": False, "slowdown": 1.0}]
    t_ramp, t_crash, t_end = posts[0][0] - start, posts[-2][0] - start, posts[-1][0] - start
    assert 0.2 <= t_ramp < 0.5 and 1.2 <= t_crash < 1.5 and 1.6 <= t_end < 1.9
    rows = d.labels("r1")
    assert [(r["kind"], r["replica"], r["factor"]) for r in rows] == [("ramp", "r1", 16.0), ("crash", "r1", 0.0)]
    assert rows[0]["end_ms"] == rows[1]["start_ms"] and rows[0]["start_ms"] < rows[0]["end_ms"] < rows[1]["end_ms"]
    assert abs(rows[1]["start_s"] - t_crash) < 0.01


def test_fault_driver_names_a_fault_it_could_not_apply() -> None:
    d = demo_real.FaultDriver("http://127.0.0.1:9", "tok", time.time() - 10, ramp_s=0, crash_s=1, end_s=2,
                              factor=4.0)
    d.run()  # past the end: tries to restore, cannot reach the worker
    with pytest.raises(DemoError, match="not applied as planned"):
        d.labels("r1")
    assert d.errors and "end" in d.errors[0]


def test_real_config_is_valid_and_its_objectives_are_bucket_bounds(tmp_path: Path) -> None:
    stack = Stack.prepare(tmp_path, "postgresql://unused", Scale(), "")
    stack.config_file.write_text(demo_config(tmp_path, stack, stack.port("receiver"), real=True))
    cfg = config_mod.load(path=stack.config_file, env={})
    assert cfg.gateway.upstreams == [f"http://127.0.0.1:{p}" for p in demo_real.worker_ports(stack)]
    assert cfg.slo.ttft_ms / 1000 in names.TTFT_BUCKETS and cfg.slo.e2e_ms / 1000 in names.E2E_BUCKETS
    assert cfg.ab.experiments["routing"]["pool"] == cfg.gateway.pool
    # without --real the simulated demo's config is unchanged: default objectives, no upstreams
    plain = tmp_path / "plain.toml"
    plain.write_text(demo_config(tmp_path, stack, stack.port("receiver")))
    cfg = config_mod.load(path=plain, env={})
    assert not cfg.gateway.upstreams and cfg.slo.ttft_ms == config_mod.SloConfig().ttft_ms


def test_fault_driver_thread_stops_on_request() -> None:
    d = demo_real.FaultDriver("http://127.0.0.1:9", "tok", time.time() + 60, ramp_s=10, crash_s=20, end_s=30,
                              factor=4.0)
    d.start_thread()
    t0 = time.monotonic()
    d.stop()  # before anything was applied: nothing to put back
    assert time.monotonic() - t0 < 2 and not d.applied and not d.errors
    assert not any(t.name == "llmsla-demo-fault" and t.is_alive() for t in threading.enumerate())
