"""Partition and policy upkeep, run after every migrate and by ``llmsla store maintain``.

Plain PostgreSQL: create daily partitions ``partitions_ahead_days`` ahead, drop those past
``retention_days``. TimescaleDB: (re)apply retention, columnstore and continuous-aggregate
refresh policies from the configuration; its background jobs then do the work.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg

from llmsla import names
from llmsla.config import Config
from llmsla.store.connection import scalar
from llmsla.store.engine_rollups import ENGINE_ROLLUPS
from llmsla.store.forecast_rollups import FORECAST_ROLLUPS
from llmsla.store.rollups import ROLLUPS

log = logging.getLogger(__name__)

WINDOW_TABLES = (names.T_REQUEST_WINDOWS, names.T_POLICY_WINDOWS, names.T_GPU_WINDOWS, names.T_ENGINE_WINDOWS)
#: Roll-ups are small: they are kept this many times as long as the 5 s windows.
ROLLUP_RETENTION_FACTOR = 4
#: Every roll-up (request windows, forecasts) -> its bucket width.
ALL_ROLLUPS: dict[str, str] = {**ROLLUPS, **FORECAST_ROLLUPS, **ENGINE_ROLLUPS}


def _existing(conn: psycopg.Connection, tables: Iterable[str]) -> list[str]:
    """The tables of ``tables`` this store has: one migrated part of the way (``migrate(upto=...)``,
    a store as an older release left it) lacks the later ones, e.g. ``engine_windows``."""
    return [t for t in tables if scalar(conn, "SELECT to_regclass(%s)", (t,)) is not None]


@dataclass
class MaintainResult:
    partitions_created: int = 0
    partitions_dropped: int = 0


def maintain(conn: psycopg.Connection, cfg: Config, *, flavor: str, now: dt.datetime | None = None) -> MaintainResult:
    now = now or dt.datetime.now(dt.UTC)
    if flavor == "timescale":
        _timescale_policies(conn, cfg)
        return MaintainResult(partitions_dropped=apply_retention(conn, cfg, flavor=flavor, now=now))
    today = now.date()
    result = MaintainResult()
    for table in _existing(conn, names.TIME_TABLES):
        col = names.TIME_TABLES[table]
        result.partitions_created += scalar(
            conn,
            "SELECT llmsla_ensure_partitions(%s, %s, %s, %s)",
            (table, col, today - dt.timedelta(days=1), today + dt.timedelta(days=cfg.store.partitions_ahead_days)),
        )
    result.partitions_dropped = apply_retention(conn, cfg, flavor=flavor, now=now)
    return result


def apply_retention(conn: psycopg.Connection, cfg: Config, *, flavor: str, now: dt.datetime | None = None) -> int:
    """Drop what is older than ``store.retention_days``; returns partitions dropped (plain)."""
    cutoff = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(days=cfg.store.retention_days)
    if flavor == "timescale":
        # the retention policy job does this on its schedule; doing it now makes the command
        # (and the tests) deterministic
        for table in _existing(conn, names.TIME_TABLES):
            conn.execute("SELECT drop_chunks(%s, older_than => %s)", (table, cutoff))
        return 0
    dropped = 0
    for table in _existing(conn, names.TIME_TABLES):
        col = names.TIME_TABLES[table]
        dropped += scalar(conn, "SELECT llmsla_drop_partitions(%s, %s, %s)", (table, col, cutoff))
    rollup_cutoff = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(days=cfg.store.retention_days * ROLLUP_RETENTION_FACTOR)
    for table in ALL_ROLLUPS:  # tables (request roll-ups: views before migration 0003, nothing to delete)
        if conn.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (table,)).fetchone() == ("r",):
            conn.execute(f"DELETE FROM {table} WHERE bucket < %s", (rollup_cutoff,))
    return dropped


def materialize_rollups(conn: psycopg.Connection, views: tuple[str, ...] | None = None) -> list[str]:
    """Materialise TimescaleDB's continuous aggregates now, over their whole range; returns the
    views refreshed (none on plain PostgreSQL, whose roll-ups are tables its triggers keep
    current). Queries never need it (real-time aggregation answers past the newest materialised
    bucket and the refresh policy catches up late rows); a backfill, an import and a test that
    reads the materialised rows do. Commits the open transaction: a refresh runs outside one."""
    from llmsla.store.migrate import recorded_flavor  # migrate imports this module

    if recorded_flavor(conn) != "timescale":
        return []
    if not conn.autocommit:
        conn.commit()
    was, conn.autocommit = conn.autocommit, True
    done = []
    try:
        for view in views or tuple(ALL_ROLLUPS):
            if scalar(conn, "SELECT to_regclass(%s)", (view,)) is not None:
                conn.execute("CALL refresh_continuous_aggregate(%s, NULL, NULL)", (view,))
                _wait_for_policy_run(conn, view)
                done.append(view)
    finally:
        conn.autocommit = was
    return done


#: How long :func:`materialize_rollups` waits for a refresh policy's run of a view to end.
POLICY_RUN_WAIT_S = 60.0


def _wait_for_policy_run(conn: psycopg.Connection, view: str, timeout_s: float = POLICY_RUN_WAIT_S) -> None:
    """Wait until no run of ``view``'s refresh policy is in progress. TimescaleDB takes a
    refresh's invalidations in one transaction and materialises them in another, so a policy run
    that overlapped ours may hold the buckets ours found nothing left to do for: until it
    commits, they read stale. (The policy's first run comes seconds after the migration that
    adds it; then one a minute for the minute roll-ups.)"""
    deadline = time.monotonic() + timeout_s
    while policy_runs(conn, view):
        if time.monotonic() > deadline:
            log.warning("%s: its refresh policy has been running for over %.0f s; its latest buckets may "
                        "read stale until it ends", view, timeout_s)
            return
        time.sleep(0.05)


def policy_runs(conn: psycopg.Connection, view: str | None = None) -> int:
    """Runs of the roll-ups' refresh policies in progress in this database (TimescaleDB), of
    ``view`` alone when it is given."""
    return int(scalar(conn, "SELECT count(*) FROM timescaledb_information.jobs j "
                            "JOIN timescaledb_information.job_stats s USING (job_id) "
                            "WHERE j.proc_name = 'policy_refresh_continuous_aggregate' "
                            "AND j.hypertable_schema = current_schema() AND s.job_status = 'Running' "
                            "AND (%s::text IS NULL OR j.hypertable_name = %s)", (view, view)))


def compress_chunks(conn: psycopg.Connection, older_than: dt.datetime, tables: tuple[str, ...] = WINDOW_TABLES) -> int:
    """Convert the window tables' chunks that end before ``older_than`` to the columnstore now,
    as the columnstore policy job does on its schedule; returns the chunks converted (0 on plain
    PostgreSQL, which has none). For a backfill that should be compact at once, and for tests.
    Writes into converted chunks keep working (TimescaleDB 2.25: DML on the columnstore)."""
    from llmsla.store.migrate import recorded_flavor  # migrate imports this module

    if recorded_flavor(conn) != "timescale":
        return 0
    done = 0
    for table in _existing(conn, tables):
        done += scalar(conn,
            "SELECT count(compress_chunk(format('%%I.%%I', chunk_schema, chunk_name)::regclass)) "
            "FROM timescaledb_information.chunks WHERE hypertable_schema = current_schema() "
            "AND hypertable_name = %s AND NOT is_compressed AND range_end <= %s", (table, older_than))
    return done


def refresh_start_offset(cfg: Config) -> dt.timedelta:
    """How far back a continuous aggregate's refresh policy looks: as far as the 5 s rows are
    kept, less a day. A backlog replay or a late upsert hours old invalidates buckets far behind
    the newest ones, and real-time aggregation only covers what is newer than the newest
    materialised bucket, so a shorter window left those buckets stale for good. The refresh
    re-materialises only invalidated buckets, so the long window costs nothing when nothing is
    late; it stays inside the 5 s retention because refreshing a bucket whose rows were dropped
    would empty it."""
    return max(dt.timedelta(days=cfg.store.retention_days) - dt.timedelta(days=1), dt.timedelta(hours=2))


def _timescale_policies(conn: psycopg.Connection, cfg: Config) -> None:
    retention = dt.timedelta(days=cfg.store.retention_days)
    compress_after = dt.timedelta(days=cfg.store.compress_after_days)
    for table in _existing(conn, names.TIME_TABLES):
        conn.execute("SELECT remove_retention_policy(%s, if_exists => true)", (table,))
        conn.execute("SELECT add_retention_policy(%s, drop_after => %s)", (table, retention))
    for table in _existing(conn, WINDOW_TABLES):
        conn.execute("CALL remove_columnstore_policy(%s, if_exists => true)", (table,))
        conn.execute("CALL add_columnstore_policy(%s, after => %s)", (table, compress_after))
    for view, width in ALL_ROLLUPS.items():
        if scalar(conn, "SELECT to_regclass(%s)", (view,)) is None:
            continue  # a store migrated only part of the way (migrate(upto=...)) has not got it yet
        step = dt.timedelta(minutes=1) if "minute" in width else dt.timedelta(hours=1)
        conn.execute("SELECT remove_continuous_aggregate_policy(%s, if_exists => true)", (view,))
        conn.execute(
            "SELECT add_continuous_aggregate_policy(%s, start_offset => %s, end_offset => %s, schedule_interval => %s)",
            (view, refresh_start_offset(cfg), step, step),
        )
        # roll-ups are small: keep them four times as long as the 5 s windows
        conn.execute("SELECT remove_retention_policy(%s, if_exists => true)", (view,))
        conn.execute("SELECT add_retention_policy(%s, drop_after => %s)", (view, retention * ROLLUP_RETENTION_FACTOR))
