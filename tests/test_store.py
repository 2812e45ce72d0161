"""Store: idempotent migrations, partitions ahead, retention, roll-ups, redaction.

Runs against the embedded PostgreSQL, or against ``LLMSLA_TEST_DSN`` (e.g. a TimescaleDB) with
the same assertions where the two flavours promise the same behaviour.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import psycopg
import pytest

from llmsla import names
from llmsla.redaction import redact
from llmsla.store import connect
from llmsla.store.maintenance import maintain, materialize_rollups
from llmsla.store.migrate import load_migrations, migrate, recorded_flavor

UTC = dt.UTC


def schema_snapshot(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute(
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' ORDER BY 1"
    ).fetchall()


def assert_daily_hypertables(conn: psycopg.Connection) -> None:
    dims = dict(conn.execute(
        "SELECT hypertable_name, time_interval FROM timescaledb_information.dimensions"
    ).fetchall())
    for table in names.TIME_TABLES:
        assert dims.get(table) == dt.timedelta(days=1), table


def window_row(bucket: dt.datetime, replica: str = "r0", requests: int = 10) -> dict:
    return {
        "bucket": bucket, "model": "m", "pool": "p", "replica": replica, "arm": "default",
        "requests": requests, "ok": requests - 1, "errors": 1, "timeouts": 0, "cancelled": 0, "rejected": 0,
        "qps": requests / 5, "ttft_p50_ms": 100.0, "ttft_p95_ms": 300.0, "ttft_p99_ms": 500.0,
        "e2e_p50_ms": 1000.0, "e2e_p95_ms": 2000.0, "e2e_p99_ms": 3000.0, "itl_mean_ms": 20.0,
        "itl_jitter_ms": 2.0, "queue_p99_ms": 1.0, "prompt_tokens": 100, "output_tokens": 50,
        "output_tps": 10.0, "ttft_slo_ms": 800.0, "e2e_slo_ms": 10000.0, "ttft_within_slo": requests - 2,
        "e2e_within_slo": requests - 1, "ttft_count": requests - 1, "ttft_sum_ms": 150.0 * (requests - 1),
        "e2e_sum_ms": 1200.0 * requests, "itl_n": 40, "itl_sum_ms": 800.0, "itl_sumsq_ms2": 16160.0,
    }


def insert_windows(conn: psycopg.Connection, rows: list[dict]) -> None:
    cols = list(rows[0])
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {names.T_REQUEST_WINDOWS} ({', '.join(cols)}) VALUES ({', '.join('%s' for _ in cols)})",
            [tuple(r[c] for c in cols) for r in rows],
        )


def test_migrate_twice_is_a_noop(pg_dsn: str, cfg) -> None:
    with connect(pg_dsn) as conn:
        first = migrate(conn, cfg)
        snap = schema_snapshot(conn)
        second = migrate(conn, cfg)
        assert first.applied == [f"{m.version:04d}_{m.name}" for m in load_migrations()]
        assert second.applied == []
        assert second.partitions_created == 0
        assert schema_snapshot(conn) == snap
        assert conn.execute(f"SELECT count(*) FROM {names.T_MIGRATIONS}").fetchone()[0] == len(load_migrations())
        for table in [*names.TIME_TABLES, names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H]:
            assert conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is not None, table


def test_concurrent_migrations_serialise(pg_dsn: str, cfg) -> None:
    results, errors = [], []

    def run() -> None:
        try:
            with connect(pg_dsn) as conn:
                results.append(migrate(conn, cfg).applied)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(len(r) for r in results) == [0, 0, len(load_migrations())]


def test_partitions_exist_ahead_of_time(pg_dsn: str, cfg) -> None:
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        if recorded_flavor(conn) == "timescale":
            assert_daily_hypertables(conn)  # chunks are created on insert: nothing to create ahead
            return
        today = dt.datetime.now(UTC).date()
        for table in names.TIME_TABLES:
            parts = {r[0] for r in conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s", (table,))}
            for ahead in range(-1, cfg.store.partitions_ahead_days + 1):
                day = today + dt.timedelta(days=ahead)
                assert f"{table}_p{day:%Y%m%d}" in parts, (table, day)
            assert f"{table}_default" in parts
        # a row for tomorrow lands in tomorrow's partition, not the default one
        tomorrow = dt.datetime.combine(today + dt.timedelta(days=1), dt.time(12), UTC)
        insert_windows(conn, [window_row(tomorrow)])
        where = conn.execute(f"SELECT tableoid::regclass::text FROM {names.T_REQUEST_WINDOWS}").fetchone()[0]
        assert where == f"{names.T_REQUEST_WINDOWS}_p{tomorrow:%Y%m%d}"


def test_retention_drops_old_partitions_and_keeps_recent_rows(pg_dsn: str, cfg) -> None:
    now = dt.datetime.now(UTC)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        old = [window_row(now - dt.timedelta(days=d), replica=f"old{d}") for d in (40, 35, 31)]
        recent = [window_row(now - dt.timedelta(days=d, minutes=1), replica=f"new{d}") for d in (0, 1, 29)]
        insert_windows(conn, old + recent)
        conn.commit()
        result = maintain(conn, cfg, flavor=recorded_flavor(conn) or "plain", now=now)
        conn.commit()
        kept = {r[0] for r in conn.execute(f"SELECT replica FROM {names.T_REQUEST_WINDOWS}")}
        assert kept == {"new0", "new1", "new29"}
        if recorded_flavor(conn) == "plain":
            assert result.partitions_dropped >= 3  # the three old days, backfilled then dropped
            left = conn.execute(
                "SELECT count(*) FROM pg_class WHERE relname LIKE %s", (f"{names.T_REQUEST_WINDOWS}_p{(now - dt.timedelta(days=40)):%Y%m%d}",)
            ).fetchone()[0]
            assert left == 0


def test_backfilled_day_moves_out_of_default_partition(pg_dsn: str, cfg) -> None:
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        if recorded_flavor(conn) == "timescale":
            assert_daily_hypertables(conn)  # any day gets its chunk on insert; no default partition
            return
        day = dt.datetime.now(UTC) - dt.timedelta(days=12)
        insert_windows(conn, [window_row(day), window_row(day + dt.timedelta(seconds=5))])
        assert conn.execute(f"SELECT count(*) FROM {names.T_REQUEST_WINDOWS}_default").fetchone()[0] == 2
        maintain(conn, cfg, flavor="plain")
        assert conn.execute(f"SELECT count(*) FROM {names.T_REQUEST_WINDOWS}_default").fetchone()[0] == 0
        assert conn.execute(f"SELECT count(*) FROM {names.T_REQUEST_WINDOWS}_p{day:%Y%m%d}").fetchone()[0] == 2


def test_rollups_sum_exactly(pg_dsn: str, cfg) -> None:
    """The 1 m roll-up equals a sum computed here from the same 5 s rows."""
    base = dt.datetime.now(UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=10)
    rows = [window_row(base + dt.timedelta(seconds=5 * i), requests=10 + i) for i in range(24)]  # 2 minutes
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        insert_windows(conn, rows)
        conn.commit()
        materialize_rollups(conn)
        got = conn.execute(
            f"SELECT bucket, requests, ttft_within_slo, ttft_p99_ms_max, windows FROM {names.T_REQUEST_WINDOWS_1M} ORDER BY bucket"
        ).fetchall()
    expected = []
    for minute in range(2):
        chunk = rows[minute * 12:(minute + 1) * 12]
        expected.append((base + dt.timedelta(minutes=minute), sum(r["requests"] for r in chunk),
                         sum(r["ttft_within_slo"] for r in chunk), 500.0, 12))
    assert got == expected


def test_upsert_key_rejects_duplicates(pg_dsn: str, cfg) -> None:
    now = dt.datetime.now(UTC).replace(microsecond=0)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        insert_windows(conn, [window_row(now)])
        with pytest.raises(psycopg.errors.UniqueViolation):
            insert_windows(conn, [window_row(now)])


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://alice:s3cret@db:5432/llmsla", "postgresql://alice:***@db:5432/llmsla"),
        ("postgresql://alice@db/llmsla", "postgresql://alice@db/llmsla"),
        ("host=db user=alice password=s3cret dbname=x", "host=db user=alice password=*** dbname=x"),
        ("host=db password='a b c' dbname=x", "host=db password=*** dbname=x"),
    ],
)
def test_redact_never_shows_password(dsn: str, shown: str) -> None:
    assert redact(dsn) == shown
    assert "s3cret" not in redact(dsn)


def test_unreachable_store_error_hides_password() -> None:
    from llmsla.store.connection import StoreError

    with pytest.raises(StoreError) as err:
        connect("postgresql://alice:s3cret@127.0.0.1:1/llmsla", timeout_s=0.5)
    assert "s3cret" not in str(err.value)
    assert "***" in str(err.value)


def test_connect_waits_between_attempts(tmp_path) -> None:
    """A store that refuses connections (restarting, no server on its socket yet) is retried
    every 0.2 s until the deadline, not in a loop that burns a core: a real connect to a socket
    directory with no server fails in microseconds, so a spinning retry spends the whole second
    on the CPU."""
    from llmsla.store.connection import StoreError

    cpu0 = time.process_time()
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="No such file or directory"):
        connect(f"postgresql://alice@/llmsla?host={tmp_path}", timeout_s=1.0)
    assert time.monotonic() - t0 >= 1.0
    assert time.process_time() - cpu0 < 0.3


def test_window_tables_have_the_declared_columns(pg_dsn: str, cfg) -> None:
    """The migrations create exactly the columns of ``llmsla.store.schema``, in its order: the
    list the stream job, the forecaster and the roll-ups derive theirs from."""
    from llmsla.store import rollups, schema

    with connect(pg_dsn) as conn:
        migrate(conn, cfg)

        def columns(table: str) -> tuple[str, ...]:
            return tuple(r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' "
                "AND table_name = %s AND column_name <> %s ORDER BY ordinal_position", (table, schema.UPDATED_AT)))

        assert columns(names.T_REQUEST_WINDOWS) == schema.table_order(schema.REQUEST_COLUMNS)
        assert columns(names.T_POLICY_WINDOWS) == schema.POLICY_COLUMNS
        assert columns(names.T_GPU_WINDOWS) == schema.GPU_COLUMNS
        assert columns(names.T_REQUEST_WINDOWS_1M) == schema.table_order((*schema.REQUEST_KEYS, *rollups.rollup_columns()))
