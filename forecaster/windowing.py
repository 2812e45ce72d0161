"""The store's 5 s request and GPU windows, computed in memory from events.

Building a training set through the streaming job would cost a JVM run per simulation; this
module computes the same rows with the same definitions (docs/streaming.md: tumbling windows
aligned to the epoch, keyed by (model, pool, replica, arm, tenant, class) or (node, gpu), exact percentiles
with linear interpolation, ITL pooled from per-request summaries). ``tests/forecaster`` runs
the real PyFlink job on the same events and checks every column equal, so the training data
and the online scorer (which reads the store) see identical windows.

A frame is a ``dict`` of equal-length numpy columns named as in the store, ``bucket`` in epoch
ms (int64), the key columns as object arrays.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from llmsla import names
from llmsla.events import EngineSample, GpuSample, RequestEvent
from llmsla.goodput import GoodputBounds
from llmsla.store import schema

Frame = dict[str, np.ndarray]

#: The store's columns (:mod:`llmsla.store.schema`); the request frame has no histograms.
REQUEST_KEYS = schema.REQUEST_KEYS
REQUEST_VALUES = schema.REQUEST_VALUES
GPU_KEYS = schema.GPU_KEYS
GPU_VALUES = schema.GPU_VALUES
POLICY_KEYS = schema.POLICY_KEYS
#: The policy columns the features read: decision counts and temperatures, not the latencies.
POLICY_VALUES: tuple[str, ...] = tuple(c for c in schema.POLICY_VALUES if not c.endswith("_ms"))
ENGINE_KEYS = schema.ENGINE_KEYS
#: The engine columns the features read: the queue, the KV cache and preemptions, not the
#: engine's own latencies and histograms (the request windows hold the served latencies).
ENGINE_VALUES: tuple[str, ...] = ("samples", "waiting_mean", "waiting_max", "running_mean", "running_max",
                                  "kv_usage_mean", "kv_usage_max", "preemptions", "counter_resets")



def empty(keys: tuple[str, ...], values: tuple[str, ...]) -> Frame:
    out: Frame = {k: np.empty(0, dtype=object) for k in keys}
    out["bucket"] = np.empty(0, dtype=np.int64)
    for v in values:
        out[v] = np.empty(0, dtype=float)
    return out


def _pct(values: list[float], q: float) -> float:
    """Exact percentile, linear interpolation at rank q * (n - 1) (Flink, numpy, percentile_cont)."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else math.nan


def request_windows(events: Iterable[RequestEvent], *, ttft_slo_ms: float, e2e_slo_ms: float,
                    width_s: int = names.REQUEST_WINDOW_S, goodput: GoodputBounds | None = None) -> Frame:
    """5 s request windows; a null percentile (no values) is NaN. ``goodput``: the catalog's
    bounds (``GoodputBounds.from_catalog``); default: the TTFT and E2E objectives given, no TPOT
    objective (the shipped catalog's)."""
    good = goodput or GoodputBounds(ttft_slo_ms, None, e2e_slo_ms)
    width = width_s * 1000
    groups: dict[tuple, list[RequestEvent]] = {}
    for e in events:
        key = (e.ts_ms - e.ts_ms % width, e.model, e.pool, e.replica, e.arm, e.tenant, e.class_)
        groups.setdefault(key, []).append(e)
    rows: list[tuple] = []
    for key in sorted(groups):
        g = groups[key]
        counts = dict.fromkeys(names.STATUS_COLUMNS.values(), 0)
        for e in g:
            counts[names.STATUS_COLUMNS[e.status]] += 1
        ttft = [e.ttft_ms for e in g if e.ttft_ms is not None]
        e2e = [e.e2e_ms for e in g]
        itl_n = sum(e.itl_ms.n for e in g)
        itl_sum = math.fsum(e.itl_ms.n * e.itl_ms.mean for e in g)
        itl_sumsq = math.fsum(e.itl_ms.n * (e.itl_ms.std ** 2 + e.itl_ms.mean ** 2) for e in g)
        mean = itl_sum / itl_n if itl_n else math.nan
        jitter = math.sqrt(max(itl_sumsq / itl_n - mean * mean, 0.0)) if itl_n else math.nan
        out_tok = sum(e.output_tokens for e in g)
        rows.append((*key, len(g), counts["ok"], counts["errors"], counts["timeouts"], counts["cancelled"],
                     counts["rejected"], len(g) / width_s,
                     _pct(ttft, 50), _pct(ttft, 95), _pct(ttft, 99), _pct(e2e, 50), _pct(e2e, 95), _pct(e2e, 99),
                     mean, jitter, _pct([e.queue_ms for e in g], 99),
                     sum(e.prompt_tokens for e in g), out_tok, out_tok / width_s,
                     ttft_slo_ms, e2e_slo_ms, sum(t <= ttft_slo_ms for t in ttft), sum(x <= e2e_slo_ms for x in e2e),
                     len(ttft), math.fsum(ttft), math.fsum(e2e), itl_n, itl_sum, itl_sumsq,
                     sum(good.request_met(e.status, e.ttft_ms, e.e2e_ms, e.output_tokens, tenant=e.tenant, class_=e.class_)
                         for e in g)))
    return _frame(rows, REQUEST_KEYS, REQUEST_VALUES)


def gpu_windows(samples: Iterable[GpuSample], *, width_s: int = names.GPU_WINDOW_S) -> Frame:
    width = width_s * 1000
    groups: dict[tuple, list[GpuSample]] = {}
    for s in samples:
        groups.setdefault((s.ts_ms - s.ts_ms % width, s.node, s.gpu), []).append(s)
    rows = []
    for key in sorted(groups):
        g = groups[key]
        rows.append((*key, len(g), max(s.mem_used_bytes for s in g),
                     math.fsum(s.mem_used_bytes for s in g) / len(g), max(s.mem_total_bytes for s in g),
                     math.fsum(s.util for s in g) / len(g), max(s.temp_c for s in g),
                     math.fsum(s.power_w for s in g) / len(g)))
    return _frame(rows, GPU_KEYS, GPU_VALUES)


def engine_windows(samples: Iterable[EngineSample], *, width_s: int = names.ENGINE_WINDOW_S) -> Frame:
    """5 s engine windows per (pool, replica, engine), as the stream job writes ``engine_windows``
    (docs/streaming.md#windows): gauges as mean and max over the window's samples; preemptions
    as the sum of the counter's increases between a replica's consecutive samples (the sample's
    own value after a reset or a decrease; unknown for a replica's first sample, so a window of
    unknowns is NaN)."""
    width = width_s * 1000
    groups: dict[tuple, list[tuple[float | None, float | None, float | None, float | None, int]]] = {}
    prev: dict[tuple, float | None] = {}
    for s in sorted(samples, key=lambda e: e.ts_ms):  # stable: a replica's samples in time order
        who = (s.pool, s.replica, s.engine)
        before, cur = prev.get(who), s.preemptions_total
        if cur is None or before is None:
            d = None
        else:
            d = cur if s.counter_reset == 1 or cur < before else cur - before
        prev[who] = cur
        groups.setdefault((s.ts_ms - s.ts_ms % width, *who), []).append(
            (s.waiting, s.running, s.kv_usage, d, s.counter_reset))

    def known(v: list) -> list[float]:
        return [float(x) for x in v if x is not None]

    def mean(v: list) -> float:
        k = known(v)
        return math.fsum(k) / len(k) if k else math.nan

    def top(v: list) -> float:
        k = known(v)
        return max(k) if k else math.nan

    rows = []
    for key in sorted(groups):
        waiting, running, kv, inc, resets = (list(c) for c in zip(*groups[key], strict=True))
        rows.append((*key, len(waiting), mean(waiting), top(waiting), mean(running), top(running), mean(kv), top(kv),
                     math.fsum(known(inc)) if known(inc) else math.nan, sum(resets)))
    return _frame(rows, ENGINE_KEYS, ENGINE_VALUES)


def _frame(rows: list[tuple], keys: tuple[str, ...], values: tuple[str, ...]) -> Frame:
    if not rows:
        return empty(keys, values)
    cols = list(zip(*rows, strict=True))
    out: Frame = {}
    for i, k in enumerate(keys):
        out[k] = np.asarray(cols[i], dtype=np.int64 if k in ("bucket", "gpu") else object)
    for j, v in enumerate(values):
        out[v] = np.asarray(cols[len(keys) + j], dtype=float)
    return out


def concat(frames: list[Frame]) -> Frame:
    frames = [f for f in frames if len(f["bucket"])]
    if not frames:
        raise ValueError("concat: no rows")
    return {k: np.concatenate([f[k] for f in frames]) for k in frames[0]}


class Collector:
    """A simulator sink that keeps events in memory (for :func:`request_windows`)."""

    def __init__(self) -> None:
        self.requests: list[RequestEvent] = []
        self.gpus: list[GpuSample] = []
        self.gpu_models: dict[tuple[str, int], str] = {}
        self.engines: list[EngineSample] = []

    def request(self, event: RequestEvent) -> None:
        self.requests.append(event)

    def gpu(self, sample: GpuSample, model_name: str) -> None:
        self.gpus.append(sample)

    def engine(self, sample: EngineSample) -> None:
        """The simulator's ``engine_sink`` (for :func:`engine_windows`)."""
        self.engines.append(sample)
