"""Forecaster and actions: which series the forecaster expects to break the SLA, and what the
control loop did about it.

Risk per target live from Prometheus (``llmsla_forecast_risk``, exported by the forecaster) and
historical from ``forecasts``; every row of ``action_log`` (alert-driven receiver actions and
other control API changes) as annotations on the time axis and as a table.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dash_m

from llmsla import names
from llmsla.config import Config
from llmsla.dashboards import common as c
from llmsla.dashboards import promql, storesql


def build(cfg: Config) -> dash_m.Dashboard:
    d = c.new_dashboard(
        c.UID_FORECAST, "llmsla / Forecaster and actions",
        "Degradation risk per target (live and stored) with the control actions taken (action_log).",
        time_from="now-6h",
    ).with_variable(c.prometheus_datasource()).with_variable(c.store_datasource())
    d = d.with_variable(c.query_variable(names.L_POOL, promql.VAR_POOL, "Pool"))
    for a in c.action_annotations():
        d = d.annotation(a)
    risk = c.thresholds([(None, "green"), (0.5, "orange"), (0.8, "red")])
    d = d.with_panel(c.timeseries_panel(
        "Risk per target (live)", [promql.FORECAST_RISK], unit="percentunit", w=12, min_val=0, max_val=1, slo=risk,
        description="The forecaster's current probability that each target breaks its SLO within the horizon."))
    d = d.with_panel(c.timeseries_panel(
        "Risk per target (store)", [storesql.RISK_HISTORY], unit="percentunit", w=12, min_val=0, max_val=1, slo=risk,
        description="Highest stored risk per target in each interval (forecasts table)."))
    d = d.with_panel(c.table_panel(
        "Latest forecasts", [storesql.LATEST_FORECASTS], w=24, h=7,
        description="Newest forecast per forecaster, target, pool, replica and horizon within the last hour of the range."))
    d = d.with_panel(c.table_panel(
        "Actions", [storesql.ACTIONS], w=24, h=9,
        description="The control audit log: who changed what, why (alert), and the outcome."))
    return c.number_panels(d.build())
