"""The online scorer's incremental reads equal a full read of the scored range on the embedded
PostgreSQL, step after step - with windows arriving late within ``reread``, the streaming job
stalling and catching up, and the clock going back - while fetching a fraction of the rows; and
the features it rolls forward from them (``FeatureWindow``) equal a full build of each window."""

from __future__ import annotations

import numpy as np
import psycopg

from llmsla import config as config_mod
from llmsla import names
from llmsla.forecaster import features, store_io, windowing
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.feature_window import FeatureWindow
from llmsla.forecaster.window_cache import WindowCache
from llmsla.store.migrate import migrate

T0 = 1_800_000_000_000
STEP = 5000


def _frames(steps: range, replicas: int | list[int] = 4, seed: int = 0):
    reps = range(replicas) if isinstance(replicas, int) else replicas
    rows = [(T0 + s * STEP, f"r{r}") for s in steps for r in reps]
    req = windowing.empty(windowing.REQUEST_KEYS, windowing.REQUEST_VALUES)
    req["bucket"] = np.array([b for b, _ in rows], dtype=np.int64)
    req["model"] = np.array(["6b"] * len(rows), dtype=object)
    req["pool"] = np.array(["p"] * len(rows), dtype=object)
    req["replica"] = np.array([r for _, r in rows], dtype=object)
    req["arm"] = np.array(["a"] * len(rows), dtype=object)
    req[names.L_TENANT] = np.array([names.DEFAULT_TENANT] * len(rows), dtype=object)
    req[names.L_CLASS] = np.array([names.DEFAULT_CLASS] * len(rows), dtype=object)
    rng = np.random.default_rng(seed)
    for i, v in enumerate(windowing.REQUEST_VALUES):
        req[v] = np.arange(len(rows), dtype=float) + i + rng.uniform(0, 50, len(rows))
    req["ttft_p99_ms"][::7] = np.nan
    gpu = windowing.empty(windowing.GPU_KEYS, windowing.GPU_VALUES)
    gpu["bucket"] = req["bucket"].copy()
    gpu["node"] = np.array(["sim-0"] * len(rows), dtype=object)
    gpu["gpu"] = np.array([int(r[1:]) for _, r in rows], dtype=np.int64)
    for v in windowing.GPU_VALUES:
        gpu[v] = rng.uniform(0.1, 1, len(rows))
    gpu["mem_total_bytes"] = np.full(len(rows), 80e9)
    gpu["mem_used_max_bytes"] = rng.uniform(1e9, 79e9, len(rows))
    pw = names.POLICY_WINDOW_S * 1000
    minutes = sorted({T0 + s * STEP - (T0 + s * STEP) % pw for s in steps})
    pol = windowing.empty(windowing.POLICY_KEYS, windowing.POLICY_VALUES)
    pol["bucket"] = np.array(minutes, dtype=np.int64)
    pol["zone"] = np.array(["p"] * len(minutes), dtype=object)
    pol["policy_id"] = np.array(["x"] * len(minutes), dtype=object)
    for v in windowing.POLICY_VALUES:
        pol[v] = rng.uniform(0, 1, len(minutes))
    eng = windowing.empty(windowing.ENGINE_KEYS, windowing.ENGINE_VALUES)
    eng["bucket"] = req["bucket"].copy()
    eng["pool"] = req["pool"].copy()
    eng["replica"] = req["replica"].copy()
    eng["engine"] = np.array([names.ENGINE_VLLM] * len(rows), dtype=object)
    for v in windowing.ENGINE_VALUES:
        eng[v] = rng.uniform(0, 8, len(rows))
    eng["kv_usage_max"] = rng.uniform(0, 1, len(rows))
    eng["preemptions"][::5] = np.nan  # a replica's first sample: unknown
    eng["samples"] = np.full(len(rows), 5.0)
    eng["counter_resets"] = np.zeros(len(rows))
    return req, gpu, pol, eng


def _write(conn: psycopg.Connection, frames) -> None:
    for t, f in zip(store_io.TABLES, frames, strict=True):
        store_io.write_frame(conn, t.table, t.keys, t.values, f)


def _equal(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w)
        for k in w:
            assert np.array_equal(g[k], w[k], equal_nan=g[k].dtype.kind == "f"), k


def test_incremental_reads_equal_full_reads(pg_dsn) -> None:
    cfg = config_mod.load(env={})
    window, reread = 16, 20_000
    with psycopg.connect(pg_dsn) as conn:
        migrate(conn, cfg)
        _write(conn, _frames(range(0, 30)))
        cache = WindowCache(reread)
        full_rows = 0

        def step(s: int) -> None:
            nonlocal full_rows
            t0, end = T0 + (s - window + 1) * STEP, T0 + (s + 1) * STEP
            want = store_io.read_windows(conn, t0, end)
            full_rows += sum(len(f["bucket"]) for f in want)
            _equal(cache.read(conn, t0, end), want)

        for s in range(20, 30):
            step(s)
        # a late upsert of a window the cache already holds, inside reread: seen
        conn.execute(f"UPDATE {names.T_REQUEST_WINDOWS} SET requests = -1 WHERE bucket = %s AND replica = 'r1'",
                     (store_io._ts(T0 + 27 * STEP),))
        conn.commit()
        step(30)
        # the streaming job stalls (nothing new for 6 steps), then writes them all at once
        for s in range(31, 37):
            step(s)
        req, gpu, pol, eng = _frames(range(30, 40))
        late = pol["bucket"] >= T0 + 30 * STEP  # minutes not written yet (the job upserts them)
        _write(conn, (req, gpu, {k: v[late] for k, v in pol.items()}, eng))
        for s in range(37, 42):
            step(s)
        # the clock goes back: a full read again
        step(35)
    assert cache.rows_read < full_rows / 2, (cache.rows_read, full_rows)


def _same_series(got: features.TargetSeries, want: features.TargetSeries) -> None:
    assert got.targets == want.targets and got.models == want.models and got.t0_ms == want.t0_ms
    for name in ("x", "present", "counts", "signals"):
        assert np.array_equal(getattr(got, name), getattr(want, name), equal_nan=name != "present"), name


def test_rolled_features_equal_a_full_build(pg_dsn) -> None:
    """Step by step through late upserts (request and policy windows), a stall and its catch-up,
    a replica joining and one leaving the window, a gap and the clock going back: every step's
    rolled series equals ``features.build`` over a full read, and most steps build a few steps."""
    cfg = config_mod.load(env={})
    slos = slo_mod.from_config(cfg)
    window, reread = 24, 35_000  # at step 31 the policy minute of step 12 is the first one re-read,
    # and it feeds a step (23) before the first request window re-read (24)
    with psycopg.connect(pg_dsn) as conn:
        migrate(conn, cfg)
        _write(conn, _frames(range(0, 31), seed=1))
        cache, fw = WindowCache(reread), FeatureWindow(window, slos, feature_names=features.KNOWN)
        steps = 0

        def step(s: int) -> None:
            nonlocal steps
            t0, end = T0 + (s - window + 1) * STEP, T0 + (s + 1) * STEP
            req, gpu, pol, eng = cache.read(conn, t0, end)
            got = fw.update(req, gpu, pol, t0_ms=t0, changed_from_ms=cache.changed_from_ms, eng=eng)
            want_req, want_gpu, want_pol, want_eng = store_io.read_windows(conn, t0, end)
            on_grid = {k: v[want_req["bucket"] >= t0] for k, v in want_req.items()}
            want = features.build(want_req, want_gpu, want_pol, targets=features.targets_of(on_grid), t0_ms=t0,
                                  n_steps=window, slos=slos, feature_names=features.KNOWN, eng=want_eng)
            _same_series(got, want)
            steps += 1

        for s in range(20, 31):
            step(s)
        builds_before = fw.full_builds
        conn.execute(f"UPDATE {names.T_REQUEST_WINDOWS} SET requests = 99, e2e_p99_ms = 12345 "
                     "WHERE bucket = %s AND replica = 'r1'", (store_io._ts(T0 + 27 * STEP),))
        assert T0 % 60_000 == 0  # so minute 12 feeds steps 23-34, in the window
        conn.execute(f"UPDATE {names.T_POLICY_WINDOWS} SET temperature_jitter = 7 WHERE bucket = %s",
                     (store_io._ts(T0 + 12 * STEP),))
        conn.execute(f"UPDATE {names.T_ENGINE_WINDOWS} SET waiting_mean = 42 WHERE bucket = %s AND replica = 'r2'",
                     (store_io._ts(T0 + 28 * STEP),))
        conn.commit()
        step(31)
        col = features.KNOWN.index("engine_waiting")
        assert fw.last is not None and (fw.last.x[:, 28 - (31 - window + 1), col] >= 42).any(), "late engine upsert seen"
        assert fw.full_builds == builds_before, "a late upsert inside reread is rolled in, not rebuilt"
        for s in range(32, 37):  # stalled: nothing new
            step(s)
        # the job catches up; r3 is gone from now on and r5 joins
        req, gpu, pol, eng = _frames(range(31, 61), replicas=[0, 1, 2, 5], seed=2)
        late = pol["bucket"] >= T0 + 31 * STEP
        _write(conn, (req, gpu, {k: v[late] for k, v in pol.items()}, eng))
        for s in range(37, 60):  # r3 leaves the window at s = 53
            step(s)
        step(52)  # the clock goes back
        step(80)  # a gap as long as the window
    assert steps == 42
    # whole windows: the first, r5 joining, r3 leaving, the clock going back, the gap
    assert fw.full_builds == 5, fw.full_builds
    assert fw.steps_built < steps * window / 2, (fw.steps_built, steps * window)
