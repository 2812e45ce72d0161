"""vLLM's own series (``vllm:*``) for an engine that is not vLLM: the reference worker and the
fleet simulator's replicas.

Why: ``llmsla engines`` reads a vLLM fleet through ``engines/vllm.py``; when the worker and the
simulator expose the same names, types, labels (``model_name``, ``engine``) and default buckets
as vLLM V1's ``PrometheusStatLogger``, every test and the demo exercise that adapter. The values
come from the caller's real state (the worker's block manager, the simulator's batch model);
this module only names and shapes them. See docs/engines.md#the-reference-worker-and-the-simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llmsla import names


@dataclass(frozen=True)
class VllmSeries:
    """The children of one engine (one label set): what the engine sets and observes."""

    waiting: Gauge
    running: Gauge
    kv_usage: Gauge
    preemptions: Counter
    prefix_queries: Counter
    prefix_hits: Counter
    prompt_tokens: Counter
    generation_tokens: Counter
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    queue: Histogram


class VllmMetrics:
    """The ``vllm:*`` families in ``registry``; :meth:`engine` binds one engine's label set.

    ``model_name`` and ``engine`` label every series, as in vLLM; ``cache_config_info`` carries the
    block size and the number of blocks in its labels, as vLLM's info gauge does."""

    def __init__(self, registry: CollectorRegistry) -> None:
        ln = [names.VLLM_L_MODEL, names.VLLM_L_ENGINE]

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ln, buckets=buckets, registry=registry)

        self.waiting = Gauge(names.VLLM_REQUESTS_WAITING, "Number of requests waiting to be processed.", ln,
                             registry=registry)
        self.running = Gauge(names.VLLM_REQUESTS_RUNNING, "Number of requests in model execution batches.", ln,
                             registry=registry)
        self.kv_usage = Gauge(names.VLLM_KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.", ln,
                              registry=registry)
        self.preemptions = Counter(names.VLLM_PREEMPTIONS, "Cumulative number of preemption from the engine.", ln,
                                   registry=registry)
        self.prefix_queries = Counter(names.VLLM_PREFIX_CACHE_QUERIES,
                                      "Prefix cache queries, in terms of number of queried tokens.", ln,
                                      registry=registry)
        self.prefix_hits = Counter(names.VLLM_PREFIX_CACHE_HITS,
                                   "Prefix cache hits, in terms of number of cached tokens.", ln, registry=registry)
        self.prompt_tokens = Counter(names.VLLM_PROMPT_TOKENS, "Number of prefill tokens processed.", ln,
                                     registry=registry)
        self.generation_tokens = Counter(names.VLLM_GENERATION_TOKENS, "Number of generation tokens processed.",
                                         ln, registry=registry)
        self.ttft = hist(names.VLLM_TTFT_SECONDS, "Histogram of time to first token in seconds.",
                         names.VLLM_TTFT_BUCKETS)
        self.itl = hist(names.VLLM_ITL_SECONDS, "Histogram of inter-token latency in seconds.", names.VLLM_ITL_BUCKETS)
        self.e2e = hist(names.VLLM_E2E_SECONDS, "Histogram of e2e request latency in seconds.",
                        names.VLLM_REQUEST_BUCKETS)
        self.queue = hist(names.VLLM_QUEUE_SECONDS, "Histogram of time spent in WAITING phase for request.",
                          names.VLLM_REQUEST_BUCKETS)
        self._info = Gauge(names.VLLM_CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig",
                           ["block_size", "enable_prefix_caching", "num_gpu_blocks", names.VLLM_L_ENGINE],
                           registry=registry)

    def engine(self, model_name: str, *, num_blocks: int, block_size: int = names.VLLM_BLOCK_SIZE,
               engine: str = "0", prefix_caching: bool = True) -> VllmSeries:
        """The series of one engine, with its cache config published."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self._info.labels(str(block_size), str(prefix_caching), str(num_blocks), engine).set(1)
        lab = (model_name, engine)
        return VllmSeries(
            waiting=self.waiting.labels(*lab), running=self.running.labels(*lab), kv_usage=self.kv_usage.labels(*lab),
            preemptions=self.preemptions.labels(*lab), prefix_queries=self.prefix_queries.labels(*lab),
            prefix_hits=self.prefix_hits.labels(*lab), prompt_tokens=self.prompt_tokens.labels(*lab),
            generation_tokens=self.generation_tokens.labels(*lab), ttft=self.ttft.labels(*lab),
            itl=self.itl.labels(*lab), e2e=self.e2e.labels(*lab), queue=self.queue.labels(*lab),
        )
