"""LADR's use of each request's prompt size (control/router.py, control/ladr.py,
control/sampler.py): the prompt tokens waiting for their first token on each replica, the
prefill speed learnt from first tokens, long prompts sent where prefill is fast, and the prompt
size reaching the router from the fleet simulator
(tests/exporters/test_gateway_router_learning.py: from the gateway).
See docs/control.md#expected-completion-time-learnt-replica-speed."""

from __future__ import annotations

import math
import random

import pytest

from llmsla.control.router import Replica, Router
from llmsla.fleet import engine, workload

ECT = {"ect": 3.0, "alpha": 0.0, "beta": 0.0, "floor": 0.001}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _waiting(r: Router, rid: str) -> float:
    return next(x for x in r.snapshot()["pools"]["default"] if x["id"] == rid)["ect"]["waiting_prompt_tokens"]


def test_waiting_prompt_tokens_are_kept_per_replica():
    r = Router([Replica("a", "default"), Replica("b", "default")], "ladr")
    assert r.begin("a", 100) == 0.0  # nothing ahead of the first
    assert r.begin("a", 50) == 100.0  # the first one's prompt is ahead of the second
    assert r.begin("b", 7) == 0.0
    assert _waiting(r, "a") == 150.0 and _waiting(r, "b") == 7.0
    r.first_token("a", 20.0, prompt_tokens=100, ahead_tokens=0.0)
    assert _waiting(r, "a") == 50.0
    r.end("a", 300.0, ttft_ms=20.0, output_tokens=10)  # its first token was told: nothing more to take off
    assert _waiting(r, "a") == 50.0
    r.end("a", 5.0, ok=False, prompt_tokens=50)  # no first token came: its prompt waits no more
    assert _waiting(r, "a") == 0.0
    r.end("b", 5.0, ok=False)  # a caller that forgets the prompt: the idle replica heals to 0
    assert _waiting(r, "b") == 0.0


@pytest.mark.parametrize("bad", [None, 0, -5, math.nan, math.inf, True, "12"])
def test_a_bad_prompt_size_counts_nothing_and_the_pick_still_works(bad):
    r = Router([Replica("a", "default"), Replica("b", "default")], "ladr", **ECT)
    assert r.begin("a", bad) == 0.0
    assert _waiting(r, "a") == 0.0
    r.first_token("a", 10.0, prompt_tokens=bad, ahead_tokens=0.0)  # nothing learnt, nothing raised
    assert r.snapshot()["pools"]["default"][0]["ect"]["prefill_per_token_s"] is None
    assert r.pick("default", prompt_tokens=bad).id in ("a", "b")
    r.end("a", 10.0, ok=True, ttft_ms=1.0, output_tokens=3, prompt_tokens=bad)
    assert r.outstanding("a") == 0


def test_prefill_speed_is_learnt_from_first_tokens_and_the_tokens_ahead():
    r = Router([Replica("a", "default")], "ladr", **ECT)
    rng = random.Random(1)
    for _ in range(200):
        prompts = [rng.randint(10, 5000) for _ in range(3)]
        aheads = [r.begin("a", p) for p in prompts]
        for p, ahead in zip(prompts, aheads, strict=True):  # FCFS: each behind the ones before it
            r.first_token("a", 1000 * 3e-5 * (ahead + p), prompt_tokens=p, ahead_tokens=ahead)
        for _ in prompts:
            r.end("a", 100.0, ttft_ms=10.0, output_tokens=5)
    ect = r.snapshot()["pools"]["default"][0]["ect"]
    assert ect["prefill_per_token_s"] == pytest.approx(3e-5, rel=1e-6)
    assert r.snapshot()["prompt_tokens_mean"]["default"] == pytest.approx(2500, rel=0.3)


def _teach(r: Router, clock: Clock, prefill: dict[str, float], n: int = 60) -> None:
    """Both replicas decode alike; ``prefill`` s/token differs. Requests one at a time."""
    for i in range(n):
        for rid, pf in prefill.items():
            clock.t += 0.01
            p = 200 + 37 * (i % 11)
            ahead = r.begin(rid, p)
            r.first_token(rid, 1000 * pf * (ahead + p), prompt_tokens=p, ahead_tokens=ahead)
            r.end(rid, 1000 * (pf * p + 0.02 * 100), ttft_ms=1000 * pf * p, output_tokens=100)
            r.observe(rid)


def test_long_prompts_go_where_prefill_is_fast():
    clock = Clock()
    r = Router([Replica("fast", "default"), Replica("slow", "default")], "ladr", clock=clock,
               rng=random.Random(2), **ECT)
    _teach(r, clock, {"fast": 2e-5, "slow": 2e-4})
    shares = {}
    for prompt in (20, 20_000):
        picks = {"fast": 0, "slow": 0}
        for _ in range(2000):
            picks[r.pick("default", prompt_tokens=prompt).id] += 1  # no begin: the same state each time
        shares[prompt] = picks["fast"] / 2000
    # a 20k-token prompt takes 4 s to prefill on the slow one: of the sampler's TRIES draws the
    # fast replica wins whenever it is among them (1 - 0.4 ** 2 at the short prompts' odds)
    assert shares[20_000] > 0.85
    assert shares[20_000] > shares[20] + 0.2  # a short one cares less


def test_prompt_tokens_waiting_on_a_replica_steer_picks_away_from_it():
    clock = Clock()
    r = Router([Replica("a", "default"), Replica("b", "default")], "ladr", clock=clock, rng=random.Random(3), **ECT)
    _teach(r, clock, {"a": 1e-4, "b": 1e-4})
    before = sum(r.pick("default").id == "a" for _ in range(1000)) / 1000
    r.begin("a", 30_000)  # a huge prompt not prefilled yet: 3 s ahead of anything sent to a
    after = sum(r.pick("default").id == "a" for _ in range(1000)) / 1000
    assert 0.3 < before < 0.7
    assert after < 0.1
    r.first_token("a", 3000.0, prompt_tokens=30_000, ahead_tokens=0.0)  # prefilled: a is fine again
    r.end("a", 3000.0, ttft_ms=3000.0, output_tokens=1)
    again = sum(r.pick("default").id == "a" for _ in range(1000)) / 1000
    assert again > 0.3


def test_the_simulator_gives_the_router_each_request_prompt_size():
    rng = random.Random(5)
    arrivals = workload.poisson(8.0, 30.0, workload.TokenDist(300, 0.5, hi=4000), workload.TokenDist(40, 0.3), rng)
    cfg = engine.SimConfig(engine.fleet("6b:1,13b:1"), policy="ladr", seed=1, gpu_interval_s=0,
                           router_params=dict(ECT))
    sim = engine.Simulator(cfg)
    seen: list[int | None] = []
    real_pick = sim.router.pick

    def pick(*a, **kw):  # a spy: the real router picks
        seen.append(kw.get("prompt_tokens"))
        return real_pick(*a, **kw)

    sim.router.pick = pick  # type: ignore[method-assign]  # spy on the real router's pick
    res = sim.run(arrivals, start_ms=0)
    assert sorted(x for x in seen if x is not None) == sorted(a.prompt for a in arrivals)
    snap = sim.router.snapshot()
    assert snap["prompt_tokens_mean"]["default"] == pytest.approx(
        sum(a.prompt for a in arrivals) / len(arrivals), rel=0.35)
    per = {x["id"]: x["ect"] for x in snap["pools"]["default"]}
    assert all(e["prefill_per_token_s"] is not None and e["waiting_prompt_tokens"] == 0 for e in per.values())
    big, small = (per[x["id"]]["prefill_per_token_s"] for x in sorted(snap["pools"]["default"],
                                                                     key=lambda x: x["id"] != "r1"))
    assert big > small  # r1 is the 13B: slower to prefill, and the router learnt it
    assert len(res.rows) == len(arrivals)
