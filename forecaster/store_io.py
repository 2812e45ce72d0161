"""Reading the store's windows into frames and writing scores to ``forecasts``.

The column names are the store's (``llmsla/store/migrations/0001_core.sql``), so a frame read
here and one computed by :mod:`llmsla.forecaster.windowing` are interchangeable for
:func:`llmsla.forecaster.features.build`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import psycopg

from llmsla import names
from llmsla.forecaster import windowing as w
from llmsla.seams import StoreReader


def read_table(conn: StoreReader, table: str, keys: tuple[str, ...], values: tuple[str, ...],
          from_ms: int, to_ms: int) -> w.Frame:
    """Rows of ``table`` with ``from_ms <= bucket < to_ms`` as a frame (NULL -> NaN)."""
    cols = ["(extract(epoch from bucket) * 1000)::bigint", *keys[1:], *values]
    rows = conn.execute(
        f"SELECT {', '.join(cols)} FROM {table} WHERE bucket >= %s AND bucket < %s "
        f"ORDER BY {', '.join(str(i + 1) for i in range(len(keys)))}",  # a stable row order: sums add alike
        (_ts(from_ms), _ts(to_ms))).fetchall()
    if not rows:
        return w.empty(keys, values)
    out: w.Frame = {}
    cols_t = list(zip(*rows, strict=True))
    for i, k in enumerate(keys):
        out[k] = np.asarray(cols_t[i], dtype=np.int64 if k in ("bucket", "gpu") else object)
    for j, v in enumerate(values):
        out[v] = np.array(cols_t[len(keys) + j], dtype=float)  # NULL (None) becomes NaN
    return out


@dataclass(frozen=True)
class Table:
    """A window table the scorer reads: its columns, and how far before the scored range."""

    table: str
    keys: tuple[str, ...]
    values: tuple[str, ...]
    lookback_ms: int = 0
    width_ms: int = names.REQUEST_WINDOW_S * 1000


#: request, GPU, policy and engine windows; a 60 s policy window is used for the minute after
#: it, so policy rows are read from two minutes before the scored range
TABLES: tuple[Table, ...] = (
    Table(names.T_REQUEST_WINDOWS, w.REQUEST_KEYS, w.REQUEST_VALUES),
    Table(names.T_GPU_WINDOWS, w.GPU_KEYS, w.GPU_VALUES, width_ms=names.GPU_WINDOW_S * 1000),
    Table(names.T_POLICY_WINDOWS, w.POLICY_KEYS, w.POLICY_VALUES, lookback_ms=2 * names.POLICY_WINDOW_S * 1000,
          width_ms=names.POLICY_WINDOW_S * 1000),
    Table(names.T_ENGINE_WINDOWS, w.ENGINE_KEYS, w.ENGINE_VALUES, width_ms=names.ENGINE_WINDOW_S * 1000),
)


def read_windows(conn: StoreReader, from_ms: int, to_ms: int) -> tuple[w.Frame, w.Frame, w.Frame, w.Frame]:
    """Request, GPU and engine windows with ``from_ms <= bucket < to_ms``; policy windows from
    two minutes earlier (a 60 s window is used for the minute after it). In :data:`TABLES` order:
    requests, GPUs, policies, engines."""
    requests, gpus, policies, engines = (read_table(conn, t.table, t.keys, t.values, from_ms - t.lookback_ms, to_ms)
                                         for t in TABLES)
    return requests, gpus, policies, engines


def write_frame(conn: psycopg.Connection, table: str, keys: tuple[str, ...], values: tuple[str, ...],
                frame: w.Frame) -> int:
    """Insert a frame's rows (NaN as NULL): simulated windows into a store for the online
    scorer's tests and benchmark, without running the streaming job."""
    cols = [*keys, *values]
    n = len(frame["bucket"])
    short = [c for c in cols if c not in frame or len(frame[c]) != n]
    if short:
        raise ValueError(f"{table}: the frame's columns {', '.join(short)} do not have one value per bucket ({n})")
    rows = []
    for i in range(n):
        row: list = [_ts(int(frame["bucket"][i]))]
        row += [int(frame[k][i]) if k == "gpu" else str(frame[k][i]) for k in keys[1:]]
        row += [None if math.isnan(frame[v][i]) else float(frame[v][i]) for v in values]
        rows.append(row)
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))})", rows)
    conn.commit()
    return len(rows)


def _ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


#: ``forecasts`` columns as written, with their array types for the one-statement upsert.
_FORECAST_COLS = (("ts", "timestamptz"), ("forecaster", "text"), ("target", "text"), ("pool", "text"),
                  ("replica", "text"), ("horizon_s", "integer"), ("predicted", "float8"), ("threshold", "float8"),
                  ("risk", "float8"))


def write_forecasts(conn: psycopg.Connection, rows: Iterable[tuple]) -> int:
    """Upsert ``(ts_ms, forecaster, target, pool, replica, horizon_s, predicted, threshold, risk)``
    in one statement (one firing of the roll-up trigger per step, not one per target). A key
    given twice keeps its last row, as row-by-row upserts would."""
    latest = {(r[0], *r[1:6]): (_ts(r[0]), *r[1:]) for r in rows}
    if not latest:
        return 0
    cols = [c for c, _ in _FORECAST_COLS]
    columns = [list(col) for col in zip(*latest.values(), strict=True)]
    conn.execute(
        f"INSERT INTO {names.T_FORECASTS} ({', '.join(cols)}) SELECT * FROM unnest("
        + ", ".join(f"%s::{t}[]" for _, t in _FORECAST_COLS) + ") "
        "ON CONFLICT (ts, forecaster, target, pool, replica, horizon_s) DO UPDATE SET "
        "predicted = EXCLUDED.predicted, threshold = EXCLUDED.threshold, risk = EXCLUDED.risk", columns)
    conn.commit()
    return len(latest)


def read_forecasts(conn: StoreReader, from_ms: int, to_ms: int, prefer: str = "") -> list[tuple]:
    """``(ts_ms, pool, replica, horizon_s, threshold, risk)`` of ``forecasts`` with
    ``from_ms <= ts < to_ms``, one row per step, target and horizon: where several forecasters
    scored it (replicated scorers, a model change), ``prefer``'s row, else the first by name."""
    return conn.execute(
        f"SELECT DISTINCT ON (ts, pool, replica, horizon_s) (extract(epoch from ts) * 1000)::bigint, pool, replica, "
        f"horizon_s, threshold, risk FROM {names.T_FORECASTS} WHERE ts >= %s AND ts < %s AND risk IS NOT NULL AND threshold > 0 "
        "ORDER BY ts, pool, replica, horizon_s, (forecaster = %s) DESC, forecaster",
        (_ts(from_ms), _ts(to_ms), prefer)).fetchall()
