"""The columnstore, for real: 5 s request windows with histograms, written by the stream job's
store writer, converted to the columnstore (TimescaleDB) and then read by every panel query,
upserted late, replayed as a backlog and extended by windows never seen, losing nothing.

On plain PostgreSQL the same writes and answers are checked (it has no columnstore: converting
is a no-op, asserted), so both flavours give the same answers for the same rows.
"""

from __future__ import annotations

import datetime as dt
import random

import psycopg
from test_store_rollups import _floor, assert_rollup, random_rows, stored

from llmsla import histogram as H
from llmsla import names
from llmsla.dashboards import runner, storesql
from llmsla.dashboards.macros import TimeRange, Variable
from llmsla.dashboards.query import REGISTRY, SqlQuery
from llmsla.store import connect
from llmsla.store.maintenance import compress_chunks, materialize_rollups
from llmsla.store.migrate import migrate, recorded_flavor
from llmsla.streaming import sql
from llmsla.streaming.store_sink import StoreWriter

UTC = dt.UTC
T = names.T_REQUEST_WINDOWS
KEYS = sql.TABLE_KEYS[T]


def copy_line(row: dict) -> str:
    """A window row as the job encodes it for the writer: a line of COPY text."""
    def text(v: object) -> str:
        if v is None:
            return r"\N"
        return v.isoformat() if isinstance(v, dt.datetime) else str(v)
    return "\t".join(text(row.get(c)) for c in sql.TABLE_COLUMNS[T])


def write(dsn: str, rows: list[dict]) -> None:
    w = StoreWriter(dsn)
    try:
        w.write(T, [sql.ROW_SEPARATOR.join(copy_line(r) for r in rows)])
    finally:
        w.close()


def stored_windows(conn: psycopg.Connection) -> dict[tuple, tuple]:
    cols = [c for c in sql.TABLE_COLUMNS[T] if c not in KEYS]
    return {tuple(r[:len(KEYS)]): tuple(r[len(KEYS):]) for r in conn.execute(
        f"SELECT {', '.join(KEYS)}, {', '.join(f'{c}::text' for c in cols)} FROM {T}")}


def answers(conn: psycopg.Connection, end: dt.datetime) -> dict[tuple, list[tuple]]:
    """Every registered store query over ranges that read each tier (30 m, 6 h, 2 d)."""
    vars_ = {"model": ("m",), "pool": ("p",), "replica": ("r0", "r1", "r2"), "arm": ("default",), "zone": ("eu",),
             "policy_id": ("p1",), "experiment": ("e1",), "tenant": ("default",), "class": ("interactive",)}
    out = {}
    assert storesql.TTFT_P99_HISTORY.key in REGISTRY  # the store queries are registered
    for span in (dt.timedelta(minutes=30), dt.timedelta(hours=6), dt.timedelta(days=2)):
        for key, q in REGISTRY.items():
            if isinstance(q, SqlQuery):
                t = runner.sql(conn, q, TimeRange(end - span, end), 60000, {k: Variable(v) for k, v in vars_.items()},
                               timescaledb=False)
                out[(span, key)] = sorted(t.rows, key=repr)
    return out


def test_columnstore_keeps_answers_upserts_replays_and_backlogs(pg_dsn: str, cfg) -> None:
    now = dt.datetime.now(UTC)
    start = _floor(now - dt.timedelta(days=3), 86400) + dt.timedelta(hours=10)
    rng = random.Random(21)
    rows = random_rows(rng, start, 240)  # 20 minutes x 3 replicas, histograms in most windows
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        timescale = recorded_flavor(conn) == "timescale"
    write(pg_dsn, rows)
    with connect(pg_dsn) as conn:
        materialize_rollups(conn)
        before = answers(conn, start + dt.timedelta(minutes=30))
        assert sum(len(v) for v in before.values()) > 100  # the queries do see the rows
        windows = stored_windows(conn)
        converted = compress_chunks(conn, now - dt.timedelta(days=1))
        conn.commit()
        if timescale:  # converted now, or already by the columnstore policy's first run
            assert conn.execute("SELECT array_agg(is_compressed) FROM timescaledb_information.chunks "
                                "WHERE hypertable_name = %s", (T,)).fetchone()[0] == [True]
            raw, packed = conn.execute(
                "SELECT sum(before_compression_total_bytes), sum(after_compression_total_bytes) "
                "FROM chunk_columnstore_stats(%s) WHERE compression_status = 'Compressed'", (T,)).fetchone()
            assert packed < raw, (raw, packed)
        else:
            assert converted == 0  # no columnstore on plain PostgreSQL
        assert stored_windows(conn) == windows
        assert answers(conn, start + dt.timedelta(minutes=30)) == before

    # late upserts into the converted chunk: a replay rewrites every fourth window
    replay = [dict(r, ttft_p99_ms=1.0, requests=1, e2e_hist=H.Hist.of([1.0]).literal()) for r in rows[::4]]
    write(pg_dsn, replay)
    # a backlog replay of everything (the latest values), and windows never seen in that hour
    latest = list({tuple(r[k] for k in KEYS): r for r in rows + replay}.values())
    backlog = random_rows(rng, start + dt.timedelta(minutes=40), 24)
    write(pg_dsn, latest + backlog)
    with connect(pg_dsn) as conn:
        got = stored_windows(conn)
        assert len(got) == len(latest) + len(backlog) == conn.execute(f"SELECT count(*) FROM {T}").fetchone()[0]
        for r in latest + backlog:
            assert got[tuple(r[k] for k in KEYS)][sql.TABLE_COLUMNS[T].index("requests") - len(KEYS)] == str(r["requests"])
        assert_rollup(stored(conn, names.T_REQUEST_WINDOWS_1M), rows + replay + backlog, 60)
        assert_rollup(stored(conn, names.T_REQUEST_WINDOWS_1H), rows + replay + backlog, 3600)
        if timescale:  # the writes went into the columnstore chunk (not a new one beside it)
            assert conn.execute("SELECT count(*) FROM timescaledb_information.chunks WHERE hypertable_name = %s",
                                (T,)).fetchone()[0] == 1
