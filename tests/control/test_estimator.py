"""LADR's learnt replica speed (control/estimator.py) and the expected-completion-time term:
convergence on a known rate, a replica that restarts at another speed, bad input, bounded
state, and the router sending a slow replica its share and no more."""

from __future__ import annotations

import math
import random
import statistics
import sys

import pytest

from llmsla.control import estimator
from llmsla.control.estimator import OutputLength, ServiceEstimate
from llmsla.control.router import Replica, Router

N0 = 16.0


def _complete(est: ServiceEstimate, tpot_per_load: float, ttft_per_load: float, out: int, load: float) -> None:
    """A request as a replica of the given true speed would serve it at ``load``."""
    ttft = ttft_per_load * load
    est.observe(ttft + tpot_per_load * (out - 1) * (load + N0), ttft, out, load, N0)


def test_converges_on_a_known_rate_whatever_the_load_and_length():
    rng = random.Random(1)
    est = ServiceEstimate()
    for _ in range(400):
        _complete(est, 0.002, 0.01, rng.randint(2, 500), rng.uniform(1, 40))
    assert est.tpot_per_load == pytest.approx(0.002, rel=1e-6)
    assert est.ttft_s == pytest.approx(0.01, rel=1e-6)
    assert est.n == 400


def test_noisy_observations_average_out():
    rng = random.Random(2)
    est = ServiceEstimate()
    for _ in range(3000):
        noise = rng.lognormvariate(0, 0.3)
        load = rng.uniform(1, 30)
        out = rng.randint(10, 300)
        est.observe(0.05 + 0.001 * noise * (out - 1) * (load + N0), 0.05, out, load, N0)
    mean_noise = math.exp(0.3 ** 2 / 2)  # E[lognormal(0, 0.3)]
    assert est.tpot_per_load == pytest.approx(0.001 * mean_noise, rel=0.15)


def test_follows_a_replica_that_restarts_at_another_speed():
    est = ServiceEstimate()
    for _ in range(300):
        _complete(est, 0.001, 0.01, 100, 10)
    assert est.tpot_per_load == pytest.approx(0.001)
    # restarted on a 3x slower GPU behind the same id: each observation moves the estimate by
    # at most CLIP, and the EWMA gets within 5 % in a bounded number of completions
    n = 0
    while abs(est.tpot_per_load - 0.003) > 0.05 * 0.003:
        _complete(est, 0.003, 0.01, 100, 10)
        n += 1
        assert n < 200, est.tpot_per_load
    assert n > 10  # one completion does not swing it (outliers must not)
    est.reset()
    assert est.tpot_per_load is None and est.ttft_s is None and est.n == 0
    _complete(est, 0.01, 0.02, 100, 5)  # after a reset, the first FIRST_TOKENS tokens set it whole
    assert est.tpot_per_load == pytest.approx(0.01)


def test_first_estimate_rests_on_enough_tokens_not_one_stalled_request():
    """A replica's first request of 3 tokens waited out another's long prefill (2 s): per token
    it reads 50x the replica's speed. Its first estimate pools the tokens until FIRST_TOKENS came
    (time over tokens x load), so that request weighs by its 2 tokens, not as the whole estimate."""
    est = ServiceEstimate()
    est.observe(0.1 + 2.0, 0.1, 3, 4, N0)  # 2 decode tokens, 2 s: a stall
    assert est.tpot_per_load is None and est.first is not None and est.n == 1
    for _ in range(estimator.FIRST_TOKENS // 40 + 1):  # 40 decode tokens each at the true speed
        assert est.tpot_per_load is None
        _complete(est, 0.001, 0.01, 41, 4)
    pooled = (2.0 + (estimator.FIRST_TOKENS // 40 + 1) * 0.001 * 40 * (4 + N0)) / (
        2 * (4 + N0) + (estimator.FIRST_TOKENS // 40 + 1) * 40 * (4 + N0))
    assert est.tpot_per_load == pytest.approx(pooled)
    assert est.first is None
    assert est.tpot_per_load < 2.5 * 0.001  # taken whole, the stall would have read 0.05


def test_a_token_reading_pools_into_the_first_estimate_too():
    est = ServiceEstimate()
    assert est.observe_cadence(0.5, 20 * (2 + N0), 20, 0.1)  # 20 tokens: not enough alone
    assert est.tpot_per_load is None and est.cadence_n == 1
    assert est.observe_cadence(0.001 * 64 * (2 + N0), 64 * (2 + N0), 64, 0.1)
    assert est.tpot_per_load == pytest.approx((0.5 + 0.001 * 64 * (2 + N0)) / (84 * (2 + N0)))
    before = est.tpot_per_load
    assert est.observe_cadence(0.002 * 64 * (2 + N0), 64 * (2 + N0), 64, 0.1)  # then an EWMA step
    assert est.tpot_per_load == pytest.approx(before + 0.1 * (0.002 - before))
    for bad in ((math.nan, 1.0, 1.0), (1.0, 0.0, 1.0), (-1.0, 1.0, 1.0), (1.0, 1.0, math.inf)):
        assert est.observe_cadence(*bad, 0.1) is False


def test_a_replica_whose_first_request_stalled_still_gets_its_share():
    """Two identical replicas; fast1's first completion is a 3-token request that waited 2 s
    behind a long prompt. Taken whole it made fast1 look 50x slower and the ECT sent it almost
    nothing, so nothing corrected it; pooled over its first tokens it keeps about half."""
    clock = Clock()
    speeds = {"fast0": 1.0, "fast1": 1.0}
    r = Router([Replica(x, "default") for x in speeds], "ladr", clock=clock, rng=random.Random(3),
               ect=3.0, alpha=0.0, beta=0.0)
    r.begin("fast1")
    clock.t += 2.1
    r.end("fast1", 2100.0, ttft_ms=100.0, output_tokens=3)
    picks = _serve(r, speeds, 2000, clock)
    assert picks["fast1"] > 0.4 * (picks["fast0"] + picks["fast1"]), picks


def test_one_outlier_moves_the_estimate_a_bounded_step():
    est = ServiceEstimate()
    for _ in range(100):
        _complete(est, 0.001, 0.01, 100, 10)
    _complete(est, 1000.0, 0.01, 100, 10)  # a request stuck for hours
    assert est.tpot_per_load <= 0.001 * (1 + estimator.GAIN * (estimator.CLIP - 1)) + 1e-12
    assert est.tpot_per_load <= estimator.MAX_TPOT


@pytest.mark.parametrize("latency, ttft, out, load", [
    (math.nan, 0.1, 10, 1), (math.inf, 0.1, 10, 1), (-1.0, 0.1, 10, 1), (1.0, 0.1, 10, math.nan),
    (1.0, 0.1, 10, -3),
])
def test_bad_observations_are_ignored(latency, ttft, out, load):
    est = ServiceEstimate()
    _complete(est, 0.001, 0.01, 100, 10)
    before = (est.tpot_per_load, est.ttft_s, est.n)
    assert est.observe(latency, ttft, out, load, N0) is False
    assert (est.tpot_per_load, est.ttft_s, est.n) == before


def test_ttft_after_the_end_or_one_token_teaches_no_decode_speed():
    est = ServiceEstimate()
    assert est.observe(1.0, 2.0, 10, 1, N0) is False  # TTFT > latency: TTFT dropped, no decode
    assert est.observe(1.0, 0.5, 1, 1, N0) is True  # one token: TTFT only
    assert est.tpot_per_load is None and est.ttft_s == pytest.approx(0.5)


def test_memory_is_bounded():
    est, out = ServiceEstimate(), OutputLength()
    for i in range(10_000):
        _complete(est, 0.001, 0.01, 2 + i % 300, 1 + i % 50)
        out.observe(1 + i % 300)
    assert not hasattr(est, "__dict__") and not hasattr(out, "__dict__")  # slots: fixed fields only
    assert all(not isinstance(getattr(est, f), list | dict) for f in est.__slots__)
    assert sys.getsizeof(est) < 100
    assert 100 < out.mean < 200
    out.observe(0)  # a request that produced nothing says nothing about lengths
    assert 100 < out.mean < 200


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _serve(router: Router, speeds: dict[str, float], n: int, clock: Clock) -> dict[str, int]:
    """Dispatch ``n`` requests of 100 output tokens, one every 10 ms, each replica's latency
    following the batching model at its live load, and count the picks."""
    picks = dict.fromkeys(speeds, 0)
    inflight: list[tuple[float, str, float, float]] = []
    for _ in range(n):
        clock.t += 0.01
        inflight.sort()
        while inflight and inflight[0][0] <= clock.t:
            end, rid, start, ttft = inflight.pop(0)
            router.end(rid, (end - start) * 1000.0, ttft_ms=ttft * 1000.0, output_tokens=100)
        rid = router.pick("default").id
        router.begin(rid)
        picks[rid] += 1
        load = router.outstanding(rid)
        ttft = 0.01 * speeds[rid]
        inflight.append((clock.t + ttft + speeds[rid] * 1e-4 * 99 * (load + N0), rid, clock.t, ttft))
        for r in speeds:
            router.observe(r)  # probes keep idle replicas fresh
    return picks


def test_ect_learns_a_slow_replica_and_sends_it_less():
    clock = Clock()
    speeds = {"fast0": 1.0, "fast1": 1.0, "slow": 4.0}
    r = Router([Replica(x, "default") for x in speeds], "ladr", clock=clock, rng=random.Random(3),
               ect=3.0, alpha=0.0, beta=0.0)
    _serve(r, speeds, 500, clock)  # learning
    picks = _serve(r, speeds, 2000, clock)
    snap = {x["id"]: x for x in r.snapshot()["pools"]["default"]}
    learnt = {k: snap[k]["ect"]["tpot_per_load_s"] for k in speeds}
    assert learnt["slow"] / learnt["fast0"] == pytest.approx(4.0, rel=0.2)
    assert snap["slow"]["ect"]["observations"] > 10
    assert r.snapshot()["output_tokens_mean"]["default"] == pytest.approx(100)
    # a 4x slower replica finishes a request in about the same time only at a much smaller queue
    assert picks["slow"] < 0.5 * min(picks["fast0"], picks["fast1"])
    assert picks["slow"] > 0  # still measured
    assert abs(picks["fast0"] - picks["fast1"]) < 0.15 * picks["fast0"]


def test_ect_off_or_unmeasured_leaves_the_picks_unchanged():
    """ect = 0 (the default), or ect > 0 before any completion carried output tokens: the pick
    sequence is LADR's as before."""
    seqs = []
    for params in ({}, {"ect": 3.0}):
        clock = Clock()
        r = Router([Replica(f"r{i}", "default") for i in range(4)], "ladr", clock=clock,
                   rng=random.Random(7), **params)
        seq = []
        for i in range(300):
            clock.t += 0.01
            rid = r.pick("default").id
            r.begin(rid)
            seq.append(rid)
            if i % 3 == 0:
                r.end(seq[i // 2], 100.0 + 10 * (i % 7), ttft_ms=5.0)  # no output tokens
        seqs.append(seq)
    assert seqs[0] == seqs[1]


def test_ect_parameter_is_checked():
    r = Router([Replica("r0", "default")], "ladr")
    with pytest.raises(ValueError, match="ect"):
        r.set_params(ect=-1)
    with pytest.raises(ValueError, match="ect_n0"):
        r.set_params(ect_n0=math.nan)
    r.set_params(ect=2.0, ect_n0=8.0)
    assert r.snapshot()["params"]["ect"] == 2.0


def test_ect_weight_comes_from_config():
    from llmsla import config as config_mod
    from llmsla.control.router import from_config

    cfg = config_mod.load(env={"LLMSLA_CONTROL_LADR_ECT": "3"})
    assert from_config(cfg, [Replica("r0", "default")], shared=None).params["ect"] == 3.0
    with pytest.raises(config_mod.ConfigError, match="ladr_ect"):
        config_mod.load(env={"LLMSLA_CONTROL_LADR_ECT": "-1"})


# -- prefill speed per prompt token, change detection ---------------------------------------------

def test_prefill_converges_on_a_known_per_token_rate_whatever_the_prompt():
    """Prompts vary 100x (Mooncake) and the tokens ahead vary too: TTFT / (ahead + prompt) is
    the replica's rate, so identical replicas learn the same speed."""
    rng = random.Random(4)
    a, b = ServiceEstimate(), ServiceEstimate()
    for _ in range(500):
        for est in (a, b):
            prompt, ahead = rng.randint(100, 10_000), rng.choice((0, 0, 2_000, 30_000))
            assert est.observe_prefill(2e-5 * (ahead + prompt), ahead + prompt)
    assert a.prefill_per_token == pytest.approx(2e-5, rel=1e-6)
    assert b.prefill_per_token == pytest.approx(2e-5, rel=1e-6)


def test_noisy_prefill_stays_near_its_rate_and_equal_replicas_stay_equal():
    rng = random.Random(5)
    ests = [ServiceEstimate() for _ in range(3)]
    spread = []
    for i in range(4000):
        for est in ests:
            tokens = rng.randint(50, 20_000)
            est.observe_prefill(1e-5 * tokens * rng.lognormvariate(0, 0.3), tokens)
        if i > 500:
            vals = [e.prefill_per_token for e in ests]
            spread.append(max(vals) / min(vals))
    mean_noise = math.exp(0.3 ** 2 / 2)
    for est in ests:
        assert est.prefill_per_token == pytest.approx(1e-5 * mean_noise, rel=0.15)
    assert statistics.median(spread) < 1.15  # identical replicas look identical (no steering)


@pytest.mark.parametrize("ttft, tokens", [(math.nan, 10), (-1.0, 10), (0.1, 0), (0.1, math.inf), (math.inf, 5),
                                          (0.1, -3)])
def test_bad_prefill_observations_are_ignored(ttft, tokens):
    est = ServiceEstimate()
    est.observe_prefill(0.01, 100)
    assert est.observe_prefill(ttft, tokens) is False
    assert est.prefill_per_token == pytest.approx(1e-4)


def test_a_slowdown_is_caught_in_a_few_completions_not_dozens():
    """Residuals persistently beyond MARGIN on one side switch to FAST_GAIN until the estimate
    is within MARGIN: a replica throttled 4x is within MARGIN after RUN + a few completions,
    half what GAIN alone needs, decode and prefill alike, and back the same way."""
    def catch_up(est: ServiceEstimate, tpot: float, prefill: float) -> int:
        m = estimator.MARGIN
        n = 0
        while not (tpot / m <= est.tpot_per_load <= tpot * m and prefill / m <= est.prefill_per_token <= prefill * m):
            _complete(est, tpot, 0.01, 100, 10)
            est.observe_prefill(prefill * 1000, 1000)
            n += 1
            assert n < estimator.RUN + 8, (est.tpot_per_load, est.prefill_per_token)
        return n

    est = ServiceEstimate()
    for _ in range(300):
        _complete(est, 0.001, 0.01, 100, 10)
        est.observe_prefill(0.01, 1000)
    n = catch_up(est, 0.004, 4e-5)
    assert n >= estimator.RUN  # not on the first outliers
    plain = 0.001  # the plain EWMA's pace on the same observations
    m = 0
    while plain < 0.004 / estimator.MARGIN:
        plain = estimator._clipped_ewma(plain, 0.004, estimator.GAIN, estimator.CLIP)
        m += 1
    assert m > 2 * n
    for _ in range(300):
        _complete(est, 0.004, 0.01, 100, 10)
        est.observe_prefill(0.04, 1000)
    catch_up(est, 0.001, 1e-5)  # it recovers


def test_noise_alone_rarely_switches_to_the_fast_gain():
    """Small residuals never count, and log-normal noise of sigma 0.5 puts few observations
    beyond MARGIN: the run rarely reaches RUN on a steady replica."""
    rng = random.Random(6)
    est = ServiceEstimate()
    fast = 0
    for i in range(5000):
        est.observe_prefill(1e-5 * 1000 * rng.lognormvariate(0, 0.5), 1000)
        fast += i > 100 and abs(est.run_prefill) >= estimator.RUN
    assert fast < 0.005 * 5000


def test_reset_forgets_prefill_and_the_detectors():
    est = ServiceEstimate()
    for _ in range(20):
        _complete(est, 0.001, 0.01, 100, 10)
        est.observe_prefill(0.5, 1000)  # a far-off run: the detector is mid-run
        est.observe_prefill(0.001, 1000)
    est.reset()
    assert (est.prefill_per_token, est.run_prefill, est.run_tpot, est.tpot_per_load) == (None, 0, 0, None)
    est.observe_prefill(0.02, 1000)  # the first observation after a reset is taken whole
    assert est.prefill_per_token == pytest.approx(2e-5)


def test_memory_is_bounded_with_prefill_too():
    est = ServiceEstimate()
    for i in range(10_000):
        _complete(est, 0.001, 0.01, 2 + i % 300, 1 + i % 50)
        est.observe_prefill(0.001 * (1 + i % 7), 1 + i % 5000)
    assert not hasattr(est, "__dict__")
    assert all(not isinstance(getattr(est, f), list | dict) for f in est.__slots__)
    assert sys.getsizeof(est) < 100
