"""The 1-minute and 1-hour roll-ups of ``request_windows``, from one column list.

Plain PostgreSQL gets ordinary views (``date_bin``); TimescaleDB gets continuous aggregates
(``time_bucket``). Both expose the same names and columns. Counts and sums roll up exactly, so
attainment (``ttft_within_slo / requests``) and means (``ttft_sum_ms / ttft_count``, ITL pooled
variance from ``itl_sumsq_ms2``) are exact at any width; a percentile cannot be merged from
percentiles, so the roll-ups keep the worst 5 s window's P99 (``*_p99_ms_max``).
"""

from __future__ import annotations

from llmsla import names

#: Bucket origin of the plain flavour's date_bin (epoch-aligned like time_bucket).
ORIGIN = "TIMESTAMPTZ '2000-01-01 00:00:00+00'"
KEYS = ("model", "pool", "replica", "arm")

ROLLUPS: dict[str, str] = {
    names.T_REQUEST_WINDOWS_1M: "1 minute",
    names.T_REQUEST_WINDOWS_1H: "1 hour",
}

_SUMS = (
    "requests", "ok", "errors", "timeouts", "cancelled", "rejected", "prompt_tokens",
    "output_tokens", "ttft_within_slo", "e2e_within_slo", "ttft_count", "ttft_sum_ms",
    "e2e_sum_ms", "itl_n", "itl_sum_ms", "itl_sumsq_ms2",
)
_MAXES = ("ttft_p99_ms", "e2e_p99_ms", "queue_p99_ms", "ttft_slo_ms", "e2e_slo_ms")


def rollup_select(width: str, *, timescale: bool) -> str:
    bucket = (
        f"time_bucket(INTERVAL '{width}', bucket)"
        if timescale
        else f"date_bin(INTERVAL '{width}', bucket, {ORIGIN})"
    )
    cols = [f"{bucket} AS bucket", "model", "pool", "replica", "arm", "count(*) AS windows"]
    cols += [f"sum({c}) AS {c}" for c in _SUMS]
    cols += [f"max({c}) AS {c}_max" if c.endswith("_p99_ms") else f"max({c}) AS {c}" for c in _MAXES]
    return (
        "SELECT " + ",\n       ".join(cols) + f"\nFROM {names.T_REQUEST_WINDOWS}\n"
        f"GROUP BY {bucket}, model, pool, replica, arm"
    )


def rollup_ddl(*, timescale: bool) -> str:
    stmts = []
    for view, width in ROLLUPS.items():
        body = rollup_select(width, timescale=timescale)
        if timescale:
            stmts.append(
                f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view}\n"
                f"WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS\n{body}\nWITH NO DATA;"
            )
        else:
            stmts.append(f"CREATE OR REPLACE VIEW {view} AS\n{body};")
    return "\n\n".join(stmts)


# -- plain PostgreSQL: materialised roll-ups -----------------------------------------------------
# A view over the 5 s table makes a 7-day panel aggregate every 5 s row (7.7M rows for 64
# replicas) and disappears with the 5 s partitions at retention. Migration 0003 therefore turns
# the plain flavour's roll-ups into tables kept current by a statement-level trigger on
# request_windows: the 1 m groups a statement touched are re-aggregated from their 5 s rows, then
# the touched 1 h groups from their 1 m rows. Re-aggregating (not adding deltas) keeps a replayed
# upsert idempotent and the *_max columns exact. TimescaleDB keeps its continuous aggregates.

#: Trigger function name (plain flavour); a later migration that adds roll-up columns re-renders it.
ROLLUP_FUNCTION = "llmsla_request_rollups"
_ROLLUP_LOCK = 0x11A5_0110  # pg_advisory_xact_lock key: one roll-up writer at a time


def rollup_columns() -> list[str]:
    """The roll-ups' columns after the key, in table order."""
    return ["windows", *_SUMS, *(f"{c}_max" if c.endswith("_p99_ms") else c for c in _MAXES)]


def _aggregates(*, from_rollup: bool) -> list[str]:
    """Aggregate expressions for :func:`rollup_columns`, from 5 s rows or from a finer roll-up."""
    out = ["sum(windows)" if from_rollup else "count(*)"]
    out += [f"sum({c})" for c in _SUMS]
    for c in _MAXES:
        src = f"{c}_max" if c.endswith("_p99_ms") and from_rollup else c
        out.append(f"max({src})")
    return out


def _upsert(target: str, source: str, width: str, *, from_rollup: bool, keys_from: str) -> str:
    """Re-aggregate the ``width`` groups named by ``keys_from`` (rows with bucket + keys) from
    ``source`` into ``target``; one index range scan per touched group (LATERAL)."""
    cols = rollup_columns()
    aggs = ", ".join(f"{a} AS {c}" for a, c in zip(_aggregates(from_rollup=from_rollup), cols, strict=True))
    key_eq = " AND ".join(f"s.{k} = g.{k}" for k in KEYS)
    keys = ", ".join(KEYS)
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols)
    return (
        f"INSERT INTO {target} (bucket, {keys}, {', '.join(cols)})\n"
        f"SELECT g.b, {', '.join('g.' + k for k in KEYS)}, a.*\n"
        f"FROM (SELECT DISTINCT date_bin(INTERVAL '{width}', bucket, {ORIGIN}) AS b, {keys} FROM {keys_from}) g,\n"
        f"LATERAL (SELECT {aggs} FROM {source} s\n"
        f"         WHERE s.bucket >= g.b AND s.bucket < g.b + INTERVAL '{width}' AND {key_eq}) a\n"
        f"WHERE a.windows > 0\n"
        f"ON CONFLICT (bucket, {keys}) DO UPDATE SET {sets}"
    )


def rollup_tables_ddl() -> str:
    """Plain flavour: replace the roll-up views with tables, backfill them, install the trigger."""
    m1, h1 = names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H
    keys = ", ".join(KEYS)
    stmts = [f"DROP VIEW IF EXISTS {h1}", f"DROP VIEW IF EXISTS {m1}"]
    for table, width in ROLLUPS.items():
        # CREATE TABLE AS gives exactly the columns and types the views (and TimescaleDB's
        # continuous aggregates) expose
        stmts.append(f"CREATE TABLE {table} AS\n{rollup_select(width, timescale=False)}\nWITH NO DATA")
        stmts.append(f"ALTER TABLE {table} ADD PRIMARY KEY (bucket, {keys})")
    stmts.append(f"INSERT INTO {m1}\n{rollup_select(ROLLUPS[m1], timescale=False)}")
    stmts.append(_upsert(h1, m1, ROLLUPS[h1], from_rollup=True, keys_from=m1))
    stmts.append(rollup_function_ddl())
    for event in ("INSERT", "UPDATE"):  # a trigger with transition tables has one event
        stmts.append(
            f"CREATE TRIGGER {names.T_REQUEST_WINDOWS}_rollup_{event.lower()} AFTER {event} ON {names.T_REQUEST_WINDOWS}\n"
            f"REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION {ROLLUP_FUNCTION}()"
        )
    return ";\n\n".join(stmts) + ";"


def rollup_function_ddl() -> str:
    """The trigger function; the advisory lock serialises concurrent writers, and each statement
    inside it takes a fresh snapshot (READ COMMITTED), so the re-aggregation sees every row
    committed before it."""
    m1, h1 = names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H
    body = ";\n    ".join([
        f"PERFORM pg_advisory_xact_lock({_ROLLUP_LOCK})",
        _upsert(m1, names.T_REQUEST_WINDOWS, ROLLUPS[m1], from_rollup=False, keys_from="llmsla_new_rows").replace("\n", "\n    "),
        _upsert(h1, m1, ROLLUPS[h1], from_rollup=True, keys_from="llmsla_new_rows").replace("\n", "\n    "),
        "RETURN NULL",
    ])
    return (
        f"CREATE OR REPLACE FUNCTION {ROLLUP_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN\n    {body};\nEND $$"
    )
