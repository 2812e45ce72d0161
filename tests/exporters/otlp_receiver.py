"""A real OTLP/HTTP receiver on loopback for tests: what an OpenTelemetry Collector's ``otlp``
receiver would get, decoded from the protobuf the SDK's exporters send (gzip or not)."""

from __future__ import annotations

import asyncio
import gzip
import threading
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def value(v: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as Python (arrays as tuples)."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


class OtlpReceiver:
    """``with OtlpReceiver() as rx: ... rx.traces_url, rx.metrics_url, rx.spans()``."""

    def __init__(self) -> None:
        self.trace_requests: list[ExportTraceServiceRequest] = []
        self.metric_requests: list[ExportMetricsServiceRequest] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.port = 0

    @property
    def traces_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/metrics"

    async def _read(self, request: web.Request) -> bytes:
        raw = await request.read()
        return gzip.decompress(raw) if request.headers.get("Content-Encoding") == "gzip" else raw

    async def _traces(self, request: web.Request) -> web.Response:
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(await self._read(request))
        with self._lock:
            self.trace_requests.append(msg)
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def _metrics(self, request: web.Request) -> web.Response:
        msg = ExportMetricsServiceRequest()
        msg.ParseFromString(await self._read(request))
        with self._lock:
            self.metric_requests.append(msg)
        return web.Response(body=b"", content_type="application/x-protobuf")

    def _main(self) -> None:
        async def run() -> None:
            app = web.Application(client_max_size=64 << 20)
            app.router.add_post("/v1/traces", self._traces)
            app.router.add_post("/v1/metrics", self._metrics)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        asyncio.run(run())

    def __enter__(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._main, name="otlp-receiver", daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "OTLP receiver did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """Every span received: ``(resource attributes, span proto)``."""
        with self._lock:
            reqs = list(self.trace_requests)
        return [(attributes(rs.resource.attributes), sp) for msg in reqs for rs in msg.resource_spans
                for ss in rs.scope_spans for sp in ss.spans]

    def histogram_points(self) -> list[tuple[dict[str, Any], str, Any]]:
        """Every histogram data point received: ``(resource attributes, metric name, point)``."""
        with self._lock:
            reqs = list(self.metric_requests)
        return [(attributes(rm.resource.attributes), m.name, p) for msg in reqs for rm in msg.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics for p in m.histogram.data_points]

