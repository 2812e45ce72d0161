"""The online scorer's incremental reads equal a full read of the scored range on the embedded
PostgreSQL, step after step - with windows arriving late within ``reread``, the streaming job
stalling and catching up, and the clock going back - while fetching a fraction of the rows."""

from __future__ import annotations

import numpy as np
import psycopg

from llmsla import config as config_mod
from llmsla import names
from llmsla.forecaster import store_io, windowing
from llmsla.forecaster.window_cache import WindowCache
from llmsla.store.migrate import migrate

T0 = 1_800_000_000_000
STEP = 5000


def _frames(steps: range, replicas: int = 4):
    rows = [(T0 + s * STEP, f"r{r}") for s in steps for r in range(replicas)]
    req = windowing.empty(windowing.REQUEST_KEYS, windowing.REQUEST_VALUES)
    req["bucket"] = np.array([b for b, _ in rows], dtype=np.int64)
    req["model"] = np.array(["6b"] * len(rows), dtype=object)
    req["pool"] = np.array(["p"] * len(rows), dtype=object)
    req["replica"] = np.array([r for _, r in rows], dtype=object)
    req["arm"] = np.array(["a"] * len(rows), dtype=object)
    for i, v in enumerate(windowing.REQUEST_VALUES):
        req[v] = np.arange(len(rows), dtype=float) + i
    req["ttft_p99_ms"][::7] = np.nan
    gpu = windowing.empty(windowing.GPU_KEYS, windowing.GPU_VALUES)
    gpu["bucket"] = req["bucket"].copy()
    gpu["node"] = np.array(["sim-0"] * len(rows), dtype=object)
    gpu["gpu"] = np.array([int(r[1:]) for _, r in rows], dtype=np.int64)
    for v in windowing.GPU_VALUES:
        gpu[v] = np.ones(len(rows))
    pw = names.POLICY_WINDOW_S * 1000
    minutes = sorted({T0 + s * STEP - (T0 + s * STEP) % pw for s in steps})
    pol = windowing.empty(windowing.POLICY_KEYS, windowing.POLICY_VALUES)
    pol["bucket"] = np.array(minutes, dtype=np.int64)
    pol["zone"] = np.array(["p"] * len(minutes), dtype=object)
    pol["policy_id"] = np.array(["x"] * len(minutes), dtype=object)
    for v in windowing.POLICY_VALUES:
        pol[v] = np.full(len(minutes), 0.5)
    return req, gpu, pol


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
        req, gpu, pol = _frames(range(30, 40))
        late = pol["bucket"] >= T0 + 30 * STEP  # minutes not written yet (the job upserts them)
        _write(conn, (req, gpu, {k: v[late] for k, v in pol.items()}))
        for s in range(37, 42):
            step(s)
        # the clock goes back: a full read again
        step(35)
    assert cache.rows_read < full_rows / 2, (cache.rows_read, full_rows)
