"""The OpenTelemetry SDK pieces every llmsla process sets up the same way: resource, sampler,
OTLP span export.

Why one place: the gateway and the worker must agree on sampling (a trace the edge sampled is
recorded all the way down, one it dropped is dropped everywhere: ``ParentBased`` around
``TraceIdRatioBased(otel.sample_ratio)``), and on identity: every gateway or worker gets its own
``service.instance.id``, so the ``--workers N`` processes of one gateway are N distinct streams
to a collector (summed there), never one stream written by several processes.

Providers are private (never the global one): several gateways and workers live in one test
process, each with its own endpoint.
"""

from __future__ import annotations

import uuid

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.semconv._incubating.attributes.service_attributes import SERVICE_INSTANCE_ID
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME

#: Spans queued for export before the SDK drops (and logs) any: minutes of a busy gateway's
#: traffic, so a collector restart loses nothing.
SPAN_QUEUE = 1 << 16


def resource(service_name: str) -> Resource:
    """``service.name`` + a fresh ``service.instance.id`` (a UUID, as the conventions advise):
    one per gateway or worker instance, so two in one process (tests) or the processes of
    ``--workers N`` never share a metric stream. ``OTEL_RESOURCE_ATTRIBUTES`` adds the rest,
    e.g. ``deployment.environment.name``."""
    return Resource.create({SERVICE_NAME: service_name, SERVICE_INSTANCE_ID: str(uuid.uuid4())})


def sampler(ratio: float) -> Sampler:
    """Parent-based ratio sampling: a caller's sampled flag decides for its requests; new traces
    are recorded with probability ``ratio`` (decided on the trace id, so every process agrees)."""
    return ParentBased(TraceIdRatioBased(min(1.0, max(0.0, ratio))))


def otlp_span_processor(endpoint: str, *, max_queue_size: int = SPAN_QUEUE) -> SpanProcessor:
    """Batched OTLP/HTTP span export to ``endpoint`` (a full ``.../v1/traces`` URL), off the
    request path."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), max_queue_size=max_queue_size)
