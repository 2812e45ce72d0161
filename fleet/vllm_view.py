"""Each simulated replica as a vLLM replica: its batch model's state under vLLM's names.

Why: ``llmsla engines`` reads a vLLM fleet through ``engines/vllm.py``; a paced simulation that
serves every replica's ``vllm:*`` series (``/replicas/<id>/metrics`` beside the simulator's
``/metrics``) lets the demo and the tests run that same adapter over simulated replicas. The
values are the model's own (fleet/replica.py): the waiting queue and running batch, KV usage
(tokens held / capacity, in vLLM's 16-token blocks), preemptions, prompt tokens prefilled, and
engine-side TTFT / inter-token / E2E / queue times (from the replica's receipt of a request, as
vLLM measures them). The model has no prefix sharing: queries count and hits stay 0.
Histograms are added to in bulk (a decode segment of ``k`` identical iterations is ``k x batch``
inter-token gaps of one value), which prometheus-client's Histogram cannot do, hence a
collector. See docs/fleet.md#the-model.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from llmsla import names
from llmsla.exposition import exposition
from llmsla.fleet.engine import Simulator
from llmsla.fleet.replica import ReplicaSim


class BulkHistogram:
    """A cumulative histogram that takes ``n`` observations of one value at once."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.le = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, the last is +Inf
        self.sum = 0.0
        self.count = 0

    def add(self, value: float, n: int = 1) -> None:
        if n <= 0:
            return
        self.counts[bisect.bisect_left(self.le, value)] += n
        self.sum += value * n
        self.count += n

    def family(self, name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=[names.VLLM_L_MODEL, names.VLLM_L_ENGINE])
        acc, buckets = 0, []
        for bound, c in zip((*[repr(float(b)) for b in self.le], "+Inf"), self.counts, strict=True):
            acc += c
            buckets.append((bound, acc))
        fam.add_metric(labels, buckets, self.sum)
        return fam


class ReplicaVllm:
    """What the replica model reports (its ``obs``) and the collector that exposes it."""

    def __init__(self) -> None:
        self.ttft = BulkHistogram(names.VLLM_TTFT_BUCKETS)
        self.itl = BulkHistogram(names.VLLM_ITL_BUCKETS)
        self.e2e = BulkHistogram(names.VLLM_REQUEST_BUCKETS)
        self.queue = BulkHistogram(names.VLLM_REQUEST_BUCKETS)
        self.prompt_tokens = 0  # tokens prefilled (recomputed ones again, as vLLM's queries count them)


class ReplicaCollector(Collector):
    """``vllm:*`` of one replica, read from its state at each scrape; ``now`` gives the
    simulated time (KV usage inside a decode segment), ``lock`` the simulator's event lock."""

    def __init__(self, rep: ReplicaSim, view: ReplicaVllm, now: Callable[[], float],
                 lock: threading.RLock | None = None) -> None:
        self.rep, self.view, self.now, self.lock = rep, view, now, lock

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        if self.lock is None:
            yield from self._collect()
        else:
            with self.lock:
                yield from list(self._collect())

    def _collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        rep, v = self.rep, self.view
        lab = [rep.spec.name, "0"]
        ln = [names.VLLM_L_MODEL, names.VLLM_L_ENGINE]
        bs = names.VLLM_BLOCK_SIZE

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=ln)
            g.add_metric(lab, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=ln)
            c.add_metric(lab, value)
            return c

        waiting = sum(1 for r in rep.waiting if not r.dead)
        running = sum(1 for r in rep.running if not r.dead) if rep.up else 0
        cap = max(1, rep.kv_cap)
        yield gauge(names.VLLM_REQUESTS_WAITING, "Number of requests waiting to be processed.", waiting)
        yield gauge(names.VLLM_REQUESTS_RUNNING, "Number of requests in model execution batches.", running)
        yield gauge(names.VLLM_KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.",
                    min(1.0, rep.kv_at(self.now()) / cap))
        info = GaugeMetricFamily(names.VLLM_CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig",
                                 labels=["block_size", "enable_prefix_caching", "num_gpu_blocks", names.VLLM_L_ENGINE])
        info.add_metric([str(bs), "False", str(max(1, rep.spec.kv_capacity_tokens // bs)), "0"], 1.0)
        yield info
        yield counter(names.VLLM_PREEMPTIONS, "Cumulative number of preemption from the engine.", rep.preemptions)
        yield counter(names.VLLM_PREFIX_CACHE_QUERIES, "Prefix cache queries, in terms of number of queried tokens.",
                      v.prompt_tokens)
        yield counter(names.VLLM_PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens.", 0)
        yield counter(names.VLLM_GENERATION_TOKENS, "Number of generation tokens processed.", rep.tokens_out)
        yield v.ttft.family(names.VLLM_TTFT_SECONDS, "Histogram of time to first token in seconds.", lab)
        yield v.itl.family(names.VLLM_ITL_SECONDS, "Histogram of inter-token latency in seconds.", lab)
        yield v.e2e.family(names.VLLM_E2E_SECONDS, "Histogram of e2e request latency in seconds.", lab)
        yield v.queue.family(names.VLLM_QUEUE_SECONDS, "Histogram of time spent in WAITING phase for request.", lab)


def attach(sim: Simulator, lock: threading.RLock | None = None) -> dict[str, CollectorRegistry]:
    """Make every replica of ``sim`` keep vLLM's observations (before the run: the histograms
    start with it); one registry per replica, by replica id, each with that replica's series."""
    out: dict[str, CollectorRegistry] = {}
    for rid, rep in sim.reps.items():
        rep.obs = ReplicaVllm()
        reg = CollectorRegistry()
        reg.register(ReplicaCollector(rep, rep.obs, lambda: sim.now, lock))
        out[rid] = reg
    return out


def add_routes(app: web.Application, registries: dict[str, CollectorRegistry]) -> None:
    """``GET /replicas/{id}/metrics``: that replica's ``vllm:*`` series (404 for another id)."""

    async def handler(request: web.Request) -> web.Response:
        rid = request.match_info["replica"]
        reg = registries.get(rid)
        if reg is None:
            raise web.HTTPNotFound(text=f"no replica {rid!r} (replicas: {', '.join(registries)})")
        body, ctype = await asyncio.to_thread(exposition, reg)
        return web.Response(body=body, headers={"Content-Type": ctype})

    app.router.add_get("/replicas/{replica}/metrics", handler)
