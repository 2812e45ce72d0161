"""The gateway's requests as OTLP metrics in the GenAI conventions, beside Prometheus (opt-in).

Recording is pre-aggregated here (a dict lookup and a bisect under one lock) and a daemon thread
hands the counts to the SDK's exporter, because the SDK's ``Histogram.record`` hashes the
attribute set on every call. Cumulative temporality, one stream per process: the backend sums
``--workers N`` instances. See docs/opentelemetry.md#otlp-metrics.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from llmsla.config import Config
from llmsla.exporters import genai

log = logging.getLogger(__name__)

_SCOPE = InstrumentationScope(__name__, schema_url=genai.SCHEMA_URL)


class _Hist:
    """A cumulative explicit-bucket histogram of one attribute set (``bisect_left``: a value on a
    bound falls in that bound's bucket, as Prometheus's ``le`` and OTLP's upper-inclusive bounds)."""

    __slots__ = ("counts", "n", "sum", "min", "max")

    def __init__(self, n_bounds: int) -> None:
        self.counts = [0] * (n_bounds + 1)
        self.n = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, bounds: Sequence[float], value: float) -> None:
        self.counts[bisect_left(bounds, value)] += 1
        self.n += 1
        self.sum += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value


class _Series:
    """The histograms of one attribute set."""

    __slots__ = ("attrs", "start_ns", "ttft", "tpot", "duration", "client", "tokens_in", "tokens_out")

    def __init__(self, attrs: dict[str, Any], owner: GenAIMetrics) -> None:
        self.attrs = attrs
        self.start_ns = owner.start_ns
        self.ttft = _Hist(len(owner.ttft_bounds))
        self.tpot = _Hist(len(owner.tpot_bounds))
        self.duration = _Hist(len(owner.e2e_bounds))
        self.client = _Hist(len(owner.e2e_bounds))
        self.tokens_in = _Hist(len(owner.token_bounds))
        self.tokens_out = _Hist(len(owner.token_bounds))


class GenAIMetrics:
    """Cumulative GenAI histograms of one process, exported over OTLP/HTTP.

    ``exporter``: any SDK ``MetricExporter`` (default: ``OTLPMetricExporter`` to
    ``cfg.otel.metrics_endpoint``); ``start=False`` exports only on :meth:`force_flush` and
    :meth:`shutdown`.
    """

    MAX_SERIES = 4096  # attribute sets kept; the label guard bounds them long before this

    def __init__(self, cfg: Config, resource: Resource, *, exporter: MetricExporter | None = None,
                 start: bool = True) -> None:
        self.ttft_bounds = genai.ADVISED_BOUNDS[genai.TIME_TO_FIRST_TOKEN[0]]
        self.tpot_bounds = genai.ADVISED_BOUNDS[genai.TIME_PER_OUTPUT_TOKEN[0]]
        self.e2e_bounds = genai.ADVISED_BOUNDS[genai.REQUEST_DURATION[0]]
        self.token_bounds = genai.ADVISED_BOUNDS[genai.TOKEN_USAGE[0]]
        self.resource = resource
        self.start_ns = time.time_ns()
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            exporter = OTLPMetricExporter(endpoint=cfg.otel.metrics_endpoint)
        self.exporter = exporter
        self.interval_s = cfg.otel.metrics_interval_s
        self._series: dict[tuple, _Series] = {}
        self._lock = threading.Lock()
        self._export_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.exports = 0
        self.export_failures = 0
        self.dropped = 0  # requests not recorded because MAX_SERIES attribute sets exist
        if start:
            self._thread = threading.Thread(target=self._run, name="llmsla-otlp-metrics", daemon=True)
            self._thread.start()

    # -- recording (request path) ----------------------------------------------------------------
    def record(self, key: tuple, make_attrs: Callable[[], dict[str, Any]], *, ttft_s: float | None,
               e2e_s: float, tpot_s: float | None, input_tokens: int | None, output_tokens: int | None,
               client_s: float | None = None) -> None:
        """One finished request. ``key``: a tuple of its attribute values; ``make_attrs`` builds
        the attribute dict, called only the first time a key is seen. None: not observed (no
        first token, not a success, no usage reported, no replica called: ``client_s`` is the
        call to the replica, from dispatch to the end)."""
        with self._lock:
            s = self._series.get(key)
            if s is None:
                if len(self._series) >= self.MAX_SERIES:
                    self.dropped += 1
                    return
                s = self._series[key] = _Series(make_attrs(), self)
            if ttft_s is not None:
                s.ttft.add(self.ttft_bounds, ttft_s)
            if tpot_s is not None:
                s.tpot.add(self.tpot_bounds, tpot_s)
            s.duration.add(self.e2e_bounds, e2e_s)
            if client_s is not None:
                s.client.add(self.e2e_bounds, client_s)
            if input_tokens is not None:
                s.tokens_in.add(self.token_bounds, input_tokens)
            if output_tokens is not None:
                s.tokens_out.add(self.token_bounds, output_tokens)

    # -- export (its own thread) -----------------------------------------------------------------
    def collect(self) -> MetricsData:
        """The cumulative state as the SDK's data model (what ``OTLPMetricExporter`` encodes)."""
        now = time.time_ns()
        ttft: list[HistogramDataPoint] = []
        tpot: list[HistogramDataPoint] = []
        duration: list[HistogramDataPoint] = []
        client: list[HistogramDataPoint] = []
        usage: list[HistogramDataPoint] = []

        def point(s: _Series, h: _Hist, bounds: tuple[float, ...], attrs: dict[str, Any]) -> HistogramDataPoint:
            return HistogramDataPoint(attributes=attrs, start_time_unix_nano=s.start_ns, time_unix_nano=now,
                                      count=h.n, sum=h.sum, bucket_counts=list(h.counts),
                                      explicit_bounds=bounds, min=h.min, max=h.max)

        with self._lock:
            for s in self._series.values():
                if s.ttft.n:
                    ttft.append(point(s, s.ttft, self.ttft_bounds, s.attrs))
                if s.tpot.n:
                    tpot.append(point(s, s.tpot, self.tpot_bounds, s.attrs))
                if s.duration.n:
                    duration.append(point(s, s.duration, self.e2e_bounds, s.attrs))
                if s.client.n:
                    client.append(point(s, s.client, self.e2e_bounds, s.attrs))
                for h, kind in ((s.tokens_in, genai.TOKEN_INPUT), (s.tokens_out, genai.TOKEN_OUTPUT)):
                    if h.n:
                        usage.append(point(s, h, self.token_bounds, {**s.attrs, genai.TOKEN_TYPE: kind}))
        metrics = []
        for (name, unit, description), points in ((genai.TIME_TO_FIRST_TOKEN, ttft), (genai.TIME_PER_OUTPUT_TOKEN, tpot),
                                                  (genai.REQUEST_DURATION, duration), (genai.TOKEN_USAGE, usage),
                                                  (genai.CLIENT_DURATION, client)):
            if points:
                metrics.append(Metric(name=name, description=description, unit=unit,
                                      data=Histogram(data_points=points,
                                                     aggregation_temporality=AggregationTemporality.CUMULATIVE)))
        scope = ScopeMetrics(scope=_SCOPE, metrics=metrics, schema_url=genai.SCHEMA_URL)
        return MetricsData(resource_metrics=[ResourceMetrics(resource=self.resource, scope_metrics=[scope],
                                                             schema_url=genai.SCHEMA_URL)])

    def _export(self, timeout_s: float = 10.0) -> bool:
        with self._export_lock:
            data = self.collect()
            if not data.resource_metrics[0].scope_metrics[0].metrics:
                return True
            try:
                result = self.exporter.export(data, timeout_millis=timeout_s * 1000)
            except Exception:  # the exporter logs its own HTTP errors; anything else, once here
                log.exception("OTLP metric export failed")
                result = None
            ok = result is MetricExportResult.SUCCESS
            self.exports += 1
            self.export_failures += 0 if ok else 1
            return ok

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._export()

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export the current state now (tests, shutdown)."""
        return self._export(timeout_s)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the export thread, export once more, close the exporter."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._export(timeout_s)
        self.exporter.shutdown()
