"""Every store (PostgreSQL/TimescaleDB) query of the dashboards and the report.

Written for Grafana's PostgreSQL datasource: ``$__timeFilter``/``$__timeGroupAlias`` macros,
multi-value variables in ``IN ($var)`` (Grafana quotes each value), a ``metric`` column naming
the series of a time-series query. Request-window queries go through
:func:`llmsla.dashboards.rollup.request_windows`, which picks the 5 s table or a roll-up from the
range; :data:`TIERED` keeps their builders so ``bench/dashboards.py`` can run the same query on the
5 s table alone. No SQL comments (see :mod:`llmsla.dashboards.macros`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmsla import names
from llmsla.dashboards.query import SqlQuery, register
from llmsla.dashboards.rollup import (
    ENGINE_TIERS,
    FORECAST_TIERS,
    LABEL_FILTER,
    TIERS,
    Tier,
    engine_windows,
    forecast_windows,
    request_windows,
)

TIME = "$__timeGroupAlias(bucket, $__interval)"
T_POLICY, T_FORECASTS, T_ACTIONS, T_AB = names.T_POLICY_WINDOWS, names.T_FORECASTS, names.T_ACTION_LOG, names.T_AB_RESULTS

#: Tiered queries by key -> their SQL on every tier (``raw=False``) or on the 5 s table alone
#: (``raw=True``: the bench's anchor, what the panel costs without roll-ups).
TIERED: dict[str, Callable[[bool], str]] = {}
#: Tiered queries by key -> the tables of each family they read, each tier's table, finest first
#: (the plan test's expectation: a range reads tier ``i`` of every family).
TIER_TABLES: dict[str, tuple[tuple[str, ...], ...]] = {}


def _sql(key: str, sql: str, columns: tuple[str, ...], **kw: Any) -> SqlQuery:
    return register(SqlQuery(key, sql.strip(), columns, **kw))


def _tiered(key: str, build: Callable[[tuple[Tier, ...]], str], columns: tuple[str, ...],
            family: tuple[Tier, ...] = TIERS, **kw: object) -> SqlQuery:
    TIERED[key] = lambda raw: build(family[:1] if raw else family)
    TIER_TABLES[key] = (tuple(t.table for t in family),)
    return _sql(key, build(family), columns, **kw)


# -- variables (store-only dashboards) ------------------------------------------------------------
_RECENT_1H = "bucket > $__timeFrom()::timestamptz - INTERVAL '1 hour' AND bucket <= $__timeTo()::timestamptz"


def _store_var(label: str) -> SqlQuery:
    """Distinct label values of the request windows around the range, from the 1 h roll-up (the
    hour holding the range start included, so a short range still lists its series)."""
    return _sql(f"var.store_{label}", f"SELECT DISTINCT {label} FROM {names.T_REQUEST_WINDOWS_1H} WHERE {_RECENT_1H} ORDER BY 1",
                (label,), fmt="table")


VAR_MODEL, VAR_POOL, VAR_REPLICA, VAR_ARM = (_store_var(lbl) for lbl in names.REQUEST_LABELS)
VAR_TENANT, VAR_CLASS = (_store_var(lbl) for lbl in (names.L_TENANT, names.L_CLASS))
VAR_ZONE = _sql("var.zone", f"SELECT DISTINCT zone FROM {T_POLICY} WHERE $__timeFilter(bucket) ORDER BY 1",
                ("zone",), fmt="table")
VAR_POLICY_ID = _sql("var.policy_id",
                     f"SELECT DISTINCT policy_id FROM {T_POLICY} WHERE $__timeFilter(bucket) AND zone IN ($zone) ORDER BY 1",
                     ("policy_id",), fmt="table")
VAR_EXPERIMENT = _sql("var.experiment", f"SELECT DISTINCT experiment FROM {T_AB} WHERE $__timeFilter(ts) ORDER BY 1",
                      ("experiment",), fmt="table")

# -- request windows: P99 per instance, QPS, attainment -------------------------------------------


def _p99_by_replica(column: str) -> Callable[[tuple[Tier, ...]], str]:
    return lambda tiers: (
        f"SELECT {TIME}, replica AS metric, max({column}) / 1000.0 AS p99_s\n"
        f"FROM {request_windows([column], tiers=tiers)}\nGROUP BY 1, 2 ORDER BY 1, 2"
    )


TTFT_P99_HISTORY = _tiered("instances.ttft_p99_history", _p99_by_replica("ttft_p99_ms"), ("time", "metric", "p99_s"))
E2E_P99_HISTORY = _tiered("instances.e2e_p99_history", _p99_by_replica("e2e_p99_ms"), ("time", "metric", "p99_s"))

QPS_HISTORY = _tiered(
    "history.qps",
    lambda tiers: (
        f"SELECT {TIME}, pool AS metric,\n"
        f"       sum(requests) / GREATEST($__interval_ms / 1000.0, max(width_s)) AS qps\n"
        f"FROM {request_windows(['requests'], tiers=tiers)}\nGROUP BY 1, 2 ORDER BY 1, 2"
    ),
    ("time", "metric", "qps"),
)


def _attainment(by: str, where: str | None = None) -> Callable[[tuple[Tier, ...]], str]:
    cols = ["requests", "ttft_within_slo", "e2e_within_slo"]
    return lambda tiers: (
        f"SELECT {TIME}, {by} AS metric,\n"
        f"       sum(ttft_within_slo)::float8 / NULLIF(sum(requests), 0) AS ttft_attainment,\n"
        f"       sum(e2e_within_slo)::float8 / NULLIF(sum(requests), 0) AS e2e_attainment\n"
        f"FROM {request_windows(cols, tiers=tiers) if where is None else request_windows(cols, where, tiers=tiers)}\n"
        f"GROUP BY 1, 2 ORDER BY 1, 2"
    )


#: The tenancy panels' filter: the request labels and the store's tenant and class variables.
TENANCY_FILTER = f"{LABEL_FILTER} AND {names.L_TENANT} IN (${names.L_TENANT}) AND {names.L_CLASS} IN (${names.L_CLASS})"
#: Goodput over the requests of the windows that count it (NULL in windows written before the
#: store had the column: they are left out of both sides, never counted as 0).
GOODPUT_RATIO = "sum(goodput)::float8 / NULLIF(sum(requests) FILTER (WHERE goodput IS NOT NULL), 0)"


def _tenancy(by: str) -> Callable[[tuple[Tier, ...]], str]:
    cols = [by, "requests", "ttft_within_slo", "goodput"]
    return lambda tiers: (
        f"SELECT {TIME}, {by} AS metric,\n"
        f"       sum(ttft_within_slo)::float8 / NULLIF(sum(requests), 0) AS ttft_attainment,\n"
        f"       {GOODPUT_RATIO} AS goodput_ratio\n"
        f"FROM {request_windows(cols, TENANCY_FILTER, tiers=tiers)}\n"
        f"GROUP BY 1, 2 ORDER BY 1, 2"
    )


_TENANCY_COLS = ("time", "metric", "ttft_attainment", "goodput_ratio")
ATTAINMENT_BY_TENANT = _tiered("tenancy.by_tenant", _tenancy(names.L_TENANT), _TENANCY_COLS)
ATTAINMENT_BY_CLASS = _tiered("tenancy.by_class", _tenancy(names.L_CLASS), _TENANCY_COLS)
TENANCY_SUMMARY = _tiered(
    "tenancy.summary",
    lambda tiers: (
        f"SELECT {names.L_TENANT}, {names.L_CLASS}, sum(requests) AS requests,\n"
        "       sum(ttft_within_slo)::float8 / NULLIF(sum(requests), 0) AS ttft_attainment,\n"
        "       sum(e2e_within_slo)::float8 / NULLIF(sum(requests), 0) AS e2e_attainment,\n"
        f"       {GOODPUT_RATIO} AS goodput_ratio\n"
        f"FROM {request_windows([names.L_TENANT, names.L_CLASS, 'requests', 'ttft_within_slo', 'e2e_within_slo', 'goodput'], TENANCY_FILTER, tiers=tiers)}\n"
        "GROUP BY 1, 2 ORDER BY 1, 2"
    ),
    (names.L_TENANT, names.L_CLASS, "requests", "ttft_attainment", "e2e_attainment", "goodput_ratio"),
    fmt="table",
)

_ATT_COLS = ("time", "metric", "ttft_attainment", "e2e_attainment")
ATTAINMENT_BY_POOL = _tiered("history.attainment", _attainment("pool"), _ATT_COLS)
ATTAINMENT_BY_ARM = _tiered("ab.attainment", _attainment("arm"), _ATT_COLS)
ARM_SUMMARY = _tiered(
    "ab.arm_summary",
    lambda tiers: (
        "SELECT arm, sum(requests) AS requests,\n"
        "       sum(requests)::float8 / NULLIF(sum(sum(requests)) OVER (), 0) AS share,\n"
        "       sum(ttft_within_slo)::float8 / NULLIF(sum(requests), 0) AS ttft_attainment,\n"
        "       sum(e2e_within_slo)::float8 / NULLIF(sum(requests), 0) AS e2e_attainment,\n"
        "       sum(errors + timeouts)::float8 / NULLIF(sum(requests), 0) AS error_ratio\n"
        f"FROM {request_windows(['requests', 'ttft_within_slo', 'e2e_within_slo', 'errors', 'timeouts'], tiers=tiers)}\n"
        "GROUP BY arm ORDER BY arm"
    ),
    ("arm", "requests", "share", "ttft_attainment", "e2e_attainment", "error_ratio"),
    fmt="table",
)

# -- engine vs gateway TTFT per replica (engine windows beside request windows) -----------------
#: TTFT per pool/replica and interval as the gateway measured it (its clock starts when the
#: request reaches it) and as the engine measured it (its own histogram, from when the request
#: reached the engine): the means from exact sums and counts, and their difference (the time spent
#: before the engine: gateway, network, tokenizer); P50 and P99 of the interval from the summed
#: histograms on the store's one layout (the engine's native buckets spread onto it by the stream
#: job), so both sides' percentiles have the same definition. Both over every request of the
#: replica (the engine knows no model or arm variable); each side from the tier the range picks
#: (5 s, 1 m or 1 h, the same width on both sides).
_REPLICA_FILTER = f"{names.L_POOL} IN (${names.L_POOL}) AND {names.L_REPLICA} IN (${names.L_REPLICA})"


def _ttft_side(windows: str, sum_col: str, count_col: str, hist: str) -> str:
    return (f"SELECT {TIME}, pool || '/' || replica AS metric, sum({sum_col}) AS sum_ms, sum({count_col}) AS n,\n"
            f"         llmsla_hist_p50({hist}) AS p50_ms, llmsla_hist_p99({hist}) AS p99_ms\n"
            f"  FROM {windows} GROUP BY 1, 2")


def _engine_gateway_ttft(raw: bool) -> str:
    gateway = request_windows(["ttft_sum_ms", "ttft_count", names.C_TTFT_HIST], _REPLICA_FILTER,
                              tiers=TIERS[:1] if raw else TIERS)
    engine = engine_windows(["engine_ttft_sum_ms", "engine_ttft_count", names.C_ENGINE_TTFT_HIST], _REPLICA_FILTER,
                            tiers=ENGINE_TIERS[:1] if raw else ENGINE_TIERS)
    return (
        "SELECT g.time, g.metric,\n"
        "       g.sum_ms / NULLIF(g.n, 0) / 1000.0 AS gateway_ttft_s,\n"
        "       e.sum_ms / NULLIF(e.n, 0) / 1000.0 AS engine_ttft_s,\n"
        "       (g.sum_ms / NULLIF(g.n, 0) - e.sum_ms / NULLIF(e.n, 0)) / 1000.0 AS gap_s,\n"
        "       g.p50_ms / 1000.0 AS gateway_p50_s, g.p99_ms / 1000.0 AS gateway_p99_s,\n"
        "       e.p50_ms / 1000.0 AS engine_p50_s, e.p99_ms / 1000.0 AS engine_p99_s\n"
        f"FROM ({_ttft_side(gateway, 'ttft_sum_ms', 'ttft_count', names.C_TTFT_HIST)}) AS g\n"
        f"JOIN ({_ttft_side(engine, 'engine_ttft_sum_ms', 'engine_ttft_count', names.C_ENGINE_TTFT_HIST)}) AS e\n"
        "  ON e.time = g.time AND e.metric = g.metric\n"
        "ORDER BY 1, 2"
    )


ENGINE_GATEWAY_TTFT_KEY = "instances.engine_gateway_ttft"
TIERED[ENGINE_GATEWAY_TTFT_KEY] = _engine_gateway_ttft
TIER_TABLES[ENGINE_GATEWAY_TTFT_KEY] = (tuple(t.table for t in TIERS), tuple(t.table for t in ENGINE_TIERS))
ENGINE_GATEWAY_TTFT = _sql(
    ENGINE_GATEWAY_TTFT_KEY, _engine_gateway_ttft(False),
    ("time", "metric", "gateway_ttft_s", "engine_ttft_s", "gap_s", "gateway_p50_s", "gateway_p99_s",
     "engine_p50_s", "engine_p99_s"),
)

# -- A/B results ----------------------------------------------------------------------------------
_AB_WHERE = "$__timeFilter(ts) AND experiment IN ($experiment) AND arm IN ($arm)"
_LATENCY = f"'{names.AB_METRIC_TTFT_P95}', '{names.AB_METRIC_E2E_P95}'"
#: every metric where lower is better (the quantiles, the mean ITL); the rest are ratios
_LOWER_IS_BETTER = ", ".join(f"'{m}'" for m in names.AB_LATENCY_METRICS)
P95_DIFF = _sql(
    "ab.p95_diff",
    f"SELECT $__time(ts), arm || ' ' || metric AS metric, effect, ci_low, ci_high\n"
    f"FROM {T_AB} WHERE {_AB_WHERE} AND metric IN ({_LATENCY})\nORDER BY 1, 2",
    ("time", "metric", "effect", "ci_low", "ci_high"),
)
VERDICTS = _sql(
    "ab.verdicts",
    "SELECT DISTINCT ON (experiment, arm, metric) ts AS time, experiment, arm, metric, n, value, baseline,\n"
    "       effect, ci_low, ci_high, p_value,\n"
    "       CASE\n"
    f"         WHEN metric = '{names.AB_METRIC_SRM}' THEN CASE WHEN p_value < 0.001 THEN 'sample ratio mismatch' ELSE 'split ok' END\n"
    "         WHEN ci_low IS NULL OR ci_high IS NULL THEN 'no interval'\n"
    f"         WHEN metric IN ({_LOWER_IS_BETTER}) AND ci_high < 0 THEN 'better'\n"
    f"         WHEN metric IN ({_LOWER_IS_BETTER}) AND ci_low > 0 THEN 'worse'\n"
    f"         WHEN metric NOT IN ({_LOWER_IS_BETTER}) AND ci_low > 0 THEN 'better'\n"
    f"         WHEN metric NOT IN ({_LOWER_IS_BETTER}) AND ci_high < 0 THEN 'worse'\n"
    "         ELSE 'no difference'\n"
    "       END AS verdict\n"
    f"FROM {T_AB} WHERE {_AB_WHERE}\nORDER BY experiment, arm, metric, ts DESC",
    ("time", "experiment", "arm", "metric", "n", "value", "baseline", "effect", "ci_low", "ci_high", "p_value", "verdict"),
    fmt="table",
)
SRM = _sql(
    "ab.srm",
    "SELECT $__time(ts), experiment || ' ' || arm AS metric, p_value\n"
    f"FROM {T_AB} WHERE {_AB_WHERE} AND metric = '{names.AB_METRIC_SRM}'\nORDER BY 1, 2",
    ("time", "metric", "p_value"),
)

# -- temperature policy (60 s windows; no roll-up needed: one row per zone and policy a minute) ---
_POLICY_WHERE = "$__timeFilter(bucket) AND zone IN ($zone) AND policy_id IN ($policy_id)"
_MEAN = "sum(temperature_mean * decisions) / NULLIF(sum(decisions), 0)"
POLICY_TEMPERATURE = _sql(
    "policy.temperature",
    f"SELECT {TIME}, zone || '/' || policy_id AS metric, {_MEAN} AS temperature\n"
    f"FROM {T_POLICY} WHERE {_POLICY_WHERE}\nGROUP BY 1, 2 ORDER BY 1, 2",
    ("time", "metric", "temperature"),
)
POLICY_JITTER = _sql(
    "policy.jitter",
    # pooled population std: E[x^2] per window is jitter^2 + mean^2, weighted by decisions
    f"SELECT {TIME}, zone || '/' || policy_id AS metric,\n"
    f"       sqrt(GREATEST(sum(decisions * (temperature_jitter ^ 2 + temperature_mean ^ 2)) / NULLIF(sum(decisions), 0)\n"
    f"                     - ({_MEAN}) ^ 2, 0)) AS jitter\n"
    f"FROM {T_POLICY} WHERE {_POLICY_WHERE}\nGROUP BY 1, 2 ORDER BY 1, 2",
    ("time", "metric", "jitter"),
)
POLICY_LATENCY = _sql(
    "policy.latency_p99",
    f"SELECT {TIME}, zone AS metric, max(latency_p99_ms) AS latency_p99_ms\n"
    f"FROM {T_POLICY} WHERE {_POLICY_WHERE}\nGROUP BY 1, 2 ORDER BY 1, 2",
    ("time", "metric", "latency_p99_ms"),
)
POLICY_DECIDE = _sql(
    "policy.decide_p99",
    f"SELECT {TIME}, zone AS metric, max(decide_p99_ms) AS decide_p99_ms\n"
    f"FROM {T_POLICY} WHERE {_POLICY_WHERE}\nGROUP BY 1, 2 ORDER BY 1, 2",
    ("time", "metric", "decide_p99_ms"),
)
POLICY_DECISIONS = _sql(
    "policy.decisions",
    f"SELECT {TIME}, zone AS metric, sum(decisions) AS decisions\n"
    f"FROM {T_POLICY} WHERE {_POLICY_WHERE}\nGROUP BY 1, 2 ORDER BY 1, 2",
    ("time", "metric", "decisions"),
)

# -- forecasts and actions ------------------------------------------------------------------------
RISK_HISTORY = _tiered(
    "forecast.risk_history",
    # one series per scored target, named like the live panel's legend: pool/replica (kind)
    lambda tiers: (
        f"SELECT {TIME}, pool || '/' || replica || ' (' || target || ')' AS metric, max(risk_max) AS risk\n"
        f"FROM {forecast_windows('pool IN ($pool)', tiers=tiers)}\nGROUP BY 1, 2 ORDER BY 1, 2"
    ),
    ("time", "metric", "risk"),
    family=FORECAST_TIERS,
)
LATEST_FORECASTS = _sql(
    "forecast.latest",
    # the newest forecast per series from the last hour of the range: a 7-day range must not sort
    # every stored forecast to find the current ones
    "SELECT DISTINCT ON (forecaster, target, pool, replica, horizon_s) ts AS time, forecaster, target, pool,\n"
    "       replica, horizon_s, predicted, threshold, risk\n"
    f"FROM {T_FORECASTS} WHERE $__timeFilter(ts) AND ts > $__timeTo()::timestamptz - INTERVAL '1 hour' AND pool IN ($pool)\n"
    "ORDER BY forecaster, target, pool, replica, horizon_s, ts DESC",
    ("time", "forecaster", "target", "pool", "replica", "horizon_s", "predicted", "threshold", "risk"),
    fmt="table",
)
ACTIONS = _sql(
    "actions.table",
    "SELECT ts AS time, source, actor, action, target, params::text AS params, reason, alertname, outcome\n"
    f"FROM {T_ACTIONS} WHERE $__timeFilter(ts)\nORDER BY ts DESC LIMIT 500",
    ("time", "source", "actor", "action", "target", "params", "reason", "alertname", "outcome"),
    fmt="table",
)
_ANNOTATION_TEXT = "action || ' ' || target || ' -> ' || outcome || CASE WHEN reason <> '' THEN ': ' || reason ELSE '' END"
ALERT_ANNOTATIONS = _sql(
    "actions.alert_annotations",
    f"SELECT ts AS time, alertname || ': ' || {_ANNOTATION_TEXT} AS text, concat_ws(',', source, alertname, outcome) AS tags\n"
    f"FROM {T_ACTIONS} WHERE $__timeFilter(ts) AND alertname IS NOT NULL\nORDER BY ts",
    ("time", "text", "tags"),
    fmt="table",
)
ACTION_ANNOTATIONS = _sql(
    "actions.action_annotations",
    f"SELECT ts AS time, actor || ': ' || {_ANNOTATION_TEXT} AS text, concat_ws(',', source, actor, outcome) AS tags\n"
    f"FROM {T_ACTIONS} WHERE $__timeFilter(ts) AND alertname IS NULL\nORDER BY ts",
    ("time", "text", "tags"),
    fmt="table",
)
