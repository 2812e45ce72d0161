"""Simulated traffic looks like gateway traffic: every spool line validates against the
events.py contracts (read back with spool.read_segment), and the recorders' Prometheus series
agree with the events computed independently from the spool."""

from __future__ import annotations

import time
from pathlib import Path

from llmsla import names
from llmsla.events import GpuSample, RequestEvent
from llmsla.fleet import engine, faults

from .conftest import read_events, run_to_spool


def _sample(reg, name: str, **labels) -> float:
    total = 0.0
    for metric in reg.collect():
        for s in metric.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def test_events_validate_and_match_metrics(tmp_path: Path, sim_cfg, conv_5min) -> None:
    sim = engine.SimConfig(engine.fleet("6b:3,70b:1"), policy="least_outstanding", seed=3, timeout_s=60)
    res, sink = run_to_spool(sim_cfg, tmp_path / "spool", sim, conv_5min,
                             faults=[faults.parse("crash:r1:100:130")])
    reqs = read_events(tmp_path / "spool", names.SPOOL_REQUESTS)
    gpus = read_events(tmp_path / "spool", names.SPOOL_GPU)
    assert all(isinstance(e, RequestEvent) for e in reqs) and len(reqs) == len(conv_5min)
    assert all(isinstance(e, GpuSample) for e in gpus)
    # every replica sampled every 5 s while up (r1 misses the crash window)
    assert len({(g.node, g.gpu) for g in gpus}) == 4
    statuses = {e.status for e in reqs}
    assert names.STATUS_OK in statuses and names.STATUS_ERROR in statuses
    # default anchoring: the whole run lies in the recent past (the stream job's window)
    now_ms = time.time() * 1000
    assert all(now_ms - 7 * 86400e3 < e.ts_ms <= now_ms for e in reqs + gpus)
    reg = sink.registry
    assert _sample(reg, names.REQUESTS + "_total") == len(reqs)
    for status in statuses:
        assert _sample(reg, names.REQUESTS + "_total", status=status) == sum(e.status == status for e in reqs)
    out_tokens = sum(e.output_tokens for e in reqs)
    assert _sample(reg, names.TOKENS + "_total", kind=names.TOKEN_KIND_OUTPUT) == out_tokens
    # histogram bucket at the 10 s SLO bound == events with e2e <= 10 s, per replica
    for rid in ("r0", "r3"):
        want = sum(e.e2e_ms <= 10_000 for e in reqs if e.replica == rid)
        got = _sample(reg, names.REQUEST_E2E_SECONDS + "_bucket", replica=rid, le="10.0")
        assert got == want
    # the GPU gauges hold the last sample of each GPU
    last = {}
    for g in gpus:
        last[g.uuid] = g
    for g in last.values():
        assert _sample(reg, names.GPU_MEMORY_USED_BYTES, uuid=g.uuid) == g.mem_used_bytes
