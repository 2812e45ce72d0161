"""``llmsla engines`` as a real process against fake engine servers for a few seconds:
EngineSample lines in the spool, ``llmsla_engine_*`` on its /metrics; ``--once``; bad options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp import web

from llmsla import names, services, spool
from llmsla.events import EngineSample
from llmsla.httpkit import BackgroundServer

from . import expositions as ex


def _engine_app(body: str, ctype: str) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=body.encode(), headers={"Content-Type": ctype})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def _trtllm_serve_app(exposition: str | None) -> web.Application:
    """trtllm-serve's routes: ``/metrics`` answers with the iteration stats as JSON; the
    Prometheus exposition is mounted at ``/prometheus/metrics`` only with return_perf_metrics
    (``exposition`` None: without)."""
    async def stats(_request: web.Request) -> web.Response:
        return web.json_response([{"iter": 812, "numActiveRequests": 6, "numQueuedRequests": 11,
                                   "kvCacheStats": {"maxNumBlocks": 6400, "usedNumBlocks": 2000}}])

    async def metrics(_request: web.Request) -> web.Response:
        assert exposition is not None
        return web.Response(body=exposition.encode(), headers={"Content-Type": "text/plain; version=0.0.4"})

    app = web.Application()
    app.router.add_get("/metrics", stats)
    if exposition is not None:
        app.router.add_get("/prometheus/metrics", metrics)
    return app


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmsla", *args], capture_output=True, text=True, env=env, timeout=120)


def _lines(root: Path) -> list[Any]:
    out = []
    for seg in spool.published_segments(root, names.SPOOL_ENGINE):
        out += list(spool.read_segment(seg, names.SPOOL_ENGINE))
    return out


def test_engines_command_spools_samples_and_serves_metrics(tmp_path: Path) -> None:
    env = {**os.environ, "LLMSLA_SPOOL_DIR": str(tmp_path / "spool"), "LLMSLA_ENGINE_SCRAPE_INTERVAL_S": "0.25",
           "LLMSLA_SPOOL_SEGMENT_MAX_AGE_S": "0.2", "LLMSLA_ENGINE_TYPES": "canary=sglang"}
    with BackgroundServer() as bg:
        vllm = bg.serve(_engine_app(ex.vllm().text, "text/plain; version=0.0.4"), "127.0.0.1", 0)
        sgl = bg.serve(_engine_app(ex.sglang().openmetrics, "application/openmetrics-text; version=1.0.0"),
                       "127.0.0.1", 0)
        dead = services.free_port()
        port = services.free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmsla", "engines", "--port", str(port), "--upstream", vllm.url,
             "--upstream", f"canary={sgl.url}", "--upstream", f"http://127.0.0.1:{dead}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
        try:
            services.wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc, timeout_s=60)
            time.sleep(3.0)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                metrics = resp.read().decode()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
                health = json.loads(resp.read())
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "scraping 3 replicas" in out
    assert 'llmsla_engine_up{engine="vllm",pool="default",replica="r0"} 1.0' in metrics
    assert 'llmsla_engine_up{engine="sglang",pool="canary",replica="r1"} 1.0' in metrics
    assert 'llmsla_engine_up{engine="auto",pool="default",replica="r2"} 0.0' in metrics
    assert 'llmsla_engine_requests_running{engine="vllm",pool="default",replica="r0"} 5.0' in metrics
    assert 'llmsla_engine_kv_capacity_tokens{engine="sglang",pool="canary",replica="r1"} 200000.0' in metrics
    assert 'llmsla_engine_scrape_failures_total{pool="default",reason="connect",replica="r2"}' in metrics
    assert health["replicas"]["r2"] == {"up": False, "failures": health["replicas"]["r2"]["failures"], "reason": "connect"}

    lines = _lines(tmp_path / "spool")
    assert all(isinstance(x, EngineSample) for x in lines), [x for x in lines if not isinstance(x, EngineSample)]
    by = {r: [x for x in lines if x.replica == r] for r in ("r0", "r1", "r2")}
    assert len(by["r0"]) >= 6 and len(by["r1"]) >= 6 and not by["r2"]  # ~12 each in 3 s at 0.25 s
    v, s = by["r0"][-1], by["r1"][-1]
    assert (v.engine, v.pool, v.waiting, v.kv_blocks_total, v.preemptions_total) == ("vllm", "default", 5.0, 2000, 5.0)
    assert v.ttft is not None and v.ttft["count"] == 5 and v.lora_adapters is None
    assert (s.engine, s.pool, s.running, s.kv_block_size, s.prefix_cache_hit_rate) == ("sglang", "canary", 15.0, 16, 0.5)


def test_once_prints_samples_and_fails_when_a_replica_is_down(tmp_path: Path) -> None:
    env = {**os.environ, "LLMSLA_SPOOL_DIR": str(tmp_path / "spool")}
    with BackgroundServer() as bg:
        trt = bg.serve(_trtllm_serve_app(ex.trtllm().text), "127.0.0.1", 0)
        tri = bg.serve(_engine_app(ex.TRITON, "text/plain; charset=utf-8"), "127.0.0.1", 0)
        # a trtllm pool is scraped at /prometheus/metrics, the others (auto here) at /metrics
        ok = _run("engines", "--once", "--upstream", trt.url, "--upstream", f"canary={tri.url}",
                  env={**env, "LLMSLA_ENGINE_TYPES": "default=trtllm"})
        assert ok.returncode == 0, ok.stderr
        got = json.loads(ok.stdout)
        assert got["r0"]["sample"]["engine"] == "trtllm" and got["r1"]["sample"]["engine"] == "triton"
        assert got["r1"]["sample"]["itl"] is None
        EngineSample.from_dict(got["r0"]["sample"])
        # without --upstream: the gateway's replicas, with the gateway's ids and pools
        gw = _run("engines", "--once", env={**env, "LLMSLA_GATEWAY_UPSTREAMS": trt.url,
                                            "LLMSLA_GATEWAY_POOLS": f"canary={tri.url}",
                                            "LLMSLA_ENGINE_TYPES": "canary=triton,default=trtllm"})
        assert gw.returncode == 0, gw.stderr
        got = {rid: (v["sample"]["pool"], v["sample"]["engine"]) for rid, v in json.loads(gw.stdout).items()}
        assert got == {"r0": ("default", "trtllm"), "r1": ("canary", "triton")}
        # not told it is trtllm-serve: its /metrics is JSON, and the failure says where to look
        auto = _run("engines", "--once", "--upstream", trt.url, env=env)
        assert auto.returncode == 1, auto.stdout
        err = json.loads(auto.stdout)["r0"]
        assert err["reason"] in ("parse", "unknown_engine") and "/prometheus/metrics" in err["error"], err
        assert _run("engines", "--once", "--upstream", trt.url, "--path", "/prometheus/metrics", env=env).returncode == 0
        bare = bg.serve(_trtllm_serve_app(None), "127.0.0.1", 0)
        off = _run("engines", "--once", "--upstream", bare.url, "--type", "trtllm", env=env)
        err = json.loads(off.stdout)["r0"]
        assert off.returncode == 1 and err["reason"] == "http_status" and "return_perf_metrics" in err["error"], err
        down = _run("engines", "--once", "--upstream", f"http://127.0.0.1:{services.free_port()}", env=env)
        assert down.returncode == 1 and json.loads(down.stdout)["r0"]["reason"] == "connect"


def test_bad_options_and_config(tmp_path: Path) -> None:
    env = {**os.environ, "LLMSLA_SPOOL_DIR": str(tmp_path / "spool")}
    bad = _run("engines", "--once", "--type", "tgi", "--upstream", "http://127.0.0.1:1", env=env)
    assert bad.returncode == 2 and "--type" in bad.stderr
    bad = _run("engines", "--once", "--upstream", "ftp://x", env=env)
    assert bad.returncode == 2 and "--upstream" in bad.stderr
    bad = _run("config", "check", env={**env, "LLMSLA_ENGINE_TYPES": "canary=tgi"})
    assert bad.returncode == 2 and "engine.types" in bad.stderr and "canary" in bad.stderr
    none = _run("engines", "--once", env=env)
    assert none.returncode == 2 and "no replicas" in none.stderr


def test_once_follows_the_gateway_discovery_file(tmp_path: Path) -> None:
    """With gateway.discovery = file: the file's replicas under the gateway's address ids, the
    static gateway.pools replica beside them as r0; a missing file is a clear error."""
    from llmsla.discovery import replica_id

    env = {**os.environ, "LLMSLA_SPOOL_DIR": str(tmp_path / "spool")}
    f = tmp_path / "replicas"
    with BackgroundServer() as bg:
        trt = bg.serve(_engine_app(ex.trtllm().text, "text/plain; version=0.0.4"), "127.0.0.1", 0)
        tri = bg.serve(_engine_app(ex.TRITON, "text/plain; charset=utf-8"), "127.0.0.1", 0)
        f.write_text(f"# the fleet\n{trt.url}\ncanary={tri.url}\n")
        disc = {**env, "LLMSLA_GATEWAY_DISCOVERY": "file", "LLMSLA_GATEWAY_DISCOVERY_FILE": str(f),
                "LLMSLA_GATEWAY_POOLS": f"static={trt.url}"}
        out = _run("engines", "--once", env=disc)
        assert out.returncode == 0, out.stderr
        got = {rid: (v["sample"]["pool"], v["sample"]["engine"]) for rid, v in json.loads(out.stdout).items()}
        assert got == {"r0": ("static", "trtllm"), replica_id("default", trt.url, "default"): ("default", "trtllm"),
                       replica_id("canary", tri.url, "default"): ("canary", "triton")}
        f.unlink()
        gone = _run("engines", "--once", env=disc)
        assert gone.returncode == 2 and str(f) in gone.stderr
