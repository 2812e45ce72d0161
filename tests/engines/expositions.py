"""Exposition texts of each engine, written from the engine's own metric definitions.

vLLM, SGLang and trtllm-serve all expose through prometheus-client, so their texts are rendered
by prometheus-client from registries declared with each engine's names, types, label names and
default buckets as its source defines them (vLLM ``vllm/v1/metrics/loggers.py``, SGLang
``python/sglang/srt/observability/metrics_collector.py``, TensorRT-LLM ``tensorrt_llm/metrics/collector.py``):
``text`` is the Prometheus text format (0.0.4, with prometheus-client's ``_created`` gauges),
``openmetrics`` OpenMetrics 1.0 (``_created`` samples, ``# EOF``; names unescaped, see :func:`render`). Triton's C++ exposition
(prometheus-cpp) is written out by hand from the backend's README and metrics reporter. A few
metrics of each engine that the record does not read are declared too (they must be ignored).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest as text_latest
from prometheus_client.openmetrics.exposition import generate_latest as om_latest

# -- default buckets, as each engine's source declares them ------------------------------------------
VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
             20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
VLLM_TPOT = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
             40.0, 80.0]
VLLM_REQUEST = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                240.0, 480.0, 960.0, 1920.0, 7680.0]
SGLANG_TTFT = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
SGLANG_E2E = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400]
SGLANG_ITL = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
              0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
SGLANG_QUEUE = [0.0, 0.001, 0.005, 0.010, 0.050, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80,
                90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000]
TRT_TTFT = VLLM_TTFT
TRT_TPOT = VLLM_TPOT
TRT_REQUEST = VLLM_REQUEST

# -- what the registries observe: (engine index or rank) -> values --------------------------------------
TTFT_OBS = {"0": [0.003, 0.05, 0.3], "1": [0.003, 1.5]}
ITL_OBS = {"0": [0.02, 0.02, 0.09], "1": [0.3]}
E2E_OBS = {"0": [0.9, 4.0, 12.0], "1": [2.2]}
QUEUE_OBS = {"0": [0.0, 0.4, 0.0], "1": [1.1]}


def cumulative(bounds: list[float], observations: list[float]) -> list[int]:
    """What a cumulative histogram with ``bounds`` holds after ``observations``: counts[i] =
    observations <= bounds[i] (Prometheus's ``le``)."""
    return [sum(1 for o in observations if o <= b) for b in bounds]


@dataclass
class Rendered:
    text: str
    openmetrics: str
    registry: CollectorRegistry = field(repr=False)


def render(reg: CollectorRegistry) -> Rendered:
    """Both formats as the engine sends them to ``llmsla engines`` (whose Accept header asks for
    OpenMetrics with ``escaping=allow-utf-8``: prometheus-client >= 0.22 would otherwise rewrite
    ``vllm:`` sample names to ``vllm_`` under unchanged ``# TYPE vllm:`` lines, which no parser
    accepts; tests/engines/test_scrape.py serves through prometheus-client's own content
    negotiation)."""
    return Rendered(text_latest(reg).decode(), om_latest(reg, escaping="allow-utf-8").decode(), reg)


# -- vLLM --------------------------------------------------------------------------------------------
def vllm(*, model: str = "meta-llama/Llama-3.1-8B-Instruct", engines: tuple[str, ...] = ("0", "1"),
         preemptions: dict[str, float] | None = None, hits: dict[str, float] | None = None,
         queries: dict[str, float] | None = None, lora: tuple[str, str] | None = None,
         usage: dict[str, float] | None = None, kv_size_tokens: int | None = 16000) -> Rendered:
    """vLLM V1 ``PrometheusStatLogger``: labels model_name, engine; ``lora`` = (running, waiting)
    adapter lists (one gauge without an engine label: vLLM releases before 0.13 refused LoRA with
    several engines). ``cache_config_info`` is written from the front end's one config under
    every engine: ``num_gpu_blocks`` summed over the engines (1000 each here), the per-engine
    ``kv_cache_size_tokens`` (None: a release before it was published)."""
    reg = CollectorRegistry()
    ln = ["model_name", "engine"]
    running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", ln, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", ln, registry=reg)
    gpu_usage = Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. DEPRECATED", ln, registry=reg)
    kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", ln, registry=reg)
    q_old = Counter("vllm:gpu_prefix_cache_queries", "DEPRECATED", ln, registry=reg)
    h_old = Counter("vllm:gpu_prefix_cache_hits", "DEPRECATED", ln, registry=reg)
    q = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", ln, registry=reg)
    h = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", ln, registry=reg)
    pre = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", ln, registry=reg)
    prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", ln, registry=reg)
    iters = Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ln,
                      buckets=[1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], registry=reg)
    ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ln,
                     buckets=VLLM_TTFT, registry=reg)
    tpot = Histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", ln,
                     buckets=VLLM_TPOT, registry=reg)
    e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", ln,
                    buckets=VLLM_REQUEST, registry=reg)
    queue = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                      ln, buckets=VLLM_REQUEST, registry=reg)
    info_labels = ["block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization", "num_gpu_blocks"]
    info_labels += ["kv_cache_size_tokens"] if kv_size_tokens is not None else []
    info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [*info_labels, "engine"],
                 registry=reg)
    config = ("16", "auto", "True", "0.9", str(1000 * len(engines)))
    config += (str(kv_size_tokens),) if kv_size_tokens is not None else ()
    preemptions = preemptions or {"0": 2, "1": 3}
    hits = hits or {"0": 250, "1": 250}
    queries = queries or {"0": 1000, "1": 1000}
    usage = usage or {"0": 0.25, "1": 0.75}
    for i, e in enumerate(engines):
        lab = (model, e)
        running.labels(*lab).set(3 - i)
        waiting.labels(*lab).set(4 - 3 * i)
        gpu_usage.labels(*lab).set(usage[e])
        kv_usage.labels(*lab).set(usage[e])
        for c in (q, q_old):
            c.labels(*lab).inc(queries[e])
        for c in (h, h_old):
            c.labels(*lab).inc(hits[e])
        pre.labels(*lab).inc(preemptions[e])
        prompt.labels(*lab).inc(777)
        iters.labels(*lab).observe(100)
        for hist, obs in ((ttft, TTFT_OBS), (tpot, ITL_OBS), (e2e, E2E_OBS), (queue, QUEUE_OBS)):
            for v in obs.get(e, []):
                hist.labels(*lab).observe(v)
        info.labels(*config, e).set(1)
    if lora is not None:
        g = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                  ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=reg)
        g.labels("4", "", "stale-adapter").set(1700000000.0)  # an older label set, still exported
        g.labels("4", lora[1], lora[0]).set(1700000100.5)
    return render(reg)


# -- SGLang ------------------------------------------------------------------------------------------
def sglang(*, model: str = "Qwen/Qwen2.5-7B-Instruct", ranks: tuple[str, ...] = ("0", "1"), tp: int = 2, pp: int = 1,
           all_schedulers: bool = False, priority: bool = False, pages: bool = True) -> Rendered:
    """SGLang's scheduler and tokenizer collectors, labelled as the server labels them.

    One scheduler per data-parallel rank (``ranks``) x tensor rank (``tp``) x pipeline stage
    (``pp``), labels model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, dp_rank (and
    ``priority`` with priority scheduling). Each reports its data-parallel rank's capacity, page
    layout, retractions and queue times (every scheduler: the same requests); the queue gauges
    only on tensor rank 0 of each pipeline stage, or on every rank with ``all_schedulers``
    (``--enable-metrics-for-all-schedulers``); with ``priority`` the queue gauges carry the total
    under ``priority=""`` beside a per-priority split. The tokenizer's series have no ranks (it
    serves every data-parallel rank): model_name, engine_type, and ``is_streaming`` on TTFT, E2E
    and prompt tokens, ``cache_source`` on cached tokens. ``pages``: the release publishes
    ``page_size`` / ``num_pages``."""
    reg = CollectorRegistry()
    sl = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"] + (["priority"] if priority else [])
    tl = ["model_name", "engine_type"]
    running = Gauge("sglang:num_running_reqs", "The number of running requests.", sl, registry=reg)
    queue_reqs = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", sl, registry=reg)
    used = Gauge("sglang:num_used_tokens", "The number of used tokens.", sl, registry=reg)
    usage = Gauge("sglang:token_usage", "The token usage.", sl, registry=reg)
    hit_rate = Gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", sl, registry=reg)
    max_tokens = Gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", sl,
                       registry=reg)
    page_size = Gauge("sglang:page_size", "Number of tokens per KV cache page.", sl, registry=reg)
    num_pages = Gauge("sglang:num_pages", "Number of KV cache pages.", sl, registry=reg)
    gen = Gauge("sglang:gen_throughput", "The generation throughput (token/s).", sl, registry=reg)
    retracted_old = Gauge("sglang:num_retracted_reqs", "The number of retracted requests.", sl, registry=reg)
    retracted = Counter("sglang:num_retracted_requests", "Total number of retracted requests.", sl, registry=reg)
    queue = Histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", sl,
                      buckets=SGLANG_QUEUE, registry=reg)
    prompt = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", [*tl, "is_streaming"], registry=reg)
    cached = Counter("sglang:cached_tokens", "Number of cached prompt tokens.", [*tl, "cache_source"], registry=reg)
    nreq = Counter("sglang:num_requests", "Number of requests processed.", tl, registry=reg)
    ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                     [*tl, "is_streaming"], buckets=SGLANG_TTFT, registry=reg)
    itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tl,
                    buckets=SGLANG_ITL, registry=reg)
    e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                    [*tl, "is_streaming"], buckets=SGLANG_E2E, registry=reg)
    for i, r in enumerate(ranks):
        for t in range(tp):
            for p in range(pp):
                lab = (model, "unified", str(t), str(p), str(t), r) + (("",) if priority else ())
                max_tokens.labels(*lab).set(100000)
                if pages:
                    page_size.labels(*lab).set(16)
                    num_pages.labels(*lab).set(100000 // 16)
                retracted_old.labels(*lab).set(1)
                retracted.labels(*lab).inc(1 + i)
                for v in QUEUE_OBS.get(r, []):
                    queue.labels(*lab).observe(v)
                if t != 0 and not all_schedulers:
                    continue
                running.labels(*lab).set(7 + i)
                queue_reqs.labels(*lab).set(2 * i)
                used.labels(*lab).set(4000)
                usage.labels(*lab).set(0.2 + 0.4 * i)
                hit_rate.labels(*lab).set(0.5)
                gen.labels(*lab).set(1234.5)
                if priority:  # the split beside the total
                    running.labels(*lab[:-1], "0").set(3)
                    running.labels(*lab[:-1], "1").set(4 + i)
                    queue_reqs.labels(*lab[:-1], "1").set(2 * i)
        tok = (model, "unified")
        streaming = "true" if i % 2 == 0 else "false"
        prompt.labels(*tok, streaming).inc(800 + 200 * i)
        cached.labels(*tok, ("device", "host")[i % 2]).inc(200 + 100 * i)
        nreq.labels(*tok).inc(10)
        for hist, obs, lab in ((ttft, TTFT_OBS, (*tok, streaming)), (itl, ITL_OBS, tok), (e2e, E2E_OBS, (*tok, streaming))):
            for v in obs.get(r, []):
                hist.labels(*lab).observe(v)
    return render(reg)


# -- trtllm-serve ------------------------------------------------------------------------------------
def trtllm(*, reused: float = 30, missed: float = 90, cumulative_labels: dict[str, str] | None = None,
           prompt_tokens: tuple[float, float] | None = (1800, 450)) -> Rendered:
    """TensorRT-LLM's ``MetricsCollector`` with the labels trtllm-serve passes (model_name,
    engine_type; its gauges also carry the writing process's ``pid``, as its multiprocess
    collector labels them); iteration stats and per-request perf metrics enabled.
    ``prompt_tokens``: the per-request (prompt, cached) token counters (None: a release without)."""
    reg = CollectorRegistry()
    labels = cumulative_labels or {"model_name": "nvidia/Llama-3.1-8B-Instruct-FP8", "engine_type": "trtllm"}
    ln = list(labels)
    lab = list(labels.values())
    gln, glab = [*ln, "pid"], [*lab, "4242"]
    p = "trtllm_"
    ok = Counter(p + "request_success_total", "Count of successfully processed requests.", [*ln, "finished_reason"],
                 registry=reg)
    e2e = Histogram(p + "e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", ln,
                    buckets=TRT_REQUEST, registry=reg)
    ttft = Histogram(p + "time_to_first_token_seconds", "Histogram of time to first token in seconds.", ln,
                     buckets=TRT_TTFT, registry=reg)
    tpot = Histogram(p + "time_per_output_token_seconds", "Histogram of time per output token in seconds.", ln,
                     buckets=TRT_TPOT, registry=reg)
    queue = Histogram(p + "request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", ln,
                      buckets=TRT_REQUEST, registry=reg)
    hit_rate = Gauge(p + "kv_cache_hit_rate", "KV cache hit rate", gln, registry=reg)
    reused_c = Counter(p + "kv_cache_reused_blocks", "Cumulative number of KV cache blocks reused (cache hits)", ln,
                       registry=reg)
    missed_c = Counter(p + "kv_cache_missed_blocks", "Cumulative number of KV cache blocks missed (cache misses)", ln,
                       registry=reg)
    util = Gauge(p + "kv_cache_utilization", "KV cache utilization", gln, registry=reg)
    running = Gauge(p + "num_requests_running", "Number of active requests", gln, registry=reg)
    waiting = Gauge(p + "num_requests_waiting", "Number of queued requests", gln, registry=reg)
    max_blocks = Gauge(p + "kv_cache_max_blocks", "Maximum number of KV cache blocks", gln, registry=reg)
    free_blocks = Gauge(p + "kv_cache_free_blocks", "Number of free KV cache blocks", gln, registry=reg)
    used_blocks = Gauge(p + "kv_cache_used_blocks", "Number of used KV cache blocks", gln, registry=reg)
    per_block = Gauge(p + "kv_cache_tokens_per_block", "Number of tokens per KV cache block", gln, registry=reg)
    gpu_mem = Gauge(p + "gpu_memory_usage_bytes", "GPU memory usage in bytes", gln, registry=reg)
    ok.labels(*lab, "stop").inc(4)
    for hist, obs in ((ttft, TTFT_OBS), (tpot, ITL_OBS), (e2e, E2E_OBS), (queue, QUEUE_OBS)):
        for v in obs["0"]:
            hist.labels(*lab).observe(v)
    hit_rate.labels(*glab).set(0.4)
    reused_c.labels(*lab).inc(reused)
    missed_c.labels(*lab).inc(missed)
    util.labels(*glab).set(0.3125)
    running.labels(*glab).set(6)
    waiting.labels(*glab).set(11)
    max_blocks.labels(*glab).set(6400)
    free_blocks.labels(*glab).set(4400)
    used_blocks.labels(*glab).set(2000)
    per_block.labels(*glab).set(32)
    gpu_mem.labels(*glab).set(1.5e10)
    if prompt_tokens is not None:
        prompt = Counter(p + "prompt_tokens", "Number of prefill tokens processed", ln, registry=reg)
        cached = Counter(p + "prompt_cached_tokens", "Number of cached prompt tokens", ln, registry=reg)
        prompt.labels(*lab).inc(prompt_tokens[0])
        cached.labels(*lab).inc(prompt_tokens[1])
    return render(reg)


# -- Triton + TensorRT-LLM backend (prometheus-cpp, written out) -------------------------------------
TRITON = """\
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 3
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 8
# HELP nv_trt_llm_runtime_memory_metrics TRT LLM runtime memory metrics
# TYPE nv_trt_llm_runtime_memory_metrics gauge
nv_trt_llm_runtime_memory_metrics{memory_type="pinned",model="tensorrt_llm",version="1"} 0
nv_trt_llm_runtime_memory_metrics{memory_type="gpu",model="tensorrt_llm",version="1"} 1610236
nv_trt_llm_runtime_memory_metrics{memory_type="cpu",model="tensorrt_llm",version="1"} 0
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.4875
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 3042
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 3198
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 6240
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="reused",model="tensorrt_llm",version="1"} 200
# HELP nv_trt_llm_inflight_batcher_metrics TRT LLM inflight_batcher-specific metrics
# TYPE nv_trt_llm_inflight_batcher_metrics gauge
nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric="micro_batch_id",model="tensorrt_llm",version="1"} 0
nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric="generation_requests",model="tensorrt_llm",version="1"} 4
nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric="total_context_tokens",model="tensorrt_llm",version="1"} 512
nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric="paused_requests",model="tensorrt_llm",version="1"} 0
# HELP nv_trt_llm_general_metrics General TRT LLM metrics
# TYPE nv_trt_llm_general_metrics gauge
nv_trt_llm_general_metrics{general_type="iteration_counter",model="tensorrt_llm",version="1"} 812
nv_trt_llm_general_metrics{general_type="timestamp",model="tensorrt_llm",version="1"} 1700074049
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 40
nv_inference_request_success{model="tensorrt_llm",version="1"} 40
# HELP nv_inference_first_response_histogram_ms Duration from request to first response in milliseconds
# TYPE nv_inference_first_response_histogram_ms histogram
nv_inference_first_response_histogram_ms_count{model="ensemble",version="1"} 40
nv_inference_first_response_histogram_ms_sum{model="ensemble",version="1"} 9000
nv_inference_first_response_histogram_ms_bucket{model="ensemble",version="1",le="100"} 10
nv_inference_first_response_histogram_ms_bucket{model="ensemble",version="1",le="500"} 30
nv_inference_first_response_histogram_ms_bucket{model="ensemble",version="1",le="2000"} 40
nv_inference_first_response_histogram_ms_bucket{model="ensemble",version="1",le="5000"} 40
nv_inference_first_response_histogram_ms_bucket{model="ensemble",version="1",le="+Inf"} 40
nv_inference_first_response_histogram_ms_count{model="tensorrt_llm",version="1"} 40
nv_inference_first_response_histogram_ms_sum{model="tensorrt_llm",version="1"} 8000
nv_inference_first_response_histogram_ms_bucket{model="tensorrt_llm",version="1",le="100"} 12
nv_inference_first_response_histogram_ms_bucket{model="tensorrt_llm",version="1",le="500"} 32
nv_inference_first_response_histogram_ms_bucket{model="tensorrt_llm",version="1",le="2000"} 39
nv_inference_first_response_histogram_ms_bucket{model="tensorrt_llm",version="1",le="5000"} 40
nv_inference_first_response_histogram_ms_bucket{model="tensorrt_llm",version="1",le="+Inf"} 40
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-1d2b5e51-9f5b-b1b5-0a5c-2a6a1d5b8e11"} 0.83
"""
