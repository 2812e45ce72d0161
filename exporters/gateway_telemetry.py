"""The gateway's OpenTelemetry: one GenAI request span per request, and the opt-in OTLP metrics.

The span is a SERVER span named per the GenAI conventions (``chat llmsla-tiny``), a child of
the caller's ``traceparent``; the ``traceparent`` the gateway sends upstream (and returns to the
client) carries *its* span id, so the worker's request span and its temperature-policy decision
spans hang under it. Its attributes are the values of the request's ``RequestEvent`` (tokens,
queue time, TTFT, replica, pool, arm, status), set in one call when the request ends, plus the
request's ``gen_ai.request.*`` parameters and what the response said (model, id, finish reasons).

Cost, by design:

* ``otel.endpoint`` empty: no ``TracerProvider`` exists and no SDK span is made; :meth:`begin`
  is the trace-context continuation the gateway always did (``httpkit.trace_context``, which
  also applies ``otel.sample_ratio`` to new traces, so the workers below still sample alike).
* endpoint set: the sampling decision comes first, by the rule of OpenTelemetry's
  ``ParentBased(TraceIdRatioBased(otel.sample_ratio))`` (a caller's flags decide for its
  requests, the ratio for new traces, on the trace id). An unsampled request makes no SDK span
  either: it gets the same trace context as without an exporter (a fresh span id, the flags
  not sampled) and nothing happens at its end. (Leaving the decision to the SDK's
  ``start_span`` cost ~10 us more per dropped request on the bench machine: sampler, id
  generator, a non-recording span.)
* sampled: an SDK span, its attributes and ``end``; a ``BatchSpanProcessor`` encodes and sends
  off the request path.

Nothing here may cost the request: a failure is logged (rate-limited) and counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from llmsla import names
from llmsla.config import Config
from llmsla.events import RequestEvent, string_problem
from llmsla.exporters import genai, otel_sdk
from llmsla.exporters.genai_metrics import GenAIMetrics
from llmsla.exporters.metrics import LabelGuard
from llmsla.exporters.openai import ParsedRequest
from llmsla.exporters.recorder import StreamTimer
from llmsla.httpkit import next_hop, trace_context

log = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
_FAILED = frozenset((names.STATUS_ERROR, names.STATUS_TIMEOUT))  # the server's fault: span status ERROR
#: Longest the gateway's stop waits for the last spans and metric points.
SHUTDOWN_S = 5.0


class _DecidedTraceIds(RandomIdGenerator):
    """The SDK's id generator, except that a new trace the gateway already drew (and decided to
    sample on, by the ratio rule) keeps that trace id."""

    def __init__(self) -> None:
        # set just before start_span of a new sampled trace, consumed by it (begin() runs on the
        # gateway's one event-loop thread, the only caller of this provider's start_span)
        self.decided = 0

    def generate_trace_id(self) -> int:
        tid, self.decided = self.decided, 0
        return tid or super().generate_trace_id()


@dataclass(slots=True)
class RequestTelemetry:
    """What :meth:`GatewayTelemetry.begin` hands the request path."""

    trace_id: str  # the RequestEvent's trace_id
    traceparent: str  # for the upstream request and the response: this gateway span's id
    span: trace.Span | None  # None when not sampled (or no exporter)
    operation: str  # gen_ai.operation.name
    start_ns: int  # the span's start (arrival), epoch ns


class GatewayTelemetry:
    """Spans (``cfg.otel.endpoint``) and OTLP metrics (``cfg.otel.metrics_endpoint``) of one
    gateway process. ``guard``: the Prometheus label guard, so OTLP attribute values fold into
    ``other`` exactly where the Prometheus labels do."""

    def __init__(self, cfg: Config, guard: LabelGuard, *, service_name: str | None = None,
                 span_processor: SpanProcessor | None = None) -> None:
        """``span_processor``: a trace backend in place of OTLP to ``otel.endpoint`` (benches,
        embedding); spans are made when either is given."""
        o = cfg.otel
        self.sample_ratio = o.sample_ratio
        self.guard = guard
        # gen_ai.response.model comes from the upstream: its own guard, so it can never take a
        # model-label slot from the Prometheus series
        self.response_guard = LabelGuard(cfg.metrics.label_top_n)
        resource = otel_sdk.resource(service_name or o.service_name)
        self.provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        if o.endpoint or span_processor is not None:
            # begin() hands the SDK only requests it decided to sample: parent-based, roots always
            self._ids = _DecidedTraceIds()
            self.provider = TracerProvider(resource=resource, sampler=otel_sdk.sampler(1.0), id_generator=self._ids)
            self.provider.add_span_processor(span_processor or otel_sdk.otlp_span_processor(o.endpoint))
            self._tracer = self.provider.get_tracer(__name__, schema_url=genai.SCHEMA_URL)
        self.metrics = GenAIMetrics(cfg, resource) if o.metrics_endpoint else None
        self._servers: dict[str, tuple[str, int]] = {}
        self.failures = 0
        self._failure_logged = 0.0

    @property
    def tracing(self) -> bool:
        """True when this gateway makes SDK spans (an exporter is configured)."""
        return self._tracer is not None

    # -- request path ----------------------------------------------------------------------------
    def begin(self, headers: Mapping[str, str], path: str, req: ParsedRequest, arrival: float) -> RequestTelemetry:
        """The request's trace context, and its span when tracing; ``arrival``: the handler's
        ``perf_counter`` stamp, which becomes the span's start."""
        op = genai.operation(path)
        tracer = self._tracer
        if tracer is None:
            trace_id, traceparent = trace_context(headers, self.sample_ratio)
            return RequestTelemetry(trace_id, traceparent, None, op, 0)
        context = _PROPAGATOR.extract(headers)
        parent = trace.get_current_span(context).get_span_context()
        trace_id, traceparent = next_hop(parent, self.sample_ratio)  # the decision, and the unsampled answer
        if not int(traceparent[-2:], 16) & 1:
            return RequestTelemetry(trace_id, traceparent, None, op, 0)
        if not parent.is_valid:
            self._ids.decided = int(trace_id, 16)  # the trace id the ratio decided on
        start_ns = time.time_ns() - int((time.perf_counter() - arrival) * 1e9)
        span = tracer.start_span(genai.span_name(op, req.model), context=context, kind=SpanKind.SERVER,
                                 start_time=start_ns)
        ctx = span.get_span_context()
        trace_id = f"{ctx.trace_id:032x}"
        return RequestTelemetry(trace_id, f"00-{trace_id}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}", span, op,
                                start_ns)

    def end(self, tel: RequestTelemetry, ev: RequestEvent | None, timer: StreamTimer, req: ParsedRequest,
            upstream_url: str | None) -> None:
        """The request is over: ``ev`` is its validated RequestEvent (None if it could not be
        built), ``upstream_url`` the replica it went to (None if none)."""
        span = tel.span
        recording = span is not None and span.is_recording()
        if not recording and (self.metrics is None or ev is None):
            return
        try:
            server = self._server(upstream_url) if upstream_url else None
            if recording:
                self._end_span(span, tel, ev, timer, req, server)  # type: ignore[arg-type]
            if self.metrics is not None and ev is not None:
                self._record_metrics(tel, ev, timer, server)
        except Exception as exc:  # telemetry must never cost the request or its event
            self.failures += 1
            now = time.monotonic()
            if self.failures == 1 or now - self._failure_logged >= 60.0:
                log.error("request telemetry failed (%d so far): %s: %s", self.failures, type(exc).__name__, exc,
                          exc_info=self.failures == 1)
                self._failure_logged = now

    def _server(self, url: str) -> tuple[str, int]:
        server = self._servers.get(url)
        if server is None:
            server = self._servers[url] = genai.server_of(url)
        return server

    def _end_span(self, span: trace.Span, tel: RequestTelemetry, ev: RequestEvent | None, timer: StreamTimer,
                  req: ParsedRequest, server: tuple[str, int] | None) -> None:
        attrs = genai.request_attributes(tel.operation, req.body, req.model)
        attrs[names.OTEL_ATTR_STREAM] = req.stream
        if server is not None:
            attrs[genai.SERVER_ADDRESS], attrs[genai.SERVER_PORT] = server
        if timer.model is not None and string_problem(timer.model) is None:
            attrs[genai.RESPONSE_MODEL] = timer.model
        if timer.response_id is not None and string_problem(timer.response_id) is None:
            attrs[genai.RESPONSE_ID] = timer.response_id
        if timer.finish_reasons:
            attrs[genai.RESPONSE_FINISH_REASONS] = tuple(timer.finish_reasons)
        end_ns = None
        if ev is not None:
            attrs[genai.USAGE_INPUT_TOKENS] = ev.prompt_tokens
            attrs[genai.USAGE_OUTPUT_TOKENS] = ev.output_tokens
            attrs[names.OTEL_ATTR_POOL] = ev.pool
            attrs[names.OTEL_ATTR_REPLICA] = ev.replica
            attrs[names.OTEL_ATTR_ARM] = ev.arm
            attrs[names.OTEL_ATTR_POLICY] = ev.policy
            attrs[names.OTEL_ATTR_STATUS] = ev.status
            attrs[names.OTEL_ATTR_QUEUE_MS] = ev.queue_ms
            if ev.ttft_ms is not None:
                attrs[names.OTEL_ATTR_TTFT_MS] = ev.ttft_ms
            if ev.status != names.STATUS_OK:
                attrs[genai.ERROR_TYPE] = ev.status
            if ev.status in _FAILED:
                span.set_status(Status(StatusCode.ERROR, ev.status))
            end_ns = tel.start_ns + round(ev.e2e_ms * 1e6)  # the span lasts the event's E2E
        span.set_attributes(attrs)
        span.end(end_time=end_ns)

    def _record_metrics(self, tel: RequestTelemetry, ev: RequestEvent, timer: StreamTimer,
                        server: tuple[str, int] | None) -> None:
        assert self.metrics is not None
        ok = ev.status == names.STATUS_OK
        fold = self.guard.fold
        # the same folds, in the same order and with the same admission, as RequestMetrics.children
        model = fold(names.L_MODEL, ev.model, admit=ok)[0]
        pool = fold(names.L_POOL, ev.pool)[0]
        replica = fold(names.L_REPLICA, ev.replica)[0]
        arm = fold(names.L_ARM, ev.arm)[0]
        response_model = self.response_guard.fold(names.L_MODEL, timer.model, admit=ok)[0] if timer.model else None
        key = (tel.operation, model, response_model, pool, replica, arm, server, None if ok else ev.status)
        self.metrics.record(key, lambda: _metric_attributes(key), ttft_s=None if ev.ttft_ms is None else ev.ttft_ms / 1000.0,
                            e2e_s=ev.e2e_ms / 1000.0, gaps_s=[g / 1000.0 for g in timer.gaps_ms],
                            input_tokens=ev.prompt_tokens, output_tokens=ev.output_tokens)

    # -- lifecycle -------------------------------------------------------------------------------
    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export every finished span and the metrics now (tests, shutdown)."""
        ok = True
        if self.provider is not None:
            ok = self.provider.force_flush(int(timeout_s * 1000))
        if self.metrics is not None:
            ok = self.metrics.force_flush(timeout_s) and ok
        return ok

    def shutdown(self, timeout_s: float = SHUTDOWN_S) -> None:
        """Send the last spans and metric points, traces and metrics at once, for at most
        ``timeout_s``: with the collector unreachable the OTLP exporters retry until their own
        deadlines (~10 s each, one after the other), which must not hold up the gateway's stop
        (its supervisor kills after 15 s). What is still unsent then is dropped, with a log line."""
        jobs = [(what, fn) for what, fn in (("spans", self.provider and self.provider.shutdown),
                                            ("metrics", self.metrics and self.metrics.shutdown)) if fn]
        threads = [threading.Thread(target=fn, name=f"llmsla-otel-shutdown-{what}", daemon=True)
                   for what, fn in jobs]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        for (what, _), t in zip(jobs, threads, strict=True):
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.error("OpenTelemetry %s not all exported within %.0f s of shutdown (collector unreachable?); "
                          "dropping the rest", what, timeout_s)


def _metric_attributes(key: tuple) -> dict[str, Any]:
    """The OTLP attribute set of a metrics key (see ``_record_metrics``)."""
    op, model, response_model, pool, replica, arm, server, error_type = key
    attrs: dict[str, Any] = {genai.OPERATION_NAME: op, genai.PROVIDER_NAME: names.GENAI_PROVIDER,
                             genai.REQUEST_MODEL: model, names.OTEL_ATTR_POOL: pool,
                             names.OTEL_ATTR_REPLICA: replica, names.OTEL_ATTR_ARM: arm}
    if response_model is not None:
        attrs[genai.RESPONSE_MODEL] = response_model
    if server is not None:
        attrs[genai.SERVER_ADDRESS], attrs[genai.SERVER_PORT] = server
    if error_type is not None:
        attrs[genai.ERROR_TYPE] = error_type
    return attrs
