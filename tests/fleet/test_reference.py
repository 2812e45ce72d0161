"""The engine's fast-forwarding (multi-iteration segments cut by arrivals, KV-limited runs,
preemption and recompute) against a naive iteration-by-iteration reference written here from the
scheduling rules alone: per-request TTFT and E2E must agree."""

from __future__ import annotations

import random
from collections import deque

import pytest

from llmsla.fleet import engine, faults, models, workload


class _R:
    def __init__(self, i: int, a: workload.Arrival) -> None:
        self.i, self.t, self.prompt, self.output = i, a.t, a.prompt, a.output
        self.gen = self.kv = 0
        self.first: float | None = None


def naive(arrivals: list[workload.Arrival], spec: models.ModelSpec, cap: int) -> dict[int, tuple[float, float]]:
    """One loop turn per iteration: FCFS admission, newest-first preemption, recompute."""
    pending = deque(_R(i, a) for i, a in enumerate(arrivals))
    waiting: deque[_R] = deque()
    running: list[_R] = []
    kv, t = 0, 0.0
    out: dict[int, tuple[float, float]] = {}
    while pending or waiting or running:
        while pending and pending[0].t <= t:
            waiting.append(pending.popleft())
        if not waiting and not running:
            t = pending[0].t
            continue
        while running and kv + len(running) > cap:
            r = running.pop()
            kv -= r.kv
            r.kv = 0
            waiting.appendleft(r)
        n_dec, ptok, admitted = len(running), 0, 0
        free = cap - kv - n_dec
        while waiting and len(running) < spec.max_batch:
            r = waiting[0]
            need = r.prompt + r.gen
            if need + 1 > free or (admitted and ptok + need > spec.max_prefill_tokens):
                break
            waiting.popleft()
            r.kv, kv, free, ptok, admitted = need, kv + need, free - need - 1, ptok + need, admitted + 1
            running.append(r)
        t += spec.iteration_s(ptok, n_dec) if admitted else spec.iteration_s(0, len(running))
        for r in running:
            r.kv += 1
            kv += 1
            r.gen += 1
            if r.first is None:
                r.first = t
        for r in [r for r in running if r.gen >= r.output]:
            kv -= r.kv
            running.remove(r)
            out[r.i] = ((r.first - r.t) * 1000, (t - r.t) * 1000)
    return out


@pytest.mark.parametrize("rate, share", [(6.0, 1.0), (12.0, 1.0), (10.0, 0.03)])
def test_engine_matches_iteration_by_iteration_reference(rate: float, share: float) -> None:
    spec = models.get("6b")
    rng = random.Random(int(rate * 100 + share * 10))
    arrivals = workload.poisson(rate, 120.0, workload.TokenDist(300, 0.8, hi=1500),
                                workload.TokenDist(150, 0.8, hi=1000), rng)
    cap = int(spec.kv_capacity_tokens * share)
    cfg = engine.SimConfig([engine.ReplicaConfig("r0", "6b")], net_delay_s=0.0, probe_s=0,
                           gpu_interval_s=0, timeout_s=1e6)
    fl = [faults.Fault(0.0, 1e7, "memory", "r0", share)] if share < 1 else []
    res = engine.Simulator(cfg).run(arrivals, faults=fl, start_ms=0)
    want = naive(arrivals, spec, cap)
    assert len(res.rows) == len(want) == len(arrivals)
    got = {round(r.arrival_s, 9): r for r in res.rows}
    for i, a in enumerate(arrivals):
        row = got[round(a.t, 9)]
        assert row.status == "ok"
        assert row.ttft_ms == pytest.approx(want[i][0], abs=0.01), (i, a)
        assert row.e2e_ms == pytest.approx(want[i][1], abs=0.01), (i, a)
    if share < 1:
        assert res.replicas["r0"]["preemptions"] > 0  # the KV-limited case really preempts
