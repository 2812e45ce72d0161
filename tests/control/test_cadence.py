"""LADR reads a replica's decode speed from the tokens its streams are returning now
(``Router.tokens``, control/ladr.py ``cadence``): the reading's arithmetic, a slowdown seen
before any request on the slowed replica completes, bad input, the parameters, and the
simulator telling the router its tokens as a gateway relays them
(docs/control.md#expected-completion-time-learnt-replica-speed)."""

from __future__ import annotations

import collections
import math
import random
import statistics

import pytest

from llmsla.control.router import Replica, Router

N0 = 16.0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _router(n: int = 3, **params: float) -> tuple[Router, Clock]:
    clock = Clock()
    params = {"ect": 3.0, "alpha": 0.0, "beta": 0.0, **params}
    return Router([Replica(f"r{i}", "default") for i in range(n)], "ladr", clock=clock,
                  rng=random.Random(5), **params), clock


def _ect(r: Router) -> dict[str, dict]:
    return {x["id"]: x["ect"] for x in r.snapshot()["pools"]["default"]}


def test_a_reading_is_the_mean_gap_per_unit_of_load_once_enough_tokens_came_back() -> None:
    r, clock = _router(ect_cadence=1.0)  # gain 1: the estimate is the reading
    for _ in range(4):
        r.begin("r0")  # four streams on r0 while its tokens come back
    r.tokens("r0", 40, 40 * 0.040)  # 40 ms between tokens
    clock.t += 0.3
    assert _ect(r)["r0"]["cadence_readings"] == 0  # 40 < 64 tokens: no reading yet
    assert _ect(r)["r0"]["tpot_per_load_s"] is None
    r.tokens("r0", 24, 24 * 0.040)
    clock.t += 0.3
    got = _ect(r)["r0"]
    assert got["cadence_readings"] == 1
    assert got["tpot_per_load_s"] == pytest.approx(0.040 / (4 + N0))
    # the load is the one each token came back at: 32 tokens at 4 outstanding, 32 at 1
    for _ in range(3):
        r.end("r0", 100.0)
    r.tokens("r0", 32, 32 * 0.030)
    clock.t += 0.3
    assert _ect(r)["r0"]["tpot_per_load_s"] == pytest.approx(0.040 / (4 + N0))  # 32 < 64: held
    r.begin("r1")  # another replica's load does not count
    r.tokens("r0", 32, 32 * 0.010)
    clock.t += 0.3
    want = (32 * 0.030 + 32 * 0.010) / (32 * 1 + 32 * 1 + 64 * N0)
    assert _ect(r)["r0"]["tpot_per_load_s"] == pytest.approx(want)
    assert _ect(r)["r0"]["cadence_readings"] == 2


def _stream(r: Router, clock: Clock, speeds: dict[str, float], seconds: float, step: float = 0.05) -> None:
    """Every replica has 8 streams in flight that never finish; each returns tokens at its
    speed (seconds per token = 20 ms x speed), told every ``step`` as a gateway relays them."""
    t_end = clock.t + seconds
    while clock.t < t_end - 1e-9:
        clock.t += step
        for rid, speed in speeds.items():
            gap = 0.020 * speed
            n = round(8 * step / gap)
            r.tokens(rid, n, n * gap)
            r.observe(rid)  # probes keep them fresh
        r.pick("default")  # a pick refreshes the scores when due


def test_a_slowdown_is_seen_in_the_tokens_before_any_request_completes() -> None:
    """Three equal replicas with 8 streams each, speeds learnt from their tokens; then r0
    slows 3x. Within five seconds (a request of 200 tokens there now takes 12), with no completion anywhere, r0's estimate is over twice the
    others' and LADR sends it less than half of either other's picks. With the cadence off the
    estimates stay where the completions left them (none came), and r0 keeps its share."""
    for gain, sees in ((0.1, True), (0.0, False)):
        r, clock = _router(ect_cadence=gain)
        for rid in ("r0", "r1", "r2"):
            for _ in range(8):
                r.begin(rid)
            for _ in range(3):  # completions teach a first estimate (5 ms per token at load 8 + 16)
                r.end(rid, 1000.0, ttft_ms=0.0, output_tokens=201)
                r.begin(rid)
        _stream(r, clock, {"r0": 1.0, "r1": 1.0, "r2": 1.0}, 3.0)
        before = _ect(r)
        assert before["r0"]["tpot_per_load_s"] == pytest.approx(before["r1"]["tpot_per_load_s"], rel=0.05)
        _stream(r, clock, {"r0": 3.0, "r1": 1.0, "r2": 1.0}, 5.0)
        after = _ect(r)
        ratio = after["r0"]["tpot_per_load_s"] / after["r1"]["tpot_per_load_s"]
        picks = {"r0": 0, "r1": 0, "r2": 0}
        for _ in range(600):
            picks[r.pick("default").id] += 1
        if sees:
            assert after["r0"]["cadence_readings"] > 10
            assert ratio > 2.0
            assert picks["r0"] < 0.5 * min(picks["r1"], picks["r2"])
        else:
            assert after["r0"]["cadence_readings"] == 0
            assert ratio == pytest.approx(1.0)
            assert picks["r0"] > 0.5 * min(picks["r1"], picks["r2"])


def test_with_engine_data_the_load_is_the_engines_running_batch() -> None:
    """A saturated replica: 12 requests outstanding, the engine running 4 and 8 waiting for a
    slot. Its tokens are shared by the 4 running, so the reading is the gap per 4 (+ n0), not
    per 12: counted per outstanding request it would make the replica look 1.4x faster than it
    is. Without engine data, or with a report older than ``engine_ttl_s``, the outstanding
    count stays the load; between scrapes the running batch moves with this router's requests
    (a request come back frees a slot that a waiting one takes)."""
    r, clock = _router(ect_cadence=1.0)
    for rid in ("r0", "r1"):
        for _ in range(12):
            r.begin(rid)
    r.update_engine("r0", waiting=8, running=4, kv_usage=0.9)
    clock.t += 0.3  # a refresh: r0's engine data is fresh
    r.pick("default")
    r.tokens("r0", 64, 64 * 0.050)
    r.tokens("r1", 64, 64 * 0.050)
    clock.t += 0.3
    got = _ect(r)
    assert got["r0"]["tpot_per_load_s"] == pytest.approx(0.050 / (4 + N0))
    assert got["r1"]["tpot_per_load_s"] == pytest.approx(0.050 / (12 + N0))  # no engine data
    r.end("r0", 100.0)  # one came back: a waiting request takes its slot, 4 still run
    r.tokens("r0", 64, 64 * 0.040)
    clock.t += 0.3
    assert _ect(r)["r0"]["tpot_per_load_s"] == pytest.approx(0.040 / (4 + N0))
    clock.t += 5.0  # the report is older than engine_ttl_s (3 s): the outstanding count again
    r.pick("default")
    r.tokens("r0", 64, 64 * 0.040)
    clock.t += 0.3
    assert _ect(r)["r0"]["tpot_per_load_s"] == pytest.approx(0.040 / (11 + N0))
    r.update_engine("r1", waiting=0, running=0, kv_usage=0.0)  # an engine without a running count
    clock.t += 0.3
    r.pick("default")
    r.tokens("r1", 64, 64 * 0.030)
    clock.t += 0.3
    assert _ect(r)["r1"]["tpot_per_load_s"] == pytest.approx(0.030 / (12 + N0))


@pytest.mark.parametrize("n, gap", [(0, 1.0), (-5, 1.0), (64, -1.0), (64, math.nan)])
def test_bad_token_reports_are_ignored(n: int, gap: float) -> None:
    r, clock = _router(ect_cadence=1.0)
    r.begin("r0")
    r.tokens("r0", n, gap)
    r.tokens("nobody", 64, 1.0)  # a replica removed while its stream ran: nothing to do
    clock.t += 0.3
    assert _ect(r)["r0"]["cadence_readings"] == 0
    assert _ect(r)["r0"]["tpot_per_load_s"] is None


def test_an_infinite_gap_is_not_a_reading_and_the_next_one_counts() -> None:
    r, clock = _router(ect_cadence=1.0)
    r.begin("r0")
    r.tokens("r0", 64, math.inf)
    clock.t += 0.3
    assert _ect(r)["r0"]["tpot_per_load_s"] is None
    r.tokens("r0", 64, 64 * 0.017)
    clock.t += 0.3
    assert _ect(r)["r0"]["tpot_per_load_s"] == pytest.approx(0.017 / (1 + N0))


def test_cadence_parameters_are_checked_and_come_from_config() -> None:
    from llmsla import config as config_mod
    from llmsla.control.router import from_config

    r, _ = _router()
    assert r.params["ect_cadence"] == 0.1 and r.params["ect_cadence_tokens"] == 64
    for bad in ({"ect_cadence": 1.5}, {"ect_cadence": -0.1}, {"ect_cadence_tokens": -1}):
        with pytest.raises(ValueError, match="ect_cadence"):
            r.set_params(**bad)
    cfg = config_mod.load(env={"LLMSLA_CONTROL_LADR_ECT_CADENCE": "0.3"})
    assert from_config(cfg, [Replica("r0", "default")], shared=None).params["ect_cadence"] == 0.3
    with pytest.raises(config_mod.ConfigError, match="ladr_ect_cadence"):
        config_mod.load(env={"LLMSLA_CONTROL_LADR_ECT_CADENCE": "2"})


def test_the_simulator_tells_the_router_the_tokens_as_they_stream() -> None:
    """A fleet of three 6B replicas, r0 slowed 3x throughout, LADR with its ECT: every replica's
    speed is read from its tokens, r0's about 3x the others', and the router was told each
    token past its stream's first once (the simulator's own count)."""
    from llmsla.fleet import engine, faults, workload

    arrivals = workload.poisson(12.0, 60.0, workload.TokenDist(128, 0.5, hi=1024),
                                workload.TokenDist(128, 0.3, hi=512), random.Random(2))
    cfg = engine.SimConfig(engine.fleet("6b:3"), policy="ladr", seed=2, gpu_interval_s=0,
                           router_params={"ect": 3.0, "alpha": 0.0, "beta": 0.0})
    sim = engine.Simulator(cfg)
    told: dict[str, int] = {}
    real = sim.router.tokens

    def spy(rid: str, n: int, gap_s: float) -> None:
        told[rid] = told.get(rid, 0) + n
        real(rid, n, gap_s)

    sim.router.tokens = spy  # type: ignore[method-assign]  # counts what the real router is told
    sim.run(arrivals, faults=[faults.Fault(0.0, 1e9, "slowdown", "r0", 3.0)], start_ms=0)
    ect = _ect(sim.router)
    assert all(ect[rid]["cadence_readings"] > 10 for rid in ("r0", "r1", "r2"))
    slow = ect["r0"]["tpot_per_load_s"] / statistics.fmean([ect["r1"]["tpot_per_load_s"], ect["r2"]["tpot_per_load_s"]])
    assert 2.0 < slow < 4.5
    for rid, rep in sim.reps.items():  # every token told once, none twice (the last ones may be untold)
        assert 0.95 * rep.decoded <= told[rid] <= rep.decoded



def _taught(**params: float) -> tuple[Router, Clock]:
    """A router of two replicas that learnt the same speed from 20 completions each."""
    r, clock = _router(2, **params)
    for _ in range(20):
        for rid in ("r0", "r1"):
            r.begin(rid)
            r.end(rid, 1000.0, ttft_ms=100.0, output_tokens=100)
    return r, clock


def _picks(feed: list[dict[str, tuple[float, float]]] | None, n: int = 300) -> list[str]:
    """Picks of a router whose two replicas learnt the same speed and hold 8 requests each,
    after the engine reports in ``feed`` (each a scrape: replica -> (waiting, running))."""
    r, clock = _taught()
    for rid in ("r0", "r1"):
        for _ in range(8):
            r.begin(rid)
    for scrape in feed or []:
        for rid, (waiting, running) in scrape.items():
            r.update_engine(rid, waiting=waiting, running=running, kv_usage=0.5)
    clock.t += 0.25  # a refresh: the scores the picks below all share
    return [r.pick("default").id for _ in range(n)]


def test_a_full_batch_makes_a_new_request_wait_for_a_slot() -> None:
    """r0's engine reports 6 of its 8 requests waiting beside a running batch of 2, the most it
    ever ran: its batch is full, so a new request would wait there for running ones to finish
    (``ladr.slot_turn``) and the picks go to r1. The same report from a replica that once ran
    16 at a time means requests between two scheduler steps, not a full batch: the picks are
    those of a router without engine data, pick for pick."""
    from llmsla.control import ladr

    full = _picks([{"r0": (6, 2), "r1": (0, 8)}])
    assert full.count("r1") > 0.9 * len(full), collections.Counter(full)
    roomy = _picks([{"r0": (0, 16), "r1": (0, 8)}, {"r0": (6, 2), "r1": (0, 8)}])
    assert roomy == _picks(None)
    assert 0.35 < roomy.count("r1") / len(roomy) < 0.65

    r, clock = _router(1)
    r.update_engine("r0", waiting=3, running=4, kv_usage=0.9)
    st = r._states["r0"]
    st.engine_fresh = True
    assert ladr.batch_full(st) and r.snapshot()["pools"]["default"][0]["engine"]["batch_full"] is True
    assert ladr.slot_turn(st, ladr.engine_now(st), 0.5, N0) == pytest.approx(0.5 * (4 + N0) / 4)
    r.update_engine("r0", waiting=3, running=0, kv_usage=0.0)  # an engine without a running count
    assert not ladr.batch_full(st) and ladr.slot_turn(st, ladr.engine_now(st), 0.5, N0) == 0.0


def test_a_kv_bound_batch_is_full_below_its_peak() -> None:
    """A replica whose KV cache is all but full holds its waiting requests back with fewer
    running than its peak (long prompts): still full. The same batch with a roomy cache is
    not."""
    from llmsla.control import ladr

    r, _ = _router(1)
    st = r._states["r0"]
    r.update_engine("r0", waiting=0, running=57, kv_usage=0.9)
    r.update_engine("r0", waiting=4, running=55, kv_usage=0.99)
    assert ladr.batch_full(st)
    r.update_engine("r0", waiting=4, running=55, kv_usage=0.5)
    assert not ladr.batch_full(st)


@pytest.mark.parametrize("ect, sharpness", [(3.0, 8.0), (50.0, 8.0), (3.0, 100.0), (1000.0, 1000.0)])
def test_extreme_scores_do_not_overflow_the_sampler(ect: float, sharpness: float) -> None:
    """A full replica 2,000 requests deep beside an idle one, at the parameters an operator may
    set: every pick goes to the idle replica, none raises (a base far above the best member's
    once overflowed the float)."""
    r, clock = _taught(ect=ect, sharpness=sharpness)
    for _ in range(2000):
        r.begin("r0")
    r.begin("r1")
    r.update_engine("r0", waiting=1990, running=10, kv_usage=0.99)
    r.update_engine("r1", waiting=0, running=1, kv_usage=0.1)
    clock.t += 0.3
    picks = [r.pick("default").id for _ in range(50)]
    assert picks.count("r1") >= 49
