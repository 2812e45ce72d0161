"""SGLang (``sglang:*``), from ``python/sglang/srt/metrics/collector.py``
(``SchedulerMetricsCollector`` and ``TokenizerMetricsCollector``).

Series carry the server's labels (``model_name`` and, with data/tensor parallelism, ranks such as
``dp_rank``, ``tp_rank``): requests and counters are summed over them, the token usage ratio is
averaged. SGLang's KV cache is token-granular: ``sglang:max_total_num_tokens`` is the capacity in
tokens and it exposes no block count or page size (None). Preemptions are SGLang's
retractions (``sglang:num_retracted_requests_total``). The prefix-cache hit rate comes from the
counters ``sglang:cached_tokens_total`` / ``sglang:prompt_tokens_total`` (tokens), and from the
``sglang:cache_hit_rate`` gauge when no interval is available. LoRA: only slot counts are
exposed, no adapter names (None).
"""

from __future__ import annotations

from typing import Any

from llmsla import names

from .parse import Exposition
from .record import as_int

ENGINE = names.ENGINE_SGLANG
#: The families this adapter reads (only these are parsed, :func:`llmsla.engines.parse.select`).
READS: tuple[str, ...] = (
    "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage", "sglang:max_total_num_tokens",
    "sglang:num_retracted_requests", "sglang:cached_tokens", "sglang:prompt_tokens", "sglang:cache_hit_rate",
    "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds", "sglang:queue_time_seconds",
)


def read(expo: Exposition) -> dict[str, Any]:
    capacity = as_int(expo.total("sglang:max_total_num_tokens"))
    return {
        "waiting": expo.total("sglang:num_queue_reqs"),
        "running": expo.total("sglang:num_running_reqs"),
        "kv_usage": expo.mean("sglang:token_usage"),
        "kv_blocks_total": None,
        "kv_block_size": None,
        "kv_capacity_tokens": capacity,
        "preemptions_total": expo.total("sglang:num_retracted_requests_total"),
        "prefix_cache_hits_total": expo.total("sglang:cached_tokens_total"),
        "prefix_cache_queries_total": expo.total("sglang:prompt_tokens_total"),
        "prefix_cache_hit_rate": expo.mean("sglang:cache_hit_rate"),
        "lora_adapters": None,
        "histograms": {
            "ttft": expo.histogram("sglang:time_to_first_token_seconds"),
            "itl": expo.histogram("sglang:inter_token_latency_seconds"),
            "e2e": expo.histogram("sglang:e2e_request_latency_seconds"),
            "queue": expo.histogram("sglang:queue_time_seconds"),
        },
    }
