"""Every request and GPU metric object, created in one place from ``names.*`` and ``cfg.metrics``.

One module owns the definitions (as vLLM's ``v1/metrics`` does) so the gateway, the ASGI
middleware, the fleet simulator and the GPU collector cannot drift apart. A label guard folds
unknown or excess label values so clients cannot blow up Prometheus, and labelled children are
cached so a request costs a dict lookup. Exposition is core (:mod:`llmsla.exposition`).
See docs/gateway.md#metrics-exportersmetricspy.
"""

from __future__ import annotations

import math
import threading
import weakref
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any, Final

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llmsla import names, slo_catalog
from llmsla.config import Config
from llmsla.events import string_problem
from llmsla.goodput import GoodputBounds, tpot_seconds

#: Cached label tuples before the cache is reset (bounds memory when clients send junk labels;
#: the folded values themselves are bounded by the guard, the raw keys are not).
_CACHE_MAX = 4096


def _fast_histogram(child: Any) -> bool:
    """True when ``child`` has the internals :func:`observe_many` relies on (prometheus_client's
    Histogram: non-cumulative ``_buckets`` values, ``_upper_bounds`` ending in +Inf, ``_sum``);
    anything else falls back to ``observe``. A test pins equality with ``observe``."""
    return (hasattr(child, "_buckets") and hasattr(child, "_upper_bounds") and hasattr(child, "_sum")
            and len(child._buckets) == len(child._upper_bounds) and child._upper_bounds[-1] == float("inf"))


def observe_many(child: Any, values: Sequence[float]) -> None:
    """``child.observe(v)`` for each value, with one lock round per touched bucket instead of a
    linear bucket scan and two locks per value (a 256-token stream is 255 gaps)."""
    if not values:
        return
    if not _fast_histogram(child):
        for v in values:
            child.observe(v)
        return
    bounds = child._upper_bounds
    counts: dict[int, int] = {}
    for v in values:
        i = bisect_left(bounds, v)
        counts[i] = counts.get(i, 0) + 1
    child._sum.inc(math.fsum(values))
    buckets = child._buckets
    for i, c in counts.items():
        buckets[i].inc(c)


def _observe1(child: Any, value: float) -> None:
    """``child.observe(value)`` with a bisect instead of the client's linear bucket scan (the
    caller checked :func:`_fast_histogram`); NaN goes through ``observe`` (no bucket)."""
    if value != value:
        child.observe(value)
        return
    child._sum.inc(value)
    child._buckets[bisect_left(child._upper_bounds, value)].inc(1)


def observe_n(child: Any, value: float, n: int) -> None:
    """``child.observe(value)`` ``n`` times in O(1) (the simulator's ITL summaries)."""
    if n <= 0:
        return
    if not _fast_histogram(child):
        for _ in range(n):
            child.observe(value)
        return
    child._sum.inc(value * n)
    child._buckets[bisect_left(child._upper_bounds, value)].inc(n)


class LabelGuard:
    """Bounds the distinct values of each guarded label.

    A value is kept if it is in the label's allow-list (when one is configured) and among the
    first ``top_n`` distinct values *admitted*; anything else becomes ``other``. Only a request
    the upstream served (``admit``: status ok) can claim a slot, so a flood of junk model names,
    which the upstream refuses, cannot take the slots of real traffic. First-admitted rather than
    most-frequent: it needs no counting state and never relabels an existing series. A value
    that cannot be stored or rendered (``events.string_problem``) never gets a slot.
    """

    def __init__(self, top_n: int, allowed: dict[str, Iterable[str]] | None = None) -> None:
        self.top_n = top_n
        self.allowed = {k: frozenset(v) for k, v in (allowed or {}).items() if v}
        self._seen: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def fold(self, label: str, value: str, *, admit: bool = True) -> tuple[str, bool]:
        """``(value_to_export, folded)``; ``admit``: this value may claim a free slot."""
        seen = self._seen.get(label)
        if seen is not None and value in seen:
            return value, False
        allowed = self.allowed.get(label)
        if allowed is not None and value not in allowed:
            return names.LABEL_OVERFLOW_VALUE, True
        if not admit or string_problem(value) is not None:
            return names.LABEL_OVERFLOW_VALUE, True
        with self._lock:
            seen = self._seen.setdefault(label, set())
            if value in seen:
                return value, False
            if len(seen) >= self.top_n:
                return names.LABEL_OVERFLOW_VALUE, True
            seen.add(value)
        return value, False

    @classmethod
    def from_config(cls, cfg: Config) -> LabelGuard:
        m = cfg.metrics
        return cls(
            m.label_top_n,
            {names.L_MODEL: m.allowed_models, names.L_POOL: m.allowed_pools, names.L_ARM: m.allowed_arms},
        )


class _Children:
    """The labelled children of one (model, pool, replica, arm, tenant, class) series set."""

    __slots__ = ("model", "ttft", "itl", "tpot", "e2e", "queue", "prompt", "output", "status", "goodput", "overflow",
                 "fast")

    def __init__(self, m: RequestMetrics, labels: tuple[str, ...], overflow: list[Any]) -> None:
        self.model = labels[0]  # the model label as exported (``other`` when the guard folded it)
        self.ttft = m.ttft.labels(*labels)
        self.itl = m.itl.labels(*labels)
        self.tpot = m.tpot.labels(*labels)
        self.e2e = m.e2e.labels(*labels)
        self.queue = m.queue.labels(*labels)
        self.prompt = m.tokens.labels(*labels, names.TOKEN_KIND_PROMPT)
        self.output = m.tokens.labels(*labels, names.TOKEN_KIND_OUTPUT)
        self.status = {s: m.requests.labels(*labels, s) for s in names.STATUSES}
        self.goodput = m.goodput.labels(*labels)
        self.overflow = overflow
        # checked once here instead of per observation (see _fast_histogram)
        self.fast = all(_fast_histogram(h) for h in (self.ttft, self.itl, self.tpot, self.e2e, self.queue))


class RequestMetrics:
    """The request metric families of one registry (histograms in seconds)."""

    def __init__(self, cfg: Config, registry: CollectorRegistry | None) -> None:
        m = cfg.metrics
        labels = names.REQUEST_SERIES_LABELS
        reg = registry
        self.ttft = Histogram(names.REQUEST_TTFT_SECONDS, "Time from request arrival at the gateway to the first "
                              "token-carrying chunk of a streamed response (requests that produced one).",
                              labels, buckets=m.ttft_buckets, registry=reg)
        # both per-token scales, so both take metrics.itl_buckets (and slo.itl_ms is a bound of each)
        self.itl = Histogram(names.REQUEST_INTER_CHUNK_SECONDS, "Gaps between consecutive token-carrying chunks "
                             "of a streamed response, one observation per gap.",
                             labels, buckets=m.itl_buckets, registry=reg)
        self.tpot = Histogram(names.REQUEST_TPOT_SECONDS, "Per-request time per output token after the first, "
                              "(E2E - TTFT) / (output tokens - 1), of successful streamed requests.",
                              labels, buckets=m.itl_buckets, registry=reg)
        self.e2e = Histogram(names.REQUEST_E2E_SECONDS, "Time from request arrival to the last byte of the response (every status).",
                             labels, buckets=m.e2e_buckets, registry=reg)
        self.queue = Histogram(names.REQUEST_QUEUE_SECONDS, "Time a request waited in the gateway before dispatch to a replica.",
                               labels, buckets=m.queue_buckets, registry=reg)
        self.requests = Counter(names.REQUESTS, "Finished requests by outcome.", (*labels, names.L_STATUS), registry=reg)
        self.goodput = Counter(names.REQUEST_GOODPUT, "Successful requests that met every latency objective of the "
                               "SLO specs at once (TTFT, time per output token, E2E).", labels, registry=reg)
        self.good = GoodputBounds.from_catalog(slo_catalog.load(cfg))
        self.tokens = Counter(names.TOKENS, "Prompt and generated tokens.", (*labels, names.L_KIND), registry=reg)
        self.in_flight = Gauge(names.REQUESTS_IN_FLIGHT, "Requests currently inside the gateway.", (names.L_POOL,),
                               registry=reg, multiprocess_mode="livesum")
        self.overflow = Counter(names.LABEL_OVERFLOW, "Label values folded into 'other' by the cardinality guard.",
                                (names.L_LABEL,), registry=reg)
        self.bad_requests = Counter(names.GATEWAY_BAD_REQUESTS, "Requests refused with a 4xx before dispatch, by reason.",
                                    (names.L_REASON,), registry=reg)
        self.shed_requests = Counter(names.GATEWAY_SHED, "Requests refused (429 shed_by_slo) because their class is shed "
                                     "in their pool, before the body is read.", (names.L_POOL, names.L_CLASS),
                                     registry=reg)
        self.guard = LabelGuard.from_config(cfg)
        # tenant and class are bounded by the configuration, not by a top-N: every declared tenant
        # keeps its label however many there are (exporters/tenants.py resolves them per request)
        t = cfg.tenants
        self.tenant_values = frozenset((*t.declared, names.LABEL_OVERFLOW_VALUE, names.DEFAULT_TENANT))
        self.class_values = frozenset((*t.classes, names.DEFAULT_CLASS))
        self._overflow_children = {lbl: self.overflow.labels(lbl) for lbl in labels}
        self._cache: dict[tuple[str, ...], _Children] = {}
        self._by_folded: dict[tuple[Any, ...], _Children] = {}
        self._in_flight_children: dict[str, Any] = {}

    def children(self, model: str, pool: str, replica: str, arm: str, tenant: str = names.DEFAULT_TENANT,
                 class_: str = names.DEFAULT_CLASS, *, admit: bool = True) -> _Children:
        """Labelled children for a raw label tuple (guarded, cached). ``admit``: the upstream
        served this request, so its model name may claim a free slot. A tuple folded for lack of
        admission is not cached under its raw values: its next served request may claim one.
        ``tenant`` and ``class_`` outside the configured ones (a simulated or replayed event's)
        are ``other``."""
        key = (model, pool, replica, arm, tenant, class_)
        ch = self._cache.get(key)
        if ch is not None:
            return ch
        folded: list[str] = []
        flags: list[bool] = []
        for lbl, value in zip(names.REQUEST_LABELS, key, strict=False):
            # only the model is the client's choice; pool, replica and arm come from our config
            v, was_folded = self.guard.fold(lbl, value, admit=admit or lbl != names.L_MODEL)
            folded.append(v)
            flags.append(was_folded)
        for value, known in ((tenant, self.tenant_values), (class_, self.class_values)):
            folded.append(value if value in known else names.LABEL_OVERFLOW_VALUE)
            flags.append(value not in known)
        overflow = [self._overflow_children[lbl] for lbl, f in zip(names.REQUEST_SERIES_LABELS, flags, strict=True) if f]
        fkey = (*folded, *flags)
        ch = self._by_folded.get(fkey)
        if ch is None:
            if len(self._by_folded) >= _CACHE_MAX:
                self._by_folded.clear()
            ch = self._by_folded[fkey] = _Children(self, tuple(folded), overflow)
        if admit or not overflow:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = ch
        return ch

    def folded(self, label: str) -> None:
        """Count a request whose ``label`` (tenant or class) was folded before it was recorded:
        it named a tenant that is not declared, or a class it may not have."""
        self._overflow_children[label].inc()

    def bad_request(self, reason: str) -> None:
        """Count a malformed request (``reason`` is one of the gateway's fixed codes)."""
        self.bad_requests.labels(reason).inc()

    def shed(self, pool: str, class_: str) -> None:
        """Count a request refused by load shedding (its class is one of the configured ones)."""
        self.shed_requests.labels(self.guard.fold(names.L_POOL, pool)[0], class_).inc()

    def in_flight_child(self, pool: str) -> Any:
        ch = self._in_flight_children.get(pool)
        if ch is None:
            ch = self._in_flight_children[pool] = self.in_flight.labels(self.guard.fold(names.L_POOL, pool)[0])
        return ch

    def observe(self, *, model: str, pool: str, replica: str, arm: str, status: str, queue_s: float,
                tenant: str = names.DEFAULT_TENANT, class_: str = names.DEFAULT_CLASS,
                ttft_s: float | None, e2e_s: float, prompt_tokens: int, output_tokens: int,
                itl_gaps_s: Sequence[float] = (), itl_mean_s: float = 0.0, itl_n: int = 0,
                admit: bool | None = None) -> str:
        """Account one finished request; returns the model label it was counted under (the
        request's own, or ``other`` when the guard folded it), which the spool line carries too. ``ttft_s``: None when no first token was seen (a
        non-streamed response has none: its body arrives whole). Inter-chunk gaps: each raw gap
        when known; else the mean ``itl_n`` times, which keeps the histogram's ``_sum`` and
        ``_count`` exact (simulator events). TPOT: once, from E2E, TTFT and the output tokens
        (:func:`tpot_seconds`). ``admit``: the model may claim a label slot (default: status ok;
        the gateway also admits a model a replica lists as served)."""
        if admit is None:
            admit = status == names.STATUS_OK
        ch = self.children(model, pool, replica, arm, tenant, class_, admit=admit)
        for c in ch.overflow:
            c.inc()
        ch.status[status].inc()
        if ch.fast:
            _observe1(ch.queue, queue_s)
            _observe1(ch.e2e, e2e_s)
            if ttft_s is not None:
                _observe1(ch.ttft, ttft_s)
        else:
            ch.queue.observe(queue_s)
            ch.e2e.observe(e2e_s)
            if ttft_s is not None:
                ch.ttft.observe(ttft_s)
        tpot = tpot_seconds(status, ttft_s, e2e_s, output_tokens)
        if status == names.STATUS_OK and self.good.met(ttft_s, tpot, e2e_s, tenant=tenant, class_=class_):
            ch.goodput.inc()
        if tpot is not None:
            if ch.fast:
                _observe1(ch.tpot, tpot)
            else:
                ch.tpot.observe(tpot)
        if itl_gaps_s:
            observe_many(ch.itl, itl_gaps_s)
        elif itl_n:
            observe_n(ch.itl, itl_mean_s, itl_n)
        if prompt_tokens:
            ch.prompt.inc(prompt_tokens)
        if output_tokens:
            ch.output.inc(output_tokens)
        return ch.model


class GpuMetrics:
    """NVML and torch-allocator gauges of one registry. ``llmsla_gpu_collector_up`` lives with
    the collector (exporters/gpu.py): a host without NVML must export it and nothing else."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry
        lbl = (names.L_GPU, names.L_UUID, names.L_MODEL_NAME)
        mode: Final = "mostrecent"  # Final: the Literal prometheus_client asks for

        def g(name: str, doc: str, labels: Sequence[str] = lbl) -> Gauge:
            return Gauge(name, doc, labels, registry=reg, multiprocess_mode=mode)

        self.mem_used = g(names.GPU_MEMORY_USED_BYTES, "Device memory used (NVML).")
        self.mem_total = g(names.GPU_MEMORY_TOTAL_BYTES, "Device memory total (NVML).")
        self.mem_free = g(names.GPU_MEMORY_FREE_BYTES, "Device memory free (NVML).")
        self.util = g(names.GPU_UTILIZATION_RATIO, "GPU utilisation 0..1 over NVML's sample period.")
        self.temp = g(names.GPU_TEMPERATURE_CELSIUS, "GPU core temperature.")
        self.power = g(names.GPU_POWER_WATTS, "GPU power draw.")
        self.sm_clock = g(names.GPU_SM_CLOCK_HERTZ, "SM clock (NVML nvmlDeviceGetClockInfo, NVML_CLOCK_SM).")
        self.mem_clock = g(names.GPU_MEMORY_CLOCK_HERTZ, "Memory clock (NVML nvmlDeviceGetClockInfo, NVML_CLOCK_MEM).")
        self.throttle = g(names.GPU_CLOCK_THROTTLE_REASON, "1 while NVML reports this clock event (throttle) reason active, else 0.",
                          (*lbl, names.L_REASON))
        self.remap_pending = g(names.GPU_ROW_REMAP_PENDING, "1 if a row remap is pending (takes effect at the next GPU reset).")
        self.remap_failed = g(names.GPU_ROW_REMAP_FAILED, "1 if a row remap failed: the memory cannot be repaired.")
        self.pcie_throughput = g(names.GPU_PCIE_THROUGHPUT_BYTES, "PCIe throughput over NVML's 20 ms sample, bytes/s.",
                                 (*lbl, names.L_DIRECTION))

        def c(name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, (*lbl, *extra), registry=reg)

        self.xid = c(names.GPU_XID_ERRORS, "Critical XID error events NVML delivered since the collector started.", (names.L_XID,))
        self.ecc = c(names.GPU_ECC_ERRORS, "ECC memory errors (NVML nvmlDeviceGetTotalEccErrors).", (names.L_ERROR, names.L_ECC_COUNTER))
        self.remapped_rows = c(names.GPU_REMAPPED_ROWS, "Memory rows remapped for correctable / uncorrectable errors.", (names.L_ERROR,))
        self.pcie_replays = c(names.GPU_PCIE_REPLAYS, "PCIe replays (link-level retransmissions).")
        self.nvlink_bytes = c(names.GPU_NVLINK_BYTES, "NVLink data bytes over all links.", (names.L_DIRECTION,))
        self.nvlink_errors = c(names.GPU_NVLINK_ERRORS, "NVLink errors over all links, by kind.", (names.L_ERROR,))
        self.torch_allocated = g(names.TORCH_CUDA_ALLOCATED_BYTES, "Bytes held by live tensors (torch CUDA allocator, this process).", (names.L_GPU,))
        self.torch_reserved = g(names.TORCH_CUDA_RESERVED_BYTES, "Bytes reserved by the torch CUDA caching allocator (this process).", (names.L_GPU,))
        self.torch_frag = g(names.TORCH_CUDA_FRAGMENTATION_BYTES, "Reserved minus allocated: cached but unused allocator memory.", (names.L_GPU,))


_request_metrics: weakref.WeakKeyDictionary[Any, RequestMetrics] = weakref.WeakKeyDictionary()
_gpu_metrics: weakref.WeakKeyDictionary[Any, GpuMetrics] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _NoRegistry:
    """Key for metrics created without a registry (multi-process mode collects from files)."""


_NO_REGISTRY = _NoRegistry()


def request_metrics(cfg: Config, registry: CollectorRegistry | None = None) -> RequestMetrics:
    """The request metrics of ``registry`` (default: the global one), created once per registry
    so several recorders in one process share series instead of clashing."""
    reg = DEFAULT_REGISTRY if registry is None else registry
    with _lock:
        m = _request_metrics.get(reg)
        if m is None:
            m = _request_metrics[reg] = RequestMetrics(cfg, reg)
        return m


def gpu_metrics(registry: CollectorRegistry | None = None) -> GpuMetrics:
    reg = DEFAULT_REGISTRY if registry is None else registry
    with _lock:
        m = _gpu_metrics.get(reg)
        if m is None:
            m = _gpu_metrics[reg] = GpuMetrics(reg)
        return m
