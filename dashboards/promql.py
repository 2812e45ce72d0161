"""Every PromQL query of the dashboards (and of the report), built from ``llmsla.names``.

Request series are filtered by the dashboard variables ``$model``, ``$pool``, ``$replica``, ``$arm``
(multi-value, include-all, no custom all value, so "All" expands to the listed values and the
same variable also works in SQL). Rates use ``$__rate_interval`` (at least four scrapes, so a
short panel interval never leaves a window with one sample). The heatmaps take the per-bucket
rate of the histogram with format ``heatmap``: Grafana turns the cumulative ``le`` series into
per-bucket values and the panel draws them as they are (no re-bucketing).
"""

from __future__ import annotations

from typing import Any

from llmsla import names
from llmsla.dashboards.query import SLOTH_RULES, PromQuery, register

RATE = "$__rate_interval"


def selector(*labels: str, extra: str = "") -> str:
    """``{model=~"$model", ...}``: a regex match on each dashboard variable."""
    parts = [f'{lbl}=~"${lbl}"' for lbl in labels]
    if extra:
        parts.append(extra)
    return "{" + ", ".join(parts) + "}"


REQ = selector(*names.REQUEST_LABELS)
REQUESTS_TOTAL = f"{names.REQUESTS}_total"
_FAILED = f'{names.L_STATUS}=~"{names.STATUS_ERROR}|{names.STATUS_TIMEOUT}"'
_COUNTED = f'{names.L_STATUS}!="{names.STATUS_CANCELLED}"'


def _q(key: str, expr: str, **kw: Any) -> PromQuery:
    return register(PromQuery(key, expr, **kw))


# -- variables ------------------------------------------------------------------------------------
VAR_MODEL = _q("var.model", f"label_values({REQUESTS_TOTAL}, {names.L_MODEL})")
VAR_POOL = _q("var.pool", f"label_values({REQUESTS_TOTAL}{selector(names.L_MODEL)}, {names.L_POOL})")
VAR_REPLICA = _q("var.replica", f"label_values({REQUESTS_TOTAL}{selector(names.L_MODEL, names.L_POOL)}, {names.L_REPLICA})")
VAR_ARM = _q("var.arm", f"label_values({REQUESTS_TOTAL}{selector(names.L_MODEL, names.L_POOL)}, {names.L_ARM})")
SLO_SEL = selector(names.L_MODEL, names.L_POOL, names.L_SLOTH_SLO)
#: Sloth's meta series (objective, error budget) are one per SLO, without model/pool labels
SLO_META_SEL = selector(names.L_SLOTH_SLO)
VAR_SLO = _q("var.slo", f"label_values({names.SLO_SLI_ERROR['5m']}{selector(names.L_MODEL, names.L_POOL)}, {names.L_SLOTH_SLO})",
             pending=SLOTH_RULES)

# -- fleet SLA overview ---------------------------------------------------------------------------
QPS = _q("fleet.qps", f"sum by ({names.L_POOL}) (rate({REQUESTS_TOTAL}{REQ}[{RATE}]))",
         legend="{{pool}}", labels=(names.L_POOL,))


def _pool_ratio(key: str, numerator: str, denominator: str) -> PromQuery:
    """``numerator / denominator`` per pool, both counter selectors; "or ... * 0": a pool without
    a single numerator event still gets a series (0), not a gap."""
    def per_pool(sel: str) -> str:
        return f"sum by ({names.L_POOL}) (rate({sel}[{RATE}]))"

    return _q(key, f"({per_pool(numerator)} or {per_pool(REQUESTS_TOTAL + REQ)} * 0) / {per_pool(denominator)}",
              legend="{{pool}}", labels=(names.L_POOL,))


ERROR_RATIO = _pool_ratio("fleet.error_ratio", REQUESTS_TOTAL + selector(*names.REQUEST_LABELS, extra=_FAILED),
                          REQUESTS_TOTAL + REQ)
#: Share of the requests the availability SLO counts (all but cancelled) that met every latency
#: objective at once (llmsla_request_goodput_total; AIPerf's --goodput over the SLO specs)
GOODPUT_RATIO = _pool_ratio("fleet.goodput_ratio", f"{names.REQUEST_GOODPUT}_total{REQ}",
                            REQUESTS_TOTAL + selector(*names.REQUEST_LABELS, extra=_COUNTED))


def _quantile(key: str, metric: str, q: float, by: tuple[str, ...] = ()) -> PromQuery:
    group = ", ".join((names.L_LE, *by))
    legend = "{{" + by[0] + "}}" if by else f"P{round(q * 100)}"
    return _q(key, f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{REQ}[{RATE}])))",
              legend=legend, labels=by)


TTFT_QUANTILES = tuple(_quantile(f"fleet.ttft_p{round(q * 100)}", names.REQUEST_TTFT_SECONDS, q) for q in (0.5, 0.95, 0.99))
E2E_QUANTILES = tuple(_quantile(f"fleet.e2e_p{round(q * 100)}", names.REQUEST_E2E_SECONDS, q) for q in (0.5, 0.95, 0.99))


def _heatmap(key: str, metric: str) -> PromQuery:
    return _q(key, f"sum by ({names.L_LE}) (rate({metric}_bucket{REQ}[{RATE}]))",
              legend="{{le}}", fmt="heatmap", labels=(names.L_LE,))


TTFT_HEATMAP = _heatmap("fleet.ttft_heatmap", names.REQUEST_TTFT_SECONDS)
E2E_HEATMAP = _heatmap("fleet.e2e_heatmap", names.REQUEST_E2E_SECONDS)
_GPU_BY = f"{names.L_INSTANCE}, {names.L_GPU}"
GPU_MEM_USED = _q("fleet.gpu_mem_used", f"max by ({_GPU_BY}) ({names.GPU_MEMORY_USED_BYTES})",
                  legend="{{instance}} GPU {{gpu}} used", labels=(names.L_INSTANCE, names.L_GPU))
GPU_MEM_TOTAL = _q("fleet.gpu_mem_total", f"max by ({_GPU_BY}) ({names.GPU_MEMORY_TOTAL_BYTES})",
                   legend="{{instance}} GPU {{gpu}} total", labels=(names.L_INSTANCE, names.L_GPU))
QUEUE_LENGTH = _q("fleet.queue_length",
                  f"sum by ({names.L_INSTANCE}) ({names.WORKER_QUEUE_LENGTH}{selector(names.L_MODEL)})",
                  legend="{{instance}}", labels=(names.L_INSTANCE,))
IN_FLIGHT = _q("fleet.in_flight", f"sum by ({names.L_POOL}) ({names.REQUESTS_IN_FLIGHT}{selector(names.L_POOL)})",
               legend="{{pool}}", labels=(names.L_POOL,))
#: Load shedding by the error budget: requests refused per second and the share set per class
SHED_RATE = _q("fleet.shed_rate", f"sum by ({names.L_POOL}, {names.L_CLASS}) "
               f"(rate({names.GATEWAY_SHED}_total{selector(names.L_POOL)}[{RATE}]))",
               legend="{{pool}} {{class}} shed", labels=(names.L_POOL, names.L_CLASS))
SHED_SHARE = _q("fleet.shed_share", f"max by ({names.L_POOL}, {names.L_CLASS}) "
                f"({names.SHED_SHARE_RATIO}{selector(names.L_POOL)})",
                legend="{{pool}} {{class}}", labels=(names.L_POOL, names.L_CLASS))
_ROUTER_SEL = selector(names.L_POOL, names.L_REPLICA)
ROUTER_PICKS = _q("fleet.router_picks",
                  f"sum by ({names.L_POOL}, {names.L_REPLICA}) (rate({names.ROUTER_PICKS}_total{_ROUTER_SEL}[{RATE}]))",
                  legend="{{pool}}/{{replica}}", labels=(names.L_POOL, names.L_REPLICA))
ROUTER_WEIGHTS = _q("fleet.router_weights",
                    f"max by ({names.L_POOL}, {names.L_REPLICA}) ({names.ROUTER_WEIGHT}{_ROUTER_SEL})",
                    legend="{{pool}}/{{replica}}", labels=(names.L_POOL, names.L_REPLICA))

# -- P99 per instance (live) ----------------------------------------------------------------------
TTFT_P99_BY_REPLICA = _quantile("instances.ttft_p99_live", names.REQUEST_TTFT_SECONDS, 0.99, (names.L_REPLICA,))
E2E_P99_BY_REPLICA = _quantile("instances.e2e_p99_live", names.REQUEST_E2E_SECONDS, 0.99, (names.L_REPLICA,))

# -- GPU health beside each replica's TTFT burn (live) ---------------------------------------------
#: Per-replica TTFT burn rate over 5 m: the replica's SLI error ratio (llmsla's per-replica
#: recording rule) over the SLO's error budget; 1 = burning exactly the budget.
_TTFT_SLO = f'{names.L_SLOTH_SLO}="{names.SLO_TTFT}"'
REPLICA_TTFT_BURN = _q(
    "instances.replica_ttft_burn",
    f"max by ({names.L_MODEL}, {names.L_POOL}, {names.L_REPLICA}) ("
    f"{names.SLO_REPLICA_SLI_ERROR['5m']}{selector(names.L_MODEL, names.L_POOL, names.L_REPLICA, extra=_TTFT_SLO)}"
    f" / on ({names.L_SLOTH_ID}) group_left () {names.SLO_ERROR_BUDGET}{{{_TTFT_SLO}}})",
    legend="{{pool}}/{{replica}}", labels=(names.L_POOL, names.L_REPLICA), pending=SLOTH_RULES)
_THROTTLING = f'{names.L_REASON}!~"{"|".join(names.GPU_THROTTLE_BENIGN)}"'
#: Clock throttle reasons that slow a GPU down (idle and operator-set clocks left out): 1 while active.
GPU_THROTTLE = _q("instances.gpu_throttle",
                  f"max by ({_GPU_BY}, {names.L_REASON}) ({names.GPU_CLOCK_THROTTLE_REASON}{{{_THROTTLING}}})",
                  legend="{{instance}} GPU {{gpu}} {{reason}}", labels=(names.L_INSTANCE, names.L_GPU, names.L_REASON))
GPU_XIDS = _q("instances.gpu_xids",
              f"sum by ({_GPU_BY}, {names.L_XID}) (increase({names.GPU_XID_ERRORS}_total[{RATE}]))",
              legend="{{instance}} GPU {{gpu}} XID {{xid}}", labels=(names.L_INSTANCE, names.L_GPU, names.L_XID))

# -- the engines' own signals per replica (``llmsla engines``, docs/engines.md) -------------------
#: ``llmsla_engine_*`` carry replica, pool and engine only (no model, no arm); one engine label per
#: replica at a time, so the per-replica aggregation only drops it.
_ENGINE_SEL = selector(names.L_POOL, names.L_REPLICA)
_ENGINE_BY = f"{names.L_POOL}, {names.L_REPLICA}"
_ENGINE_LABELS = (names.L_POOL, names.L_REPLICA)


def _engine(key: str, expr: str, legend: str = "{{pool}}/{{replica}}") -> PromQuery:
    return _q(key, expr, legend=legend, labels=_ENGINE_LABELS)


ENGINE_WAITING = _engine("instances.engine_waiting",
                         f"sum by ({_ENGINE_BY}) ({names.ENGINE_REQUESTS_WAITING}{_ENGINE_SEL})",
                         "{{pool}}/{{replica}} waiting")
ENGINE_RUNNING = _engine("instances.engine_running",
                         f"sum by ({_ENGINE_BY}) ({names.ENGINE_REQUESTS_RUNNING}{_ENGINE_SEL})",
                         "{{pool}}/{{replica}} running")
ENGINE_KV_USAGE = _engine("instances.engine_kv_usage",
                          f"max by ({_ENGINE_BY}) ({names.ENGINE_KV_USAGE_RATIO}{_ENGINE_SEL})")
ENGINE_PREEMPTIONS = _engine("instances.engine_preemptions",
                             f"sum by ({_ENGINE_BY}) (rate({names.ENGINE_PREEMPTIONS}_total{_ENGINE_SEL}[{RATE}]))")
ENGINE_PREFIX_HITS = _engine("instances.engine_prefix_cache_hits",
                             f"max by ({_ENGINE_BY}) ({names.ENGINE_PREFIX_CACHE_HIT_RATIO}{_ENGINE_SEL})")

# -- discovery (the gateway with gateway.discovery file/dns, and ``llmsla engines``) ----------------
#: Each consumer exports its own view; ``job`` tells the gateway's from the engine adapters'.
DISCOVERY_REPLICAS = _q("instances.discovery_replicas",
                        f"max by ({names.L_JOB}, {names.L_POOL}, {names.L_STATE}) "
                        f"({names.DISCOVERY_REPLICAS}{selector(names.L_POOL)})",
                        legend="{{job}} {{pool}} {{state}}", labels=(names.L_POOL, names.L_STATE))
DISCOVERY_FAILURES = _q("instances.discovery_failures",
                        f"sum by ({names.L_JOB}, {names.L_SOURCE}, {names.L_REASON}) "
                        f"(increase({names.DISCOVERY_FAILURES}_total[{RATE}]))",
                        legend="{{job}} {{source}} {{reason}}", labels=(names.L_SOURCE, names.L_REASON))
DISCOVERY_AGE = _q("instances.discovery_age",
                   f"time() - max by ({names.L_JOB}, {names.L_SOURCE}) ({names.DISCOVERY_LAST_SUCCESS})",
                   legend="{{job}} {{source}}", labels=(names.L_SOURCE,))

# -- SLO and error budget (Sloth's recording rules) -----------------------------------------------
_SLO_LABELS = (names.L_SLOTH_SERVICE, names.L_SLOTH_SLO)
_SLO_LEGEND = "{{sloth_service}}/{{sloth_slo}}"
SLI = _q("slo.sli", f"1 - {names.SLO_SLI_ERROR['5m']}{SLO_SEL}", legend=_SLO_LEGEND, labels=_SLO_LABELS,
         pending=SLOTH_RULES)
OBJECTIVE = _q("slo.objective", f"{names.SLO_OBJECTIVE}{SLO_META_SEL}", legend=_SLO_LEGEND + " objective",
               labels=_SLO_LABELS, pending=SLOTH_RULES)
BURN_RATES = tuple(
    _q(f"slo.burn_rate_{w}",
       f"{names.SLO_SLI_ERROR[w]}{SLO_SEL} / on ({names.L_SLOTH_ID}) group_left () {names.SLO_ERROR_BUDGET}{SLO_META_SEL}",
       legend=f"{_SLO_LEGEND} {w}", labels=_SLO_LABELS, pending=SLOTH_RULES)
    for w in names.SLO_WINDOWS if w != "30d"
)
CURRENT_BURN_RATE = _q("slo.current_burn_rate", f"{names.SLO_CURRENT_BURN_RATE}{SLO_SEL}", legend=_SLO_LEGEND,
                       labels=_SLO_LABELS, pending=SLOTH_RULES)
PERIOD_BURN_RATE = _q("slo.period_burn_rate", f"{names.SLO_PERIOD_BURN_RATE}{SLO_SEL}", legend=_SLO_LEGEND,
                      labels=_SLO_LABELS, pending=SLOTH_RULES)
BUDGET_REMAINING = _q("slo.budget_remaining", f"{names.SLO_PERIOD_ERROR_BUDGET_REMAINING}{SLO_SEL}",
                      legend=_SLO_LEGEND, labels=_SLO_LABELS, pending=SLOTH_RULES)
FIRING_ALERTS = _q("slo.firing_alerts", f'{names.ALERTS}{{{names.L_ALERTSTATE}="{names.ALERTSTATE_FIRING}"}}',
                   fmt="table", instant=True, labels=(names.L_ALERTNAME, names.L_SEVERITY))

# -- forecaster (live) ----------------------------------------------------------------------------
FORECAST_RISK = _q("forecast.risk_live",
                   f"max by ({names.L_POOL}, {names.L_REPLICA}, {names.L_TARGET}) ({names.FORECAST_RISK}{selector(names.L_MODEL, names.L_POOL)})",
                   legend="{{pool}}/{{replica}} ({{target}})", labels=(names.L_POOL, names.L_TARGET))


# -- the forecaster's own accuracy (rolling window, per horizon; docs/forecaster.md) -------------
def _per_horizon(key: str, metric: str, legend: str) -> PromQuery:
    return _q(key, f"max by ({names.L_HORIZON}) ({metric})", legend=legend + " ({{horizon}} s)",
              labels=(names.L_HORIZON,))


FORECAST_PRECISION = _per_horizon("forecast.precision", names.FORECAST_PRECISION, "precision")
FORECAST_RECALL = _per_horizon("forecast.recall", names.FORECAST_RECALL, "recall")
FORECAST_VALIDATION_RECALL = _per_horizon("forecast.validation_recall", names.FORECAST_VALIDATION_RECALL,
                                          "validation recall")
FORECAST_FALSE_ALARMS = _per_horizon("forecast.false_alarms_per_day", names.FORECAST_FALSE_ALARMS_PER_DAY,
                                     "false alarms/day")
FORECAST_BREACHES = _per_horizon("forecast.breaches", names.FORECAST_BREACHES, "breaches judged")
#: a gauge histogram (the window's warned breaches): its buckets are counts already, no rate()
FORECAST_LEAD = _q("forecast.lead", f"sum by ({names.L_LE}) ({names.FORECAST_LEAD_SECONDS}_bucket)",
                   legend="{{le}}", fmt="heatmap", instant=True, labels=(names.L_LE,))
