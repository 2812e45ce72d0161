"""One simulated replica: a continuous-batching scheduler with a KV-cache budget, vLLM's defaults.

Between two things that change the batch every decode iteration costs the same, so the replica
plans a *segment* of identical iterations and the engine schedules one event at its end; an
arrival cuts it at the next iteration boundary, where a real engine would admit the newcomer.
That is what makes an hour of trace on 8 replicas take seconds; a test holds it equal to a naive
per-iteration reference. See docs/fleet.md#the-model.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from llmsla import names
from llmsla.fleet.models import ModelSpec

if TYPE_CHECKING:
    from llmsla.fleet.vllm_view import ReplicaVllm


class Req:
    """A request inside the simulator (slots: touched on every segment)."""

    __slots__ = (
        "i", "trace_id", "unit", "class_", "arm", "route_policy", "policy", "pool", "role", "prompt", "output", "arrival", "rep", "net_back", "dispatch_t",
        "engine_t", "admit_t", "first_t", "last_t", "gen", "kv", "itl_n", "itl_sum", "itl_sq", "itl_max",
        "preempted", "dead", "done", "tenant", "class_", "ahead",
    )

    def __init__(self, i: int, arrival: float, prompt: int, output: int) -> None:
        self.i = i
        self.trace_id = ""
        self.unit = ""
        self.class_ = names.DEFAULT_CLASS  # the request class: what load shedding looks at
        self.arm = ""  # the A/B arm label ("" = SimConfig.arm)
        self.route_policy: str | None = None  # an arm's router policy (None = the router's)
        self.policy = ""  # the temperature schedule it ran ("" = SimConfig.temperature_policy)
        self.pool = ""
        self.role: str | None = None
        self.prompt = prompt
        self.output = output
        self.arrival = arrival
        self.rep: ReplicaSim | None = None
        self.net_back = 0.0
        self.dispatch_t: float | None = None  # left the gateway queue (holds a gateway slot)
        self.engine_t = 0.0  # delivered to the replica (vLLM's arrival: its engine-side times start here)
        self.admit_t: float | None = None
        self.first_t: float | None = None
        self.last_t = 0.0
        self.gen = 0
        self.kv = 0
        self.itl_n = 0
        self.itl_sum = 0.0
        self.itl_sq = 0.0
        self.itl_max = 0.0
        self.preempted = 0
        self.dead = False  # timed out / failed while queued or running: drop at the next boundary
        self.done = False  # outcome recorded
        self.ahead: float | None = None  # prompt tokens the router saw ahead at dispatch; None once told
        self.tenant = names.DEFAULT_TENANT  # SimConfig.tenant_mix (fleet/tenancy.py)
        self.class_ = names.DEFAULT_CLASS


class ReplicaSim:
    """Batch state of one replica; the engine drives it with plan/advance/interrupt."""

    def __init__(self, rid: str, pool: str, role: str, spec: ModelSpec, index: int) -> None:
        self.id, self.pool, self.role, self.spec, self.index = rid, pool, role, spec, index
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.kv_used = 0
        self.kv_cap = spec.kv_capacity_tokens
        self.slow = 1.0
        self.up = True
        self.busy = False
        self.t0 = 0.0  # current segment: start, iteration time, iterations, prefilled requests
        self.d = 0.0
        self.k = 0
        self.prefill: list[Req] = []
        self.version = 0  # bumps invalidate the scheduled segment-end event
        self.n_dead = 0
        self.failed: list[Req] = []  # could never fit the KV cache; the engine records them
        # stats
        self.preemptions = 0
        self.busy_acc = 0.0
        self.busy_since = 0.0
        self.kv_peak = 0
        self.tokens_out = 0
        self.decoded = 0  # tokens made past each stream's first (the gateway's cadence: Router.tokens)
        self.decoded_gap = 0.0  # the sum of their inter-token gaps (seconds)
        self.iterations = 0
        self.gpu_last = (0.0, 0.0)  # (time, busy seconds) at the previous GPU sample
        #: vLLM's engine-side observations (fleet/vllm_view.py), kept only when its series are served
        self.obs: ReplicaVllm | None = None

    # -- planning --------------------------------------------------------------------------------
    def plan(self, t: float) -> float | None:
        """Start the next segment at ``t``; its end time, or None when there is nothing to run."""
        running = self.running
        if self.n_dead:
            self._purge(running)
        cap = self.kv_cap
        waiting = self.waiting
        # 1. room for one more token per running sequence, else preempt the newest (recompute)
        while running and self.kv_used + len(running) > cap:
            r = running.pop()
            self.kv_used -= r.kv
            r.kv = 0
            r.preempted += 1
            self.preemptions += 1
            waiting.appendleft(r)
        # 2. FCFS admission
        spec = self.spec
        n_dec = len(running)
        free = cap - self.kv_used - n_dec
        budget = spec.max_prefill_tokens
        prefill: list[Req] = []
        ptok = 0
        while waiting and len(running) < spec.max_batch:
            r = waiting[0]
            if r.dead:
                waiting.popleft()
                continue
            need = r.prompt + r.gen
            if need + 1 > free:
                if not running and need + 1 > cap:  # cannot fit even alone: the engine fails it
                    waiting.popleft()
                    r.dead = True
                    self.failed.append(r)
                    continue
                break
            if prefill and ptok + need > budget:
                break
            waiting.popleft()
            if self.obs is not None:
                self.obs.prompt_tokens += need
            r.kv = need
            self.kv_used += need
            free -= need + 1
            ptok += need
            prefill.append(r)
            running.append(r)
            if r.admit_t is None:
                r.admit_t = t
        # 3. the segment
        if prefill:
            d = spec.b0_s + spec.b1_s * ptok + spec.b2_s * n_dec
            k = 1
        elif running:
            n = len(running)
            d = spec.b0_s + spec.b2_s * n
            k = min(r.output - r.gen for r in running)
            k = min(k, (cap - self.kv_used) // n)
        else:
            if self.busy:
                self.busy = False
                self.busy_acc += t - self.busy_since
            return None
        if not self.busy:
            self.busy = True
            self.busy_since = t
        d *= self.slow
        self.t0, self.d, self.k, self.prefill = t, d, k, prefill
        return t + k * d

    def _purge(self, running: list[Req]) -> None:
        keep = []
        for r in running:
            if r.dead:
                self.kv_used -= r.kv
                r.kv = 0
            else:
                keep.append(r)
        running[:] = keep
        self.n_dead = 0

    def advance(self) -> list[Req]:
        """Apply the planned segment (called at its end); returns the requests that finished."""
        k, d = self.k, self.d
        t_end = self.t0 + k * d
        running = self.running
        n = len(running)
        self.kv_used += k * n
        self.iterations += k
        self.tokens_out += k * n
        if self.kv_used > self.kv_peak:
            self.kv_peak = self.kv_used
        obs = self.obs
        if self.prefill:  # one mixed iteration: newcomers get a token, recomputed ones resume
            for r in running:
                r.kv += 1
                r.gen += 1
                if r.first_t is None:
                    r.first_t = t_end
                    if obs is not None:
                        obs.ttft.add(t_end - r.engine_t)
                else:
                    gap = t_end - r.last_t
                    self.decoded += 1
                    self.decoded_gap += gap
                    if obs is not None:
                        obs.itl.add(gap)
                    r.itl_n += 1
                    r.itl_sum += gap
                    r.itl_sq += gap * gap
                    if gap > r.itl_max:
                        r.itl_max = gap
                r.last_t = t_end
            self.prefill = []
        else:
            kd, kdd = k * d, k * d * d
            self.decoded += k * n
            self.decoded_gap += kd * n
            if obs is not None:
                obs.itl.add(d, k * n)
            for r in running:
                r.kv += k
                r.gen += k
                r.itl_n += k
                r.itl_sum += kd
                r.itl_sq += kdd
                if d > r.itl_max:
                    r.itl_max = d
                r.last_t = t_end
        finished = [r for r in running if r.gen >= r.output]
        if finished:
            for r in finished:
                self.kv_used -= r.kv
                r.kv = 0
                if obs is not None:
                    obs.e2e.add(t_end - r.engine_t)
                    obs.queue.add(max(0.0, (r.admit_t if r.admit_t is not None else t_end) - r.engine_t))
            running[:] = [r for r in running if r.gen < r.output]
        return finished

    def interrupt(self, t: float) -> float | None:
        """Cut a multi-iteration decode segment at the first boundary at or after ``t`` so the
        scheduler can react (admit an arrival, apply a fault); the new end time, or None when
        the current segment already ends there."""
        if not self.busy or self.k <= 1:
            return None
        j = max(1, math.ceil((t - self.t0) / self.d - 1e-9))
        if j >= self.k:
            return None
        self.k = j
        self.version += 1
        return self.t0 + j * self.d

    # -- observation -----------------------------------------------------------------------------
    def _tokens_done(self, t: float) -> int:
        """Tokens made by ``t`` inside the current decode segment, not yet applied (0 outside one)."""
        if not self.busy or self.prefill or self.d <= 0:
            return 0
        return min(self.k, max(0, int((t - self.t0) / self.d))) * len(self.running)

    def kv_at(self, t: float) -> int:
        """KV tokens in use at ``t`` (inside a decode segment: the iterations done by then)."""
        return self.kv_used + self._tokens_done(t)

    def decoded_at(self, t: float) -> tuple[int, float]:
        """(:attr:`decoded`, :attr:`decoded_gap`) at ``t``: inside a decode segment with the
        iterations done by then (the gateway sees each token as it comes)."""
        done = self._tokens_done(t)
        return self.decoded + done, self.decoded_gap + done * self.d

    def busy_time(self, t: float) -> float:
        return self.busy_acc + (t - self.busy_since if self.busy else 0.0)

    def queue_length(self) -> int:
        return len(self.waiting) + len(self.running)

    def crash(self) -> list[Req]:
        """Lose all state; returns the requests that were in the replica (to be failed)."""
        lost = [r for r in self.running if not r.dead] + [r for r in self.waiting if not r.dead]
        self.running.clear()
        self.waiting.clear()
        self.kv_used = 0
        self.prefill = []
        self.n_dead = 0
        self.version += 1
        self.k = 0
        return lost

    def stop_busy(self, t: float) -> None:
        if self.busy:
            self.busy = False
            self.busy_acc += t - self.busy_since
