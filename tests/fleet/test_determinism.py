"""Same seed -> byte-identical event stream (requests and GPU samples), with LADR's random
sampling, network jitter and every fault kind in play; a different seed changes it."""

from __future__ import annotations

from pathlib import Path

from llmsla.fleet import engine, faults

from .conftest import run_to_spool, spool_bytes

FAULTS = [
    faults.parse("slowdown:r1:30:90:3"),
    faults.parse("memory:r2:60:120:0.05"),
    faults.parse("crash:r3:150:180"),
    faults.parse("jitter:*:200:230:0.2"),
]


def _run(tmp: Path, name: str, cfg, arrivals, seed: int) -> tuple[bytes, bytes, list]:
    sim = engine.SimConfig(engine.fleet("6b:4"), policy="ladr", seed=seed)
    res, _ = run_to_spool(cfg, tmp / name, sim, arrivals, faults=FAULTS, start_ms=1_790_000_000_000)
    return spool_bytes(tmp / name, "requests"), spool_bytes(tmp / name, "gpu"), res.rows


def test_same_seed_same_bytes(tmp_path: Path, sim_cfg, conv_5min) -> None:
    a_req, a_gpu, a_rows = _run(tmp_path, "a", sim_cfg, conv_5min, seed=7)
    b_req, b_gpu, b_rows = _run(tmp_path, "b", sim_cfg, conv_5min, seed=7)
    assert a_req.count(b"\n") == len(conv_5min) == len(a_rows)
    assert a_gpu.count(b"\n") > 0
    assert a_req == b_req
    assert a_gpu == b_gpu
    c_req, _, _ = _run(tmp_path, "c", sim_cfg, conv_5min, seed=8)
    assert c_req != a_req
