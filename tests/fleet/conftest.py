"""Helpers shared by the fleet tests: a small real-trace load and spool read-back."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmsla import config as config_mod
from llmsla.fleet import engine, traces, workload
from llmsla.fleet.sink import RecorderSink
from llmsla.spool import BadLine, published_segments, read_segment


@pytest.fixture(scope="session")
def conv_5min() -> list[workload.Arrival]:
    """Five minutes of the Azure conversation trace (about 1,600 requests)."""
    arrivals, rep = traces.load("azure_conv")
    assert rep.skipped == 0
    return workload.window(arrivals, start_s=600, duration_s=300)


@pytest.fixture()
def sim_cfg() -> config_mod.Config:
    return config_mod.load(env={})


def run_to_spool(cfg: config_mod.Config, spool: Path, sim: engine.SimConfig, arrivals, **kw):
    """Run with the real recorders writing to ``spool``; returns (result, sink)."""
    with RecorderSink(cfg, spool_dir=spool) as sink:
        res = engine.Simulator(sim).run(arrivals, sink=sink, **kw)
    return res, sink


def spool_bytes(root: Path, kind: str) -> bytes:
    return b"".join(p.read_bytes() for p in published_segments(root, kind))


def read_events(root: Path, kind: str) -> list:
    out = []
    for p in published_segments(root, kind):
        for ev in read_segment(p, kind):
            assert not isinstance(ev, BadLine), f"{ev}"
            out.append(ev)
    return out


class ListSink:
    """Keeps events in memory (for tests that look at per-request ITL without a spool)."""

    def __init__(self) -> None:
        self.requests: list = []
        self.gpus: list = []

    def request(self, event) -> None:
        self.requests.append(event.validate())

    def gpu(self, sample, model_name: str) -> None:
        self.gpus.append((sample.validate(), model_name))
