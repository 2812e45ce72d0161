"""The job writes the 1 m roll-up rows itself (its minutes summed on the JVM, migration 0009), and
the 1 m and 1 h roll-ups stay exactly the roll-up of the 5 s windows in the store: after a backlog
across an hour boundary, after the same backlog is replayed by a fresh run (nothing is counted
twice), and after another writer rewrites some windows through the 5 s table's triggers. The
reference is computed in Python from the 5 s rows (tests/test_store_rollups.py)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import psycopg
from test_store_rollups import H1, M1, assert_rollup, stored

from llmsla import histogram as H
from llmsla import names
from llmsla.store import connect, schema
from llmsla.store.migrate import migrate, recorded_flavor
from llmsla.store.rollups import HISTS
from llmsla.streaming import sql, synth

from .conftest import publish, start_stream

KEYS = synth.Keys(models=("m",), pools=("east", "west"), replicas=2, arms=("control", "treatment"))  # 8 series


def _windows(conn: psycopg.Connection) -> list[dict]:
    cols = sql.REQUEST_COLUMNS
    exprs = [f"{c}::text" if c in HISTS else c for c in cols]
    rows = conn.execute(f"SELECT {', '.join(exprs)} FROM {names.T_REQUEST_WINDOWS}").fetchall()
    return [dict(zip(cols, r, strict=True)) for r in rows]


def _run(cfg, tmp_path: Path, *args: str) -> None:
    log = tmp_path / "stream.log"
    proc = start_stream(cfg, "--once", *args, "--kinds", names.SPOOL_REQUESTS, log=log, watermark_delay_s=1)
    assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]


def test_job_minutes_equal_the_rollup_of_its_windows(cfg, spool_dirs, tmp_path: Path) -> None:
    hour_ms = (int(time.time()) // 3600 - 2) * 3_600_000
    start_ms = hour_ms - 3 * 60_000 + 2_500  # six minutes across an hour boundary, not minute-aligned
    cols = synth.request_columns(9_000, start_ms=start_ms, span_ms=6 * 60_000, seed=7, keys=KEYS)
    lines = list(synth.request_lines(cols, KEYS))
    order = sorted(range(len(lines)), key=lambda i: int(cols["ts_ms"][i]))
    for w in range(3):  # three writers, each its time-ordered share in two segments
        mine = [lines[i] for i in order[w::3]]
        for part, chunk in enumerate((mine[: len(mine) // 2], mine[len(mine) // 2:])):
            first = int(cols["ts_ms"][order[w::3][0 if part == 0 else len(mine) // 2]])
            publish(spool_dirs[names.SPOOL_REQUESTS], f"{first:013d}-gw{w}-{part:06d}.jsonl", chunk)

    with connect(cfg.store.dsn) as conn:
        migrate(conn, cfg)
        plain = recorded_flavor(conn) == "plain"
        if plain:  # the roll-ups can only come from the job's minute rows (TimescaleDB: its own)
            conn.execute(f"ALTER TABLE {names.T_REQUEST_WINDOWS} DISABLE TRIGGER USER")
            conn.commit()
    _run(cfg, tmp_path)
    with psycopg.connect(cfg.store.dsn) as conn:
        rows = _windows(conn)
        assert sum(r["requests"] for r in rows) == len(lines)
        minutes = stored(conn, M1)
        assert len(minutes) == 7 * 8  # six minutes not aligned: seven buckets, eight series
        assert_rollup(minutes, rows, 60)
        assert_rollup(stored(conn, H1), rows, 3600)

    _run(cfg, tmp_path, "--fresh")  # the whole backlog again: windows and minutes rewritten as they were
    with psycopg.connect(cfg.store.dsn) as conn:
        again = _windows(conn)
        assert len(again) == len(rows)
        assert_rollup(stored(conn, M1), again, 60)
        assert_rollup(stored(conn, H1), again, 3600)
        if not plain:
            return  # rewriting windows: TimescaleDB's invalidation and refresh
        conn.execute(f"ALTER TABLE {names.T_REQUEST_WINDOWS} ENABLE TRIGGER USER")
        # another writer rewrites some windows through the 5 s table's triggers
        replay = [dict(r, requests=1, ttft_p99_ms=1.0, e2e_hist=H.Hist.of([1.0]).literal()) for r in again[::5]]
        col_names = list(sql.REQUEST_COLUMNS)
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in col_names if c not in sql.TABLE_KEYS[names.T_REQUEST_WINDOWS])
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {names.T_REQUEST_WINDOWS} ({', '.join(col_names)}) VALUES "
                f"({', '.join('%s::integer[]' if c in HISTS else '%s' for c in col_names)}) "
                f"ON CONFLICT ({', '.join(sql.TABLE_KEYS[names.T_REQUEST_WINDOWS])}) DO UPDATE SET {updates}",
                [tuple(r[c] for c in col_names) for r in replay],
            )
        conn.commit()
        assert_rollup(stored(conn, M1), again + replay, 60)
        assert_rollup(stored(conn, H1), again + replay, 3600)


def test_minutes_from_the_job_skip_the_5s_triggers(cfg, pg_dsn: str) -> None:
    """Under llmsla.writer_minutes the 5 s rows add nothing to the roll-ups, and a minute row
    written as is reaches its hour once, however often it is rewritten."""
    from test_store import insert_windows, window_row

    from llmsla.store.rollups import WRITER_MINUTES, writer_minutes_upsert

    minute = dt.datetime.fromtimestamp((int(time.time()) // 60 - 90) * 60, dt.UTC)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        if recorded_flavor(conn) != "plain":
            return
        five = [dict(window_row(minute + dt.timedelta(seconds=5 * i)), ttft_hist=H.Hist.of([90.0 + i, 400.0]).literal(),
                     e2e_hist=H.Hist.of([900.0 * (i + 1)]).literal()) for i in range(3)]
        with conn.transaction():
            conn.execute("SELECT set_config(%s, 'on', true)", (WRITER_MINUTES,))
            insert_windows(conn, five)
        assert conn.execute(f"SELECT count(*) FROM {M1}").fetchone()[0] == 0
        assert conn.execute(f"SELECT count(*) FROM {H1}").fetchone()[0] == 0
        # the job's minute row for them, written twice (a replay)
        for _ in range(2):
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("SELECT set_config(%s, 'on', true)", (WRITER_MINUTES,))
                cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS stage ON COMMIT DELETE ROWS AS "
                            f"SELECT {', '.join(sql.MINUTE_COLUMNS)} FROM {M1} WITH NO DATA")
                ref = stored_reference(five)
                cur.execute(f"INSERT INTO stage ({', '.join(sql.MINUTE_COLUMNS)}) VALUES ({', '.join('%s' for _ in sql.MINUTE_COLUMNS)})",
                            [ref[c] for c in sql.MINUTE_COLUMNS])
                cur.execute(writer_minutes_upsert("stage"))
            assert_rollup(stored(conn, M1), five, 60)
            assert_rollup(stored(conn, H1), five, 3600)


def stored_reference(rows: list[dict]) -> dict:
    """The one minute row of ``rows`` (all in one minute and series), by MINUTE_COLUMNS name."""
    from test_store_rollups import reference

    ((key, values),) = reference(rows, 60).items()
    out = dict(zip(schema.REQUEST_KEYS, key, strict=True))
    out.update({c: (v.literal() if isinstance(v, H.Hist) else v) for c, v in values.items()})
    return out
