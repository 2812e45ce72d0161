"""Load shedding in the fleet simulator: the same counter the gateway applies, no event for a
shed request (as at the gateway), and a batch flood shed away gives the interactive class its
TTFT back."""

from __future__ import annotations

import random

from llmsla.control.shed import ShedControls
from llmsla.fleet import engine, workload

CLASSES = ("interactive", "batch", "sheddable")


def _load(seconds: float = 60.0) -> list[workload.Arrival]:
    rng = random.Random(7)
    out = []
    for rate, cls in ((2.0, "interactive"), (14.0, "batch")):  # the batch tenant floods the replica
        t = 0.0
        while (t := t + rng.expovariate(rate)) < seconds:
            out.append(workload.Arrival(t, 256, 128, "", cls))
    return sorted(out)


def _run(shares: dict[str, float] | None) -> tuple[engine.Simulator, list]:
    got: list = []

    class Sink:
        def request(self, ev):  # noqa: ANN001
            got.append(ev)

        def gpu(self, sample, model_name):  # noqa: ANN001
            pass

    shed = ShedControls(CLASSES, ["default"])
    if shares:
        shed.set_shares("default", shares, actor="test")
    cfg = engine.SimConfig([engine.ReplicaConfig("r0", "6b")], seed=0, gpu_interval_s=0, probe_s=0)
    sim = engine.Simulator(cfg, shed=shed)
    sim.run(_load(), sink=Sink(), start_ms=0)
    return sim, got


def _attainment(events: list, cls: str, ttft_ms: float = 1000.0) -> float:
    mine = [e for e in events if e.class_ == cls]
    return sum(e.ttft_ms is not None and e.ttft_ms <= ttft_ms for e in mine) / len(mine)


def test_shedding_is_exact_and_records_no_event() -> None:
    arrivals = _load()
    n_batch = sum(a.class_ == "batch" for a in arrivals)
    sim, events = _run({"batch": 0.5})
    assert sim.shed_counts == {("default", "batch"): n_batch // 2}
    assert len(events) == len(arrivals) - n_batch // 2
    assert sum(e.class_ == "interactive" for e in events) == len(arrivals) - n_batch  # never shed


def test_shedding_the_flood_gives_interactive_its_ttft_back() -> None:
    _, flooded = _run(None)
    _, shed = _run({"batch": 1.0})
    before, after = _attainment(flooded, "interactive"), _attainment(shed, "interactive")
    print(f"interactive TTFT <= 1 s: {before:.3f} flooded, {after:.3f} with batch shed")
    assert before < 0.5 and after > 0.99
