"""The 1-minute and 1-hour roll-ups of ``engine_windows`` (migration 0015), from one declaration.

``engine_windows`` holds one row per replica every 5 s: a 7-day panel over it read 121k rows per
replica. The roll-ups keep, per bucket and (pool, replica, engine), the rows' columns under the
same names, aggregated as :data:`llmsla.store.schema.ENGINE_VALUE_ROLLUP` declares: counter
increases and counts summed (each window's increase is reset-safe already, so the sum is too),
gauge means weighted by the samples behind them, maxima of the maxima, the engine's mean TTFT
from the summed sum and count, its TTFT histogram (on the store's fixed layout) summed, so any
range's percentiles come from the summed counts. Plain PostgreSQL: tables kept current by a statement-level
trigger on ``engine_windows`` (touched minutes re-aggregated from the 5 s rows, touched hours
from the minutes: idempotent under a replayed window, maxima exact); TimescaleDB: continuous
aggregates over the hypertable. Both flavours expose the same names, columns and types; the
dashboards pick the tier from the range (:mod:`llmsla.dashboards.rollup`). See docs/store.md.
"""

from __future__ import annotations

from llmsla import names
from llmsla.store import schema
from llmsla.store.rollups import ORIGIN, regroup_upsert

KEYS: tuple[str, ...] = tuple(schema.ENGINE_KEYS[1:])
ENGINE_ROLLUPS: dict[str, str] = {
    names.T_ENGINE_WINDOWS_1M: "1 minute",
    names.T_ENGINE_WINDOWS_1H: "1 hour",
}
#: Roll-up columns after the key, in table order: the 5 s rows aggregated (``windows``) and their
#: value and histogram columns under their own names.
COLUMNS: list[str] = ["windows", *schema.ENGINE_VALUES, *schema.ENGINE_HISTS]
FUNCTION = "llmsla_engine_rollups"
_LOCK = 0x11A5_0112  # pg_advisory_xact_lock key: one engine roll-up writer at a time


def aggregate(column: str, *, from_rollup: bool) -> str:
    """The aggregate of one roll-up column over 5 s rows, or over finer roll-up rows (which carry
    the same column names). A weighted mean counts only the rows where the gauge was exposed; a
    finer roll-up row weighs by all its samples (a gauge exposed in only part of one minute is the
    one case where the hour's mean is not the exact sample mean)."""
    if column == "windows":
        return "sum(windows)" if from_rollup else "count(*)"
    if column in schema.ENGINE_HISTS:  # integer[] in the 5 s rows, bigint[] in a roll-up: overloaded
        return f"llmsla_hist_sum({column})"
    kind = schema.ENGINE_VALUE_ROLLUP[column]
    w = schema.ENGINE_WEIGHT
    if kind == schema.SUM:
        return f"sum({column})"
    if kind == schema.MAX:
        return f"max({column})"
    if kind == schema.WMEAN:
        return f"sum({column} * {w}) / NULLIF(sum(CASE WHEN {column} IS NOT NULL THEN {w} END), 0)"
    if kind == schema.RATIO:
        num, den = schema.ENGINE_RATIOS[column]
        return f"sum({num}) / NULLIF(sum({den}), 0)"
    raise ValueError(f"engine_windows.{column}: no roll-up rule {kind!r}")


def _aggregates(*, from_rollup: bool) -> list[str]:
    return [aggregate(c, from_rollup=from_rollup) for c in COLUMNS]


def select(width: str, *, timescale: bool) -> str:
    """The roll-up as one aggregate over the 5 s rows (the continuous aggregate's query, and the
    plain tables' shape and backfill)."""
    bucket = f"time_bucket(INTERVAL '{width}', bucket)" if timescale else f"date_bin(INTERVAL '{width}', bucket, {ORIGIN})"
    aggs = ", ".join(f"{a} AS {c}" for a, c in zip(_aggregates(from_rollup=False), COLUMNS, strict=True))
    return (f"SELECT {bucket} AS bucket, {', '.join(KEYS)}, {aggs}\nFROM {names.T_ENGINE_WINDOWS}\n"
            f"GROUP BY {bucket}, {', '.join(KEYS)}")


def tables_ddl() -> str:
    """Plain flavour: the roll-up tables (``CREATE TABLE AS``: the types the continuous
    aggregates expose), backfilled from the stored windows, and the trigger that keeps them
    current. One trigger per event: a trigger with transition tables has one."""
    m1, h1 = names.T_ENGINE_WINDOWS_1M, names.T_ENGINE_WINDOWS_1H
    t = names.T_ENGINE_WINDOWS
    stmts = []
    for table, width in ENGINE_ROLLUPS.items():
        stmts.append(f"CREATE TABLE {table} AS\n{select(width, timescale=False)}\nWITH NO DATA")
        stmts.append(f"ALTER TABLE {table} ADD PRIMARY KEY (bucket, {', '.join(KEYS)})")
    stmts.append(f"INSERT INTO {m1}\n{select(ENGINE_ROLLUPS[m1], timescale=False)}")
    stmts.append(f"INSERT INTO {h1}\n{select(ENGINE_ROLLUPS[h1], timescale=False)}")
    upserts = [
        regroup_upsert(m1, t, ENGINE_ROLLUPS[m1], source_time="bucket", keys=KEYS, columns=COLUMNS,
                       aggregates=_aggregates(from_rollup=False), keys_from="llmsla_new_rows", from_time="bucket"),
        regroup_upsert(h1, m1, ENGINE_ROLLUPS[h1], source_time="bucket", keys=KEYS, columns=COLUMNS,
                       aggregates=_aggregates(from_rollup=True), keys_from="llmsla_new_rows", from_time="bucket"),
    ]
    body = ";\n    ".join([f"PERFORM pg_advisory_xact_lock({_LOCK})", *(u.replace("\n", "\n    ") for u in upserts),
                           "RETURN NULL"])
    stmts.append(f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
                 f"BEGIN\n    {body};\nEND $$")
    for event in ("INSERT", "UPDATE"):
        stmts.append(
            f"CREATE TRIGGER {t}_rollup_{event.lower()} AFTER {event} ON {t}\n"
            f"REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()")
    return ";\n\n".join(stmts) + ";"


def caggs_ddl() -> str:
    """TimescaleDB: continuous aggregates (real-time, like the request roll-ups), both over the
    hypertable, materialised from the windows already stored."""
    stmts = []
    for view, width in ENGINE_ROLLUPS.items():
        stmts.append(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view}\n"
                     f"WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS\n"
                     f"{select(width, timescale=True)}\nWITH NO DATA")
    for view in ENGINE_ROLLUPS:
        stmts.append(f"CALL refresh_continuous_aggregate('{view}', NULL, NULL)")
    return ";\n\n".join(stmts) + ";"
