"""The data sets' in-memory windows equal the store's: the same simulated events go through the
real recorders into a spool, the real PyFlink job windows them into PostgreSQL, and every column
of every request and GPU window - and the features built from them - match
``forecaster.windowing`` on the events read back from the spool."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest

from llmsla import names
from llmsla.fleet import faults, scenarios
from llmsla.fleet.sink import RecorderSink
from llmsla.forecaster import features, store_io, windowing
from llmsla.forecaster import slo as slo_mod
from llmsla.spool import BadLine, published_segments, read_segment
from tests.streaming.conftest import LLMSLA_MAIN, ROOT, stream_env


def stream_once(cfg, log: Path) -> int:
    """``llmsla stream --once`` as a real process on the test's store and spool."""
    env = stream_env(cfg, watermark_delay_s=600)
    with open(log, "wb") as fh:
        return subprocess.run([sys.executable, "-c", LLMSLA_MAIN, "stream", "--once"], env=env, stdout=fh,
                              stderr=subprocess.STDOUT, cwd=ROOT, timeout=300).returncode


def _events(root, kind):
    out = []
    for p in published_segments(root, kind):
        for ev in read_segment(p, kind):
            assert not isinstance(ev, BadLine), ev
            out.append(ev)
    return out


@pytest.mark.slow
def test_windowing_equals_the_streaming_job(cfg, tmp_path) -> None:
    start = int(time.time() * 1000) - 900_000
    start -= start % 5000
    sc = scenarios.Scenario("azure_conv", 77, "6b:3", 300.0, 240.0, 1.0,
                            (faults.Fault(60.0, 200.0, "ramp", "r1", 5.0), faults.Fault(120.0, 150.0, "crash", "r2", 0.0)))
    with RecorderSink(cfg) as sink:
        scenarios.run(sc, sink, start_ms=start)
    for kind in names.SPOOL_KINDS:
        (cfg.spool_dir() / kind).mkdir(parents=True, exist_ok=True)
    assert stream_once(cfg, tmp_path / "stream.log") == 0, (tmp_path / "stream.log").read_text()[-3000:]
    req_ev, gpu_ev = _events(cfg.spool_dir(), names.SPOOL_REQUESTS), _events(cfg.spool_dir(), names.SPOOL_GPU)
    want_req = windowing.request_windows(req_ev, ttft_slo_ms=cfg.slo.ttft_ms, e2e_slo_ms=cfg.slo.e2e_ms)
    want_gpu = windowing.gpu_windows(gpu_ev)
    with psycopg.connect(cfg.store.dsn) as conn:
        got_req, got_gpu, got_pol, got_eng = store_io.read_windows(conn, start - 60_000, start + 3_600_000)
    assert len(got_pol["bucket"]) == 0 and len(got_eng["bucket"]) == 0  # the scenario wrote neither
    for want, got, keys, values in ((want_req, got_req, windowing.REQUEST_KEYS, windowing.REQUEST_VALUES),
                                    (want_gpu, got_gpu, windowing.GPU_KEYS, windowing.GPU_VALUES)):
        order_w = np.lexsort([want[k].astype(str) for k in reversed(keys)])
        order_g = np.lexsort([got[k].astype(str) for k in reversed(keys)])
        assert len(order_w) == len(order_g) > 50
        for k in keys:
            assert list(want[k][order_w]) == list(got[k][order_g]), k
        for v in values:
            np.testing.assert_allclose(got[v][order_g], want[v][order_w], rtol=1e-9, atol=1e-9, equal_nan=True,
                                       err_msg=v)
    # and the features the online scorer builds from the store equal the data set's
    slos = slo_mod.from_config(cfg)
    pol = windowing.empty(windowing.POLICY_KEYS, windowing.POLICY_VALUES)
    targets = features.targets_of(want_req)
    a = features.build(want_req, want_gpu, pol, targets=targets, t0_ms=start, n_steps=60, slos=slos)
    b = features.build(got_req, got_gpu, got_pol, targets=targets, t0_ms=start, n_steps=60, slos=slos)
    np.testing.assert_allclose(a.x, b.x, rtol=1e-9, atol=1e-9, equal_nan=True)
    assert np.array_equal(a.present, b.present) and np.allclose(a.counts, b.counts)
