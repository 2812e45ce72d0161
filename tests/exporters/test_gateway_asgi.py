"""InstrumentedASGI around a tiny raw ASGI app, served over real loopback HTTP.

uvicorn is not installed, so the test carries a minimal ASGI server adapter on aiohttp (scope
from the request, body replayed to ``receive``, ``send`` messages written to the socket); a
client that goes away makes ``send`` raise, as in real ASGI servers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import openai
from aiohttp import web
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.exporters.asgi import InstrumentedASGI
from llmsla.spool import SpoolWriter, published_segments, read_segment

MODEL = "asgi-model"
seen_traceparents: list[str] = []


async def tiny_app(scope, receive, send) -> None:
    """An OpenAI-ish ASGI app: completions (stream or not), a 500 mode, and /ping."""
    assert scope["type"] == "http"
    if scope["path"] == "/ping":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"pong"})
        return
    raw = b""
    while True:
        msg = await receive()
        raw += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    seen_traceparents.append(dict(scope["headers"]).get(b"traceparent", b"").decode())
    try:
        body = json.loads(raw)
    except ValueError:
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"error": {"message": "app says bad json"}}'})
        return
    n = int(body.get("max_tokens", 3))
    if body.get("prompt") == "boom":
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b"internal"})
        return
    usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
    if not body.get("stream"):
        out = json.dumps({"choices": [{"index": 0, "text": "y" * n}], "usage": usage}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for i in range(n):
        await asyncio.sleep(0.02 if body.get("prompt") == "slow" else 0.002)
        chunk = {"choices": [{"index": 0, "text": "y"}], **({"usage": usage} if i == n - 1 else {})}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                    "more_body": True})
    linger = body.get("prompt") == "linger"  # as Starlette's StreamingResponse: the end in its own message
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": linger})
    if linger:
        await asyncio.sleep(0.5)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@asynccontextmanager
async def asgi_server(app) -> AsyncIterator[str]:
    """Minimal ASGI HTTP server on aiohttp: enough of the spec for the middleware and app."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": request.method, "scheme": "http", "path": request.path, "raw_path": request.path.encode(),
            "query_string": request.query_string.encode(), "root_path": "",
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()],
            "client": request.transport.get_extra_info("peername")[:2] if request.transport else None,
            "server": ("127.0.0.1", request.url.port),
        }
        sent_body = False
        disconnect = asyncio.Event()
        resp: web.StreamResponse | None = None

        async def receive():
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(msg) -> None:
            nonlocal resp
            if msg["type"] == "http.response.start":
                resp = web.StreamResponse(status=msg["status"])
                for k, v in msg.get("headers", []):
                    resp.headers[k.decode("latin-1")] = v.decode("latin-1")
                await resp.prepare(request)
            elif msg["type"] == "http.response.body":
                assert resp is not None
                await resp.write(msg.get("body", b""))  # raises once the client is gone
                if not msg.get("more_body", False):
                    await resp.write_eof()

        try:
            await app(scope, receive, send)
        finally:
            disconnect.set()
        assert resp is not None
        return resp

    srv = web.Application()
    srv.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(srv, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def test_middleware_records_like_the_gateway(tmp_path: Path) -> None:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    reg = CollectorRegistry()
    spool = SpoolWriter(cfg.spool_dir(), names.SPOOL_REQUESTS, background=False)
    app = InstrumentedASGI.from_config(tiny_app, cfg, registry=reg, spool=spool, replica="pod-1")
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    seen_traceparents.clear()

    async def main() -> dict:
        got: dict = {}
        async with asgi_server(app) as url, aiohttp.ClientSession() as s:
            async def post(body, **kw):
                async with s.post(url + "/v1/completions", data=json.dumps(body) if not isinstance(body, bytes)
                                  else body, **kw) as r:
                    return r.status, await r.text()

            got["stream"] = await post({"model": MODEL, "prompt": "hi", "max_tokens": 5, "stream": True},
                                       headers={"traceparent": tp})
            got["plain"] = await post({"model": MODEL, "prompt": "hi", "max_tokens": 4})
            got["boom"] = await post({"model": MODEL, "prompt": "boom"})
            got["bad"] = await post(b"{nope")
            async with s.get(url + "/ping") as r:
                got["ping"] = (r.status, await r.text())
            async with s.post(url + "/v1/completions", json={"model": MODEL, "prompt": "slow", "max_tokens": 100,
                                                              "stream": True}) as r:
                await r.content.readline()
                r.close()
            await asyncio.sleep(0.3)
            got["after"] = await post({"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": True})
        return got

    got = asyncio.run(main())
    spool.close()
    assert got["stream"][0] == 200 and got["stream"][1].endswith("data: [DONE]\n\n")  # passed through
    assert got["plain"][0] == 200 and got["boom"][0] == 500
    assert got["bad"] == (400, '{"error": {"message": "app says bad json"}}')  # the app's own answer
    assert got["ping"] == (200, "pong")
    evs = [e for seg in published_segments(cfg.spool_dir(), names.SPOOL_REQUESTS)
           for e in read_segment(seg, names.SPOOL_REQUESTS)]
    assert [e.status for e in evs] == ["ok", "ok", "error", "cancelled", "ok"]
    first = evs[0]
    assert first.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert seen_traceparents[0].split("-")[1] == first.trace_id and seen_traceparents[0] != tp
    assert first.replica == "pod-1" and first.model == MODEL
    assert first.output_tokens == 5 and first.prompt_tokens == 7 and first.itl_ms.n == 4
    assert first.ttft_ms is not None and first.ttft_ms <= first.e2e_ms
    assert evs[1].output_tokens == 4 and evs[1].itl_ms.n == 0
    assert 1 <= evs[3].output_tokens < 100
    lbl = {"model": MODEL, "pool": cfg.gateway.pool, "replica": "pod-1", "arm": names.DEFAULT_ARM,
           names.L_TENANT: names.DEFAULT_TENANT, names.L_CLASS: names.DEFAULT_CLASS}
    assert reg.get_sample_value("llmsla_requests_total", {**lbl, "status": "ok"}) == 3
    assert reg.get_sample_value("llmsla_request_inter_chunk_seconds_count", lbl) == sum(e.itl_ms.n for e in evs)
    assert reg.get_sample_value("llmsla_gateway_bad_requests_total", {"reason": "invalid_json"}) == 1
    assert reg.get_sample_value("llmsla_requests_in_flight", {"pool": cfg.gateway.pool}) == 0


def test_middleware_resolves_tenant_and_class_like_the_gateway(tmp_path: Path) -> None:
    """The same resolver as the gateway (exporters/tenants.py) from the ASGI request's headers:
    an API key, a trusted proxy's tenant header (any case), a class asked for, an undeclared
    tenant folded into ``other`` and counted."""
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.gateway.trusted_proxies = ["127.0.0.1/32"]
    cfg.tenants.header = "X-Tenant"
    cfg.tenants.declared = {"acme": "interactive", "globex": "batch"}
    key = "sk-acme-0123456789abcdef"
    cfg.tenants.api_keys = {key: "acme"}
    reg = CollectorRegistry()
    spool = SpoolWriter(cfg.spool_dir(), names.SPOOL_REQUESTS, background=False)
    app = InstrumentedASGI.from_config(tiny_app, cfg, registry=reg, spool=spool, replica="pod-1")
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}

    async def main() -> list[int]:
        codes = []
        async with asgi_server(app) as url, aiohttp.ClientSession() as s:
            for headers in ({"Authorization": f"Bearer {key}"}, {"x-tenant": "globex"},
                            {"X-Tenant": "globex", cfg.tenants.class_header: "sheddable"},
                            {"X-Tenant": "initech"}, {}):
                async with s.post(url + "/v1/completions", json=body, headers=headers) as r:
                    codes.append(r.status)
        return codes

    assert asyncio.run(main()) == [200] * 5
    spool.close()
    evs = [e for seg in published_segments(cfg.spool_dir(), names.SPOOL_REQUESTS)
           for e in read_segment(seg, names.SPOOL_REQUESTS)]
    other = names.LABEL_OVERFLOW_VALUE
    assert [(e.tenant, e.class_) for e in evs] == [("acme", "interactive"), ("globex", "batch"),
                                                  ("globex", "sheddable"), (other, "interactive"),
                                                  (other, "interactive")]
    lbl = {"model": MODEL, "pool": cfg.gateway.pool, "replica": "pod-1", "arm": names.DEFAULT_ARM, "status": "ok"}
    assert reg.get_sample_value("llmsla_requests_total", {**lbl, names.L_TENANT: "globex", names.L_CLASS: "batch"}) == 1
    assert reg.get_sample_value("llmsla_requests_total", {**lbl, names.L_TENANT: other, names.L_CLASS: "interactive"}) == 2
    folded = {s.labels.get("label"): s.value for m in reg.collect() for s in m.samples
              if "overflow" in s.name and s.name.endswith("_total")}
    assert folded.get(names.L_TENANT) == 1, folded


def test_a_client_leaving_after_done_was_answered(tmp_path: Path) -> None:
    """OpenAI's SDK closes the connection at ``data: [DONE]``; an app that ends the body in a
    later message (Starlette's streaming responses do) has still answered it."""
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    spool = SpoolWriter(cfg.spool_dir(), names.SPOOL_REQUESTS, background=False)
    app = InstrumentedASGI.from_config(tiny_app, cfg, registry=CollectorRegistry(), spool=spool)

    async def main() -> list[str]:
        async with asgi_server(app) as url:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            stream = await client.completions.create(model=MODEL, prompt="linger", max_tokens=3, stream=True)
            texts = [c.choices[0].text async for c in stream]
            await client.close()
            await asyncio.sleep(0.8)  # past the app's end of the body
            return texts

    texts = asyncio.run(main())
    spool.close()
    evs = [e for seg in published_segments(cfg.spool_dir(), names.SPOOL_REQUESTS)
           for e in read_segment(seg, names.SPOOL_REQUESTS)]
    assert texts == ["y"] * 3
    assert [(e.status, e.output_tokens) for e in evs] == [(names.STATUS_OK, 3)]
