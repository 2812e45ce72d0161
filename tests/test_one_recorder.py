"""The gateway, the ASGI middleware and the fleet simulator emit through one Recorder: each path
makes a SERVER span and a GenAI span under it (in-memory span exporter), a spool RequestEvent,
and the ``/metrics`` request histogram, under the same names as the gateway's."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry, generate_latest

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import wiring
from llmsla.exporters.asgi import InstrumentedASGI
from llmsla.fleet import engine, workload
from llmsla.fleet.sink import RecorderSink
from llmsla.spool import SpoolWriter, published_segments, read_segment

MODEL = "m1"
CHUNKS = [b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
          b'data: {"choices":[{"index":0,"delta":{"content":"b"}}],'
          b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n',
          b"data: [DONE]\n\n"]
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _cfg(tmp_path: Path, name: str) -> config_mod.Config:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / name)
    return cfg


def _emitted(cfg: config_mod.Config, reg: CollectorRegistry, memory: InMemorySpanExporter) -> dict:
    """What one path left behind: span (name, kind) pairs, spool events, /metrics text."""
    events = [e for seg in published_segments(cfg.spool_dir(), names.SPOOL_REQUESTS)
              for e in read_segment(seg, names.SPOOL_REQUESTS)]
    spans = memory.get_finished_spans()
    return {"spans": {(s.name, s.kind) for s in spans}, "events": events, "span_objs": spans,
            "metrics": generate_latest(reg).decode()}


@asynccontextmanager
async def _upstream() -> AsyncIterator[str]:
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for c in CHUNKS:
            await resp.write(c)
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _via_gateway(tmp_path: Path) -> dict:
    cfg = _cfg(tmp_path, "gw")
    reg, memory = CollectorRegistry(), InMemorySpanExporter()

    async def main() -> None:
        async with _upstream() as url:
            cfg.gateway.upstreams = [url]
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=reg,
                                            span_processor=SimpleSpanProcessor(memory)) as gw, \
                    aiohttp.ClientSession() as s, s.post(gw.url + "/v1/chat/completions", json=BODY) as r:
                assert r.status == 200
                await r.read()

    asyncio.run(main())
    return _emitted(cfg, reg, memory)


async def _chat_app(scope, receive, send) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for c in CHUNKS:
        await send({"type": "http.response.body", "body": c, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _via_asgi(tmp_path: Path) -> dict:
    cfg = _cfg(tmp_path, "asgi")
    reg, memory = CollectorRegistry(), InMemorySpanExporter()
    spool = SpoolWriter(cfg.spool_dir(), names.SPOOL_REQUESTS, background=False)
    rec = wiring.recorder(cfg, registry=reg, spool=spool, span_processor=SimpleSpanProcessor(memory))
    app = InstrumentedASGI(_chat_app, rec, cfg, replica="pod-1")
    sent: list[dict] = []
    body = json.dumps(BODY).encode()

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: dict) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    asyncio.run(app(scope, receive, send))
    spool.close()
    assert sent[0]["status"] == 200
    return _emitted(cfg, reg, memory)


def _via_simulator(tmp_path: Path) -> dict:
    cfg = _cfg(tmp_path, "sim")
    reg, memory = CollectorRegistry(), InMemorySpanExporter()
    arrivals = workload.poisson(2.0, 5.0, workload.TokenDist(64, 0.0), workload.TokenDist(8, 0.0),
                                random.Random(1))
    sim = engine.SimConfig(engine.fleet("6b:1"), seed=1, timeout_s=60)
    with RecorderSink(cfg, registry=reg, span_processor=SimpleSpanProcessor(memory)) as sink:
        engine.Simulator(sim).run(arrivals, sink=sink)
    out = _emitted(cfg, reg, memory)
    out["n"] = len(arrivals)
    return out


def test_asgi_and_simulator_emit_what_the_gateway_emits(tmp_path: Path) -> None:
    gw, asgi, sim = _via_gateway(tmp_path), _via_asgi(tmp_path), _via_simulator(tmp_path)
    server = ("POST /v1/chat/completions", SpanKind.SERVER)
    assert gw["spans"] == {server, (f"chat {MODEL}", SpanKind.CLIENT)}
    # the in-process app: the same names, the GenAI span INTERNAL (no remote hop)
    assert asgi["spans"] == {server, (f"chat {MODEL}", SpanKind.INTERNAL)}
    # the simulator's model names are its catalogue's; the span names follow the same pattern
    assert server in sim["spans"] and {k for _, k in sim["spans"]} == {SpanKind.SERVER, SpanKind.CLIENT}
    assert {n for n, k in sim["spans"] if k == SpanKind.CLIENT} == {f"chat {e.model}" for e in sim["events"]}
    for path in (gw, asgi, sim):
        (ev, *_) = path["events"]
        assert ev.status == names.STATUS_OK
        # the spans carry the event's trace id and its values, on every path
        hop = next(s for s in path["span_objs"] if s.kind != SpanKind.SERVER and s.context.trace_id == int(ev.trace_id, 16))
        assert hop.attributes[names.OTEL_ATTR_REPLICA] == ev.replica
        assert hop.attributes[names.OTEL_ATTR_STATUS] == names.STATUS_OK
        line = next(ln for ln in path["metrics"].splitlines()
                    if ln.startswith(names.REQUEST_E2E_SECONDS + "_count{") and f'replica="{ev.replica}"' in ln)
        assert float(line.rsplit(" ", 1)[1]) >= 1.0
    assert len(gw["events"]) == len(asgi["events"]) == 1 and len(sim["events"]) == sim["n"]
    assert len([s for s in sim["span_objs"] if s.kind == SpanKind.SERVER]) == sim["n"]
