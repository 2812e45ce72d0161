"""trtllm-serve (``trtllm_*``), from ``tensorrt_llm/metrics/collector.py`` (``MetricsCollector``).

Series carry the server's labels (``model_name``, ``engine_type``; gauges also ``pid``, as
trtllm-serve exposes through prometheus-client's multiprocess collector); one set per replica is
expected and several are summed. trtllm-serve serves them at ``/prometheus/metrics``
(``names.ENGINE_METRICS_PATHS``), and only with ``return_perf_metrics``; iteration-level series
(queue, KV blocks) also need ``enable_iter_perf_stats``; whatever is absent is None. The
prefix-cache counters are prompt *tokens* where the per-request counters exist (hits =
``trtllm_prompt_cached_tokens_total``, queries = ``trtllm_prompt_tokens_total``: the unit vLLM and
SGLang count in, and counted per request, so right whatever the attention data parallelism),
else KV *blocks* from the iteration stats (hits = ``trtllm_kv_cache_reused_blocks_total``,
queries = reused + ``trtllm_kv_cache_missed_blocks_total``); ``trtllm_kv_cache_hit_rate`` is the
gauge used when no interval is available. TensorRT-LLM counts no preemptions and names no LoRA
adapters in its metrics (None). ITL is ``trtllm_time_per_output_token_seconds``.
"""

from __future__ import annotations

from typing import Any

from llmsla import names

from .parse import Exposition
from .record import as_int

ENGINE = names.ENGINE_TRTLLM
#: The families this adapter reads (only these are parsed, :func:`llmsla.engines.parse.select`).
READS: tuple[str, ...] = (
    "trtllm_kv_cache_max_blocks", "trtllm_kv_cache_tokens_per_block", "trtllm_kv_cache_reused_blocks",
    "trtllm_kv_cache_missed_blocks", "trtllm_kv_cache_utilization", "trtllm_kv_cache_used_blocks",
    "trtllm_num_requests_waiting", "trtllm_num_requests_running", "trtllm_kv_cache_hit_rate",
    "trtllm_prompt_tokens", "trtllm_prompt_cached_tokens",
    "trtllm_time_to_first_token_seconds", "trtllm_time_per_output_token_seconds",
    "trtllm_e2e_request_latency_seconds", "trtllm_request_queue_time_seconds",
)


def read(expo: Exposition) -> dict[str, Any]:
    blocks = as_int(expo.total("trtllm_kv_cache_max_blocks"))
    size = as_int(expo.first("trtllm_kv_cache_tokens_per_block"))
    hits, queries = expo.total("trtllm_prompt_cached_tokens_total"), expo.total("trtllm_prompt_tokens_total")
    if hits is None or queries is None:  # no per-request counters: the iteration stats' blocks
        reused = expo.total("trtllm_kv_cache_reused_blocks_total")
        missed = expo.total("trtllm_kv_cache_missed_blocks_total")
        hits, queries = (reused, reused + missed) if reused is not None and missed is not None else (None, None)
    usage = expo.mean("trtllm_kv_cache_utilization")
    if usage is None and blocks:
        used = expo.total("trtllm_kv_cache_used_blocks")
        usage = None if used is None else used / blocks
    return {
        "waiting": expo.total("trtllm_num_requests_waiting"),
        "running": expo.total("trtllm_num_requests_running"),
        "kv_usage": usage,
        "kv_blocks_total": blocks,
        "kv_block_size": size,
        "kv_capacity_tokens": blocks * size if blocks is not None and size is not None else None,
        "preemptions_total": None,
        "prefix_cache_hits_total": hits,
        "prefix_cache_queries_total": queries,
        "prefix_cache_hit_rate": expo.mean("trtllm_kv_cache_hit_rate"),
        "lora_adapters": None,
        "histograms": {
            "ttft": expo.histogram("trtllm_time_to_first_token_seconds"),
            "itl": expo.histogram("trtllm_time_per_output_token_seconds"),
            "e2e": expo.histogram("trtllm_e2e_request_latency_seconds"),
            "queue": expo.histogram("trtllm_request_queue_time_seconds"),
        },
    }
