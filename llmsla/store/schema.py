"""Column lists of the store's window tables, declared once.

Three components must agree on them: the stream job writes the rows (``streaming/sql.py``), the
forecaster computes the same rows in memory and reads them back (``forecaster/windowing.py``,
``store_io.py``), and the roll-ups aggregate them (:mod:`llmsla.store.rollups`, rendered into the
migrations). Each keeps no list of its own, so a column cannot be added to one and missed by the
others. The migrations create these columns (docs/store.md); order is table order.
"""

from __future__ import annotations

from llmsla import names

#: How a ``request_windows`` value rolls up into the 1 m / 1 h tiers: counts and sums add exactly;
#: a worst-window P99 and the SLO thresholds keep their maximum; rates, means and the other
#: percentiles are not carried (the roll-ups recompute them from sums and histograms).
SUM = "sum"
MAX = "max"
NONE = "none"

#: Each window table's last write time: the store sets it (``DEFAULT now()`` and on upsert), no
#: writer lists it, so it is in none of the column lists below.
UPDATED_AT = "updated_at"

#: A request window's key: the time bucket, the series labels and (migration 0013) the request's
#: tenant and class, so every reader can cut by them; summing over them gives the fleet's figures.
REQUEST_KEYS: tuple[str, ...] = ("bucket", *names.REQUEST_SERIES_LABELS)
#: ``request_windows`` values before the histograms, in table order, with their roll-up.
REQUEST_VALUE_ROLLUP: dict[str, str] = {
    "requests": SUM, "ok": SUM, "errors": SUM, "timeouts": SUM, "cancelled": SUM, "rejected": SUM,
    "qps": NONE,
    "ttft_p50_ms": NONE, "ttft_p95_ms": NONE, "ttft_p99_ms": MAX,
    "e2e_p50_ms": NONE, "e2e_p95_ms": NONE, "e2e_p99_ms": MAX,
    "itl_mean_ms": NONE, "itl_jitter_ms": NONE, "queue_p99_ms": MAX,
    "prompt_tokens": SUM, "output_tokens": SUM, "output_tps": NONE,
    "ttft_slo_ms": MAX, "e2e_slo_ms": MAX, "ttft_within_slo": SUM, "e2e_within_slo": SUM,
    "ttft_count": SUM, "ttft_sum_ms": SUM, "e2e_sum_ms": SUM,
    "itl_n": SUM, "itl_sum_ms": SUM, "itl_sumsq_ms2": SUM,
    # migration 0013: ok requests within every latency objective at once (llmsla.goodput); NULL
    # in the windows written before it (unknown, not 0)
    "goodput": SUM,
}
REQUEST_VALUES: tuple[str, ...] = tuple(REQUEST_VALUE_ROLLUP)
#: Latency histograms (migration 0005; :mod:`llmsla.histogram`), summed when rolled up.
REQUEST_HISTS: tuple[str, ...] = (names.C_TTFT_HIST, names.C_E2E_HIST)
REQUEST_COLUMNS: tuple[str, ...] = (*REQUEST_KEYS, *REQUEST_VALUES, *REQUEST_HISTS)
REQUEST_SUMS: tuple[str, ...] = tuple(c for c, r in REQUEST_VALUE_ROLLUP.items() if r == SUM)
REQUEST_MAXES: tuple[str, ...] = tuple(c for c, r in REQUEST_VALUE_ROLLUP.items() if r == MAX)
#: The request columns migration 0013 added to the 5 s table and its roll-ups. ``ALTER TABLE``
#: appends them, so in the tables they stand last (:func:`table_order`); the lists above keep
#: the keys first (the stream job's payloads and the sink find a row's key in its leading fields,
#: and COPY names its columns).
REQUEST_ADDED_0013: tuple[str, ...] = (names.L_TENANT, names.L_CLASS, "goodput")


def table_order(columns: tuple[str, ...]) -> tuple[str, ...]:
    """``columns`` in the order a request window table holds them: 0013's columns last."""
    return (*(c for c in columns if c not in REQUEST_ADDED_0013), *(c for c in REQUEST_ADDED_0013 if c in columns))

POLICY_KEYS: tuple[str, ...] = ("bucket", names.L_ZONE, names.L_POLICY_ID)
POLICY_VALUES: tuple[str, ...] = (
    "decisions", "traces", "temperature_mean", "temperature_jitter",
    "latency_p50_ms", "latency_p99_ms", "decide_p99_ms",
)
POLICY_COLUMNS: tuple[str, ...] = (*POLICY_KEYS, *POLICY_VALUES)

GPU_KEYS: tuple[str, ...] = ("bucket", names.L_NODE, names.L_GPU)
GPU_VALUES: tuple[str, ...] = ("samples", "mem_used_max_bytes", "mem_used_mean_bytes", "mem_total_bytes",
                               "util_mean", "temp_max_c", "power_mean_w")
GPU_COLUMNS: tuple[str, ...] = (*GPU_KEYS, *GPU_VALUES)

#: How an ``engine_windows`` value rolls up into the 1 m / 1 h tiers (migration 0015,
#: :mod:`llmsla.store.engine_rollups`): counter increases (already reset-safe per window) and
#: counts add; a gauge's mean is the mean over the samples behind it (weighted by ``samples``);
#: a maximum keeps its maximum; the engine's mean TTFT is recomputed from the summed sum and count.
WMEAN = "mean"
RATIO = "ratio"

#: ``engine_windows`` (docs/streaming.md#windows): gauges as mean and max over the window's
#: samples, counter increases summed over consecutive samples (reset-safe), the engine's own TTFT
#: from its histogram's sum and count increases. Null where the engine exposes no such value.
ENGINE_KEYS: tuple[str, ...] = ("bucket", names.L_POOL, names.L_REPLICA, names.L_ENGINE)
ENGINE_VALUE_ROLLUP: dict[str, str] = {
    "samples": SUM, "waiting_mean": WMEAN, "waiting_max": MAX, "running_mean": WMEAN, "running_max": MAX,
    "kv_usage_mean": WMEAN, "kv_usage_max": MAX, "preemptions": SUM, "prefix_cache_hit_rate_mean": WMEAN,
    "engine_ttft_count": SUM, "engine_ttft_sum_ms": SUM, "engine_ttft_mean_ms": RATIO, "counter_resets": SUM,
}
ENGINE_VALUES: tuple[str, ...] = tuple(ENGINE_VALUE_ROLLUP)
#: The weight of a :data:`WMEAN` column, and the (sum, count) a :data:`RATIO` column divides.
ENGINE_WEIGHT = "samples"
ENGINE_RATIOS: dict[str, tuple[str, str]] = {"engine_ttft_mean_ms": ("engine_ttft_sum_ms", "engine_ttft_count")}
#: The engine's own TTFT histogram (migration 0015): the window's increases of the engine's native
#: buckets, spread onto the store's fixed layout (streaming NativeHistogram.java), summed when rolled
#: up; the percentiles of any range come from the summed counts, as for ``ttft_hist``.
ENGINE_HISTS: tuple[str, ...] = (names.C_ENGINE_TTFT_HIST,)
ENGINE_COLUMNS: tuple[str, ...] = (*ENGINE_KEYS, *ENGINE_VALUES, *ENGINE_HISTS)
