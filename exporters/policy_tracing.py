"""OpenTelemetry tracing of temperature-policy decisions, exported to the spool (and OTLP).

Each decision is a span under the request's span, so it can be found from the user's trace, and
an ordinary OTel ``SpanExporter`` turns those spans into ``PolicyEvent`` lines in the spool.
Every decision reaches the spool whatever the sampling flag says: PolicyEvents are data for the
policy windows, not trace samples. A private ``TracerProvider`` per tracer, because the global
one can be set only once. See docs/opentelemetry.md#decision-spans.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry, Counter, Gauge

from llmsla import names
from llmsla.config import Config
from llmsla.events import (
    SCHEMA_VERSION,
    EventError,
    PolicyEvent,
    _check_number,  # the contract's own per-field check, reused on the hot path
)
from llmsla.exporters import genai, otel_sdk
from llmsla.seams import EventSink
from llmsla.spool import SpoolWriter
from llmsla.temperature import Decision

log = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
_QUEUE = 1 << 20
_SAMPLED = trace.TraceFlags(trace.TraceFlags.SAMPLED)


def span_to_record(span: ReadableSpan) -> dict[str, Any]:
    """A finished decision span -> its validated ``PolicyEvent`` as a JSON-ready dict.

    EventError (naming the field) if an attribute is missing or out of contract.
    """
    a = span.attributes or {}
    start, end = span.start_time or 0, span.end_time or span.start_time or 0
    try:
        rec = {
            "v": SCHEMA_VERSION,
            "ts_ms": start // 1_000_000,
            "trace_id": format(span.context.trace_id, "032x"),
            "span_id": format(span.context.span_id, "016x"),
            "policy_id": a[names.SPAN_ATTR_POLICY_ID],
            "zone": a[names.SPAN_ATTR_ZONE],
            "step": a[names.SPAN_ATTR_STEP],
            "temperature": a[names.SPAN_ATTR_TEMPERATURE],
            "action": a[names.SPAN_ATTR_ACTION],
            "trigger": a[names.SPAN_ATTR_TRIGGER],
            "duration_ms": max(0, end - start) / 1e6,
        }
    except KeyError as exc:
        raise EventError(PolicyEvent.KIND, str(exc.args[0]), "missing span attribute") from None
    PolicyEvent.from_dict(rec)  # the contract check; raises EventError naming the field
    return rec


def span_to_event(span: ReadableSpan) -> PolicyEvent:
    """A finished decision span -> its ``PolicyEvent``; EventError if an attribute is bad."""
    return PolicyEvent.from_dict(span_to_record(span))


_F = {f.name: f for f in PolicyEvent.FIELDS}
_LINE = ('{"v":%d,"ts_ms":%d,"trace_id":"%032x","span_id":"%016x","policy_id":%s,"zone":%s,'
         '"step":%d,"temperature":%r,"action":%s,"trigger":%s,"duration_ms":%r}')


class PolicyLineEncoder:
    """Decision span -> validated PolicyEvent JSON line, cheap enough for every token.

    The full contract check (``PolicyEvent.from_dict``) runs for the first span of each distinct
    combination of string attributes (policy_id, zone, action, trigger: a handful per worker);
    after that only the numeric fields are checked, by the contract's own per-field check and
    bounds. The line is identical to ``PolicyEvent.to_json()`` (tested), at a fraction of its cost.
    """

    MAX_CACHED = 4096

    def __init__(self) -> None:
        self._strings: dict[tuple, tuple[str, str, str, str]] = {}

    def line(self, span: ReadableSpan) -> str:
        a = span.attributes or {}
        key = (a.get(names.SPAN_ATTR_POLICY_ID), a.get(names.SPAN_ATTR_ZONE), a.get(names.SPAN_ATTR_ACTION),
               a.get(names.SPAN_ATTR_TRIGGER))
        try:
            frag = self._strings.get(key)
        except TypeError:  # an unhashable attribute value: the full check will name it
            frag = None
        start, end = span.start_time or 0, span.end_time or span.start_time or 0
        if frag is None:
            rec = span_to_record(span)  # full contract check
            frag = (json.dumps(rec["policy_id"]), json.dumps(rec["zone"]), json.dumps(rec["action"]),
                    json.dumps(rec["trigger"]))
            if len(self._strings) >= self.MAX_CACHED:
                self._strings.clear()
            self._strings[key] = frag
            step, temperature, ts_ms = rec["step"], float(rec["temperature"]), rec["ts_ms"]
        else:
            if names.SPAN_ATTR_STEP not in a or names.SPAN_ATTR_TEMPERATURE not in a:
                span_to_record(span)  # raises, naming the missing attribute
            kind = PolicyEvent.KIND
            step = _check_number(kind, _F["step"], a[names.SPAN_ATTR_STEP], integer=True)
            temperature = float(_check_number(kind, _F["temperature"], a[names.SPAN_ATTR_TEMPERATURE], integer=False))
            ts_ms = _check_number(kind, _F["ts_ms"], start // 1_000_000, integer=True)
        ctx = span.context
        return _LINE % (SCHEMA_VERSION, ts_ms, ctx.trace_id, ctx.span_id, frag[0], frag[1], step, temperature,
                        frag[2], frag[3], max(0, end - start) / 1e6)


class SpoolPolicyExporter(SpanExporter):
    """SpanExporter that writes every ``temperature_policy.decide`` span as a PolicyEvent.

    Other spans (the request spans) are ignored here; they go to OTLP when configured. A span
    that violates the contract is logged and counted in ``rejected`` instead of failing the batch,
    so one bad producer never loses the good decisions around it.
    """

    def __init__(self, spool: EventSink) -> None:
        self.spool = spool
        self.encoder = PolicyLineEncoder()
        self.exported = 0
        self.rejected = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        encode = self.encoder.line
        for span in spans:
            if span.name != names.POLICY_SPAN_NAME:
                continue
            try:
                line = encode(span)
            except EventError as exc:
                self.rejected += 1
                log.warning("dropping policy span %016x: %s", span.context.span_id, exc)
                continue
            try:
                self.spool.write_line(line)
            except OSError as exc:  # SpoolFullError or a disk error: say so loudly, keep serving
                self.failed += 1
                log.error("policy spool write failed (%s); decision %016x lost", exc, span.context.span_id)
                continue
            self.exported += 1
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.spool.flush()
        return True

    def shutdown(self) -> None:
        self.spool.flush()


class PolicyTracer:
    """Creates request spans and decision spans, and keeps the policy metrics.

    ``registry``: where the gauge/counter live (the worker's own registry). ``spool``: a writer
    for ``names.SPOOL_POLICY``; by default one under ``cfg.spool_dir()``.
    """

    def __init__(
        self,
        cfg: Config,
        *,
        registry: CollectorRegistry | None = None,
        spool: EventSink | None = None,
        service_name: str | None = None,
        otlp_endpoint: str | None = None,
    ) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.spool = spool or SpoolWriter.from_config(cfg, names.SPOOL_POLICY, registry=registry)
        self._own_spool = spool is None
        self.resource = otel_sdk.resource(service_name or cfg.otel.service_name)
        self.provider = TracerProvider(resource=self.resource, sampler=otel_sdk.sampler(cfg.otel.sample_ratio))
        self.tracer = self.provider.get_tracer("llmsla.exporters.policy_tracing", schema_url=genai.SCHEMA_URL)
        self.scope = InstrumentationScope("llmsla.exporters.policy_tracing")
        self.spool_exporter = SpoolPolicyExporter(self.spool)
        # every decision goes to the spool, whatever the trace's sampling flag: PolicyEvents are
        # data for the policy windows, not trace samples
        self._spool_proc = BatchSpanProcessor(
            self.spool_exporter, max_queue_size=_QUEUE, max_export_batch_size=4096, schedule_delay_millis=200
        )
        # also registered with the provider, so decision spans that other code starts the usual
        # way (tracer.start_span(names.POLICY_SPAN_NAME)) are spooled too
        self.provider.add_span_processor(self._spool_proc)
        # trace backends (OTLP, tests' in-memory exporters) get request spans from the provider
        # and decision spans of sampled traces from record()
        self._trace_procs: list[SpanProcessor] = []
        endpoint = cfg.otel.endpoint if otlp_endpoint is None else otlp_endpoint
        if endpoint:
            # a decision span per token: the worker's queue is sized for its token rates
            self.add_span_processor(otel_sdk.otlp_span_processor(endpoint, max_queue_size=_QUEUE))
        self.temperature = Gauge(
            names.POLICY_TEMPERATURE, "Temperature of the latest policy decision",
            [names.L_POLICY_ID, names.L_ZONE], registry=registry,
        )
        self.decisions = Counter(
            names.POLICY_DECISIONS, "Temperature-policy decisions",
            [names.L_POLICY_ID, names.L_ZONE, names.L_ACTION, names.L_TRIGGER], registry=registry,
        )
        self._gauges: dict[tuple[str, str], Any] = {}
        self._counters: dict[tuple[str, str, str, str], Any] = {}
        self.decisions_recorded = 0

    # -- spans -----------------------------------------------------------------------------------
    def request_span(self, headers: Mapping[str, str], attributes: Mapping[str, Any] | None = None, *,
                     operation: str = genai.TEXT_COMPLETION, model: str = "") -> trace.Span:
        """Start the request's span as a child of the incoming ``traceparent`` (a new trace if none),
        named per the GenAI conventions (``genai.span_name(operation, model)``).

        The caller ends it (``span.end()``) when the response is complete.
        """
        ctx = _PROPAGATOR.extract({k.lower(): v for k, v in headers.items()})
        return self.tracer.start_span(genai.span_name(operation, model), context=ctx, kind=trace.SpanKind.SERVER,
                                      attributes=attributes)

    def add_span_processor(self, processor: SpanProcessor) -> None:
        """Add a trace backend: it gets request spans and the decision spans of sampled traces."""
        self.provider.add_span_processor(processor)
        self._trace_procs.append(processor)

    def record(self, parent: trace.Span, policy_id: str, zone: str, step: int, decision: Decision,
               start_ns: int, end_ns: int) -> None:
        """Emit one decision span under ``parent`` (timed by the caller) and update the metrics.

        Fast path: the decision is already made and timed, so the span is built finished (an SDK
        ``ReadableSpan``) and handed straight to the span processors, skipping the sampler, the
        attribute sanitiser and the span's locks — about a fifth of ``start_span``/``end``'s cost
        on the engine thread. Attributes are typed by construction here.
        """
        pctx = parent.get_span_context()
        ctx = trace.SpanContext(pctx.trace_id, random.getrandbits(64) or 1, is_remote=False,
                                trace_flags=_SAMPLED, trace_state=pctx.trace_state)
        span = ReadableSpan(
            name=names.POLICY_SPAN_NAME,
            context=ctx,
            parent=pctx,
            resource=self.resource,
            attributes={
                names.SPAN_ATTR_POLICY_ID: policy_id,
                names.SPAN_ATTR_ZONE: zone,
                names.SPAN_ATTR_STEP: step,
                names.SPAN_ATTR_TEMPERATURE: float(decision.temperature),
                names.SPAN_ATTR_ACTION: decision.action,
                names.SPAN_ATTR_TRIGGER: decision.trigger,
            },
            start_time=start_ns,
            end_time=end_ns,
            instrumentation_scope=self.scope,
        )
        self._spool_proc.on_end(span)
        if pctx.trace_flags.sampled:
            for proc in self._trace_procs:
                proc.on_end(span)
        gkey = (policy_id, zone)
        g = self._gauges.get(gkey)
        if g is None:
            g = self._gauges[gkey] = self.temperature.labels(policy_id, zone)
        g.set(decision.temperature)
        ckey = (policy_id, zone, decision.action, decision.trigger)
        c = self._counters.get(ckey)
        if c is None:
            c = self._counters[ckey] = self.decisions.labels(*ckey)
        c.inc()
        self.decisions_recorded += 1

    # -- lifecycle -------------------------------------------------------------------------------
    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export every finished span and publish the spool segment (tests, shutdown)."""
        ok = self.provider.force_flush(int(timeout_s * 1000))
        self.spool.flush()
        return ok

    def shutdown(self) -> None:
        self.provider.shutdown()
        if self._own_spool:
            self.spool.close()
        else:
            self.spool.flush()


def now_ns() -> int:
    """Wall-clock nanoseconds, the clock OTel span timestamps use."""
    return time.time_ns()
