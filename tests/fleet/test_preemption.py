"""KV-cache pressure: sequences are preempted (recompute) and counted, and still complete."""

from __future__ import annotations

import random

from llmsla.fleet import engine, faults, workload

from .conftest import ListSink


def _run(fault_list: list[faults.Fault]) -> tuple[engine.SimResult, ListSink]:
    arrivals = workload.burst(40, workload.TokenDist(300), workload.TokenDist(400), random.Random(1), spread_s=1.0)
    cfg = engine.SimConfig([engine.ReplicaConfig("r0", "6b")], gpu_interval_s=1.0, probe_s=0)
    sink = ListSink()
    return engine.Simulator(cfg).run(arrivals, faults=fault_list, sink=sink, start_ms=0), sink


def test_memory_pressure_causes_counted_preemptions() -> None:
    calm, calm_sink = _run([])
    assert calm.replicas["r0"]["preemptions"] == 0
    assert all(r.preempted == 0 for r in calm.rows)

    # 40 sequences of up to 700 tokens need ~28k KV tokens; 5 % of 124k leaves ~6.2k
    storm, sink = _run([faults.Fault(0.0, 60.0, "memory", "r0", 0.05)])
    st = storm.replicas["r0"]
    assert st["preemptions"] > 20, st
    assert st["preemptions"] == sum(r.preempted for r in storm.rows)  # counted per request too
    assert all(r.status == "ok" for r in storm.rows)  # recompute finishes every request
    cap = int(st["kv_capacity_tokens"] * 0.05)
    assert st["kv_peak_tokens"] <= cap
    # a preempted request waits for its recompute: a gap far above one iteration
    by_trace = {ev.trace_id: ev for ev in sink.requests}
    assert len(by_trace) == 40
    worst = max(ev.itl_ms.max for ev in sink.requests)
    assert worst > 10 * min(ev.itl_ms.mean for ev in sink.requests)
    # and the storm costs latency
    assert max(r.e2e_ms for r in storm.rows) > 1.5 * max(r.e2e_ms for r in calm.rows)
    # GPU memory samples show the memory grabbed by the fault (vs. the calm run's peak)
    assert min(s.mem_used_bytes for s, _ in sink.gpus) > 2 * max(s.mem_used_bytes for s, _ in calm_sink.gpus)
