"""Request spans: caller -> the gateway's HTTP SERVER span -> its GenAI CLIENT span for the hop to
the replica -> the worker's span -> policy decisions, through a real OTLP/HTTP receiver, with
attribute values equal to the request's RequestEvent and the worker's response; parent-based
sampling; no SDK spans without an exporter."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import aiohttp
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import inject
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import wiring
from llmsla.events import RequestEvent
from llmsla.exporters import genai
from llmsla.exporters.openai import CHAT_COMPLETIONS, parse_request
from llmsla.spool import published_segments, read_segment
from llmsla.worker.server import WorkerThread
from tests.exporters.otlp_receiver import OtlpReceiver, attributes
from tests.exporters.test_policy_tracing import read_policy_events
from tests.worker._worker_util import MODEL, parse_sse, worker_cfg

CHAT = genai.span_name(genai.CHAT, MODEL)
SERVER = f"POST {CHAT_COMPLETIONS}"  # the gateway's HTTP server span


def request_events(cfg: config_mod.Config) -> list[RequestEvent]:
    return [e for seg in published_segments(cfg.spool_dir(), names.SPOOL_REQUESTS)
            for e in read_segment(seg, names.SPOOL_REQUESTS)]


def gateway_cfg(cfg: config_mod.Config, upstream: str, **otel: Any) -> config_mod.Config:
    g = copy.deepcopy(cfg)
    g.gateway.upstreams = [upstream]
    g.spool.segment_max_age_s = 0.05
    for k, v in otel.items():
        setattr(g.otel, k, v)
    return g


async def chat(url: str, headers: dict[str, str], **body: Any) -> tuple[int, Any, str]:
    """A chat completion through the gateway: (status, SSE payloads or JSON body, the response's
    traceparent)."""
    payload = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "Four score and"}],
               "max_tokens": 12, "temperature": 0.8, "seed": 3, **body}
    async with aiohttp.ClientSession() as s, s.post(url + CHAT_COMPLETIONS, json=payload, headers=headers) as r:
        raw = await r.read()
        sse = r.headers.get("Content-Type", "").startswith("text/event-stream")
        return r.status, parse_sse(raw) if sse else json.loads(raw), r.headers["traceparent"]


def test_span_tree_of_a_streamed_chat_completion(tmp_path: Path) -> None:
    with OtlpReceiver() as rx:
        cfg = worker_cfg(tmp_path)
        cfg.otel.endpoint = rx.traces_url
        caller_provider = TracerProvider(resource=Resource.create({"service.name": "caller"}))
        caller_provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=rx.traces_url)))
        caller = caller_provider.get_tracer("test-caller")
        with WorkerThread(cfg) as wt:
            gcfg = gateway_cfg(cfg, wt.url)

            async def main() -> tuple[int, list, str, str]:
                async with wiring.serve_gateway(gcfg, "127.0.0.1", 0, registry=CollectorRegistry()) as gw:
                    with caller.start_as_current_span("caller", kind=trace.SpanKind.CLIENT):
                        headers: dict[str, str] = {}
                        inject(headers)  # the caller's W3C traceparent, as any instrumented client sends it
                        status, chunks, returned = await chat(gw.url, headers)
                    assert gw.gateway.telemetry.force_flush()
                    return status, chunks, returned, headers["traceparent"]

            status, chunks, returned, sent = asyncio.run(main())
            assert wt.running.policy_tracer.force_flush()
            worker_port = wt.running.port
        caller_provider.force_flush()
        caller_provider.shutdown()
        spans = rx.spans()

    assert status == 200
    last = chunks[-1]
    finish = last["choices"][0]["finish_reason"]
    [ev] = request_events(gcfg)
    trace_hex = sent.split("-")[1]
    assert ev.trace_id == trace_hex and ev.status == names.STATUS_OK

    def one(pred: Any) -> tuple[dict, Any]:
        found = [(res, sp) for res, sp in spans if pred(res, sp)]
        assert len(found) == 1, [(r.get("service.name"), s.name) for r, s in spans]
        return found[0]

    # caller -> gateway (SERVER) -> its hop to the replica (CLIENT) -> worker, one trace
    _, caller_span = one(lambda r, s: r["service.name"] == "caller")
    srv_res, srv_span = one(lambda r, s: r["service.name"] == gcfg.otel.service_name and s.name == SERVER)
    _, gw_span = one(lambda r, s: r["service.name"] == gcfg.otel.service_name and s.name == CHAT)
    wk_res, wk_span = one(lambda r, s: r["service.name"] == f"{cfg.otel.service_name}-worker" and s.name == CHAT)
    assert {sp.trace_id.hex() for _, sp in spans} == {trace_hex}
    assert caller_span.span_id.hex() == sent.split("-")[2]
    assert srv_span.parent_span_id == caller_span.span_id and srv_span.kind == SpanProto.SPAN_KIND_SERVER
    assert gw_span.parent_span_id == srv_span.span_id and gw_span.kind == SpanProto.SPAN_KIND_CLIENT
    assert wk_span.parent_span_id == gw_span.span_id and wk_span.kind == SpanProto.SPAN_KIND_SERVER
    # the traceparent returned to the client is the gateway's SERVER span (the flags are the
    # caller's: sampled, plus W3C level 2's random-trace-id bit from its SDK)
    assert returned == f"00-{trace_hex}-{srv_span.span_id.hex()}-{sent.split('-')[3]}"
    assert int(sent.split("-")[3], 16) & 1
    assert srv_res["service.instance.id"] != wk_res["service.instance.id"]

    # the SERVER span: the HTTP conventions, lasting the request's E2E
    assert attributes(srv_span.attributes) == {
        "http.request.method": "POST", "http.route": CHAT_COMPLETIONS, "url.path": CHAT_COMPLETIONS,
        "url.scheme": "http", "http.response.status_code": 200, names.OTEL_ATTR_STATUS: names.STATUS_OK}
    assert abs((srv_span.end_time_unix_nano - srv_span.start_time_unix_nano) - ev.e2e_ms * 1e6) <= 1

    # the CLIENT span: GenAI conventions + ours, equal to the RequestEvent of this request; usage
    # is what the worker reported (the gateway asked for it; the client, which did not, got none)
    ext = last["llmsla"]
    assert all("usage" not in c for c in chunks)
    assert (ev.prompt_tokens, ev.output_tokens) == (ext["prompt_tokens"], ext["output_tokens"])
    ga = attributes(gw_span.attributes)
    first_chunk_s = ga.pop(genai.RESPONSE_TIME_TO_FIRST_CHUNK)
    assert 0 < first_chunk_s <= ev.ttft_ms / 1000.0
    assert ga == {
        genai.OPERATION_NAME: genai.CHAT, genai.PROVIDER_NAME: names.GENAI_PROVIDER,
        genai.REQUEST_MODEL: MODEL, genai.RESPONSE_MODEL: last["model"], genai.RESPONSE_ID: last["id"],
        genai.REQUEST_TEMPERATURE: 0.8, genai.REQUEST_MAX_TOKENS: 12, genai.REQUEST_SEED: 3,
        genai.REQUEST_STREAM: True, genai.USAGE_INPUT_TOKENS: ev.prompt_tokens,
        genai.USAGE_OUTPUT_TOKENS: ev.output_tokens, genai.RESPONSE_FINISH_REASONS: (finish,),
        genai.SERVER_ADDRESS: "127.0.0.1", genai.SERVER_PORT: worker_port,
        names.OTEL_ATTR_POOL: ev.pool, names.OTEL_ATTR_REPLICA: ev.replica, names.OTEL_ATTR_ARM: ev.arm,
        names.OTEL_ATTR_POLICY: ev.policy, names.OTEL_ATTR_STATUS: ev.status,
        names.OTEL_ATTR_QUEUE_MS: ev.queue_ms, names.OTEL_ATTR_TTFT_MS: ev.ttft_ms,
    }
    # the hop starts at dispatch, inside the SERVER span, and ends with it
    assert srv_span.start_time_unix_nano <= gw_span.start_time_unix_nano
    assert gw_span.end_time_unix_nano == srv_span.end_time_unix_nano
    # the worker's span starts inside the hop (its end may come after: the worker ends it when
    # its handler returns, after the last bytes are already on their way)
    assert gw_span.start_time_unix_nano <= wk_span.start_time_unix_nano <= gw_span.end_time_unix_nano

    # the worker span: the same conventions, values equal to its own response (usage, timing)
    wa = attributes(wk_span.attributes)
    assert wa == {
        genai.OPERATION_NAME: genai.CHAT, genai.PROVIDER_NAME: names.GENAI_PROVIDER,
        genai.REQUEST_MODEL: MODEL, genai.RESPONSE_MODEL: MODEL, genai.RESPONSE_ID: last["id"],
        genai.REQUEST_TEMPERATURE: 0.8, genai.REQUEST_MAX_TOKENS: 12, genai.REQUEST_SEED: 3,
        genai.USAGE_INPUT_TOKENS: ext["prompt_tokens"], genai.USAGE_OUTPUT_TOKENS: ext["output_tokens"],
        genai.RESPONSE_FINISH_REASONS: (finish,),
        genai.SERVER_ADDRESS: "127.0.0.1", genai.SERVER_PORT: worker_port,
        names.OTEL_ATTR_POLICY: ext["policy"], names.OTEL_ATTR_STATUS: names.STATUS_OK, genai.REQUEST_STREAM: True,
        names.OTEL_ATTR_QUEUE_MS: ext["worker_queue_ms"], names.OTEL_ATTR_TTFT_MS: ext["worker_ttft_ms"],
    }

    # policy decisions: children of the worker's span, one per sampled token (+ the EOS one),
    # each also a PolicyEvent in the spool with the same span id
    decisions = [sp for _, sp in spans if sp.name == names.POLICY_SPAN_NAME]
    assert decisions and all(sp.parent_span_id == wk_span.span_id for sp in decisions)
    assert len(decisions) == ev.output_tokens + (1 if finish == "stop" else 0)
    events = [e for e in read_policy_events(cfg.spool.dir) if e.trace_id == trace_hex]
    assert sorted(e.span_id for e in events) == sorted(sp.span_id.hex() for sp in decisions)
    assert sorted(e.step for e in events) == list(range(len(decisions)))


def test_sampling_is_parent_based_and_unsampled_requests_still_carry_a_traceparent(tmp_path: Path) -> None:
    """otel.sample_ratio decides new traces at the gateway; a caller's flags decide its own. An
    unsampled request exports no span anywhere but still carries a valid traceparent (flags 00,
    the gateway's fresh span id) and its policy decisions still reach the spool."""
    with OtlpReceiver() as rx:
        cfg = worker_cfg(tmp_path)
        cfg.otel.endpoint = rx.traces_url
        with WorkerThread(cfg) as wt:
            never = gateway_cfg(cfg, wt.url, sample_ratio=0.0)
            always = gateway_cfg(cfg, wt.url, sample_ratio=1.0)
            caller_on = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            caller_off = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"

            async def main() -> dict[str, str]:
                out = {}
                async with wiring.serve_gateway(never, "127.0.0.1", 0, registry=CollectorRegistry()) as g0, \
                        wiring.serve_gateway(always, "127.0.0.1", 0, registry=CollectorRegistry(), spool=None) as g1:
                    for name, url, headers in (("root@0", g0.url, {}), ("sampled-parent@0", g0.url, {"traceparent": caller_on}),
                                               ("unsampled-parent@1", g1.url, {"traceparent": caller_off})):
                        status, _, returned = await chat(url, headers, stream=False)
                        assert status == 200
                        out[name] = returned
                    g0.gateway.telemetry.force_flush()
                    g1.gateway.telemetry.force_flush()
                return out

            returned = asyncio.run(main())
            wt.running.policy_tracer.force_flush()
        spans = rx.spans()

    def parts(tp: str) -> tuple[str, str, str]:
        version, tid, sid, flags = tp.split("-")
        assert version == "00" and len(tid) == 32 and len(sid) == 16 and int(tid, 16) and int(sid, 16)
        return tid, sid, flags

    root_tid, root_sid, root_flags = parts(returned["root@0"])
    assert not int(root_flags, 16) & 1  # ratio 0: a new trace is not sampled (the SDK may add W3C's random bit) ...
    on_tid, on_sid, on_flags = parts(returned["sampled-parent@0"])
    assert (on_tid, on_flags) == (caller_on.split("-")[1], "01") and on_sid != caller_on.split("-")[2]
    off_tid, off_sid, off_flags = parts(returned["unsampled-parent@1"])
    assert (off_tid, off_flags) == (caller_off.split("-")[1], "00") and off_sid != caller_off.split("-")[2]
    by_trace: dict[str, list] = {}
    for res, sp in spans:
        by_trace.setdefault(sp.trace_id.hex(), []).append((res["service.name"], sp))
    # ... but a caller's sampled flag wins over the ratio: gateway, worker and decision spans
    assert set(by_trace) == {on_tid}
    sampled = by_trace[on_tid]
    [srv] = [sp for svc, sp in sampled if svc == never.otel.service_name and sp.name == SERVER]
    [gw] = [sp for svc, sp in sampled if svc == never.otel.service_name and sp.name == CHAT]
    [wk] = [sp for svc, sp in sampled if sp.name == CHAT and svc != never.otel.service_name]
    assert srv.span_id.hex() == on_sid and gw.parent_span_id == srv.span_id and wk.parent_span_id == gw.span_id
    # every request's decisions reached the spool, sampled or not, under the trace it carried
    spooled = {e.trace_id for e in read_policy_events(cfg.spool.dir)}
    assert {root_tid, on_tid, off_tid} <= spooled
    events = {e.trace_id: e for e in request_events(never)}
    assert set(events) >= {root_tid, on_tid}


def test_without_an_exporter_the_gateway_makes_no_sdk_span(tmp_path: Path) -> None:
    """otel.endpoint empty: no TracerProvider, no span object; the trace context is continued as
    before, and otel.sample_ratio still decides new traces' flags for the processes below."""
    cfg = config_mod.load(env={})
    cfg.gateway.upstreams = ["http://127.0.0.1:9"]
    cfg.spool.dir = str(tmp_path / "spool")
    raw = b'{"model": "m", "prompt": "hi"}'
    req = parse_request(raw, "/v1/completions", max_prompt_chars=100)
    for ratio, flags in ((1.0, "01"), (0.0, "00")):
        cfg.otel.sample_ratio = ratio
        gw = wiring.gateway(cfg, registry=CollectorRegistry(), spool=None)
        tel = gw.telemetry
        assert tel.provider is None and not tel.tracing and tel.metrics is None
        fresh = tel.begin({}, "POST", "/v1/completions", req, 0.0)
        assert tel.hop(fresh, "http://127.0.0.1:9", req, {}, 0.0) == fresh.traceparent  # the same hop id
        assert fresh.span is None and fresh.traceparent.endswith(f"-{flags}") and fresh.trace_id in fresh.traceparent
        cont = tel.begin({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                         "POST", "/v1/chat/completions", req, 0.0)
        tid, sid, fl = cont.traceparent.split("-")[1:]
        assert cont.span is None and tid == "4bf92f3577b34da6a3ce929d0e0e4736" and fl == "01"
        assert sid != "00f067aa0ba902b7" and cont.operation == genai.CHAT
    # the edge decision agrees with OpenTelemetry's own ratio sampler on the same trace ids
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    from llmsla.httpkit import trace_context

    sampler = TraceIdRatioBased(0.3)
    decided = [trace_context({}, 0.3) for _ in range(2000)]
    for tid, tp in decided:
        assert tp.endswith("-01") == sampler.should_sample(None, int(tid, 16), "x").decision.is_sampled()
    share = sum(tp.endswith("-01") for _, tp in decided) / len(decided)
    assert 0.25 < share < 0.35


def test_with_an_exporter_only_sampled_requests_make_sdk_spans() -> None:
    """The decision comes first: an unsampled request gets the plain trace context and no SDK span;
    a sampled new trace keeps the trace id the ratio rule decided on (so any TraceIdRatioBased
    sampler with the same ratio agrees), and the span ends up exported."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    from llmsla.events import ItlSummary
    from llmsla.exporters.gateway_telemetry import GatewayTelemetry
    from llmsla.exporters.metrics import LabelGuard
    from llmsla.exporters.recorder import StreamTimer

    cfg = config_mod.load(env={})
    cfg.otel.sample_ratio = 0.25
    memory = InMemorySpanExporter()
    tel = GatewayTelemetry(cfg, LabelGuard(10), span_processor=SimpleSpanProcessor(memory))
    req = parse_request(b'{"model": "m", "prompt": "hi"}', "/v1/completions", max_prompt_chars=100)
    sampler = TraceIdRatioBased(0.25)
    sampled = []
    for _ in range(800):
        t = tel.begin({}, "POST", "/v1/completions", req, 0.0)
        decision = sampler.should_sample(None, int(t.trace_id, 16), "x").decision.is_sampled()
        assert (t.span is not None) == decision == bool(int(t.traceparent[-2:], 16) & 1)
        if t.span is not None:
            assert t.span.is_recording() and t.traceparent.split("-")[2] == f"{t.span.get_span_context().span_id:016x}"
            ev = RequestEvent(ts_ms=1_700_000_000_000, trace_id=t.trace_id, model="m", pool="p", replica="r0",
                              arm="a", policy="constant", prompt_tokens=1, output_tokens=0, queue_ms=0.0,
                              ttft_ms=None, itl_ms=ItlSummary.from_gaps([]), e2e_ms=1.0, status="ok")
            tel.end(t, ev, StreamTimer(0.0, streaming=False), None, admit=True)
            tel.finish(t, 200)
            sampled.append(t.trace_id)
    assert 0.18 < len(sampled) / 800 < 0.32
    assert sorted(f"{s.context.trace_id:032x}" for s in memory.get_finished_spans()) == sorted(sampled)
    for flags, expect in (("01", True), ("00", False)):  # the caller's flags win over the ratio
        t = tel.begin({"traceparent": f"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}"},
                      "POST", "/v1/completions", req, 0.0)
        assert (t.span is not None) == expect and t.traceparent.endswith(f"-{flags}")
    tel.shutdown()


def test_stream_attribute_only_on_streamed_requests() -> None:
    """gen_ai.request.stream is set if and only if the request streams (unset reads as not
    streaming, semantic conventions v1.41.1); a non-boolean ``stream`` is not streaming."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assert genai.request_attributes(genai.CHAT, {**body, "stream": True}, MODEL)[genai.REQUEST_STREAM] is True
    for stream in (False, None, "true", 1):
        assert genai.REQUEST_STREAM not in genai.request_attributes(genai.CHAT, {**body, "stream": stream}, MODEL)
    assert genai.REQUEST_STREAM not in genai.request_attributes(genai.CHAT, body, MODEL)
