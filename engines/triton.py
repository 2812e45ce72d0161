"""Triton with the TensorRT-LLM backend (``nv_trt_llm_*``).

Names come from the backend's ``custom_metrics_reporter.cc`` and README, at the commit named on
the page. Each family is a gauge with one series per category label; Triton core's opt-in TTFT
histogram is converted from ms, and what Triton does not expose (ITL, E2E, queue histograms,
preemptions, a prefix-cache denominator) stays None rather than being guessed.

``request_type="active"`` counts the requests the batcher holds, ``"scheduled"`` those in this
iteration's batch and ``"waiting"`` the rest (the backend writes active - scheduled,
``model_instance_state.cc``): running is ``scheduled``, as in the Gateway API Inference
Extension's model-server table. ``kv_cache_block_type="reused"`` is the executor's cumulative
reused-block count: the prefix-cache hits, in blocks, with no queries to divide them by.
See docs/engines.md#what-it-reads-from-each-engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmsla import names

from .parse import Exposition
from .record import as_int

ENGINE = names.ENGINE_TRITON
_REQ = "nv_trt_llm_request_metrics"
_KV = "nv_trt_llm_kv_cache_block_metrics"
#: The families this adapter reads (only these are parsed, :func:`llmsla.engines.parse.select`).
READS: tuple[str, ...] = (_REQ, _KV, "nv_inference_first_response_histogram_ms")


def _is(label: str, value: str) -> Callable[[Any], bool]:
    return lambda labels: labels.get(label) == value


def read(expo: Exposition) -> dict[str, Any]:
    def kv(kind: str) -> float | None:
        return expo.total(_KV, _is("kv_cache_block_type", kind))

    blocks = as_int(kv("max"))
    size = as_int(expo.first(_KV, _is("kv_cache_block_type", "tokens_per")))
    usage = expo.mean(_KV, _is("kv_cache_block_type", "fraction"))
    if usage is None and blocks:
        used = kv("used")
        usage = None if used is None else used / blocks
    models = {labels.get("model") for labels, _ in expo.series(_REQ) + expo.series(_KV)}
    ttft = expo.histogram("nv_inference_first_response_histogram_ms", lambda labels: labels.get("model") in models)
    return {
        "waiting": expo.total(_REQ, _is("request_type", "waiting")),
        "running": expo.total(_REQ, _is("request_type", "scheduled")),
        "kv_usage": usage,
        "kv_blocks_total": blocks,
        "kv_block_size": size,
        "kv_capacity_tokens": blocks * size if blocks is not None and size is not None else None,
        "preemptions_total": None,
        "prefix_cache_hits_total": kv("reused"),
        "prefix_cache_queries_total": None,
        "prefix_cache_hit_rate": None,
        "lora_adapters": None,
        "histograms": {"ttft": None if ttft is None else ttft.scaled(0.001), "itl": None, "e2e": None, "queue": None},
    }
