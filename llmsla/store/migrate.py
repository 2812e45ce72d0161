"""Versioned, idempotent migrations with TimescaleDB detection.

Each ``migrations/NNNN_name.sql`` holds the common DDL; ``NNNN_name.plain.sql`` or
``NNNN_name.timescale.sql`` the flavour's part, with markers where SQL generated from Python
stands. A migration is rendered once, when it is written, into
``migrations/frozen/<flavour>/NNNN_name.sql``, and ``migrate`` applies exactly those bytes: editing
the Python that renders an old migration cannot change what it creates on a new database. The
frozen files are the renderer's golden files (:mod:`llmsla.generated`): ``--check`` and a test fail
when the two disagree; ``python -m llmsla.store.migrate --write`` freezes a new migration. The
flavour is decided once, on the first migration, and recorded in ``llmsla_migrations`` so a
later run never mixes the two. An advisory lock serialises concurrent ``migrate`` calls (several
services starting at once).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import psycopg

from llmsla import generated, names
from llmsla.config import Config
from llmsla.store import engine_rollups, forecast_rollups, maintenance
from llmsla.store.connection import StoreError, scalar
from llmsla.store.rollups import (
    PRE_0013,
    hist_functions_ddl,
    pin_search_path_ddl,
    rollup_cascade_ddl,
    rollup_ddl,
    rollup_hist_caggs_ddl,
    rollup_hist_tables_ddl,
    rollup_increments_ddl,
    rollup_tables_ddl,
    shaped,
    tenant_class_plain_ddl,
    tenant_class_timescale_ddl,
    writer_minutes_ddl,
)

PLAIN = "plain"
TIMESCALE = "timescale"
FLAVORS = (PLAIN, TIMESCALE)
FROZEN_DIR = "frozen"
_LOCK_ID = 0x11A5_1A  # pg_advisory_lock key for migrations
_PARTITION = re.compile(r"\{\{PARTITION_BY (\w+)\}\}")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    common: str
    plain: str
    timescale: str

    @property
    def file_name(self) -> str:
        return f"{self.version:04d}_{self.name}.sql"

    def sql(self, flavor: str) -> str:
        """The frozen SQL this migration applies on ``flavor``."""
        path = _migrations_root() / FROZEN_DIR / flavor / self.file_name
        if not path.is_file():
            raise StoreError(f"migration {self.file_name}: no frozen SQL for {flavor} "
                             f"(run `python -m llmsla.store.migrate --write`)")
        return path.read_text(encoding="utf-8")

    def render(self, flavor: str) -> str:
        """The SQL the templates and today's Python give (what :meth:`sql` was frozen from)."""
        if flavor == PLAIN:
            common = _PARTITION.sub(r"PARTITION BY RANGE (\1)", self.common)
            extra = self.plain
        else:
            common = _PARTITION.sub("", self.common)
            extra = self.timescale
        return _render(common, flavor) + "\n" + _render(extra, flavor)


#: SQL generated from Python (one definition: the roll-up column lists, the histogram layout),
#: rendered into the migration files where these markers stand. The markers of migrations before
#: 0013 render with the roll-ups' columns as they were then (rollups.PRE_0013).
def _pre_0013(render: Callable[[str], str]) -> Callable[[str], str]:
    def rendered(flavor: str) -> str:
        with shaped(PRE_0013):
            return render(flavor)
    return rendered


_GENERATED_PRE_0013: dict[str, Callable[[str], str]] = {
    "{{ROLLUP_VIEWS}}": lambda flavor: rollup_ddl(timescale=flavor == TIMESCALE),
    "{{ROLLUP_TABLES}}": lambda flavor: rollup_tables_ddl(),
    "{{HIST_FUNCTIONS}}": lambda flavor: hist_functions_ddl(),
    "{{ROLLUP_HIST_TABLES}}": lambda flavor: rollup_hist_tables_ddl(),
    "{{ROLLUP_HIST_CAGGS}}": lambda flavor: rollup_hist_caggs_ddl(),
    "{{ROLLUP_INCREMENTS}}": lambda flavor: rollup_increments_ddl(),
    "{{ROLLUP_CASCADE}}": lambda flavor: rollup_cascade_ddl(),
    "{{ROLLUP_WRITER_MINUTES}}": lambda flavor: writer_minutes_ddl(),
    "{{FORECAST_ROLLUP_TABLES}}": lambda flavor: forecast_rollups.tables_ddl(),
    "{{FORECAST_ROLLUP_CAGGS}}": lambda flavor: forecast_rollups.caggs_ddl(),
    "{{PIN_SEARCH_PATH}}": lambda flavor: pin_search_path_ddl(),
}
_GENERATED = {
    **{marker: _pre_0013(render) for marker, render in _GENERATED_PRE_0013.items()},
    "{{TENANT_CLASS_PLAIN}}": lambda flavor: tenant_class_plain_ddl(),
    "{{TENANT_CLASS_TIMESCALE}}": lambda flavor: tenant_class_timescale_ddl(),
    "{{ENGINE_ROLLUP_TABLES}}": lambda flavor: engine_rollups.tables_ddl(),
    "{{ENGINE_ROLLUP_CAGGS}}": lambda flavor: engine_rollups.caggs_ddl(),
}


def _render(sql: str, flavor: str) -> str:
    for marker, render in _GENERATED.items():
        if marker in sql:
            sql = sql.replace(marker, render(flavor))
    return sql


@dataclass
class MigrateResult:
    flavor: str
    timescale_version: str | None
    server_version: str
    applied: list[str] = field(default_factory=list)
    partitions_created: int = 0


def _migrations_root():  # a Traversable: a directory in a checkout or an installed wheel
    return resources.files("llmsla.store") / "migrations"


def load_migrations() -> list[Migration]:
    root = _migrations_root()
    files = {p.name: p.read_text(encoding="utf-8") for p in root.iterdir() if p.name.endswith(".sql")}
    out = []
    for fname in sorted(files):
        m = re.fullmatch(r"(\d{4})_(\w+)\.sql", fname)
        if not m:
            continue
        stem = fname[:-4]
        out.append(
            Migration(
                int(m.group(1)), m.group(2), files[fname],
                files.get(f"{stem}.plain.sql", ""), files.get(f"{stem}.timescale.sql", ""),
            )
        )
    return out


def timescale_version(conn: psycopg.Connection) -> str | None:
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'timescaledb'").fetchone()
    return row[0] if row else None


def _decide_flavor(conn: psycopg.Connection, mode: str) -> str:
    """Use TimescaleDB if installed, or if available and creatable; obey ``store.timescale``."""
    if mode == "off":
        return PLAIN
    if timescale_version(conn):
        return TIMESCALE
    available = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb'").fetchone()
    if available:
        try:
            with conn.transaction():
                conn.execute("CREATE EXTENSION IF NOT EXISTS timescaledb")
            return TIMESCALE
        except psycopg.Error as exc:
            if mode == "require":
                raise StoreError(f"store.timescale = require but CREATE EXTENSION timescaledb failed: {exc}") from None
    if mode == "require":
        raise StoreError(
            "store.timescale = require but TimescaleDB is not available on this server "
            "(install it and add it to shared_preload_libraries, or set store.timescale = auto)"
        )
    return PLAIN


def recorded_flavor(conn: psycopg.Connection) -> str | None:
    if scalar(conn, "SELECT to_regclass(%s)", (names.T_MIGRATIONS,)) is None:
        return None
    row = conn.execute(f"SELECT flavor FROM {names.T_MIGRATIONS} ORDER BY version LIMIT 1").fetchone()
    return row[0] if row else None


def migrate(conn: psycopg.Connection, cfg: Config, *, upto: int | None = None) -> MigrateResult:
    """Apply pending migrations (those up to version ``upto`` when given: a store as an older
    release left it), then partition/policy maintenance. Safe to run repeatedly."""
    if not conn.autocommit:
        conn.commit()
    conn.autocommit = True
    conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_ID,))
    try:
        conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {names.T_MIGRATIONS} (
                   version integer PRIMARY KEY, name text NOT NULL, flavor text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        flavor = recorded_flavor(conn) or _decide_flavor(conn, cfg.store.timescale)
        if flavor == TIMESCALE and cfg.store.timescale == "off":
            raise StoreError("this database was migrated with TimescaleDB; store.timescale = off cannot apply")
        done = {r[0] for r in conn.execute(f"SELECT version FROM {names.T_MIGRATIONS}")}
        result = MigrateResult(flavor, timescale_version(conn), scalar(conn, "SHOW server_version"))
        for m in load_migrations():
            if m.version in done or (upto is not None and m.version > upto):
                continue
            try:
                if flavor == TIMESCALE:
                    # continuous aggregates cannot be created inside a transaction block
                    for stmt in _split_sql(m.sql(flavor)):
                        conn.execute(stmt)
                else:
                    with conn.transaction():
                        conn.execute(m.sql(flavor))
                conn.execute(
                    f"INSERT INTO {names.T_MIGRATIONS} (version, name, flavor) VALUES (%s, %s, %s)",
                    (m.version, m.name, flavor),
                )
            except psycopg.Error as exc:
                raise StoreError(f"migration {m.version:04d}_{m.name} ({flavor}) failed: {exc}") from None
            result.applied.append(f"{m.version:04d}_{m.name}")
        result.partitions_created = maintenance.maintain(conn, cfg, flavor=flavor).partitions_created
        return result
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_ID,))


def _split_sql(sql: str) -> list[str]:
    """Split on top-level semicolons (outside quotes and $$ bodies), dropping comment lines."""
    out, buf, i, quote, dollar = [], [], 0, False, False
    while i < len(sql):
        if not quote and not dollar and sql.startswith("--", i):
            j = sql.find("\n", i)
            i = len(sql) if j < 0 else j + 1
            continue
        if not quote and sql.startswith("$$", i):
            dollar = not dollar
            buf.append("$$")
            i += 2
            continue
        ch = sql[i]
        if ch == "'" and not dollar:
            quote = not quote
        if ch == ";" and not quote and not dollar:
            stmt = "".join(buf).strip()
            if stmt:
                out.append(stmt)
            buf = []
        else:
            buf.append(ch)
        i += 1
    stmt = "".join(buf).strip()
    if stmt:
        out.append(stmt)
    return out


def render_frozen() -> dict[str, str]:
    """Every migration rendered for every flavour, by path relative to ``migrations/``."""
    return {f"{FROZEN_DIR}/{flavor}/{m.file_name}": m.render(flavor)
            for m in load_migrations() for flavor in FLAVORS}


def frozen_files(cfg: Config | None, root: Path) -> dict[Path, str]:
    """:func:`render_frozen` under ``root`` (a ``migrations/`` folder), for :mod:`llmsla.generated`."""
    return {root / rel: text for rel, text in render_frozen().items()}


def _frozen_on_disk(root: Path) -> list[Path]:
    return sorted((root / FROZEN_DIR).glob("*/*.sql"))


#: The frozen SQL is the renderer's golden files; unlike the other generators ``--write`` only adds
#: (a frozen file that differs is a released migration: add a new one instead).
GENERATOR = generated.Generator(
    "migrations", "python -m llmsla.store.migrate --write", Path("llmsla/store/migrations"), frozen_files,
    lambda root: ["-m", "llmsla.store.migrate", "--check", "--dir", str(root)], owned=_frozen_on_disk)


def main(argv: list[str] | None = None) -> int:
    """Freeze new migrations (``--write``, never rewriting a frozen one unless ``--force``), or
    check that the renderer still gives every frozen file (``--check``, exit 1 when not)."""
    ap = argparse.ArgumentParser(prog="python -m llmsla.store.migrate")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="write nothing; exit 1 if a frozen migration differs")
    mode.add_argument("--write", action="store_true", help="freeze migrations that have no frozen SQL yet")
    ap.add_argument("--force", action="store_true", help="with --write: also rewrite frozen migrations that differ")
    ap.add_argument("--dir", type=Path, default=None, help="migrations folder (default: the package's)")
    args = ap.parse_args(argv)
    root = args.dir or Path(str(_migrations_root()))
    files = frozen_files(None, root)
    if args.check:
        return generated.run(files, check=True, command=GENERATOR.command, owned=_frozen_on_disk(root))
    fix = []
    for p in generated.stale(files, _frozen_on_disk(root)):
        rel = p.path.relative_to(root)
        if p.kind == generated.ORPHAN:
            print(f"no migration for {rel}; remove it by hand", file=sys.stderr)
        elif p.kind == generated.DIFFERS and not args.force:
            print(f"{rel} is frozen and the renderer now differs: add a new migration instead "
                  f"(or --force before it was ever released)", file=sys.stderr)
        else:
            fix.append(p)
    for path in generated.write(files, fix):
        print(f"wrote {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
