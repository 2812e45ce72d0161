"""Pick the 5 s request windows or a roll-up from the dashboard's time range, in the SQL itself.

One ``UNION ALL`` of three tiers, each branch guarded by the range length, which Grafana expands
to literals and PostgreSQL folds when planning, so a 7-day panel never opens a 5 s partition
(tested with EXPLAIN). No function and no dynamic SQL: the choice stays visible to the planner
and to anyone reading the panel.
See docs/dashboards.md#fast-on-7-days-roll-ups-picked-from-the-range.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmsla import names


@dataclass(frozen=True)
class Tier:
    table: str
    width_s: int
    max_range: str | None  # PostgreSQL interval literal; None = no upper bound
    rollup: bool
    time: str = "bucket"  # the table's time column


TIERS: tuple[Tier, ...] = (
    Tier(names.T_REQUEST_WINDOWS, names.REQUEST_WINDOW_S, "1 hour", rollup=False),
    Tier(names.T_REQUEST_WINDOWS_1M, 60, "1 day", rollup=True),
    Tier(names.T_REQUEST_WINDOWS_1H, 3600, None, rollup=True),
)
#: The forecasts (one score per target every 5 s) and their roll-ups (migration 0006), same ranges.
FORECAST_TIERS: tuple[Tier, ...] = (
    Tier(names.T_FORECASTS, names.REQUEST_WINDOW_S, "1 hour", rollup=False, time="ts"),
    Tier(names.T_FORECASTS_1M, 60, "1 day", rollup=True),
    Tier(names.T_FORECASTS_1H, 3600, None, rollup=True),
)

#: The engine windows (one row per replica every 5 s) and their roll-ups (migration 0015), same
#: ranges; the roll-ups keep the 5 s table's column names (llmsla.store.engine_rollups).
ENGINE_TIERS: tuple[Tier, ...] = (
    Tier(names.T_ENGINE_WINDOWS, names.ENGINE_WINDOW_S, "1 hour", rollup=False),
    Tier(names.T_ENGINE_WINDOWS_1M, 60, "1 day", rollup=True),
    Tier(names.T_ENGINE_WINDOWS_1H, 3600, None, rollup=True),
)

#: Columns whose name differs between the 5 s table and the roll-ups (logical -> (5 s, roll-up)).
PER_TIER: dict[str, tuple[str, str]] = {
    "ttft_p99_ms": ("ttft_p99_ms", "ttft_p99_ms_max"),
    "e2e_p99_ms": ("e2e_p99_ms", "e2e_p99_ms_max"),
    "queue_p99_ms": ("queue_p99_ms", "queue_p99_ms_max"),
}

RANGE = "($__timeTo()::timestamptz - $__timeFrom()::timestamptz)"

#: The dashboard filter on the request labels (multi-value variables, quoted by Grafana).
LABEL_FILTER = " AND ".join(f"{lbl} IN (${lbl})" for lbl in names.REQUEST_LABELS)


def guard(i: int, family: tuple[Tier, ...] = TIERS) -> str:
    """The range condition under which tier ``i`` of ``family`` answers."""
    conds = []
    if i > 0:
        conds.append(f"{RANGE} > INTERVAL '{family[i - 1].max_range}'")
    if family[i].max_range is not None:
        conds.append(f"{RANGE} <= INTERVAL '{family[i].max_range}'")
    return " AND ".join(conds)


def _union(family: tuple[Tier, ...], tiers: tuple[Tier, ...], columns: list[tuple[str, str]], where: str) -> str:
    """``UNION ALL`` of the ``tiers`` (a subset of ``family``), each guarded by its range;
    ``columns``: (5 s expression, roll-up expression) pairs, already aliased."""
    branches = []
    for i, tier in enumerate(family):
        if tier not in tiers:
            continue
        cols = [tier.time if tier.time == "bucket" else f"{tier.time} AS bucket"]
        cols += [rolled if tier.rollup else raw for raw, rolled in columns]
        cols.append(f"{tier.width_s} AS width_s")
        conds = [f"$__timeFilter({tier.time})"]
        if len(tiers) > 1:
            conds.append(guard(i, family))
        if where:
            conds.append(where)
        branches.append(f"SELECT {', '.join(cols)} FROM {tier.table} WHERE {' AND '.join(conds)}")
    return "(" + "\n  UNION ALL ".join(branches) + ") AS w"


def request_windows(columns: list[str], where: str = LABEL_FILTER, *, tiers: tuple[Tier, ...] = TIERS) -> str:
    """A derived table ``w`` with ``bucket``, the label columns, ``columns`` (logical names) and
    ``width_s`` (the tier's bucket width), from the tier the range picks."""
    pairs = [(lbl, lbl) for lbl in names.REQUEST_LABELS]
    for c in columns:
        raw, rolled = PER_TIER.get(c, (c, c))
        pairs.append((raw if raw == c else f"{raw} AS {c}", rolled if rolled == c else f"{rolled} AS {c}"))
    return _union(TIERS, tiers, pairs, where)


def forecast_windows(where: str, *, tiers: tuple[Tier, ...] = FORECAST_TIERS) -> str:
    """A derived table ``w`` with ``bucket``, the forecast key, ``risk_max`` (the highest risk
    in the row's bucket) and ``width_s``, from the forecasts or a roll-up by the range."""
    pairs = [(k, k) for k in ("forecaster", "target", "pool", "replica", "horizon_s")]
    pairs.append(("risk AS risk_max", "risk_max"))
    return _union(FORECAST_TIERS, tiers, pairs, where)



def engine_windows(columns: list[str], where: str, *, tiers: tuple[Tier, ...] = ENGINE_TIERS) -> str:
    """A derived table ``w`` with ``bucket``, the engine key, ``columns`` (the same names on every
    tier) and ``width_s``, from the engine windows or a roll-up by the range."""
    pairs = [(c, c) for c in (names.L_POOL, names.L_REPLICA, names.L_ENGINE, *columns)]
    return _union(ENGINE_TIERS, tiers, pairs, where)
