"""One scrape's outcome -> the ``llmsla_engine_*`` series (labels replica, pool, engine) and an
``EngineSample`` spool line.

A value the engine does not expose has no series (never a 0 that looks like an idle engine); a
replica that is down keeps only ``llmsla_engine_up 0`` and its preemption counter, so a
dashboard shows a gap, not frozen values. ``llmsla_engine_preemptions_total`` is llmsla's own
counter of the increases it saw: an engine restart (its counter going down) adds the new value,
never a negative step. The engine's histograms are not re-exported (Prometheus scrapes the
engine for those, or reads them from the store once windowed); they travel in the spool line.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from llmsla import names
from llmsla.events import EngineSample
from llmsla.spool import SpoolWriter

from .record import CHECKED_FIELDS, EngineSnapshot, sample_line
from .scrape import ScrapeError, Target

_LABELS = names.ENGINE_LABELS
#: What precedes the time in a sample's spool line.
_TS_KEY = '"ts_ms":'


class EngineRecorder:
    def __init__(self, *, registry: CollectorRegistry | None = None, spool: SpoolWriter | None = None) -> None:
        self.spool = spool

        def g(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, _LABELS, registry=registry, multiprocess_mode="mostrecent")

        self.up = g(names.ENGINE_UP, "1 if the replica's last /metrics scrape worked, else 0.")
        self.waiting = g(names.ENGINE_REQUESTS_WAITING, "Requests waiting in the engine's queue (as the engine reports).")
        self.running = g(names.ENGINE_REQUESTS_RUNNING, "Requests in the engine's running batch.")
        self.kv_usage = g(names.ENGINE_KV_USAGE_RATIO, "KV cache usage 0..1 (mean over data-parallel ranks).")
        self.kv_blocks = g(names.ENGINE_KV_BLOCKS, "KV cache blocks in total.")
        self.kv_block_size = g(names.ENGINE_KV_BLOCK_SIZE_TOKENS, "Tokens per KV cache block.")
        self.kv_capacity = g(names.ENGINE_KV_CAPACITY_TOKENS, "KV cache capacity, tokens.")
        self.hit_ratio = g(names.ENGINE_PREFIX_CACHE_HIT_RATIO,
                           "Prefix-cache hit rate 0..1 over the last scrape interval (the engine's gauge where it has no counters).")
        self.lora = g(names.ENGINE_LORA_ADAPTERS, "LoRA adapters the engine reports running or waiting.")
        self.scrape_seconds = g(names.ENGINE_SCRAPE_SECONDS, "Duration of the replica's last scrape, seconds.")
        self.preemptions = Counter(names.ENGINE_PREEMPTIONS, "Preemptions the engine reported (SGLang: retractions), "
                                   "counted across engine restarts.", _LABELS, registry=registry)
        self.failures = Counter(names.ENGINE_SCRAPE_FAILURES, "Failed scrapes of a replica's /metrics, by reason.",
                                (names.L_REPLICA, names.L_POOL, names.L_REASON), registry=registry)
        self._values = (self.waiting, self.running, self.kv_usage, self.kv_blocks, self.kv_block_size,
                        self.kv_capacity, self.hit_ratio, self.lora)
        self._engine: dict[str, str] = {}  # replica -> the engine label its series carry
        #: (value gauge index, labels) -> its bound child: prometheus-client's labels() costs more
        #: than the set, and a scraper sets every gauge of every replica every second
        self._bound: dict[tuple[int, tuple[str, str, str]], Any] = {}
        #: labels -> the bound (up, scrape_seconds, preemptions) children a success sets
        self._fixed: dict[tuple[str, str, str], tuple[Any, Any, Any]] = {}
        #: labels -> the values its gauges were last set to: an idle replica's are not set again
        self._last: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        #: replica -> its last sample, and its spool line around the time: (snapshot, the line up
        #: to the time's digits, the line after them). An idle replica's record repeats but for
        #: its time: its line is that one at the new time (:meth:`_repeat`)
        self._repeats: dict[str, tuple[EngineSnapshot, str, str]] = {}

    def _labels(self, target: Target, engine: str) -> tuple[str, str, str]:
        return (target.replica, target.pool, engine)

    def _clear(self, target: Target) -> None:
        self._repeats.pop(target.replica, None)
        engine = self._engine.get(target.replica)
        if engine is None:
            return
        labels = self._labels(target, engine)
        self._last.pop(labels, None)
        for i, gauge in enumerate(self._values):
            self._bound.pop((i, labels), None)
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)

    def sample(self, target: Target, snap: EngineSnapshot, preempted: float, seconds: float) -> None:
        """A successful scrape: gauges, the preemption counter, the spool line."""
        if self._repeat(target, snap, preempted, seconds):
            return
        event = snap.to_event().validate(checked=CHECKED_FIELDS)
        old = self._engine.get(target.replica)
        if old is not None and old != snap.engine:  # first detected (was auto), or the engine changed
            self._clear(target)
            self._fixed.pop(self._labels(target, old), None)
            for gauge in (self.up, self.scrape_seconds):
                with contextlib.suppress(KeyError):
                    gauge.remove(*self._labels(target, old))
        self._engine[target.replica] = snap.engine
        labels = self._labels(target, snap.engine)
        values: tuple[Any, ...] = (event.waiting, event.running, event.kv_usage, event.kv_blocks_total, event.kv_block_size,
                  event.kv_capacity_tokens, event.prefix_cache_hit_rate,
                  None if event.lora_adapters is None else len(event.lora_adapters))
        bound = self._bound
        if self._last.get(labels) == values:
            values = ()  # each gauge holds its value already (or has no series, for a None)
        else:
            self._last[labels] = values
        for i, (gauge, value) in enumerate(zip(self._values, values, strict=False)):
            if value is None:
                if bound.pop((i, labels), None) is not None:
                    with contextlib.suppress(KeyError):
                        gauge.remove(*labels)
            else:
                child = bound.get((i, labels))
                if child is None:
                    child = bound[(i, labels)] = gauge.labels(*labels)
                child.set(value)
        fixed = self._fixed.get(labels)
        if fixed is None:
            fixed = self._fixed[labels] = (self.up.labels(*labels), self.scrape_seconds.labels(*labels),
                                           self.preemptions.labels(*labels))
        fixed[0].set(1)
        fixed[1].set(seconds)
        if preempted > 0:
            fixed[2].inc(preempted)
        line = sample_line(event, snap)
        at = line.index(_TS_KEY) + len(_TS_KEY)
        self._repeats[target.replica] = (snap, line[:at], line[at + len(str(event.ts_ms)):])
        if self.spool is not None:
            self.spool.write_line(line)

    def _repeat(self, target: Target, snap: EngineSnapshot, preempted: float, seconds: float) -> bool:
        """Record ``snap`` when it is the replica's last sample but for its time (an idle
        replica): the gauges hold its values already, the time is checked by the contract's rule
        (the one field that moved) and the last spool line is written at the new time. False,
        with nothing done, for any other sample."""
        last = self._repeats.get(target.replica)
        if last is None or preempted or snap.with_(ts=last[0].ts) != last[0]:
            return False
        ts_ms = EngineSample.check_field("ts_ms", snap.ts_ms)
        up, scrape_seconds, _ = self._fixed[self._labels(target, snap.engine)]
        up.set(1)
        scrape_seconds.set(seconds)
        if self.spool is not None:
            self.spool.write_line(f"{last[1]}{ts_ms}{last[2]}")
        return True

    def forget(self, target: Target) -> None:
        """The replica left (discovery): every series of it goes (stale in Prometheus, not 0)."""
        self._repeats.pop(target.replica, None)
        engine = self._engine.pop(target.replica, None)
        if engine is None:
            return
        labels = self._labels(target, engine)
        self._fixed.pop(labels, None)
        self._last.pop(labels, None)
        for i in range(len(self._values)):
            self._bound.pop((i, labels), None)
        for metric in (*self._values, self.up, self.scrape_seconds, self.preemptions):
            with contextlib.suppress(KeyError):
                metric.remove(*labels)
        for reason in names.ENGINE_FAIL_REASONS:
            with contextlib.suppress(KeyError):
                self.failures.remove(target.replica, target.pool, reason)

    def failure(self, target: Target, error: ScrapeError, seconds: float) -> None:
        """A failed scrape: ``up 0``, the value series removed, the failure counted."""
        self._clear(target)
        engine = self._engine.setdefault(target.replica, target.engine)
        labels = self._labels(target, engine)
        self.up.labels(*labels).set(0)
        self.scrape_seconds.labels(*labels).set(seconds)
        self.failures.labels(target.replica, target.pool, error.reason).inc()
