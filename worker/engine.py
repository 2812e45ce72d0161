"""The continuous-batching engine of the reference worker: one loop, one thread, many requests.

Why one loop in a thread: decode steps must be batched across requests (that is the point of a
serving engine), and torch releases the GIL inside its kernels, so the asyncio HTTP side keeps
streaming while the thread computes. Between two decode steps the loop admits waiting requests
(up to ``max_batch``), prefills them into free KV-cache slots and samples their first token; then
one batched decode step advances every running request by one token. Tokens go back to each
request's asyncio queue, one ``call_soon_threadsafe`` per step for the whole batch.

The KV cache is counted in vLLM's blocks (worker/kvblocks.py): a request is admitted when the
blocks its tokens fill are free, a decode step that needs more blocks than are free preempts the
newest running request back to the head of the queue (it is recomputed, prompt and output so
far, when admitted again), and prefill reuses the prompt's cached full blocks. The engine keeps
vLLM's own series (``vllm:*``, exporters/vllm_metrics.py) from that state.

The temperature policy runs on the real logits at every step; each decision is traced
(:class:`~llmsla.exporters.policy_tracing.PolicyTracer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from llmsla import names
from llmsla.exporters.policy_tracing import PolicyTracer
from llmsla.exporters.vllm_metrics import VllmSeries
from llmsla.temperature import Policy
from llmsla.worker import model as lm
from llmsla.worker.kvblocks import BlockManager, PrefixCache, blocks_for

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256)
GREEDY_T = 1e-5  # at or below this temperature, sampling is argmax

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
#: Third element of an ``("error", message, ABORT)`` item: the worker crashed (an injected
#: ``down`` fault), so the HTTP side cuts the connection instead of ending the response cleanly.
ABORT = "abort"
#: Largest injected slowdown factor (an iteration sleeps at most this many times its own length).
MAX_SLOWDOWN = 100.0


def entropy_nats(logits: Any) -> Any:
    """Entropy (nats) of softmax(logits) along the last axis, for a (B, V) torch tensor -> (B,)."""
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


@dataclass(eq=False)
class GenRequest:
    """One generation; the handler creates it, the engine owns it until it emits ``done``."""

    tokens: list[int]
    max_tokens: int
    policy: Policy
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    seed: int | None = None
    stop: tuple[bytes, ...] = ()
    ignore_eos: bool = False  # vLLM's extension: never sample EOS (fixed-length outputs for benches)
    span: Any = None  # the request's OTel span: parent of the decision spans
    zone: str = names.DEFAULT_POOL
    received: float = field(default_factory=time.monotonic)
    admitted: float | None = None
    cancelled: bool = False
    # engine-side state
    slot: int = -1
    step: int = 0
    last: int = -1
    generated: bytearray = field(default_factory=bytearray)
    rng: random.Random | None = None
    done: bool = False
    blocks: int = 0  # KV blocks held while running
    preempted: int = 0  # times sent back to the queue for lack of blocks
    first_at: float | None = None  # when its first token left the engine (monotonic)
    last_at: float | None = None  # when its latest token left the engine


class WorkerMetrics:
    """The worker's own Prometheus metrics (``names.WORKER_*``) in the worker's registry."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        lab = [names.L_MODEL]
        self.queue = Gauge(names.WORKER_QUEUE_LENGTH, "Requests waiting for a batch slot", lab, registry=registry).labels(model_name)
        self.running = Gauge(names.WORKER_RUNNING_REQUESTS, "Requests in the running batch", lab, registry=registry).labels(model_name)
        self.batch = Histogram(names.WORKER_BATCH_SIZE, "Requests advanced per decode step", lab,
                               buckets=BATCH_BUCKETS, registry=registry).labels(model_name)
        self.tokens = Counter(names.WORKER_GENERATED_TOKENS, "Tokens generated", lab, registry=registry).labels(model_name)
        self.tps = Gauge(names.WORKER_TOKENS_PER_SECOND, "Generated tokens per second over the last second",
                         lab, registry=registry).labels(model_name)
        self.first_token = Histogram(names.WORKER_FIRST_TOKEN_SECONDS, "Worker receipt to first token handed to the response",
                                     lab, buckets=names.TTFT_BUCKETS, registry=registry).labels(model_name)
        mem = Gauge(names.WORKER_MEMORY_BYTES, "Resident set size of the worker process", lab, registry=registry)
        mem.labels(model_name).set_function(rss_bytes)


def rss_bytes() -> float:
    """Resident set size from /proc (Linux); 0 where unavailable."""
    try:
        with open("/proc/self/statm") as f:
            import os

            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return 0.0


def kv_budget(max_batch: int, max_ctx: int, kv_blocks: int = 0) -> int:
    """The engine's KV blocks: ``kv_blocks``, or (0) every slot at its full context."""
    return kv_blocks or max_batch * blocks_for(max_ctx, names.VLLM_BLOCK_SIZE)


def _dispatch(items: list[tuple[GenRequest, tuple]]) -> None:
    for req, item in items:
        req.out.put_nowait(item)


class Engine:
    """Owns the model and the KV cache; ``submit`` and ``cancel`` are safe from any thread."""

    def __init__(self, model: lm.TinyLM, *, max_batch: int, tracer: PolicyTracer | None,
                 metrics: WorkerMetrics | None = None, threads: int = 1, kv_blocks: int = 0,
                 vllm: VllmSeries | None = None) -> None:
        self.model = model
        self.max_batch = max_batch
        self.cache = lm.KVCache(model, max_batch)
        bs = names.VLLM_BLOCK_SIZE
        total = kv_budget(max_batch, model.spec.max_ctx, kv_blocks)
        if total < blocks_for(model.spec.max_ctx, bs):
            raise ValueError(f"{total} KV blocks cannot hold one request at the context of {model.spec.max_ctx} "
                             f"tokens ({blocks_for(model.spec.max_ctx, bs)} blocks of {bs})")
        self.blocks = BlockManager(total, bs)
        # as vLLM's cached blocks live in its pool, the prefix cache holds at most the pool's size
        self.prefix = PrefixCache(total, bs)
        self.vllm = vllm
        self.tracer = tracer
        self.metrics = metrics
        self.threads = threads
        self._free = list(range(max_batch))
        heapq.heapify(self._free)
        self._waiting: deque[GenRequest] = deque()
        self._running: list[GenRequest] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        # injected faults (worker/fault.py): every iteration takes ``slowdown`` times longer; while
        # ``_down`` holds a reason, nothing is admitted and everything in flight fails
        self.slowdown = 1.0
        self._down: str | None = None
        # statistics (tests and benches read these)
        self.steps = 0
        self.decisions = 0
        self.generated = 0
        self.max_batch_seen = 0
        self.batch_sizes: dict[int, int] = {}
        self.preemptions = 0
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of which found there
        self._tps_t0 = time.monotonic()
        self._tps_n = 0

    # -- control (any thread) --------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="llmsla-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def submit(self, req: GenRequest) -> None:
        with self._cond:
            if self._stop:
                raise RuntimeError("engine is stopped")
            if self._down is not None:
                raise RuntimeError(self._down)
            self._waiting.append(req)
            self._queue_gauges()
            self._cond.notify()

    def set_slowdown(self, factor: float) -> None:
        """Every iteration from now on takes ``factor`` (>= 1) times its compute time: the
        simulator's ``slowdown``/``ramp`` (fleet/faults.py) on a real engine."""
        if not 1.0 <= factor <= MAX_SLOWDOWN:
            raise ValueError(f"slowdown must be in [1, {MAX_SLOWDOWN:g}], got {factor}")
        self.slowdown = float(factor)

    def set_down(self, reason: str | None) -> None:
        """``reason``: the engine crashes - every waiting and running request fails with it (their
        connections are cut, see ``ABORT``) and new ones are refused until ``set_down(None)``."""
        with self._cond:
            self._down = reason
            self._cond.notify()

    @property
    def down(self) -> bool:
        return self._down is not None

    def cancel(self, req: GenRequest) -> None:
        """Mark a request abandoned (client gone); the loop frees its slot before the next step."""
        req.cancelled = True
        with self._cond:
            with contextlib.suppress(ValueError):  # still queued: leave now, not when admitted
                self._waiting.remove(req)
                self._queue_gauges()
            self._cond.notify()

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {
                "waiting": len(self._waiting), "running": len(self._running), "steps": self.steps,
                "decisions": self.decisions, "generated_tokens": self.generated,
                "max_batch_seen": self.max_batch_seen, "batch_sizes": dict(self.batch_sizes),
                "free_slots": len(self._free), "kv_blocks_total": self.blocks.total,
                "kv_blocks_used": self.blocks.used, "kv_block_size": self.blocks.block_size,
                "preemptions": self.preemptions, "prefix_cache_queries": self.prefix_queries,
                "prefix_cache_hits": self.prefix_hits, "prefix_cache_blocks": len(self.prefix),
            }

    def _queue_gauges(self) -> None:
        """Waiting requests, under both names (call with the lock held)."""
        n = len(self._waiting)
        if self.metrics:
            self.metrics.queue.set(n)
        if self.vllm:
            self.vllm.waiting.set(n)

    def _batch_gauges(self) -> None:
        """Running requests and KV usage, under both names (engine thread)."""
        if self.metrics:
            self.metrics.running.set(len(self._running))
        if self.vllm:
            self.vllm.running.set(len(self._running))
            self.vllm.kv_usage.set(self.blocks.usage())

    # -- the loop (engine thread) ----------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(self.threads)
        while True:
            with self._cond:
                while not self._stop and not self._waiting and not self._running:
                    if self.metrics:
                        self.metrics.tps.set(0)
                    self._cond.wait()
                if self._stop:
                    break
                if self._down is not None:  # crashed: fail everything in flight, admit nothing
                    crashed = list(self._waiting) + self._running
                    self._waiting.clear()
                    reason = self._down
                else:
                    crashed = []
            if crashed:
                for req in crashed:
                    self._release(req)
                self._running = []
                with self._cond:
                    self._queue_gauges()
                self._batch_gauges()
                self._flush([(req, ("error", reason, ABORT)) for req in crashed])
                continue
            with self._cond:
                new = self._admit()
                self._queue_gauges()
            out: list[tuple[GenRequest, tuple]] = []
            started = time.perf_counter()
            try:
                self._iteration(new, out)
            except Exception as exc:  # a bug must not wedge every request: fail the batch, go on
                log.exception("engine iteration failed")
                for req in self._running + [r for r in new if r.slot >= 0 and r not in self._running]:
                    if not req.done:
                        out.append((req, ("error", f"engine error: {exc}")))
                    self._release(req)
                self._running = []
            slow = self.slowdown
            if slow > 1.0:  # the iteration's tokens come out when the slowed iteration ends
                time.sleep((slow - 1.0) * (time.perf_counter() - started))
            self._observe(out, time.monotonic())
            self._flush(out)
        # shutting down: tell everyone still here
        out = []
        with self._cond:
            pending = list(self._waiting) + self._running
            self._waiting.clear()
        for req in pending:
            out.append((req, ("error", "worker shutting down")))
        self._running = []
        self._flush(out)

    def _flush(self, out: list[tuple[GenRequest, tuple]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for req, item in out:
            by_loop.setdefault(req.loop, []).append((req, item))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that event loop is closed (server stopped)
                loop.call_soon_threadsafe(_dispatch, items)

    def _admit(self) -> list[GenRequest]:
        """Waiting requests to prefill now, first come first served (lock held): while a slot
        is free and the blocks the head's tokens fill, plus room for its next token, are free.
        The head that does not fit waits, and so does everyone behind it (as in vLLM)."""
        new: list[GenRequest] = []
        free = self.blocks.free
        bs = self.blocks.block_size
        while self._waiting and len(self._running) + len(new) < self.max_batch:
            head = self._waiting[0]
            n = len(head.tokens) + len(head.generated)
            if blocks_for(n + 1, bs) > free:
                break
            self._waiting.popleft()
            free -= blocks_for(n, bs)
            new.append(head)
        return new

    def _free_slot(self, req: GenRequest) -> None:
        self.blocks.release(req.blocks)
        req.blocks = 0
        if req.slot >= 0:
            self.cache.lengths[req.slot] = 0
            heapq.heappush(self._free, req.slot)
            req.slot = -1

    def _release(self, req: GenRequest) -> None:
        req.done = True
        self._free_slot(req)

    def _preempt(self, req: GenRequest) -> None:
        """Send ``req`` back to the head of the queue, its blocks freed: it is recomputed
        (prompt and output so far) when admitted again, vLLM's recompute preemption."""
        self._free_slot(req)
        req.preempted += 1
        self.preemptions += 1
        if self.vllm:
            self.vllm.preemptions.inc()
        with self._cond:
            self._waiting.appendleft(req)
            self._queue_gauges()

    def _grow(self, batch: list[GenRequest]) -> list[GenRequest]:
        """Give each request of ``batch`` whose next position starts a block that block,
        preempting the newest ones while the blocks needed exceed the free ones; the batch
        that decodes."""
        bs = self.blocks.block_size
        batch = list(batch)
        needs = [r for r in batch if self.cache.lengths[r.slot] % bs == 0]
        while batch and len(needs) > self.blocks.free:
            victim = batch.pop()  # the newest: admitted last
            if victim in needs:
                needs.remove(victim)
            self._running.remove(victim)
            self._preempt(victim)
        for r in needs:
            self.blocks.allocate(1)
            r.blocks += 1
        return batch

    def _prefill(self, req: GenRequest) -> torch.Tensor:
        """Prefill ``req`` (its prompt and, after a preemption, its output so far) into its slot,
        reusing the cached full blocks of its prefix, and cache its own full blocks."""
        toks = req.tokens + list(req.generated)
        hit = self.prefix.lookup(toks)
        cached = (hit.k, hit.v) if hit.k is not None and hit.v is not None else None
        row = lm.prefill(self.model, self.cache, req.slot, toks, cached=cached)
        self.prefix.store(toks, self.cache.k[:, req.slot], self.cache.v[:, req.slot])
        req.blocks = blocks_for(len(toks), self.blocks.block_size)
        self.blocks.allocate(req.blocks)
        self.prefix_queries += len(toks)
        self.prefix_hits += hit.tokens
        if self.vllm:
            self.vllm.prefix_queries.inc(len(toks))
            self.vllm.prefix_hits.inc(hit.tokens)
            if not req.preempted:
                self.vllm.prompt_tokens.inc(len(req.tokens))
        return row

    def _observe(self, out: list[tuple[GenRequest, tuple]], now: float) -> None:
        """vLLM's latency histograms from what this iteration hands out at ``now``: a request's
        first token (TTFT from its receipt), every later one (inter-token latency), and a
        request that finished (E2E, and the time it waited for its first admission)."""
        v = self.vllm
        if v is None:
            return
        for req, item in out:
            if item[0] == "token":
                v.generation_tokens.inc()
                if req.first_at is None:
                    req.first_at = now
                    v.ttft.observe(now - req.received)
                elif req.last_at is not None:
                    v.itl.observe(now - req.last_at)
                req.last_at = now
            elif item[0] == "done":
                v.e2e.observe(now - req.received)
                if req.admitted is not None:
                    v.queue.observe(max(0.0, req.admitted - req.received))

    def _iteration(self, new: list[GenRequest], out: list[tuple[GenRequest, tuple]]) -> None:
        # 1. drop abandoned requests
        kept = []
        for req in self._running:
            if req.cancelled:
                self._release(req)
            else:
                kept.append(req)
        self._running = kept
        # 2. admit and prefill new ones; their first token comes from the prefill logits
        first: list[GenRequest] = []
        rows = []
        for req in new:
            if req.cancelled:
                req.done = True
                continue
            if req.admitted is None:  # a preempted one keeps its first admission and its sampler
                req.admitted = time.monotonic()
                req.rng = random.Random(req.seed) if req.seed is not None else random.Random()
            req.slot = heapq.heappop(self._free)
            rows.append(self._prefill(req))
            first.append(req)
        if first:
            self._advance(first, torch.stack(rows), out)
            self._running.extend(r for r in first if not r.done)
        # 3. one batched decode step for every running request (the new ones included)
        batch = self._grow([r for r in self._running if not r.done])
        if batch:
            logits = lm.decode_step(self.model, self.cache, [r.slot for r in batch], [r.last for r in batch])
            n = len(batch)
            self.steps += 1
            self.batch_sizes[n] = self.batch_sizes.get(n, 0) + 1
            self.max_batch_seen = max(self.max_batch_seen, n)
            if self.metrics:
                self.metrics.batch.observe(n)
            self._advance(batch, logits, out)
        self._running = [r for r in self._running if not r.done]
        self._batch_gauges()
        if self.metrics:
            now = time.monotonic()
            if now - self._tps_t0 >= 1.0:
                self.metrics.tps.set(self._tps_n / (now - self._tps_t0))
                self._tps_t0, self._tps_n = now, 0

    def _advance(self, reqs: list[GenRequest], logits: torch.Tensor, out: list[tuple[GenRequest, tuple]]) -> None:
        """Decide a temperature per request, sample one token each, emit, and finish where due."""
        ents = entropy_nats(logits).tolist() if any(r.policy.needs_entropy for r in reqs) else None
        temps = []
        tracer = self.tracer
        for i, r in enumerate(reqs):
            t0 = time.time_ns()
            d = r.policy.decide(r.step, ents[i] if ents is not None else None)
            t1 = time.time_ns()
            if tracer is not None and r.span is not None:
                tracer.record(r.span, r.policy.policy_id, r.zone, r.step, d, t0, t1)
            self.decisions += 1
            temps.append(d.temperature)
        no_eos = [i for i, r in enumerate(reqs) if r.ignore_eos]
        if no_eos:
            logits = logits.clone()
            logits[torch.tensor(no_eos, dtype=torch.long), lm.EOS] = float("-inf")
        toks = logits.argmax(dim=-1).tolist()
        hot = [i for i, t in enumerate(temps) if t > GREEDY_T]
        if hot:
            idx = torch.tensor(hot, dtype=torch.long)
            t = torch.tensor([temps[i] for i in hot], dtype=logits.dtype).unsqueeze(1)
            probs = torch.softmax(logits[idx] / t, dim=-1)
            cdf = probs.cumsum(dim=-1)
            draws = []
            for i in hot:
                rng = reqs[i].rng
                assert rng is not None  # given one on admission
                draws.append([rng.random()])
            u = torch.tensor(draws, dtype=cdf.dtype) * cdf[:, -1:]
            picked = torch.searchsorted(cdf, u).clamp_(max=lm.VOCAB - 1).squeeze(1).tolist()
            for i, tok in zip(hot, picked, strict=True):
                toks[i] = tok
        now = time.monotonic()
        ctx_limit = self.model.spec.max_ctx - 1
        for r, tok in zip(reqs, toks, strict=True):
            r.step += 1
            if tok == lm.EOS:
                out.append((r, ("done", FINISH_STOP)))
                self._release(r)
                continue
            r.last = tok
            r.generated.append(tok)
            self.generated += 1
            self._tps_n += 1
            if self.metrics:
                self.metrics.tokens.inc()
            out.append((r, ("token", tok, now)))
            if r.stop and any(r.generated.endswith(s) for s in r.stop):
                out.append((r, ("done", FINISH_STOP)))
                self._release(r)
            elif len(r.generated) >= r.max_tokens or self.cache.lengths[r.slot] >= ctx_limit:
                out.append((r, ("done", FINISH_LENGTH)))
                self._release(r)
