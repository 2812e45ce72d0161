"""The gradual fault kinds (the forecaster's precursors): their strength grows over the window,
visibly in the events, on their replica only; surges add load; crashes stay abrupt; the
randomised scenarios are a pure function of (trace, seed)."""

from __future__ import annotations

import random
import statistics

import pytest

from llmsla.fleet import engine, faults, scenarios, workload

from .conftest import ListSink

START_MS = 1_790_000_000_000


def _run(fault_list, *, seconds=400.0, rate=8.0, seed=3):
    arrivals = workload.poisson(rate, seconds, workload.TokenDist(600, 0.5), workload.TokenDist(150, 0.5),
                                random.Random(seed))
    cfg = engine.SimConfig(engine.fleet("6b:3"), policy="round_robin", seed=seed)
    sink = ListSink()
    res = engine.Simulator(cfg).run(arrivals, faults=fault_list, sink=sink, start_ms=START_MS)
    return res, sink


def _itl(sink, rep, lo, hi):
    vals = [e.itl_ms.mean for e in sink.requests
            if e.replica == rep and e.itl_ms.n and lo <= (e.ts_ms - START_MS) / 1000 < hi]
    assert len(vals) > 10
    return statistics.median(vals)


def test_ramp_grows_gradually_on_its_replica_only() -> None:
    _, sink = _run([faults.Fault(100.0, 300.0, "ramp", "r1", 6.0)])
    before, early, late = _itl(sink, "r1", 20, 100), _itl(sink, "r1", 110, 160), _itl(sink, "r1", 250, 300)
    assert before * 1.2 < early < late and late > 3 * before  # grows, not a step
    assert _itl(sink, "r0", 250, 300) < 1.5 * _itl(sink, "r0", 20, 100)


def test_thermal_heats_then_throttles() -> None:
    _, sink = _run([faults.Fault(100.0, 340.0, "thermal", "r2", 6.0)])
    temps = {int((s.ts_ms - START_MS) / 1000): s.temp_c for s, _ in sink.gpus if s.gpu == 2}
    assert temps[300] > temps[95] + 15  # rising temperature is the precursor
    # the first third of the window is only heat; then the clocks drop
    assert _itl(sink, "r2", 110, 170) < 1.3 * _itl(sink, "r2", 20, 100) < _itl(sink, "r2", 290, 340)


def test_leak_shrinks_kv_until_preemptions() -> None:
    res, sink = _run([faults.Fault(60.0, 360.0, "leak", "r0", 0.01)], rate=10.0)
    mem = [(int((s.ts_ms - START_MS) / 1000), s.mem_used_bytes) for s, _ in sink.gpus if s.gpu == 0]
    m = dict(mem)
    assert m[55] < m[200] < m[350]  # memory creeps up
    assert res.replicas["r0"]["preemptions"] > 0 and res.replicas["r1"]["preemptions"] == 0


def test_surge_adds_load_growing_to_its_factor() -> None:
    base = workload.poisson(5.0, 600.0, workload.TokenDist(100), workload.TokenDist(10), random.Random(1))
    out = workload.surge(base, 200.0, 500.0, 3.0, random.Random(2))
    count = lambda arr, lo, hi: sum(lo <= a.t < hi for a in arr)  # noqa: E731
    assert count(out, 0, 200) == count(base, 0, 200)
    assert count(out, 200, 300) < count(out, 400, 500)
    assert 2.3 < count(out, 450, 500) / count(base, 450, 500) < 3.5
    assert out == sorted(out)


def test_fault_specs_for_new_kinds() -> None:
    assert faults.parse("ramp:r1:10:20:5").slow_at(15) == pytest.approx(3.0)
    assert faults.parse("leak:r1:0:100:0.1").kv_share_at(50) == pytest.approx(0.55)
    for bad in ("surge:r1:0:10:2", "ramp:*:0:10:2", "leak:r0:0:10:1.5", "thermal:r0:0:10:0.5"):
        with pytest.raises(ValueError):
            faults.parse(bad)


def test_scenarios_are_a_function_of_trace_and_seed() -> None:
    a = scenarios.make("azure_conv", 7, lo_s=0, hi_s=3000, duration_s=1500)
    assert a == scenarios.make("azure_conv", 7, lo_s=0, hi_s=3000, duration_s=1500)
    assert a != scenarios.make("azure_conv", 8, lo_s=0, hi_s=3000, duration_s=1500)
    assert 0 <= a.start_s <= 1500 and a.faults
    prev_end = 0.0
    for f in a.faults:  # one after another, healthy gaps, after the warm-up
        assert f.start_s >= max(400.0, prev_end + 200.0) and f.end_s <= 1500 - 60
        prev_end = f.end_s
    with pytest.raises(ValueError, match="shorter"):
        scenarios.make("azure_conv", 1, lo_s=0, hi_s=1000, duration_s=1500)


def test_gradual_runs_are_deterministic() -> None:
    fl = [faults.Fault(50.0, 150.0, "ramp", "r0", 4.0), faults.Fault(60.0, 200.0, "leak", "r1", 0.02),
          faults.Fault(80.0, 190.0, "thermal", "r2", 5.0)]
    a = _run(fl, seconds=220.0)[1]
    b = _run(fl, seconds=220.0)[1]
    assert [e.to_json() for e in a.requests] == [e.to_json() for e in b.requests]
    assert [s.to_json() for s, _ in a.gpus] == [s.to_json() for s, _ in b.gpus]
