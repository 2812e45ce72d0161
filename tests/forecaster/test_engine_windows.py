"""The simulator's engine state, windowed as the store's ``engine_windows``.

``windowing.engine_windows`` (what the simulated data sets read) must compute the columns the
forecaster reads exactly as the stream job does; the stream job's pandas reference
(``tests/streaming/reference.py``, checked against the real job in tests/streaming) is the
yardstick, on a simulated run with a fault and on hand-made samples with a counter reset.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np

from llmsla import names
from llmsla.events import EngineSample
from llmsla.fleet import faults, scenarios
from llmsla.forecaster import windowing

T0 = 1_700_000_000_000


def _reference():
    """The stream job's reference, loaded by path (tests/ is not a package)."""
    name = "llmsla_stream_reference"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "streaming" / "reference.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # its dataclasses look their module up
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _same_as_reference(samples: list[EngineSample]) -> windowing.Frame:
    got = windowing.engine_windows(samples)
    want = _reference().engine_windows(samples)
    assert len(got["bucket"]) == len(want)
    for k in windowing.ENGINE_KEYS[1:]:
        assert got[k].tolist() == want[k].tolist(), k
    for v in windowing.ENGINE_VALUES:
        ref = np.array([math.nan if x is None else float(x) for x in want[v]], dtype=float)
        np.testing.assert_allclose(got[v], ref, rtol=1e-12, equal_nan=True, err_msg=v)
    return got


def _sample(ts_ms: int, replica: str, waiting: float, kv: float, preempt: float | None, reset: int = 0) -> EngineSample:
    return EngineSample(ts_ms=ts_ms, replica=replica, pool="default", engine=names.ENGINE_VLLM, waiting=waiting,
                        running=2.0, kv_usage=kv, kv_blocks_total=None, kv_block_size=None, kv_capacity_tokens=None,
                        preemptions_total=preempt, prefix_cache_hits_total=None, prefix_cache_queries_total=None,
                        prefix_cache_hit_rate=None, lora_adapters=None, counter_reset=reset, ttft=None, itl=None,
                        e2e=None, queue=None)


def test_hand_made_samples_reset_and_unknowns() -> None:
    """Increases between consecutive samples; a reset takes the sample's own value; a replica's
    first sample and a missing counter are unknown, so a window of unknowns is NaN."""
    s = [_sample(T0, "r0", 1, 0.2, 10), _sample(T0 + 2000, "r0", 3, 0.4, 12), _sample(T0 + 5000, "r0", 0, 0.1, 15),
         _sample(T0 + 7000, "r0", 2, 0.3, 4, reset=1), _sample(T0 + 1000, "r1", 5, 0.9, None),
         _sample(T0 + 6000, "r1", 6, 0.95, 7)]
    got = _same_as_reference(s)
    rows = {(int(b), r): i for i, (b, r) in enumerate(zip(got["bucket"], got["replica"], strict=True))}
    assert got["preemptions"][rows[(T0, "r0")]] == 2  # 10 -> 12; the first sample is unknown
    assert got["preemptions"][rows[(T0 + 5000, "r0")]] == 3 + 4  # 12 -> 15, then a reset to 4
    assert math.isnan(got["preemptions"][rows[(T0, "r1")]])
    assert got["waiting_mean"][rows[(T0, "r0")]] == 2 and got["kv_usage_max"][rows[(T0 + 5000, "r1")]] == 0.95


def test_simulated_engine_windows_equal_the_stream_jobs() -> None:
    """A simulated run with a ramp fault: the queue builds and the KV cache fills on r1."""
    fault = faults.Fault(100.0, 250.0, "ramp", "r1", 4.0)
    sc = scenarios.Scenario("azure_conv", 7, "6b:3", 5200.0, 300.0, 2.0, (fault,), 2.0)
    col = windowing.Collector()
    scenarios.run(sc, col, start_ms=T0, engine_sink=col.engine)
    assert len(col.engines) >= 3 * 50  # three replicas, one sample per 5 s GPU tick
    got = _same_as_reference(col.engines)
    r1 = got["replica"] == "r1"
    assert np.nanmax(got["waiting_max"][r1]) > 0 and np.nanmax(got["kv_usage_max"][r1]) > 0.05
