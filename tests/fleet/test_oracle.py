"""The simulator's oracle policy and its engine signals to the router (docs/fleet.md#the-oracle)."""

from __future__ import annotations

import hashlib
import random

import pytest

from llmsla import config as config_mod
from llmsla.fleet import engine, faults, models, oracle, stats, workload
from llmsla.fleet.replica import ReplicaSim

CHAT = (workload.TokenDist(128, 0.5, hi=1024), workload.TokenDist(128, 0.3, hi=512))


def test_completion_on_an_idle_replica_is_one_prefill_then_decode_steps():
    spec = models.get("6b")
    rep = ReplicaSim("r0", "default", "", spec, 0)
    expect = (spec.b0_s + spec.b1_s * 500) + 99 * (spec.b0_s + spec.b2_s * 1)
    assert oracle.completion_s(rep, 500, 100, 3.0) == pytest.approx(expect)
    rep.slow = 2.0
    assert oracle.completion_s(rep, 500, 100, 3.0) == pytest.approx(2 * expect)
    rep.up = False
    assert oracle.completion_s(rep, 500, 100, 3.0) == float("inf")


def test_oracle_prefers_the_faster_then_the_emptier_replica():
    fast = ReplicaSim("fast", "default", "", models.get("6b"), 0)
    slow = ReplicaSim("slow", "default", "", models.get("70b"), 1)
    assert oracle.pick([slow, fast], 128, 128, 0.0, {}) is fast
    busy = ReplicaSim("busy", "default", "", models.get("6b"), 2)
    queued = engine.Req(0, 0.0, 2000, 400)  # in transit to "busy": the oracle sees it too
    assert oracle.pick([busy, fast], 128, 128, 0.0, {"busy": [queued]}) is fast
    assert oracle.completion_s(busy, 128, 128, 0.0, [queued]) > oracle.completion_s(fast, 128, 128, 0.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_never_loses_to_round_robin_with_a_half_speed_replica(seed):
    arr = workload.poisson(14.0, 90.0, *CHAT, random.Random(seed))
    slow = [faults.Fault(0.0, 1e9, "slowdown", "r0", 2.0)]
    out = {}
    for policy in ("round_robin", "oracle"):
        cfg = engine.SimConfig(engine.fleet("6b:3"), policy=policy, seed=seed, gpu_interval_s=0)
        out[policy] = stats.summarize(engine.Simulator(cfg).run(arr, faults=slow, start_ms=0))
    assert out["oracle"]["requests"] == out["round_robin"]["requests"] == len(arr)
    assert out["oracle"]["e2e_p99_ms"] <= out["round_robin"]["e2e_p99_ms"]
    assert out["oracle"]["ttft_p99_ms"] <= out["round_robin"]["ttft_p99_ms"]


def test_oracle_is_the_simulators_only():
    with pytest.raises(config_mod.ConfigError, match="route_policy"):
        config_mod.load(env={"LLMSLA_CONTROL_ROUTE_POLICY": "oracle"})
    with pytest.raises(ValueError, match="policy"):
        engine.Simulator(engine.SimConfig(engine.fleet("6b:2"), policy="psychic"))


def test_engine_signals_reach_the_router_at_the_scrape_cadence():
    arr = workload.poisson(30.0, 20.0, *CHAT, random.Random(3))
    cfg = engine.SimConfig(engine.fleet("70b:1,6b:2"), policy="ladr", seed=3, gpu_interval_s=0,
                           engine_scrape_s=1.0)
    sim = engine.Simulator(cfg)
    seen: list[tuple[float, float]] = []
    update = sim.router.update_engine

    def spy(rid, **kw):
        seen.append((sim.now, kw["at"]))
        assert kw["kv_usage"] <= 1.0 and kw["waiting"] >= 0
        update(rid, **kw)

    sim.router.update_engine = spy  # type: ignore[method-assign]
    res = sim.run(arr, start_ms=0)
    times = sorted({t for t, _ in seen})
    assert times[:3] == [0.0, 1.0, 2.0] and all(t == at for t, at in seen)
    assert len(seen) == 3 * len(times)
    snap = {x["id"]: x for x in res.router["pools"]["default"]}
    assert all(x["engine"] is not None and x["engine"]["age_s"] <= 1.0 for x in snap.values())


def test_engine_scrape_is_off_by_default_and_picks_are_as_before():
    """Without engine signals the simulator's LADR picks what it picked before they existed
    (the hash was computed on that code)."""
    arr = workload.poisson(14.0, 60.0, *CHAT, random.Random(5))
    cfg = engine.SimConfig(engine.fleet("70b:1,6b:2"), policy="ladr", seed=5, gpu_interval_s=0)
    res = engine.Simulator(cfg).run(arr, faults=[faults.Fault(0.0, 1e9, "slowdown", "r1", 2.0)], start_ms=0)
    assert all(x["engine"] is None for x in res.router["pools"]["default"])
    rows = sorted(res.rows)
    assert len(rows) == 860
    assert hashlib.sha256(",".join(r.replica for r in rows).encode()).hexdigest()[:16] == "a27d9dcf042e076c"
