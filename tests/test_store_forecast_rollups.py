"""Forecast roll-ups (migration 0006): forecasts_1m / forecasts_1h equal a Python reference.

The reference groups the same rows here (the latest value per forecast key wins, as the upsert
does). Checked: the online scorer's own writes (``store_io.write_forecasts``, one upsert per row),
a many-row statement, a replay that lowers risks (the maxima fall again), forecasts stored before
the migration (backfilled), and the roll-ups' longer retention. On TimescaleDB
(``LLMSLA_TEST_DSN``) the same equalities hold for the continuous aggregates after a refresh.
"""

from __future__ import annotations

import datetime as dt
import math
import random

import psycopg
from test_store_rollups import assert_realtime_caggs

from llmsla import names
from llmsla.forecaster.store_io import write_forecasts
from llmsla.store import connect
from llmsla.store.forecast_rollups import COLUMNS, FORECAST_ROLLUPS, KEYS
from llmsla.store.maintenance import ROLLUP_RETENTION_FACTOR, apply_retention, materialize_rollups
from llmsla.store.migrate import load_migrations, migrate, recorded_flavor

UTC = dt.UTC
M1, H1 = names.T_FORECASTS_1M, names.T_FORECASTS_1H
WIDTH_S = {M1: 60, H1: 3600}


def _floor(ts: dt.datetime, seconds: int) -> dt.datetime:
    epoch = int(ts.timestamp())
    return dt.datetime.fromtimestamp(epoch - epoch % seconds, UTC)


def scores(rng: random.Random, start: dt.datetime, steps: int, targets: int = 3) -> list[tuple]:
    """``write_forecasts`` rows: (ts_ms, forecaster, target, pool, replica, horizon_s, predicted,
    threshold, risk), one per target every 5 s."""
    t0 = int(start.timestamp() * 1000)
    return [(t0 + 5000 * i, "lstm-v1", "replica", "p0", f"r{t}", 25, None, 0.5, rng.random())
            for i in range(steps) for t in range(targets)]


def reference(rows: list[tuple], seconds: int) -> dict[tuple, dict]:
    latest = {r[:6]: r for r in rows}
    out: dict[tuple, dict] = {}
    for (ts_ms, *keys), r in latest.items():
        b = _floor(dt.datetime.fromtimestamp(ts_ms / 1000, UTC), seconds)
        g = out.setdefault((b, *keys), {"steps": 0, "risk_max": -math.inf, "risk_sum": 0.0, "threshold": -math.inf,
                                        "alarm_steps": 0})
        risk, threshold = r[8], r[7]
        g["steps"] += 1
        g["risk_max"] = max(g["risk_max"], risk)
        g["risk_sum"] += risk
        g["threshold"] = max(g["threshold"], threshold)
        g["alarm_steps"] += risk >= threshold
    return out


def stored(conn: psycopg.Connection, table: str) -> dict[tuple, dict]:
    materialize_rollups(conn, (table,))
    rows = conn.execute(f"SELECT bucket, {', '.join(KEYS)}, {', '.join(COLUMNS)} FROM {table}").fetchall()
    return {tuple(r[:1 + len(KEYS)]): dict(zip(COLUMNS, (float(v) for v in r[1 + len(KEYS):]), strict=True))
            for r in rows}


def assert_rollup(conn: psycopg.Connection, rows: list[tuple]) -> None:
    for table, seconds in WIDTH_S.items():
        got, want = stored(conn, table), reference(rows, seconds)
        assert got.keys() == want.keys(), table
        for key, g in got.items():
            for c, v in g.items():  # sums: 1 h = sum of 1 m sums, equal up to summation order
                assert math.isclose(v, want[key][c], rel_tol=1e-12), (table, key, c, v, want[key][c])


def test_forecast_rollups_equal_reference_through_replays(pg_dsn: str, cfg) -> None:
    rng = random.Random(11)
    start = _floor(dt.datetime.now(UTC) - dt.timedelta(hours=3), 3600) - dt.timedelta(seconds=90)
    rows = scores(rng, start, 40)  # 200 s across an hour boundary, 3 targets
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        write_forecasts(conn, rows[:60])  # the online scorer's upsert, one statement per row
        with conn.cursor() as cur:  # and many rows in one statement
            cur.execute(
                f"INSERT INTO {names.T_FORECASTS} (ts, forecaster, target, pool, replica, horizon_s, threshold, risk) "
                "SELECT to_timestamp(t / 1000.0), f, tg, p, r, h, th, rk FROM unnest(%s::bigint[], %s::text[], "
                "%s::text[], %s::text[], %s::text[], %s::int[], %s::float8[], %s::float8[]) AS u(t, f, tg, p, r, h, th, rk)",
                [[r[i] for r in rows[60:]] for i in (0, 1, 2, 3, 4, 5, 7, 8)])
        conn.commit()
        assert_rollup(conn, rows)
        # the scorer re-scores some steps lower (a restart replaying a step): the maxima fall again
        replay = [(*r[:8], r[8] / 10) for r in rows[::2]]
        write_forecasts(conn, replay)
        assert_rollup(conn, rows + replay)
        assert max(v["risk_max"] for v in stored(conn, M1).values()) < max(r[8] for r in rows)  # an honest replay


def test_forecasts_stored_before_0006_are_backfilled(pg_dsn: str, cfg) -> None:
    rows = scores(random.Random(5), _floor(dt.datetime.now(UTC) - dt.timedelta(hours=2), 60), 30)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        if recorded_flavor(conn) == "timescale":  # plain only: TimescaleDB's are caggs from 0006 on
            assert_realtime_caggs(conn, FORECAST_ROLLUPS)
            return
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute("DROP SCHEMA public CASCADE")
        admin.execute("CREATE SCHEMA public")
    with connect(pg_dsn, autocommit=True) as conn:  # a store at schema version 5, with forecasts
        conn.execute(f"CREATE TABLE {names.T_MIGRATIONS} (version integer PRIMARY KEY, name text NOT NULL, "
                     "flavor text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        for m in load_migrations():
            if m.version < 6:
                conn.execute(m.sql("plain"))
                conn.execute(f"INSERT INTO {names.T_MIGRATIONS} (version, name, flavor) VALUES (%s, %s, 'plain')",
                             (m.version, m.name))
        conn.execute(f"SELECT llmsla_ensure_partitions('{names.T_FORECASTS}', 'ts', current_date - 1, current_date)")
        assert conn.execute("SELECT to_regclass(%s)", (M1,)).fetchone() == (None,)
        write_forecasts(conn, rows)
        assert migrate(conn, cfg).applied == [f"{m.version:04d}_{m.name}" for m in load_migrations() if m.version >= 6]
        conn.autocommit = False
        assert_rollup(conn, rows)
        write_forecasts(conn, rows[-3:])  # and the trigger keeps them current from now on
        assert_rollup(conn, rows)


def test_forecast_rollups_outlive_the_5s_partitions(pg_dsn: str, cfg) -> None:
    now = dt.datetime.now(UTC)
    old = _floor(now - dt.timedelta(days=cfg.store.retention_days + 2), 3600)
    ancient = old - dt.timedelta(days=cfg.store.retention_days * ROLLUP_RETENTION_FACTOR)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        if recorded_flavor(conn) == "timescale":
            # materialised buckets survive drop_chunks of their 5 s rows; the roll-ups' own
            # retention is a policy per continuous aggregate (tests/test_store.py)
            write_forecasts(conn, [(int(old.timestamp() * 1000), "lstm", "replica", "p0", "r0", 25, None, 0.5, 0.9)])
            conn.commit()
            materialize_rollups(conn)
            apply_retention(conn, cfg, flavor="timescale", now=now)
            conn.commit()
            assert conn.execute(f"SELECT count(*) FROM {names.T_FORECASTS}").fetchone()[0] == 0
            for table in FORECAST_ROLLUPS:
                assert [r[0] for r in conn.execute(f"SELECT bucket FROM {table}")] == [_floor(old, WIDTH_S[table])]
            return
        conn.execute(f"SELECT llmsla_ensure_partitions('{names.T_FORECASTS}', 'ts', %s, %s)",
                     (ancient.date(), old.date()))
        write_forecasts(conn, [(int(t.timestamp() * 1000), "lstm", "replica", "p0", "r0", 25, None, 0.5, 0.9)
                               for t in (old, ancient)])
        apply_retention(conn, cfg, flavor="plain", now=now)
        conn.commit()
        assert conn.execute(f"SELECT count(*) FROM {names.T_FORECASTS}").fetchone()[0] == 0
        for table in FORECAST_ROLLUPS:  # the 5 s rows are gone; the roll-up keeps the one inside 4x retention
            assert [r[0] for r in conn.execute(f"SELECT bucket FROM {table}")] == [_floor(old, WIDTH_S[table])]
