"""The gateway against hostile clients, over real loopback HTTP: arbitrary strings in every
field a client or an upstream controls, junk model names flooding the label slots, slow and
numerous connections. Nothing may blind ``/metrics``, poison the spool or starve good requests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmsla import config as config_mod
from llmsla import httpkit, names
from llmsla.app import wiring
from llmsla.events import RequestEvent
from llmsla.spool import BadLine, published_segments, read_segment
from llmsla.worker import server as worker_mod
from tests.worker._worker_util import MODEL, worker_cfg


def _cfg(tmp_path: Path, **http: Any) -> config_mod.Config:
    c = config_mod.load(env={})
    c.spool.dir = str(tmp_path / "spool")
    c.control.route_policy = "round_robin"
    for k, v in http.items():
        setattr(c.http, k, v)
    return c


class Permissive:
    """An upstream that serves any model name and echoes the request's ``llmsla_policy`` back
    as its own policy (the path by which an upstream names the policy in force)."""

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ext = {"prompt_tokens": 2, "output_tokens": 2, "policy": body.get("llmsla_policy")}
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(2):
            chunk = {"choices": [{"index": 0, "text": "x"}], **({"llmsla": ext} if i == 1 else {})}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


class Stack:
    """Permissive upstream + gateway on a private event loop in a thread, for synchronous
    (Hypothesis) tests that send many requests to one running stack."""

    def __init__(self, cfg: config_mod.Config) -> None:
        self.cfg, self.url = cfg, ""
        self.registry = CollectorRegistry()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/completions", Permissive().completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        up = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self.cfg.gateway.upstreams = [up]
        async with wiring.serve_gateway(self.cfg, "127.0.0.1", 0, registry=self.registry) as gw:
            self.url = gw.url
            self._ready.set()
            await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> Stack:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def post(self, body: bytes) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + "/v1/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            assert r.status == 200
            return r.read().decode("utf-8")


# any code point, surrogates included (json.dumps escapes them as \udXXX, as a hostile client would)
ANY_TEXT = st.text(st.characters(codec=None, categories=None), max_size=300)


def test_arbitrary_strings_never_blind_metrics_or_poison_the_spool(tmp_path: Path) -> None:
    """Any string as the model or the policy: the gateway answers 200 or a 400 with a reason,
    its /metrics still parses, and afterwards every request it let through is on the spool as
    a line the contract accepts (labels are storable). One test, one stack: the spool check
    reads what the property run wrote."""
    with Stack(_cfg(tmp_path)) as stack:

        @settings(max_examples=150, deadline=None)
        @given(model=ANY_TEXT, policy=st.one_of(ANY_TEXT, st.integers(), st.none()))
        def one_request(model: str, policy: Any) -> None:
            body = json.dumps({"model": model, "prompt": "hi", "stream": True, "llmsla_policy": policy}).encode()
            status, payload = stack.post(body)
            assert status in (200, 400), (status, payload[:200])
            if status == 400:
                assert json.loads(payload)["error"]["message"]  # a reason, never a bare status
            text = stack.metrics()  # parses: a bad label would raise here (or have made /metrics 500)
            families = {f.name: f for f in text_string_to_metric_families(text)}
            assert names.REQUESTS in families

        one_request()
        for s in (b"\xff\xfe", "\ud800".encode("utf-8", "surrogatepass")):
            assert stack.post(b'{"model": "' + s + b'", "prompt": "x"}')[0] == 400
        time.sleep(1.5)  # the writer publishes segments older than spool.segment_max_age_s
        lines = [item for seg in published_segments(stack.cfg.spool_dir(), names.SPOOL_REQUESTS)
                 for item in read_segment(seg, names.SPOOL_REQUESTS)]
    assert lines and not [x for x in lines if isinstance(x, BadLine)]
    assert all(isinstance(x, RequestEvent) for x in lines)


def test_junk_model_names_do_not_take_the_label_slots(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path)
    cfg.metrics.label_top_n = 50

    async def main() -> str:
        async with worker_mod.serve(cfg, "127.0.0.1", 0) as worker:
            cfg.gateway.upstreams = [worker.url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry()) as gw, \
                    aiohttp.ClientSession() as s:
                async def post(model: str) -> int:
                    async with s.post(gw.url + "/v1/completions",
                                      json={"model": model, "prompt": "hi", "max_tokens": 2}) as r:
                        await r.read()
                        return r.status

                statuses = await asyncio.gather(*(post(f"junk-{i}") for i in range(1000)))
                assert set(statuses) == {404}  # the worker does not serve them
                assert await post(MODEL) == 200
                async with s.get(gw.url + "/metrics") as r:
                    return await r.text()

    text = asyncio.run(main())
    requests = {(s.labels["model"], s.labels["status"]): s.value
                for f in text_string_to_metric_families(text) if f.name == names.REQUESTS
                for s in f.samples if s.name == names.REQUESTS + "_total" and s.value}
    assert requests == {(MODEL, names.STATUS_OK): 1, (names.LABEL_OVERFLOW_VALUE, names.STATUS_REJECTED): 1000}


async def _slowloris(url: str, n_heads: int, n_bodies: int) -> tuple[list, list]:
    host, port = url.split("//")[1].split(":")
    heads, bodies = [], []
    for _ in range(n_heads):  # a request head that never ends
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        heads.append((r, w))
    for _ in range(n_bodies):  # a complete head, then a body that never ends
        r, w = await asyncio.open_connection(host, int(port))
        w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000\r\n\r\n{\"model\": ")
        bodies.append((r, w))
    return heads, bodies


async def _closed_within(conns: list, timeout_s: float) -> int:
    """How many of ``conns`` the server closed within ``timeout_s`` (read hits EOF or reset)."""
    async def one(r: asyncio.StreamReader) -> bool:
        try:
            async with asyncio.timeout(timeout_s):
                while await r.read(65536):
                    pass
            return True
        except (ConnectionError, OSError):
            return True
        except TimeoutError:
            return False

    return sum(await asyncio.gather(*(one(r) for r, _ in conns)))


def test_slow_clients_are_closed_and_good_requests_keep_going(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, header_timeout_s=1.5, body_timeout_s=2.0)
    cfg.gateway.max_in_flight = 150
    cfg.gateway.client_share = 1.0  # attackers and good client share 127.0.0.1: the global bound here

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", Permissive().completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        cfg.gateway.upstreams = [f"http://127.0.0.1:{runner.addresses[0][1]}"]
        try:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry()) as gw, \
                    aiohttp.ClientSession() as s:
                async def good() -> tuple[int, float]:
                    t0 = time.perf_counter()
                    async with s.post(gw.url + "/v1/completions",
                                      json={"model": "m", "prompt": "hi", "stream": True}) as r:
                        await r.read()
                        return r.status, time.perf_counter() - t0

                baseline = [await good() for _ in range(20)]
                t0 = time.perf_counter()
                heads, bodies = await _slowloris(gw.url, 400, 140)
                await asyncio.sleep(0.3)
                during = [await good() for _ in range(20)]  # 140 bodies held + 1 < max_in_flight
                assert {st for st, _ in during} == {200}
                assert max(lat for _, lat in during) < 1.0, during  # not waiting for the attackers
                closed_heads = await _closed_within(heads, 5.0)
                closed_bodies = await _closed_within(bodies, 5.0)
                elapsed = time.perf_counter() - t0
                assert closed_heads == 400 and closed_bodies == 140
                assert elapsed < 7.0
                guard = gw.served.guard
                assert guard.timed_out >= 400
                deadline = time.monotonic() + httpkit.LINGER_S + 2.0
                while guard.open > 1 and time.monotonic() < deadline:  # 408s linger, then close
                    await asyncio.sleep(0.1)
                assert guard.open <= 1, guard.open
                assert (await good())[0] == 200
                assert max(lat for _, lat in baseline) < 1.0
                for _, w in heads + bodies:
                    w.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_body_reads_hold_in_flight_slots_and_connections_are_bounded(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, header_timeout_s=5.0, body_timeout_s=1.5, max_connections=60)
    cfg.gateway.max_in_flight = 20
    cfg.gateway.client_share = 1.0  # one client holds every slot: the global bound here

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", Permissive().completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        cfg.gateway.upstreams = [f"http://127.0.0.1:{runner.addresses[0][1]}"]
        try:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry()) as gw:
                _, bodies = await _slowloris(gw.url, 0, 20)  # every in-flight slot held by a body
                await asyncio.sleep(0.3)
                async with aiohttp.ClientSession() as s:
                    body = {"model": "m", "prompt": "hi", "stream": True}
                    async with s.post(gw.url + "/v1/completions", json=body) as r:
                        assert r.status == 429 and (await r.json())["error"]["code"] == "overloaded"
                    heads, _ = await _slowloris(gw.url, 50, 0)  # 20 + 50 > max_connections
                    await asyncio.sleep(0.3)
                    assert gw.served.guard.refused >= 10
                    refused = 0
                    for r_, _ in heads:  # the ones past the bound got a 503 and EOF at once
                        try:
                            async with asyncio.timeout(0.5):
                                data = await r_.read(4096)
                        except TimeoutError:
                            continue
                        refused += data.startswith(b"HTTP/1.1 503")
                    assert refused == gw.served.guard.refused
                    assert await _closed_within(bodies, 3.0) == 20  # 408 after body_timeout_s
                    await _closed_within(heads, 6.0)
                    async with s.post(gw.url + "/v1/completions", json=body) as r:
                        assert r.status == 200
                for _, w in heads + bodies:
                    w.close()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def test_malformed_http_is_answered_without_flooding_the_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _cfg(tmp_path)
    cfg.gateway.upstreams = ["http://127.0.0.1:9"]
    bad = [b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
           b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
           b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"]

    async def main() -> list[bytes]:
        async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry()) as gw:
            host, port = gw.host, gw.port
            answers = []
            for i in range(100):
                r, w = await asyncio.open_connection(host, port)
                w.write(bad[i % len(bad)])
                async with asyncio.timeout(5):
                    answers.append(await r.read())
                w.close()
            assert gw.served.guard.malformed >= 50
            return answers

    with caplog.at_level(logging.DEBUG):
        answers = asyncio.run(main())
    assert all(a.split(b" ", 2)[1] == b"400" for a in answers), {a[:40] for a in answers}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records[:3]


def test_lone_surrogates_are_refused_before_they_reach_a_replica(tmp_path: Path) -> None:
    """An escaped lone surrogate in a prompt or a chat message is a client error at every hop:
    the gateway answers 400 with a reason and records no ``error`` against the replica, and the
    worker, asked directly, answers 400 too (it used to crash encoding the prompt)."""
    cfg = _cfg(tmp_path)
    bodies = {"/v1/completions": {"model": MODEL, "prompt": "hi \ud800", "max_tokens": 2},
              "/v1/chat/completions": {"model": MODEL, "max_tokens": 2,
                                       "messages": [{"role": "user", "content": "x\udfff"}]}}

    async def main() -> tuple[list[tuple[int, dict]], str]:
        answers = []
        async with worker_mod.serve(worker_cfg(tmp_path / "w"), "127.0.0.1", 0) as worker:
            cfg.gateway.upstreams = [worker.url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry()) as gw, \
                    aiohttp.ClientSession() as s:
                for base in (gw.url, worker.url):
                    for path, body in bodies.items():
                        async with s.post(base + path, data=json.dumps(body).encode(),
                                          headers={"Content-Type": "application/json"}) as r:
                            answers.append((r.status, json.loads(await r.read())))
                async with s.get(gw.url + "/metrics") as r:
                    metrics = await r.text()
        return answers, metrics

    answers, metrics = asyncio.run(main())
    for status, payload in answers:
        assert status == 400, (status, payload)
        assert "lone surrogate" in payload["error"]["message"], payload
    assert f'status="{names.STATUS_ERROR}"' not in metrics


def test_start_up_line_masks_upstream_passwords(tmp_path: Path) -> None:
    """The gateway's start-up line names its upstreams without their passwords."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "LLMSLA_SPOOL_DIR": str(tmp_path / "spool")}
    proc = subprocess.Popen([sys.executable, "-m", "llmsla", "gateway", "--port", "0",
                             "--upstream", "http://ops:hunter2-secret@127.0.0.1:9"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(30)
    assert "listening on" in line, line
    assert "hunter2-secret" not in line and "http://ops:***@127.0.0.1:9" in line, line
