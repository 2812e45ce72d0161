"""Each injected fault has a visible effect inside its labelled window, on its replica, and the
label file lines up with the events' timestamps."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from llmsla import names
from llmsla.fleet import engine, faults, workload

from .conftest import ListSink

START_MS = 1_790_000_000_000
FAULTS = [
    faults.Fault(60.0, 120.0, "slowdown", "r1", 4.0),
    faults.Fault(120.0, 180.0, "memory", "r2", 0.02),
    faults.Fault(150.0, 170.0, "crash", "r3", 0.0),
    faults.Fault(200.0, 230.0, "jitter", "r0", 0.5),
]


@pytest.fixture(scope="module")
def run() -> tuple[engine.SimResult, ListSink]:
    # round robin: the router does not steer around the faults, so each replica keeps its share
    arrivals = workload.poisson(10.0, 260.0, workload.TokenDist(600, 0.5), workload.TokenDist(150, 0.5),
                                random.Random(5))
    cfg = engine.SimConfig(engine.fleet("6b:4"), policy="round_robin", seed=5, detect_s=2.0)
    sink = ListSink()
    res = engine.Simulator(cfg).run(arrivals, faults=FAULTS, sink=sink, start_ms=START_MS)
    return res, sink


def _per_token_ms(ev) -> float:
    return ev.itl_ms.mean


def _arrival_s(ev) -> float:
    return (ev.ts_ms - START_MS - ev.e2e_ms) / 1000.0


def _inside(ev, lo: float, hi: float) -> bool:
    """Arrived and finished inside [lo, hi)."""
    return lo <= _arrival_s(ev) and (ev.ts_ms - START_MS) / 1000.0 < hi


def test_slowdown_raises_itl_only_on_its_replica_in_its_window(run) -> None:
    _, sink = run
    r1_in = [_per_token_ms(e) for e in sink.requests if e.replica == "r1" and _inside(e, 60, 120)]
    r1_out = [_per_token_ms(e) for e in sink.requests if e.replica == "r1" and _inside(e, 0, 55)]
    r0_in = [_per_token_ms(e) for e in sink.requests if e.replica == "r0" and _inside(e, 60, 120)]
    assert len(r1_in) > 20 and len(r1_out) > 20
    assert statistics.median(r1_in) > 3 * statistics.median(r1_out)
    assert statistics.median(r0_in) < 1.5 * statistics.median(r1_out)


def test_memory_pressure_preempts_on_its_replica(run) -> None:
    res, _ = run
    assert res.replicas["r2"]["preemptions"] > 10
    assert all(res.replicas[r]["preemptions"] == 0 for r in ("r0", "r1", "r3"))
    preempted = [r for r in res.rows if r.preempted]
    assert preempted and all(r.replica == "r2" and r.end_s > 120 and r.arrival_s < 180 for r in preempted)


def test_crash_fails_requests_then_drains_then_recovers(run) -> None:
    res, _ = run
    # errors elsewhere: only requests too long for r2's shrunken KV cache, inside its window
    others = [r for r in res.rows if r.status == names.STATUS_ERROR and r.replica != "r3"]
    assert all(r.replica == "r2" and 120 <= r.end_s < 180 and r.prompt + 150 > 2000 for r in others)
    errors = [r for r in res.rows if r.status == names.STATUS_ERROR and r.replica == "r3"]
    assert errors
    # in-flight at the crash, or sent there before the health checker drained it (detect_s = 2)
    assert all(150 <= r.end_s <= 152.1 for r in errors)
    r3 = [r for r in res.rows if r.replica == "r3"]
    assert not [r for r in r3 if 152.1 < r.arrival_s < 170]  # drained: nothing routed there
    back = [r for r in r3 if r.arrival_s > 172.1]
    assert len(back) > 20 and all(r.status == names.STATUS_OK for r in back)
    assert all(r.status == names.STATUS_OK for r in res.rows if r.replica in ("r0", "r1"))


def test_jitter_delays_first_token_on_its_replica(run) -> None:
    _, sink = run
    inside = [e.ttft_ms for e in sink.requests if e.replica == "r0" and 200 <= _arrival_s(e) < 229]
    before = [e.ttft_ms for e in sink.requests if e.replica == "r0" and 0 <= _arrival_s(e) < 55]
    others = [e.ttft_ms for e in sink.requests if e.replica == "r1" and 200 <= _arrival_s(e) < 229]
    assert statistics.median(inside) > 300 + statistics.median(before)  # ~2 x 0.5 s mean extra
    assert statistics.median(others) < statistics.median(before) + 100


def test_label_file_lines_up_with_events(tmp_path: Path, run) -> None:
    res, sink = run
    path = faults.write_labels(tmp_path / "labels.json", res.faults, res.start_ms)
    rows = faults.read_labels(path)
    assert [(r["kind"], r["replica"]) for r in rows] == [
        ("slowdown", "r1"), ("memory", "r2"), ("crash", "r3"), ("jitter", "r0")]
    crash = rows[2]
    err_ts = [e.ts_ms for e in sink.requests if e.status == names.STATUS_ERROR and e.replica == "r3"]
    assert crash["start_ms"] <= min(err_ts) and max(err_ts) <= crash["start_ms"] + 2100


@pytest.mark.parametrize("spec, msg", [
    ("boom:r0:1:2", "fault kind"),
    ("slowdown:r0:5:1", "start < end"),
    ("memory:r0:1:2:1.5", "share of KV"),
    ("crash:*:1:2", "only allowed for jitter"),
    ("slowdown:r0:a:2", "numbers"),
    ("slowdown:r0", "expected kind"),
])
def test_bad_fault_specs_are_rejected(spec: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        faults.parse(spec)


def test_fault_on_unknown_replica_is_an_error() -> None:
    sim = engine.Simulator(engine.SimConfig(engine.fleet("6b:2")))
    with pytest.raises(ValueError, match="unknown replica 'r9'"):
        sim.run([workload.Arrival(0.0, 10, 10)], faults=[faults.parse("crash:r9:1:2")])


def test_an_operator_drain_outlives_the_crash_recovery() -> None:
    """The alert receiver drained r3 (through the control API) before it crashed: the health
    checker takes the dead replica out and puts it back when it is up, but the operator's drain
    stays until the operator restores it (the checker used to undrain it the moment the crash
    ended, which put a replica the receiver had just drained back into rotation)."""
    arrivals = workload.poisson(10.0, 120.0, workload.TokenDist(600, 0.5), workload.TokenDist(150, 0.5),
                                random.Random(6))
    cfg = engine.SimConfig(engine.fleet("6b:4"), policy="round_robin", seed=6, detect_s=2.0)
    sim = engine.Simulator(cfg)
    sim.router.drain("r3")
    sink = ListSink()
    res = sim.run(arrivals, faults=[faults.Fault(40.0, 60.0, "crash", "r3", 0.0)], sink=sink, start_ms=START_MS)
    assert sim.router.is_drained("r3")
    assert not [r for r in res.rows if r.replica == "r3"]
    assert len({r.replica for r in res.rows}) == 3 and all(r.status == names.STATUS_OK for r in res.rows)
