"""SGLang (``sglang:*``), from ``python/sglang/srt/observability/metrics_collector.py``
(``SchedulerMetricsCollector`` and ``TokenizerMetricsCollector``; ``srt/metrics/collector.py``
before it moved).

The scheduler's series carry ``model_name``, ``engine_type`` and its ranks (``tp_rank``,
``pp_rank``, ``moe_ep_rank``, and ``dp_rank`` under data parallelism): every tensor- and
pipeline-parallel rank of one data-parallel rank reports the same queue, capacity, retractions
and queue times (the capacity, retractions and queue-time histogram always; the queue gauges
per pipeline stage, or per rank with ``--enable-metrics-for-all-schedulers``), so one
scheduler's series is read per data-parallel rank (the lowest ranks) and those are summed
(the token usage ratio averaged). With priority scheduling the queue gauges carry the total
under ``priority=""`` beside a per-priority split: the total is read. The tokenizer's series
(TTFT, ITL, E2E, prompt and cached tokens) carry no ranks and are split only by disjoint labels
(``is_streaming``, ``cache_source``): they are summed.

The KV cache is paged: ``sglang:max_total_num_tokens`` is the capacity in tokens,
``sglang:page_size`` and ``sglang:num_pages`` the block size and count (None where a release
does not publish them). Preemptions are SGLang's retractions
(``sglang:num_retracted_requests_total``). The prefix-cache hit rate comes from the counters
``sglang:cached_tokens_total`` / ``sglang:prompt_tokens_total`` (tokens), and from the
``sglang:cache_hit_rate`` gauge (the last prefill batch's) when no interval is available. LoRA:
only slot counts are exposed, no adapter names (None).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmsla import names

from .parse import Exposition, LabelFilter
from .record import as_int

ENGINE = names.ENGINE_SGLANG
#: The families this adapter reads (only these are parsed, :func:`llmsla.engines.parse.select`).
READS: tuple[str, ...] = (
    "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:max_total_num_tokens",
    "sglang:page_size", "sglang:num_pages",
    "sglang:num_retracted_requests", "sglang:cached_tokens", "sglang:prompt_tokens", "sglang:cache_hit_rate",
    "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds", "sglang:queue_time_seconds",
)


#: The labels that tell one scheduler process of a data-parallel rank from another.
_RANKS = ("tp_rank", "pp_rank", "moe_ep_rank")


def _ranks(labels: Mapping[str, str]) -> tuple[int, ...]:
    return tuple(int(v) if (v := labels.get(k)) is not None and v.isdigit() else -1 for k in _RANKS)


def one_scheduler(expo: Exposition, name: str) -> LabelFilter | None:
    """A filter keeping, per data-parallel rank, the series of its lowest-ranked scheduler and
    the totals of priority scheduling (``priority=""``: the per-priority split is dropped where
    a total exists); None where every series already is that (nothing to drop)."""
    lowest: dict[str, tuple[int, ...]] = {}
    drops = False
    for labels, _ in expo.series(name):
        if labels.get("priority"):
            drops = True
            continue
        dp, ranks = labels.get("dp_rank", ""), _ranks(labels)
        seen = lowest.get(dp)
        if seen is None:
            lowest[dp] = ranks
        elif seen != ranks:
            drops = True
            lowest[dp] = min(seen, ranks)
    if not drops:
        return None

    def keep(labels: Mapping[str, str]) -> bool:
        want = lowest.get(labels.get("dp_rank", ""))
        if want is None:  # only a per-priority split for this rank: it is the data
            return True
        return not labels.get("priority") and _ranks(labels) == want
    return keep


def read(expo: Exposition) -> dict[str, Any]:
    def total(name: str) -> float | None:
        return expo.total(name, one_scheduler(expo, name))

    capacity = as_int(total("sglang:max_total_num_tokens"))
    queue = "sglang:queue_time_seconds"
    return {
        "waiting": total("sglang:num_queue_reqs"),
        "running": total("sglang:num_running_reqs"),
        "kv_usage": expo.mean("sglang:token_usage", one_scheduler(expo, "sglang:token_usage")),
        "kv_blocks_total": as_int(total("sglang:num_pages")),
        "kv_block_size": as_int(expo.first("sglang:page_size")),
        "kv_capacity_tokens": capacity,
        "preemptions_total": total("sglang:num_retracted_requests_total"),
        "prefix_cache_hits_total": expo.total("sglang:cached_tokens_total"),
        "prefix_cache_queries_total": expo.total("sglang:prompt_tokens_total"),
        "prefix_cache_hit_rate": expo.mean("sglang:cache_hit_rate", one_scheduler(expo, "sglang:cache_hit_rate")),
        "lora_adapters": None,
        "histograms": {
            "ttft": expo.histogram("sglang:time_to_first_token_seconds"),
            "itl": expo.histogram("sglang:inter_token_latency_seconds"),
            "e2e": expo.histogram("sglang:e2e_request_latency_seconds"),
            "queue": expo.histogram(queue, one_scheduler(expo, f"{queue}_count")),
        },
    }
