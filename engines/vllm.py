"""vLLM (``vllm:*``), from ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``).

Every series carries ``model_name`` and ``engine`` (the engine-core index under data
parallelism): the record sums them per replica (requests, counters, histogram buckets) and
averages the KV usage ratio over the engine indices. ``vllm:cache_config_info`` is an info
gauge whose labels hold the cache config (``num_gpu_blocks``, ``block_size``,
``kv_cache_size_tokens``), one series per engine, all written from the front end's one config:
``num_gpu_blocks`` there is already the sum over the data-parallel engines
(``vllm/v1/engine/core_client.py``), so it is read once, not summed again, while
``kv_cache_size_tokens`` is one engine's capacity (aware of hybrid attention groups, where
blocks x block size is not the capacity) and counts once per engine.
``vllm:lora_requests_info`` is a gauge set to the current time, labelled with the running and
waiting adapters (comma-separated) and no engine label: the most recent series is read (with
several engines, the adapters of the engine that wrote last).
"""

from __future__ import annotations

from typing import Any

from llmsla import names

from .parse import Exposition

ENGINE = names.ENGINE_VLLM
#: The families this adapter reads (only these are parsed, :func:`llmsla.engines.parse.select`).
READS: tuple[str, ...] = (
    "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
    "vllm:cache_config_info", "vllm:num_preemptions", "vllm:prefix_cache_hits", "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hit_rate",
    "vllm:lora_requests_info", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
)


def _label_int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None and value not in ("", "None") else None
    except ValueError:
        return None


def _cache_config(expo: Exposition) -> tuple[int | None, int | None, int | None]:
    """(KV blocks of the replica, block size, KV capacity in tokens) from ``vllm:cache_config_info``.

    Every engine's series carries the front end's ``num_gpu_blocks``, the data-parallel sum:
    the largest one read is the replica's (an engine's own count where one engine is served).
    The capacity is ``kv_cache_size_tokens`` (per engine) times the engines where vLLM publishes
    it, else blocks x block size."""
    blocks: int | None = None
    size: int | None = None
    per_engine: dict[str, int] = {}
    for labels, _ in expo.series("vllm:cache_config_info"):
        n = _label_int(labels.get("num_gpu_blocks"))
        if n is not None and (blocks is None or n > blocks):
            blocks = n
        size = size if size is not None else _label_int(labels.get("block_size"))
        tokens = _label_int(labels.get("kv_cache_size_tokens"))
        if tokens is not None:
            per_engine[labels.get("engine", "")] = tokens
    if per_engine:
        capacity: int | None = sum(per_engine.values())
    else:
        capacity = blocks * size if blocks is not None and size is not None else None
    return blocks, size, capacity


def _lora(expo: Exposition) -> tuple[str, ...] | None:
    rows = [r for r in expo.series("vllm:lora_requests_info")]
    if not rows:
        return None
    labels, _ = max(rows, key=lambda r: r[1] if r[1] == r[1] else float("-inf"))  # most recent
    out: set[str] = set()
    for key in ("running_lora_adapters", "waiting_lora_adapters"):
        out.update(a for a in (labels.get(key) or "").split(",") if a)
    return tuple(sorted(out))


def _counter(expo: Exposition, name: str, deprecated: str) -> float | None:
    value = expo.total(name)
    return value if value is not None else expo.total(deprecated)


def read(expo: Exposition) -> dict[str, Any]:
    blocks, size, capacity = _cache_config(expo)
    usage = expo.mean("vllm:kv_cache_usage_perc")
    itl = expo.histogram("vllm:inter_token_latency_seconds") or expo.histogram("vllm:time_per_output_token_seconds")
    return {
        "waiting": expo.total("vllm:num_requests_waiting"),
        "running": expo.total("vllm:num_requests_running"),
        "kv_usage": usage if usage is not None else expo.mean("vllm:gpu_cache_usage_perc"),
        "kv_blocks_total": blocks,
        "kv_block_size": size,
        "kv_capacity_tokens": capacity,
        "preemptions_total": expo.total("vllm:num_preemptions_total"),
        "prefix_cache_hits_total": _counter(expo, "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "prefix_cache_queries_total": _counter(expo, "vllm:prefix_cache_queries_total",
                                               "vllm:gpu_prefix_cache_queries_total"),
        # the V0 engine's gauge, used only where no counters exist (older releases)
        "prefix_cache_hit_rate": expo.mean("vllm:gpu_prefix_cache_hit_rate"),
        "lora_adapters": _lora(expo),
        "histograms": {
            "ttft": expo.histogram("vllm:time_to_first_token_seconds"),
            "itl": itl,
            "e2e": expo.histogram("vllm:e2e_request_latency_seconds"),
            "queue": expo.histogram("vllm:request_queue_time_seconds"),
        },
    }


