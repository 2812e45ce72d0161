"""The 1-minute and 1-hour roll-ups of ``forecasts`` (migration 0006), for the risk panels.

The online scorer writes one row per target every 5 s: 64 targets make 1.1M rows a day, and a
7-day risk panel that groups them all took 0.6 s on a tenth of that density. The roll-ups keep,
per bucket and series (forecaster, target, pool, replica, horizon), the steps scored, the
highest and the summed risk (an exact mean at any width), the threshold and the steps at or
above it (time at risk). Plain PostgreSQL: tables kept current by a statement-level trigger on
``forecasts`` (touched minutes re-aggregated from the 5 s rows, touched hours from the minutes);
TimescaleDB: continuous aggregates. Both expose the same names and columns; the dashboards pick
the tier from the range (:mod:`llmsla.dashboards.rollup`).
"""

from __future__ import annotations

from llmsla import names
from llmsla.store.rollups import ORIGIN, regroup_upsert

KEYS: tuple[str, ...] = ("forecaster", "target", "pool", "replica", "horizon_s")
FORECAST_ROLLUPS: dict[str, str] = {
    names.T_FORECASTS_1M: "1 minute",
    names.T_FORECASTS_1H: "1 hour",
}
#: Roll-up columns after the key, in table order.
COLUMNS: list[str] = ["steps", "risk_max", "risk_sum", "threshold", "alarm_steps"]
FUNCTION = "llmsla_forecast_rollups"
_LOCK = 0x11A5_0111  # pg_advisory_xact_lock key: one forecast roll-up writer at a time
_AT_RISK = "CASE WHEN risk >= threshold THEN 1 ELSE 0 END"


def _aggregates(*, from_rollup: bool) -> list[str]:
    if from_rollup:
        return ["sum(steps)", "max(risk_max)", "sum(risk_sum)", "max(threshold)", "sum(alarm_steps)"]
    return ["count(*)", "max(risk)", "sum(risk)", "max(threshold)", f"sum({_AT_RISK})"]


def _select(width: str, *, timescale: bool) -> str:
    """The roll-up as one aggregate over the 5 s rows (the continuous aggregate's query, and the
    plain tables' shape and backfill)."""
    bucket = f"time_bucket(INTERVAL '{width}', ts)" if timescale else f"date_bin(INTERVAL '{width}', ts, {ORIGIN})"
    aggs = ", ".join(f"{a} AS {c}" for a, c in zip(_aggregates(from_rollup=False), COLUMNS, strict=True))
    return (f"SELECT {bucket} AS bucket, {', '.join(KEYS)}, {aggs}\nFROM {names.T_FORECASTS}\n"
            f"GROUP BY {bucket}, {', '.join(KEYS)}")


def tables_ddl() -> str:
    """Plain flavour: the roll-up tables, backfilled, and the trigger that keeps them current."""
    m1, h1 = names.T_FORECASTS_1M, names.T_FORECASTS_1H
    stmts = []
    for table, width in FORECAST_ROLLUPS.items():
        stmts.append(f"CREATE TABLE {table} AS\n{_select(width, timescale=False)}\nWITH NO DATA")
        stmts.append(f"ALTER TABLE {table} ADD PRIMARY KEY (bucket, {', '.join(KEYS)})")
        stmts.append(f"INSERT INTO {table}\n{_select(width, timescale=False)}")
    upserts = [
        regroup_upsert(m1, names.T_FORECASTS, FORECAST_ROLLUPS[m1], source_time="ts", keys=KEYS, columns=COLUMNS,
                       aggregates=_aggregates(from_rollup=False), keys_from="llmsla_new_rows", from_time="ts"),
        regroup_upsert(h1, m1, FORECAST_ROLLUPS[h1], source_time="bucket", keys=KEYS, columns=COLUMNS,
                       aggregates=_aggregates(from_rollup=True), keys_from="llmsla_new_rows", from_time="ts"),
    ]
    body = ";\n    ".join([f"PERFORM pg_advisory_xact_lock({_LOCK})", *(u.replace("\n", "\n    ") for u in upserts),
                           "RETURN NULL"])
    stmts.append(f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
                 f"BEGIN\n    {body};\nEND $$")
    for event in ("INSERT", "UPDATE"):  # a trigger with transition tables has one event
        stmts.append(
            f"CREATE TRIGGER {names.T_FORECASTS}_rollup_{event.lower()} AFTER {event} ON {names.T_FORECASTS}\n"
            f"REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION {FUNCTION}()")
    return ";\n\n".join(stmts) + ";"


def caggs_ddl() -> str:
    """TimescaleDB: continuous aggregates, materialised from the forecasts already stored."""
    stmts = []
    for view, width in FORECAST_ROLLUPS.items():
        stmts.append(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view}\n"
                     f"WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS\n"
                     f"{_select(width, timescale=True)}\nWITH NO DATA")
    for view in FORECAST_ROLLUPS:
        stmts.append(f"CALL refresh_continuous_aggregate('{view}', NULL, NULL)")
    return ";\n\n".join(stmts) + ";"
