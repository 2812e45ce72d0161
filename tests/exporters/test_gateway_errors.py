"""Gateway failure handling against real loopback HTTP upstreams that misbehave on purpose.

Each case checks the HTTP answer the client gets (4xx with a reason where the client is at
fault, never a 500), the ``status`` of the spooled ``RequestEvent``, and that the good requests
sent around the bad ones are all recorded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import httpkit, names
from llmsla.app import wiring
from llmsla.control.router import Router
from llmsla.exporters import gateway as gw_mod
from llmsla.spool import published_segments, read_segment

MODEL = "tiny"


def _cfg(tmp_path: Path, **gateway) -> config_mod.Config:
    c = config_mod.load(env={})
    c.spool.dir = str(tmp_path / "spool")
    c.control.route_policy = "round_robin"
    for k, v in gateway.items():
        setattr(c.gateway, k, v)
    return c


def _chunk(text: str, **extra) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text}], **extra}).encode() + b"\n\n"


class Upstream:
    """A tiny OpenAI-ish server; the prompt selects the misbehaviour."""

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []
        self.cancelled = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.traceparents.append(request.headers.get("traceparent"))
        prompt, n = body["prompt"], int(body.get("max_tokens", 3))
        if prompt == "boom":
            return web.Response(status=500, text="kaboom")
        if prompt == "refuse":
            return web.json_response({"error": {"message": "prompt too long for model"}}, status=400)
        if prompt == "stall":
            await asyncio.sleep(30)
        if not body.get("stream"):
            return web.json_response({"choices": [{"index": 0, "text": "x" * n}],
                                      "usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n},
                                      "llmsla": {"worker_ttft_ms": 0.1, "worker_queue_ms": 0.0,
                                                 "prompt_tokens": 4, "output_tokens": n}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(n):
                if prompt == "stall-mid" and i == 1:
                    await asyncio.sleep(30)
                if prompt == "die-mid" and i == 1:  # replica crashes mid-stream
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if prompt == "slow":
                    await asyncio.sleep(0.05)
                extra = {}
                if i == n - 1:
                    extra = {"usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n},
                             "llmsla": {"worker_ttft_ms": 0.1, "worker_queue_ms": 0.0, "prompt_tokens": 4,
                                        "output_tokens": n}}
                await resp.write(_chunk("x", **extra))
            await resp.write(b"data: [DONE]\n\n")
            if prompt == "linger":  # the body's end comes well after [DONE]
                await asyncio.sleep(0.5)
            if prompt == "hang-after-done":  # the replica never ends the body
                await asyncio.sleep(30)
            if prompt == "die-after-done":  # the replica goes away before the body's end
                await asyncio.sleep(0.05)
                assert request.transport is not None
                request.transport.abort()
                return resp
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


@asynccontextmanager
async def upstream() -> AsyncIterator[tuple[str, Upstream]]:
    up = Upstream()
    app = web.Application()
    app.router.add_post("/v1/completions", up.completions)
    app.router.add_get("/v1/models", up.models)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", up
    finally:
        await runner.cleanup()


def events(cfg: config_mod.Config) -> list:
    out = []
    for seg in published_segments(cfg.spool_dir(), names.SPOOL_REQUESTS):
        out += list(read_segment(seg, names.SPOOL_REQUESTS))
    return out


async def _post(s: aiohttp.ClientSession, url: str, body, headers: dict | None = None) -> tuple[int, dict | str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    async with s.post(url + "/v1/completions", data=data, headers=hdrs) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


def good(stream: bool = True, n: int = 3) -> dict:
    return {"model": MODEL, "prompt": "hello", "max_tokens": n, "stream": stream}


def test_malformed_requests_get_4xx_reasons_and_good_ones_survive(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, max_body_bytes=2048, max_prompt_chars=100)
    reg = CollectorRegistry()

    async def main() -> list[tuple[int, object]]:
        async with upstream() as (url, _), wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=reg) as gw:
            cfg.gateway.upstreams = [url]
            gw.gateway.router.add_replica(gw_mod.Replica(id="r0", pool=cfg.gateway.pool, url=url))
            async with aiohttp.ClientSession() as s:
                out = [await _post(s, gw.url, good())]
                out.append(await _post(s, gw.url, b"{not json"))
                out.append(await _post(s, gw.url, {"prompt": "hi"}))
                out.append(await _post(s, gw.url, {"model": "", "prompt": "hi"}))
                out.append(await _post(s, gw.url, {"model": MODEL}))
                out.append(await _post(s, gw.url, {"model": MODEL, "prompt": "x" * 101}))
                out.append(await _post(s, gw.url, {"model": MODEL, "prompt": "x" * 3000}))
                out.append(await _post(s, gw.url, {"model": MODEL, "prompt": "hi", "stream": "yes"}))
                out.append(await _post(s, gw.url, [1, 2]))
                out.append(await _post(s, gw.url, good(stream=False)))
                return out

    res = asyncio.run(main())
    codes = [c for c, _ in res]
    assert codes == [200, 400, 400, 400, 400, 400, 413, 400, 400, 200]
    reasons = [b["error"]["code"] for c, b in res if c >= 400]  # type: ignore[index]
    assert reasons == ["invalid_json", "missing_model", "invalid_model", "missing_prompt", "prompt_too_long",
                       "body_too_large", "invalid_field", "invalid_json"]
    assert "model" in res[2][1]["error"]["message"]  # type: ignore[index]
    evs = events(cfg)
    assert [e.status for e in evs] == ["ok", "ok"]
    assert evs[0].output_tokens == 3 and evs[0].itl_ms.n == 2 and evs[0].ttft_ms is not None
    assert evs[1].ttft_ms <= evs[1].e2e_ms and evs[1].itl_ms.n == 0  # non-streaming: tokens at the end
    assert reg.get_sample_value("llmsla_gateway_bad_requests_total", {"reason": "invalid_json"}) == 2
    assert reg.get_sample_value("llmsla_gateway_bad_requests_total", {"reason": "body_too_large"}) == 1


def test_upstream_errors_timeouts_and_cancellation(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, request_timeout_s=0.5)
    reg = CollectorRegistry()

    async def main() -> dict:
        got: dict = {}
        async with upstream() as (url, up):
            dead = f"http://127.0.0.1:{__import__('llmsla.services').services.free_port()}"
            router = Router([gw_mod.Replica("r0", cfg.gateway.pool, url)], policy="round_robin", registry=reg)
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=reg, router=router) as gw, \
                    aiohttp.ClientSession() as s:
                got["ok1"] = await _post(s, gw.url, good())
                got["boom"] = await _post(s, gw.url, {**good(), "prompt": "boom"})
                got["refuse"] = await _post(s, gw.url, {**good(), "prompt": "refuse"})
                got["stall"] = await _post(s, gw.url, {**good(), "prompt": "stall"})
                got["stall_mid"] = await _post(s, gw.url, {**good(), "prompt": "stall-mid"})
                got["die_mid"] = await _post(s, gw.url, {**good(), "prompt": "die-mid"})
                # client disconnect mid-stream: read the first token, then drop the connection
                async with s.post(gw.url + "/v1/completions", json={**good(n=50), "prompt": "slow"}) as r:
                    got["slow_status"] = r.status
                    await r.content.readline()
                    r.close()
                await asyncio.sleep(0.3)
                got["ok2"] = await _post(s, gw.url, good(stream=False))
                # a replica whose port has nothing listening: connection refused -> 502
                router.add_replica(gw_mod.Replica("r1", cfg.gateway.pool, dead))
                router.drain("r0")
                got["dead"] = await _post(s, gw.url, good())
                router.undrain("r0")
                router.drain("r1")
                got["ok3"] = await _post(s, gw.url, good())
            got["upstream_cancelled"] = up.cancelled
        return got

    got = asyncio.run(main())
    assert got["ok1"][0] == 200 and got["ok2"][0] == 200 and got["ok3"][0] == 200
    assert got["boom"][0] == 502 and got["boom"][1]["error"]["code"] == "upstream_error"
    assert "500" in got["boom"][1]["error"]["message"]
    assert got["refuse"][0] == 400 and "too long" in got["refuse"][1]["error"]["message"]
    assert got["stall"][0] == 504 and got["stall"][1]["error"]["code"] == "upstream_timeout"
    # the stream had begun: 200, one token, then an SSE error event
    assert got["stall_mid"][0] == 200 and "event: error" in got["stall_mid"][1]
    assert "upstream_timeout" in got["stall_mid"][1]
    assert got["die_mid"][0] == 200 and "event: error" in got["die_mid"][1]
    assert "upstream_error" in got["die_mid"][1]
    assert got["slow_status"] == 200
    assert got["dead"][0] == 502
    assert got["upstream_cancelled"] >= 1  # the gateway aborted the upstream stream too
    evs = events(cfg)
    assert [e.status for e in evs] == ["ok", "error", "rejected", "timeout", "timeout", "error", "cancelled", "ok",
                                       "error", "ok"]
    assert [e.replica for e in evs] == ["r0"] * 8 + ["r1", "r0"]
    stall_mid = evs[4]
    assert stall_mid.ttft_ms is not None and stall_mid.output_tokens == 1 and stall_mid.e2e_ms >= 500
    assert evs[5].output_tokens == 1  # the token that made it before the crash
    cancelled = evs[6]
    assert cancelled.ttft_ms is not None and 1 <= cancelled.output_tokens < 50
    for e in evs:
        assert e.ttft_ms is None or e.ttft_ms <= e.e2e_ms
    total = sum(reg.get_sample_value("llmsla_requests_total", {"model": MODEL, "pool": cfg.gateway.pool,
                                                                "replica": r, "arm": names.DEFAULT_ARM,
                                                                "status": st, names.L_TENANT: names.DEFAULT_TENANT,
                                                                names.L_CLASS: names.DEFAULT_CLASS}) or 0
                for r in ("r0", "r1") for st in names.STATUSES)
    assert total == len(evs)


def test_overload_rejects_with_429(tmp_path: Path) -> None:
    # one client: the global bound, not the per-client one (test_gateway_client_share.py)
    cfg = _cfg(tmp_path, max_in_flight=2, max_concurrency=1, request_timeout_s=2.0, client_share=1.0)

    async def main() -> list:
        async with upstream() as (url, _):
            cfg.gateway.upstreams = [url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry()) as gw, \
                    aiohttp.ClientSession() as s:
                slow = [asyncio.create_task(_post(s, gw.url, {**good(n=6), "prompt": "slow"})) for _ in range(2)]
                await asyncio.sleep(0.1)
                rejected = await _post(s, gw.url, good())
                done = await asyncio.gather(*slow)
                after = await _post(s, gw.url, good())
                return [rejected, *done, after]

    res = asyncio.run(main())
    assert res[0][0] == 429 and res[0][1]["error"]["code"] == "overloaded"
    assert [r[0] for r in res[1:]] == [200, 200, 200]
    evs = events(cfg)
    assert sorted(e.status for e in evs) == ["ok", "ok", "ok", "rejected"]
    rej = next(e for e in evs if e.status == "rejected")
    assert rej.replica == names.NO_REPLICA and rej.ttft_ms is None
    # max_concurrency=1: one of the two slow requests queued behind the other (~6 x 50 ms)
    queued = sorted(e.queue_ms for e in evs if e.status == "ok" and e.output_tokens == 6)
    assert queued[1] >= 200


def test_traceparent_propagation_and_models(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    async def main() -> tuple:
        async with upstream() as (url, up):
            cfg.gateway.upstreams = [url, url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry()) as gw, \
                    aiohttp.ClientSession() as s:
                async with s.post(gw.url + "/v1/completions", json=good(), headers={"traceparent": incoming}) as r:
                    await r.read()
                    returned = r.headers["traceparent"]
                await _post(s, gw.url, good())
                await _post(s, gw.url, good(), headers={"traceparent": "00-zz-bad"})
                async with s.get(gw.url + "/v1/models") as r:
                    models = await r.json()
                async with s.get(gw.url + "/healthz") as r:
                    health = await r.json()
            return up.traceparents, returned, models, health

    sent, returned, models, health = asyncio.run(main())
    evs = events(cfg)
    assert evs[0].trace_id == "0af7651916cd43dd8448eb211c80319c"
    tid, sid, flags = sent[0].split("-")[1:]
    assert tid == evs[0].trace_id and sid != "b7ad6b7169203331" and flags == "01"
    assert returned == sent[0]
    for tp, ev in zip(sent[1:], evs[1:], strict=True):  # created when absent or invalid
        assert httpkit.trace_context({"traceparent": tp})[0] == ev.trace_id and tp.endswith("-01")  # valid W3C
    assert evs[1].trace_id != evs[2].trace_id
    assert [e.replica for e in evs] == ["r0", "r1", "r0"]
    assert models["data"] == [{"id": MODEL, "object": "model"}]
    assert health["status"] == "ok" and health["replicas"] == ["r0", "r1"]
