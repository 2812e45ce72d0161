"""Frozen migrations: what ``migrate`` applies are the committed bytes, the renderer still gives
them, and a store upgraded from an old release equals one created at head with the same data.

Runs on the embedded PostgreSQL, or on ``LLMSLA_TEST_DSN`` (TimescaleDB); each assertion that
differs between the flavours checks the recorded flavour and says what it expects there.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from test_store import insert_windows, window_row

from llmsla import names
from llmsla.forecaster.store_io import write_forecasts
from llmsla.store import connect
from llmsla.store import migrate as migrate_mod
from llmsla.store.maintenance import materialize_rollups
from llmsla.store.migrate import FLAVORS, load_migrations, migrate, recorded_flavor
from llmsla.store.rollups import HISTS, PRE_HIST_SUFFIX

UTC = dt.UTC
ROLLUP_TABLES = (names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H, names.T_FORECASTS_1M,
                 names.T_FORECASTS_1H)


def test_frozen_migrations_equal_their_renderer() -> None:
    """Editing the Python an old migration was rendered from fails here: add a migration."""
    assert migrate_mod.main(["--check"]) == 0  # the files themselves: tests/test_generated.py
    for m in load_migrations():
        for flavor in FLAVORS:
            assert m.sql(flavor) == m.render(flavor), (m.file_name, flavor)


def test_check_names_a_changed_migration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A renderer that now gives other SQL for 0005 is reported, and --write refuses to refreeze it."""
    real = migrate_mod.Migration.render

    def drifted(self, flavor: str) -> str:
        out = real(self, flavor)
        return out + "\n-- drift" if self.version == 5 else out

    monkeypatch.setattr(migrate_mod.Migration, "render", drifted)
    assert migrate_mod.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "frozen/plain/0005_latency_histograms.sql: differs" in out
    assert "frozen/timescale/0005_latency_histograms.sql: differs" in out
    before = (Path(migrate_mod.__file__).parent / "migrations/frozen/plain/0005_latency_histograms.sql").read_bytes()
    assert migrate_mod.main(["--write"]) == 0
    assert "add a new migration instead" in capsys.readouterr().err
    assert (Path(migrate_mod.__file__).parent / "migrations/frozen/plain/0005_latency_histograms.sql").read_bytes() == before


def test_migrate_applies_the_frozen_bytes(pg_dsn: str, cfg, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SQL executed is the frozen file's, not a fresh rendering."""
    executed: list[str] = []
    rendered: list[int] = []
    real_execute = psycopg.Connection.execute
    monkeypatch.setattr(migrate_mod.Migration, "render", lambda self, flavor: rendered.append(self.version) or "")

    def spy(self, query, *args, **kwargs):
        executed.append(str(query))
        return real_execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", spy)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        flavor = recorded_flavor(conn)
    assert rendered == []
    text = "\n".join(executed)
    for m in load_migrations():
        frozen = m.sql(flavor)
        if flavor == "plain":
            assert frozen in executed, m.file_name  # one statement per migration, in a transaction
        else:
            for stmt in migrate_mod._split_sql(frozen):  # TimescaleDB: statement by statement
                assert stmt in text, (m.file_name, stmt[:80])


@pytest.fixture()
def second_dsn(pg_server_dsn: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(pg_server_dsn)
    info["dbname"] = name
    yield psycopg.conninfo.make_conninfo(**info)
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _data(now: dt.datetime) -> tuple[list[dict], list[tuple]]:
    """Two hours of 5 s windows (3 replicas, no histograms: the columns arrive with 0005) and
    forecasts, ending an hour ago."""
    rng = random.Random(11)
    start = (now - dt.timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    rows = []
    for i in range(0, 2 * 720, 7):
        for rep in range(3):
            r = window_row(start + dt.timedelta(seconds=5 * i), replica=f"r{rep}", requests=rng.randint(2, 40))
            r["ttft_p99_ms"] = rng.uniform(50, 4000)
            rows.append(r)
    t0 = int(start.timestamp() * 1000)
    forecasts = [(t0 + 5000 * i, "lstm-v1", "replica", "p", f"r{t}", 60, None, 0.5, rng.random())
                 for i in range(0, 720, 3) for t in range(2)]
    return rows, forecasts


def _write(conn: psycopg.Connection, rows: list[dict], forecasts: list[tuple]) -> None:
    insert_windows(conn, rows)
    write_forecasts(conn, forecasts)
    conn.execute(f"INSERT INTO {names.T_DEAD_LETTERS} (received_at, source, file, line, reason, raw, fingerprint) "
                 "VALUES (now() - interval '1 hour', 'requests', 'f.jsonl', 3, 'parse: bad json', '{', 'fp1'), "
                 "(now(), 'gpu', 'g.jsonl', 1, 'schema: no node', '{}', 'fp2')")
    conn.commit()


def _catalog(conn: psycopg.Connection) -> dict[str, list[tuple]]:
    """What users and the code can see of the schema (TimescaleDB's internal objects and the
    renamed pre-0005 aggregates an upgrade keeps aside)."""
    keep = f"NOT LIKE '%{PRE_HIST_SUFFIX}'"
    return {
        "columns": conn.execute(
            "SELECT table_name, column_name, ordinal_position, data_type, udt_name, is_nullable, column_default "
            f"FROM information_schema.columns WHERE table_schema = 'public' AND table_name {keep} ORDER BY 1, 3").fetchall(),
        "functions": conn.execute(
            "SELECT proname, pg_get_function_identity_arguments(oid), prosrc, proconfig FROM pg_proc "
            "WHERE pronamespace = 'public'::regnamespace ORDER BY 1, 2").fetchall(),
        "triggers": conn.execute(
            "SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal ORDER BY 1, 2").fetchall(),
        "indexes": conn.execute(
            f"SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename {keep} "
            "ORDER BY 1, 2").fetchall(),
    }


def _rows(conn: psycopg.Connection) -> dict[str, list[tuple]]:
    materialize_rollups(conn)
    out = {}
    for table in (names.T_REQUEST_WINDOWS, *ROLLUP_TABLES):
        cols = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s AND table_schema = 'public' "
            "AND column_name <> 'updated_at' ORDER BY ordinal_position", (table,))]
        out[table] = conn.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY {', '.join(cols[:6])}").fetchall()
    out[names.T_DEAD_LETTER_TOTALS] = conn.execute(
        f"SELECT source, reason, records FROM {names.T_DEAD_LETTER_TOTALS} ORDER BY 1, 2").fetchall()
    return out


def _same(a: tuple, b: tuple) -> bool:
    """Equal rows; float sums up to their summation order (a backfill adds in another order)."""
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=1e-12) if isinstance(x, float) and isinstance(y, float) else x == y
        for x, y in zip(a, b, strict=True))


def test_store_upgraded_from_0004_equals_one_created_at_head(pg_dsn: str, second_dsn: str, cfg) -> None:
    now = dt.datetime.now(UTC)
    rows, forecasts = _data(now)
    with connect(pg_dsn) as old:
        assert migrate(old, cfg, upto=4).applied == [m.file_name[:-4] for m in load_migrations() if m.version <= 4]
        assert old.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = %s AND column_name = ANY(%s)",
                           (names.T_REQUEST_WINDOWS, list(HISTS))).fetchone()[0] == 0
        _write(old, rows, forecasts)
        upgraded = migrate(old, cfg)
        assert upgraded.applied == [m.file_name[:-4] for m in load_migrations() if m.version > 4]
        flavor = recorded_flavor(old)
        old_catalog, old_rows = _catalog(old), _rows(old)
        kept = old.execute("SELECT count(*) FROM pg_class WHERE relname LIKE %s", (f"%{PRE_HIST_SUFFIX}",)).fetchone()[0]
    with connect(second_dsn) as new:
        migrate(new, cfg)
        _write(new, rows, forecasts)
        assert recorded_flavor(new) == flavor
        new_catalog, new_rows = _catalog(new), _rows(new)
    # TimescaleDB keeps the roll-ups as 0004 left them, renamed aside (their history outlives
    # the 5 s rows); plain PostgreSQL altered its roll-up tables in place
    assert kept == (2 if flavor == "timescale" else 0)
    for part in new_catalog:
        assert old_catalog[part] == new_catalog[part], part
    assert old_rows.keys() == new_rows.keys()
    for table in new_rows:
        assert len(new_rows[table]) > 0, table
        assert len(old_rows[table]) == len(new_rows[table]), table
        for a, b in zip(old_rows[table], new_rows[table], strict=True):
            assert _same(a, b), (table, a, b)
    assert new_rows[names.T_DEAD_LETTER_TOTALS] == [("gpu", "schema", 1), ("requests", "parse", 1)]
