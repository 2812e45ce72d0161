"""Temperature-policy decision spans: trace links, exactly-once PolicyEvents, metrics, OTLP."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import aiohttp
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from llmsla import names
from llmsla.events import PolicyEvent
from llmsla.exporters import genai
from llmsla.exporters.policy_tracing import PolicyTracer, SpoolPolicyExporter
from llmsla.spool import BadLine, SpoolWriter, published_segments, read_segment
from llmsla.temperature import Decision
from llmsla.worker.server import WorkerThread
from tests.worker._worker_util import MODEL, metric_samples, post, worker_cfg


def read_policy_events(spool_dir: str) -> list[PolicyEvent]:
    out = []
    for seg in published_segments(spool_dir, names.SPOOL_POLICY):
        for ev in read_segment(seg, names.SPOOL_POLICY):
            assert not isinstance(ev, BadLine), str(ev)
            out.append(ev)
    return out


def test_decision_spans_are_children_of_the_request_trace_and_spooled_once(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path)
    with WorkerThread(cfg) as wt:
        tracer = wt.running.policy_tracer
        memory = InMemorySpanExporter()
        tracer.add_span_processor(SimpleSpanProcessor(memory))
        cases = [  # (trace id, parent span id, policy, body extras)
            ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", "cosine", {"stream": True}),
            ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", "entropy", {}),
            ("11111111111111112222222222222222", "3333333333333333", "exponential", {"temperature": 0.7}),
            (None, None, "constant", {"stream": True}),
        ]

        async def go() -> list:
            async with aiohttp.ClientSession() as s:
                tasks = []
                for tid, pid, pol, extra in cases:
                    headers = {"traceparent": f"00-{tid}-{pid}-01"} if tid else {}
                    body = {"model": MODEL, "prompt": f"policy {pol}", "max_tokens": 30, "llmsla_policy": pol,
                            "seed": 1, **extra}
                    tasks.append(post(s, wt.url, "/v1/completions", body, headers))
                res = await asyncio.gather(*tasks)
                async with s.get(wt.url + "/metrics") as r:
                    return res, await r.text()

        results, metrics = asyncio.run(go())
        tracer.force_flush()
        decisions = wt.running.engine.stats()["decisions"]

    spans = memory.get_finished_spans()
    req_spans = [s for s in spans if s.name == genai.span_name(genai.TEXT_COMPLETION, MODEL)]
    dec_spans = [s for s in spans if s.name == names.POLICY_SPAN_NAME]
    assert len(req_spans) == len(cases) and len(dec_spans) == decisions
    events = read_policy_events(cfg.spool.dir)
    # exactly once: one PolicyEvent per decision, no duplicates, same span ids as the spans
    assert len(events) == decisions
    assert sorted(e.span_id for e in events) == sorted(format(s.context.span_id, "016x") for s in dec_spans)
    known = {c[0] for c in cases if c[0]}
    for (tid, pid, pol, _), (status, body) in zip(cases, results, strict=True):
        assert status == 200
        last = body[-1] if isinstance(body, list) else body
        n_out = last["llmsla"]["output_tokens"]
        finish = last["choices"][0]["finish_reason"]
        [rs] = [s for s in req_spans if format(s.context.trace_id, "032x") == tid
                or (tid is None and format(s.context.trace_id, "032x") not in known)]
        if tid is None:  # no traceparent: a new root trace
            assert rs.parent is None
        else:
            assert format(rs.parent.span_id, "016x") == pid and rs.parent.is_remote
        kids = [s for s in dec_spans if s.parent.span_id == rs.context.span_id]
        assert all(s.context.trace_id == rs.context.trace_id for s in kids)
        # one decision per sampled token (plus the one that sampled EOS, if it stopped there)
        assert len(kids) == n_out + (1 if finish == "stop" else 0)
        trace_hex = format(rs.context.trace_id, "032x")
        mine = [e for e in events if e.trace_id == trace_hex]
        assert sorted(e.step for e in mine) == list(range(len(kids)))
        assert {e.policy_id for e in mine} == {pol} and {e.zone for e in mine} == {"default"}
        assert Counter(e.step for e in mine if e.action == "set") == Counter({0: 1})
        if pol == "exponential":
            by_step = sorted(mine, key=lambda e: e.step)
            for e in by_step:  # closed form with the worker's defaults: max(0.1, 0.7 * 0.98**s)
                assert abs(e.temperature - max(0.1, 0.7 * 0.98**e.step)) < 1e-9
        if pol == "entropy":
            assert {e.trigger for e in mine} <= {"entropy_low", "entropy_high", "entropy_ok"}
    # the counter agrees with the engine, per action
    counted = metric_samples(metrics, names.POLICY_DECISIONS + "_total")
    assert sum(counted.values()) == decisions
    by_action = Counter(e.action for e in events)
    for action, n in by_action.items():
        assert sum(v for k, v in counted.items() if f'action="{action}"' in k) == n
    assert metric_samples(metrics, names.POLICY_TEMPERATURE)


def test_spool_exporter_drops_a_bad_span_and_keeps_the_good_ones(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path)
    spool = SpoolWriter(cfg.spool.dir, names.SPOOL_POLICY, background=False)
    tracer = PolicyTracer(cfg, registry=CollectorRegistry(), spool=spool)
    root = tracer.request_span({})
    tracer.record(root, "linear", "z1", 0, Decision(0.5, "set", "schedule"), 1_000_000_000, 1_002_000_000)
    bad = tracer.tracer.start_span(names.POLICY_SPAN_NAME, attributes={names.SPAN_ATTR_POLICY_ID: "x"})
    bad.end()
    tracer.record(root, "linear", "z1", 1, Decision(0.4, "lower", "schedule"), 1_003_000_000, 1_003_500_000)
    root.end()
    tracer.force_flush()
    exporter: SpoolPolicyExporter = tracer.spool_exporter
    assert exporter.rejected == 1 and exporter.exported == 2
    events = sorted(read_policy_events(cfg.spool.dir), key=lambda e: e.step)
    assert [(e.step, e.temperature, e.action, e.ts_ms, e.duration_ms) for e in events] == [
        (0, 0.5, "set", 1000, 2.0), (1, 0.4, "lower", 1003, 0.5)]
    tracer.shutdown()
    spool.close()


def test_otlp_http_export_when_an_endpoint_is_configured(tmp_path: Path) -> None:
    """A real OTLP/HTTP receiver on loopback gets every decision span besides the spool."""
    received: list[ExportTraceServiceRequest] = []
    ready = threading.Event()
    state: dict = {}

    async def traces(request: web.Request) -> web.Response:
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(await request.read())
        received.append(msg)
        return web.Response(body=b"", content_type="application/x-protobuf")

    def serve() -> None:
        async def main() -> None:
            app = web.Application()
            app.router.add_post("/v1/traces", traces)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            state["port"], state["stop"] = runner.addresses[0][1], asyncio.Event()
            state["loop"] = asyncio.get_running_loop()
            ready.set()
            await state["stop"].wait()
            await runner.cleanup()

        asyncio.run(main())

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    assert ready.wait(10)
    try:
        cfg = worker_cfg(tmp_path)
        cfg.otel.endpoint = f"http://127.0.0.1:{state['port']}/v1/traces"
        tracer = PolicyTracer(cfg, registry=CollectorRegistry())
        root = tracer.request_span({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
        for step in range(25):
            tracer.record(root, "cosine", "default", step, Decision(1.0, "hold", "schedule"), 10**18 + step, 10**18 + step + 5)
        root.end()
        tracer.force_flush()
        tracer.shutdown()
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        th.join(10)
    spans = [sp for msg in received for rs in msg.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    decide = [sp for sp in spans if sp.name == names.POLICY_SPAN_NAME]
    assert len(decide) == 25
    assert {sp.trace_id.hex() for sp in spans} == {"4bf92f3577b34da6a3ce929d0e0e4736"}
    [req] = [sp for sp in spans if sp.name == genai.TEXT_COMPLETION]  # no model given: the operation alone
    assert req.parent_span_id.hex() == "00f067aa0ba902b7"
    assert {sp.parent_span_id for sp in decide} == {req.span_id}
    assert len(read_policy_events(cfg.spool.dir)) == 25


def test_fast_line_encoder_equals_the_contract_serialiser() -> None:
    """The exporter's cached-validation encoder writes exactly ``PolicyEvent.to_json()`` and
    rejects what the contract rejects, also once the strings are cached."""
    import random

    import pytest
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan

    from llmsla.events import EventError
    from llmsla.exporters.policy_tracing import PolicyLineEncoder, span_to_event

    rng = random.Random(4)
    enc = PolicyLineEncoder()

    def span(**attrs):
        base = {names.SPAN_ATTR_POLICY_ID: rng.choice(["cosine", "entropy", 'q"uote']),
                names.SPAN_ATTR_ZONE: rng.choice(["default", "eu-1", "zoné"]),
                names.SPAN_ATTR_STEP: rng.randrange(0, 5000), names.SPAN_ATTR_TEMPERATURE: rng.uniform(0, 2),
                names.SPAN_ATTR_ACTION: rng.choice(["set", "hold", "raise", "lower"]),
                names.SPAN_ATTR_TRIGGER: rng.choice(["schedule", "entropy_low"])}
        base.update(attrs)
        start = rng.randrange(1, 2**62)
        ctx = trace.SpanContext(rng.getrandbits(128) or 1, rng.getrandbits(64) or 1, is_remote=False)
        return ReadableSpan(name=names.POLICY_SPAN_NAME, context=ctx, attributes=base, start_time=start,
                            end_time=start + rng.randrange(0, 10**7))

    for _ in range(3000):
        sp = span()
        assert enc.line(sp) == span_to_event(sp).to_json()
    for bad in ({names.SPAN_ATTR_TEMPERATURE: 101.0}, {names.SPAN_ATTR_TEMPERATURE: float("nan")},
                {names.SPAN_ATTR_STEP: -1}, {names.SPAN_ATTR_STEP: True}, {names.SPAN_ATTR_STEP: 1.5},
                {names.SPAN_ATTR_ACTION: "explode"}, {names.SPAN_ATTR_ZONE: ""}):
        sp = span(**bad)
        with pytest.raises(EventError):
            span_to_event(sp)
        with pytest.raises(EventError):
            enc.line(sp)
    missing = span()
    enc.line(missing)  # caches its strings
    attrs = dict(missing.attributes)
    del attrs[names.SPAN_ATTR_STEP]
    with pytest.raises(EventError, match="step"):
        enc.line(ReadableSpan(name=names.POLICY_SPAN_NAME, context=missing.context, attributes=attrs,
                              start_time=missing.start_time, end_time=missing.end_time))
