"""The gateway's OpenTelemetry: two spans per sampled request, and the opt-in OTLP metrics.

A SERVER span for the request received and a CLIENT span for the hop to the replica, so the
worker's spans hang under the hop. The ASGI middleware (INTERNAL span: the model is in process)
and the fleet simulator (spans replayed from each finished event, :meth:`replay`) emit the same
spans through the same object (``exporters/recording.py``). The sampling decision is made before
touching the SDK and an unsampled request makes no SDK span. Token counts under the conventions'
names are only what the replica reported. Nothing here may cost the request.
See docs/opentelemetry.md#the-span-tree.
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
from opentelemetry.semconv.attributes import http_attributes as _http
from opentelemetry.semconv.attributes import url_attributes as _url
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from llmsla import names
from llmsla.config import Config
from llmsla.events import RequestEvent, string_problem
from llmsla.exporters import genai, otel_sdk
from llmsla.exporters.genai_metrics import GenAIMetrics
from llmsla.exporters.metrics import LabelGuard
from llmsla.exporters.openai import CHAT_COMPLETIONS, COMPLETIONS, ParsedRequest
from llmsla.exporters.recorder import StreamTimer
from llmsla.goodput import tpot_seconds
from llmsla.httpkit import next_hop, ratio_sampled, trace_context

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
    traceparent: str  # returned to the client: this gateway's SERVER span (or a fresh span id)
    span: trace.Span | None  # the SERVER span; None when not sampled (or no exporter)
    operation: str  # gen_ai.operation.name
    start_ns: int  # the request's arrival, epoch ns (the spans' clock)
    arrival: float = 0.0  # the same instant on perf_counter
    hop: trace.Span | None = None  # the CLIENT span to the replica, once one was picked
    end_ns: int | None = None  # the SERVER span's end: arrival + the event's E2E
    status: str | None = None  # the RequestEvent's status, for the SERVER span


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
        self.token_estimates = o.token_estimates
        self.failures = 0
        self._failure_logged = 0.0

    @property
    def tracing(self) -> bool:
        """True when this gateway makes SDK spans (an exporter is configured)."""
        return self._tracer is not None

    # -- request path ----------------------------------------------------------------------------
    def begin(self, headers: Mapping[str, str], method: str, path: str, req: ParsedRequest,
              arrival: float) -> RequestTelemetry:
        """The request's trace context, and its SERVER span when tracing; ``arrival``: the
        handler's ``perf_counter`` stamp, which becomes the span's start."""
        op = genai.operation(path)
        tracer = self._tracer
        if tracer is None:
            trace_id, traceparent = trace_context(headers, self.sample_ratio)
            return RequestTelemetry(trace_id, traceparent, None, op, 0, arrival)
        context = _PROPAGATOR.extract(headers)
        parent = trace.get_current_span(context).get_span_context()
        trace_id, traceparent = next_hop(parent, self.sample_ratio)  # the decision, and the unsampled answer
        if not int(traceparent[-2:], 16) & 1:
            return RequestTelemetry(trace_id, traceparent, None, op, 0, arrival)
        if not parent.is_valid:
            self._ids.decided = int(trace_id, 16)  # the trace id the ratio decided on
        start_ns = time.time_ns() - int((time.perf_counter() - arrival) * 1e9)
        span = tracer.start_span(f"{method} {path}", context=context, kind=SpanKind.SERVER, start_time=start_ns,
                                 attributes={_http.HTTP_REQUEST_METHOD: method, _http.HTTP_ROUTE: path,
                                             _url.URL_PATH: path, _url.URL_SCHEME: "http"})
        ctx = span.get_span_context()
        trace_id = f"{ctx.trace_id:032x}"
        return RequestTelemetry(trace_id, _traceparent(ctx), span, op, start_ns, arrival)

    def hop(self, tel: RequestTelemetry, upstream_url: str | None, req: ParsedRequest, headers: Mapping[str, str],
            dispatch: float) -> str:
        """The replica was picked: start the CLIENT span of the call to it (when the request is
        traced) and return the ``traceparent`` to send it. ``upstream_url`` None: the model is
        served in this process (the ASGI middleware), an INTERNAL span with no server address."""
        if tel.span is None or self._tracer is None:
            return tel.traceparent
        try:
            attrs = genai.request_attributes(tel.operation, req.body, req.model)
            if upstream_url is not None:
                attrs[genai.SERVER_ADDRESS], attrs[genai.SERVER_PORT] = self._server(upstream_url)
            conversation = genai.conversation_id(headers)
            if conversation is not None:
                attrs[genai.CONVERSATION_ID] = conversation
            start_ns = tel.start_ns + int((dispatch - tel.arrival) * 1e9)
            kind = SpanKind.CLIENT if upstream_url is not None else SpanKind.INTERNAL
            tel.hop = self._tracer.start_span(genai.span_name(tel.operation, req.model), kind=kind,
                                              context=trace.set_span_in_context(tel.span), start_time=start_ns,
                                              attributes=attrs)
            return _traceparent(tel.hop.get_span_context())
        except Exception as exc:  # telemetry must never cost the request
            self._failed(exc)
            return tel.traceparent

    def end(self, tel: RequestTelemetry, ev: RequestEvent | None, timer: StreamTimer, upstream_url: str | None,
            *, admit: bool) -> None:
        """The request's outcome is known: ``ev`` is its validated RequestEvent (None if it could
        not be built), ``upstream_url`` the replica it went to (None if none), ``admit`` whether
        its model may claim a label slot (as the Prometheus side decided). Ends the CLIENT span
        and records the OTLP metrics."""
        hop = tel.hop
        if hop is None and tel.span is None and (self.metrics is None or ev is None):
            return
        try:
            if ev is not None:
                tel.end_ns = tel.start_ns + round(ev.e2e_ms * 1e6)  # the SERVER span lasts the event's E2E
                tel.status = ev.status
            if hop is not None:
                tel.hop = None
                self._end_hop(hop, tel, ev, timer)
            if self.metrics is not None and ev is not None:
                self._record_metrics(tel, ev, timer, self._server(upstream_url) if upstream_url else None, admit)
        except Exception as exc:  # telemetry must never cost the request or its event
            self._failed(exc)

    def finish(self, tel: RequestTelemetry, http_status: int | None) -> None:
        """The response went out with ``http_status`` (None: the client went away first): end
        the SERVER span."""
        span = tel.span
        if span is None:
            return
        tel.span = None
        try:
            attrs: dict[str, Any] = {} if http_status is None else {_http.HTTP_RESPONSE_STATUS_CODE: http_status}
            if tel.status is not None:
                attrs[names.OTEL_ATTR_STATUS] = tel.status
            if http_status is not None and http_status >= 500:  # the HTTP conventions: a server span's error is a 5xx
                attrs[genai.ERROR_TYPE] = str(http_status)
                span.set_status(Status(StatusCode.ERROR, str(http_status)))
            span.set_attributes(attrs)
            span.end(end_time=tel.end_ns)
        except Exception as exc:
            self._failed(exc)

    def replay(self, ev: RequestEvent, *, operation: str = genai.CHAT) -> None:
        """A request that finished elsewhere (the fleet simulator's): the same SERVER and GenAI
        CLIENT spans and OTLP metrics as a proxied one, timed from the event (arrival =
        ``ts_ms - e2e_ms``, dispatch ``queue_ms`` later, end ``ts_ms``), sampled by the ratio
        rule on its trace id. There is no response body: the event's token counts stand for
        the replica's usage report."""
        if self._tracer is None and self.metrics is None:
            return
        try:
            end_ns = ev.ts_ms * 1_000_000
            start_ns = end_ns - round(ev.e2e_ms * 1e6)
            tid = int(ev.trace_id, 16)
            if self._tracer is not None and ratio_sampled(tid, self.sample_ratio):
                path = CHAT_COMPLETIONS if operation == genai.CHAT else COMPLETIONS
                self._ids.decided = tid  # the span carries the event's trace id
                server = self._tracer.start_span(
                    f"POST {path}", kind=SpanKind.SERVER, start_time=start_ns,
                    attributes={_http.HTTP_REQUEST_METHOD: "POST", _http.HTTP_ROUTE: path, _url.URL_PATH: path,
                                _url.URL_SCHEME: "http"})
                if ev.replica != names.NO_REPLICA:
                    attrs = genai.request_attributes(operation, {}, ev.model)
                    hop = self._tracer.start_span(genai.span_name(operation, ev.model), kind=SpanKind.CLIENT,
                                                  context=trace.set_span_in_context(server),
                                                  start_time=start_ns + round(ev.queue_ms * 1e6), attributes=attrs)
                    hop.set_attributes({genai.USAGE_INPUT_TOKENS: ev.prompt_tokens,
                                        genai.USAGE_OUTPUT_TOKENS: ev.output_tokens})
                    self._event_attributes(hop, ev)
                    hop.end(end_time=end_ns)
                server.set_attribute(names.OTEL_ATTR_STATUS, ev.status)
                if ev.status in _FAILED:
                    server.set_status(Status(StatusCode.ERROR, ev.status))
                server.end(end_time=end_ns)
            if self.metrics is not None:
                ok = ev.status == names.STATUS_OK
                ttft_s = ev.ttft_ms / 1000.0 if ok and ev.ttft_ms is not None else None
                self._metrics(operation, ev, None, ttft_s, None, ok, ev.prompt_tokens, ev.output_tokens)
        except Exception as exc:  # telemetry must never cost the simulation or the event
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
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

    def _end_hop(self, span: trace.Span, tel: RequestTelemetry, ev: RequestEvent | None,
                 timer: StreamTimer) -> None:
        attrs: dict[str, Any] = {}
        if timer.model is not None and string_problem(timer.model) is None:
            attrs[genai.RESPONSE_MODEL] = timer.model
        if timer.response_id is not None and string_problem(timer.response_id) is None:
            attrs[genai.RESPONSE_ID] = timer.response_id
        if timer.finish_reasons:
            attrs[genai.RESPONSE_FINISH_REASONS] = tuple(timer.finish_reasons)
        if timer.streaming and timer.first_token is not None and timer.dispatch is not None:
            attrs[genai.RESPONSE_TIME_TO_FIRST_CHUNK] = max(0.0, timer.first_token - timer.dispatch)
        reported_in, reported_out = timer.reported_usage()
        if reported_in is not None:
            attrs[genai.USAGE_INPUT_TOKENS] = reported_in
        if reported_out is not None:
            attrs[genai.USAGE_OUTPUT_TOKENS] = reported_out
        end_ns = None
        if ev is not None:
            if self.token_estimates and reported_in is None:
                attrs[names.OTEL_ATTR_ESTIMATED_INPUT_TOKENS] = ev.prompt_tokens
            if self.token_estimates and reported_out is None:
                attrs[names.OTEL_ATTR_ESTIMATED_OUTPUT_TOKENS] = ev.output_tokens
            end_ns = tel.end_ns
        span.set_attributes(attrs)
        if ev is not None:
            self._event_attributes(span, ev)
        span.end(end_time=end_ns)

    @staticmethod
    def _event_attributes(span: trace.Span, ev: RequestEvent) -> None:
        """The RequestEvent's values on the GenAI span (and its status when it failed)."""
        attrs: dict[str, Any] = {
            names.OTEL_ATTR_POOL: ev.pool, names.OTEL_ATTR_REPLICA: ev.replica, names.OTEL_ATTR_ARM: ev.arm,
            names.OTEL_ATTR_POLICY: ev.policy, names.OTEL_ATTR_STATUS: ev.status,
            names.OTEL_ATTR_QUEUE_MS: ev.queue_ms}
        if ev.ttft_ms is not None:
            attrs[names.OTEL_ATTR_TTFT_MS] = ev.ttft_ms
        if ev.status != names.STATUS_OK:
            attrs[genai.ERROR_TYPE] = ev.status
        if ev.status in _FAILED:
            span.set_status(Status(StatusCode.ERROR, ev.status))
        span.set_attributes(attrs)

    def _record_metrics(self, tel: RequestTelemetry, ev: RequestEvent, timer: StreamTimer,
                        server: tuple[str, int] | None, admit: bool) -> None:
        """The semconv metrics: TTFT and TPOT of successful responses that streamed a first
        token (once per request), the duration of every request (``error.type`` on failures),
        token usage as the replica reported it."""
        ok = ev.status == names.STATUS_OK
        ttft_s = (timer.first_token - tel.arrival) if ok and timer.first_token is not None else None
        reported_in, reported_out = timer.reported_usage()
        self._metrics(tel.operation, ev, timer.model, ttft_s, server, admit, reported_in, reported_out)

    def _metrics(self, operation: str, ev: RequestEvent, response_model: str | None, ttft_s: float | None,
                 server: tuple[str, int] | None, admit: bool, reported_in: int | None,
                 reported_out: int | None) -> None:
        """The OTLP points of one finished request (live or replayed)."""
        assert self.metrics is not None
        ok = ev.status == names.STATUS_OK
        fold = self.guard.fold
        # the same folds, in the same order and with the same admission, as RequestMetrics.children
        model = fold(names.L_MODEL, ev.model, admit=admit)[0]
        pool = fold(names.L_POOL, ev.pool)[0]
        replica = fold(names.L_REPLICA, ev.replica)[0]
        arm = fold(names.L_ARM, ev.arm)[0]
        if response_model:
            response_model = self.response_guard.fold(names.L_MODEL, response_model, admit=ok)[0]
        key = (operation, model, response_model or None, pool, replica, arm, server, None if ok else ev.status)
        e2e_s = ev.e2e_ms / 1000.0
        # the CLIENT span of the hop to the replica lasts from the dispatch to the end
        client_s = None if ev.replica == names.NO_REPLICA else (ev.e2e_ms - ev.queue_ms) / 1000.0
        self.metrics.record(key, lambda: _metric_attributes(key), ttft_s=ttft_s, e2e_s=e2e_s,
                            tpot_s=tpot_seconds(ev.status, ttft_s, e2e_s, ev.output_tokens),
                            input_tokens=reported_in, output_tokens=reported_out, client_s=client_s)

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


def _traceparent(ctx: trace.SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


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
