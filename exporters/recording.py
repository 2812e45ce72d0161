"""One recorder for every request llmsla sees: the gateway's, the ASGI middleware's and the
fleet simulator's.

Why one: downstream (Flink windows, dashboards, forecasts, a trace backend) must not be able to
tell simulated or in-process traffic from proxied traffic, so all three emit the same
``RequestEvent`` spool line, the same Prometheus series (:class:`RequestRecorder`) and the same
spans and OTLP metrics (:class:`GatewayTelemetry`) through this one object. The composition root
builds it (``llmsla.app.wiring.recorder``); see docs/gateway.md and docs/opentelemetry.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.sdk.trace import SpanProcessor
from prometheus_client import CollectorRegistry

from llmsla.config import Config
from llmsla.events import RequestEvent
from llmsla.exporters.gateway_telemetry import GatewayTelemetry, RequestTelemetry
from llmsla.exporters.metrics import RequestMetrics
from llmsla.exporters.openai import ParsedRequest
from llmsla.exporters.recorder import RequestRecorder, StreamTimer
from llmsla.spool import SpoolWriter


class Recorder:
    """Metrics + spool line (``requests``) and spans + OTLP metrics (``telemetry``) of requests.

    A live request (gateway, ASGI): :meth:`begin` -> :meth:`hop` -> :meth:`record` and
    :meth:`end` -> :meth:`finish`. A request that finished elsewhere (simulator):
    :meth:`record_event`.
    """

    def __init__(self, requests: RequestRecorder, telemetry: GatewayTelemetry) -> None:
        self.requests = requests
        self.telemetry = telemetry

    @classmethod
    def from_config(cls, cfg: Config, *, registry: CollectorRegistry | None = None,
                    spool: SpoolWriter | None = None, span_processor: SpanProcessor | None = None,
                    service_name: str | None = None) -> Recorder:
        """The recorder ``cfg`` describes (``otel.*`` for the telemetry); ``span_processor``
        replaces OTLP export of spans (tests, benches, embedding)."""
        requests = RequestRecorder(cfg, registry=registry, spool=spool)
        # OTLP attribute values fold into ``other`` exactly where the Prometheus labels do
        telemetry = GatewayTelemetry(cfg, requests.metrics.guard, service_name=service_name,
                                     span_processor=span_processor)
        return cls(requests, telemetry)

    @property
    def metrics(self) -> RequestMetrics:
        return self.requests.metrics

    # -- a live request ------------------------------------------------------------------------
    def begin(self, headers: Mapping[str, str], method: str, path: str, req: ParsedRequest,
              arrival: float) -> RequestTelemetry:
        return self.telemetry.begin(headers, method, path, req, arrival)

    def hop(self, tel: RequestTelemetry, upstream_url: str | None, req: ParsedRequest,
            headers: Mapping[str, str], dispatch: float) -> str:
        return self.telemetry.hop(tel, upstream_url, req, headers, dispatch)

    def record(self, event: RequestEvent, *, itl_gaps_ms: Sequence[float] | None = None,
               validate: bool = True, first_token: bool = True, admit: bool | None = None) -> None:
        """Metrics and spool line (see :meth:`RequestRecorder.record`)."""
        self.requests.record(event, itl_gaps_ms=itl_gaps_ms, validate=validate, first_token=first_token,
                             admit=admit)

    def end(self, tel: RequestTelemetry, ev: RequestEvent | None, timer: StreamTimer,
            upstream_url: str | None, *, admit: bool) -> None:
        self.telemetry.end(tel, ev, timer, upstream_url, admit=admit)

    def finish(self, tel: RequestTelemetry, http_status: int | None) -> None:
        self.telemetry.finish(tel, http_status)

    # -- a finished request --------------------------------------------------------------------
    def record_event(self, event: RequestEvent, *, validate: bool = True) -> None:
        """Metrics, spool line, spans and OTLP points of a request that finished elsewhere."""
        self.requests.record(event, validate=validate)
        self.telemetry.replay(event)

    # -- lifecycle -----------------------------------------------------------------------------
    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return self.telemetry.force_flush(timeout_s)

    def shutdown(self) -> None:
        """The last spans and metric points out (bounded; see GatewayTelemetry.shutdown)."""
        self.telemetry.shutdown()
