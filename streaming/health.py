"""What the stream job has done, as Prometheus metrics read from the store it writes.

Dead letters and windows land in the store, from whichever Flink task wrote them, so the store
is the one place that knows the totals: a counter read from the running totals of
``dead_letter_totals`` (kept by a trigger on ``dead_letters``) survives job restarts, rescaling
and the retention that drops old dead letters, and the newest window end per table says how far behind
the job is (``time() - llmsla_stream_newest_window_end_timestamp_seconds``) even when it is
down. ``llmsla stream`` serves these on ``stream.metrics_port``; the static rule
``LlmslaDeadLetters`` and the stream-lag panel read them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from llmsla import names
from llmsla.config import Config
from llmsla.store.connection import StoreError, StoreHandle, scalar

#: Window tables whose newest end is exported, with their length (the time column holds starts).
WINDOW_SECONDS = {names.T_REQUEST_WINDOWS: names.REQUEST_WINDOW_S, names.T_POLICY_WINDOWS: names.POLICY_WINDOW_S,
                  names.T_GPU_WINDOWS: names.GPU_WINDOW_S, names.T_ENGINE_WINDOWS: names.ENGINE_WINDOW_S}


class StreamHealth(Collector):
    """Collects from the store at most once per ``min_interval_s`` (scrapes from several
    Prometheus replicas share a reading); a store that does not answer yields no samples and
    the scrape still succeeds, so ``up`` stays about the process and absence about the data."""

    def __init__(self, store: StoreHandle, *, min_interval_s: float = 5.0) -> None:
        self._store = store
        self._min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._cached: list[Metric] = []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if time.monotonic() - self._at >= self._min_interval_s:
                self._cached = self._read()
                self._at = time.monotonic()
            return iter(list(self._cached))

    def _read(self) -> list[Metric]:
        try:
            with self._store.connect(autocommit=True) as conn:
                letters = conn.execute(
                    f"SELECT source, sum(records) FROM {names.T_DEAD_LETTER_TOTALS} GROUP BY source").fetchall()
                newest = {t: scalar(conn, f"SELECT extract(epoch FROM max({names.TIME_TABLES[t]})) FROM {t}")
                          for t in WINDOW_SECONDS}
        except (StoreError, psycopg.Error, OSError):
            return []
        dead = CounterMetricFamily(names.DEAD_LETTERS, "records the stream job set aside (stored in dead_letters)",
                                   labels=[names.L_SOURCE])
        for source, count in letters:
            dead.add_metric([source], float(count))
        lag = GaugeMetricFamily(names.STREAM_NEWEST_WINDOW, "end of the newest stored window, per window table",
                                labels=["table"])
        for table, start in newest.items():
            if start is not None:
                lag.add_metric([table], float(start) + WINDOW_SECONDS[table])
        return [dead, lag]


def registry_for(store: StoreHandle) -> CollectorRegistry:
    """A registry of its own: the stream's /metrics carries only what it knows."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StreamHealth(store))
    return reg


@contextlib.contextmanager
def serving(cfg: Config, store: StoreHandle | None) -> Iterator[None]:
    """``/metrics`` with the dead-letter counter and window lag on stream.metrics_host:port while
    the job runs, from the process that waits on it (``llmsla stream``, also with --jobmanager, or
    :func:`llmsla.streaming.job.main` under ``flink run`` / the operator's PythonDriver); the
    blackhole run stores nothing to report."""
    if store is None:
        yield
        return
    from aiohttp import web

    from llmsla.errors import CliError
    from llmsla.httpkit import BackgroundServer, BindError, add_metrics

    app = web.Application()
    add_metrics(app, registry_for(store))
    bg = BackgroundServer()
    try:
        try:
            served = bg.serve(app, cfg.stream.metrics_host, cfg.stream.metrics_port)
        except BindError as exc:  # the one line every server says, naming the key that chose the port
            raise CliError(f"{cfg.origin('stream.metrics_port')}: {exc}") from None
        logging.getLogger(__name__).info("stream metrics on http://%s:%d/metrics", cfg.stream.metrics_host, served.port)
        yield
    finally:
        bg.close()
