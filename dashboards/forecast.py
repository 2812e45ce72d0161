"""Forecaster and actions: which series the forecaster expects to break the SLA, and what the
control loop did about it.

Risk per target live from Prometheus (``llmsla_forecast_risk``, exported by the forecaster) and
historical from ``forecasts``; every row of ``action_log`` (alert-driven receiver actions and
other control API changes) as annotations on the time axis and as a table.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash
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
    d = d.with_row(dash.Row("Its own accuracy"))
    d = d.with_panel(c.timeseries_panel(
        "Precision and recall vs validation recall", [promql.FORECAST_PRECISION, promql.FORECAST_RECALL,
                                                       promql.FORECAST_VALIDATION_RECALL],
        unit="percentunit", w=12, min_val=0, max_val=1,
        description="Over the forecaster's rolling window (forecast.accuracy_window_s), scored against the breaches "
                    "the store recorded once each alarm's lead window passed: the share of breaches warned ahead "
                    "(recall) beside the serving model's validation recall, and the share of alert notifications "
                    "that were not false alarms (precision). Recall well below validation: LlmslaForecasterDrifted."))
    d = d.with_panel(c.bargauge_panel(
        "Lead of warned breaches (rolling window)", [promql.FORECAST_LEAD], unit="short", w=12, min_val=0,
        description="How many warned breaches had a lead of at most each bound (seconds), cumulative: the "
                    "minutes of warning an SRE actually got."))
    d = d.with_panel(c.timeseries_panel(
        "False alarms per target-day", [promql.FORECAST_FALSE_ALARMS], unit="short", w=12, min_val=0,
        description="Notifications with no breach within their lead window, per day of healthy target time "
                    "(the evaluation's definition; its threshold was chosen for forecast.false_alarms_per_day)."))
    d = d.with_panel(c.timeseries_panel(
        "Breaches judged (rolling window)", [promql.FORECAST_BREACHES], unit="short", w=12, min_val=0,
        description="Breaches the recall rests on; the drift alert waits for enough of them."))
    d = d.with_row(dash.Row("Actions taken"))
    d = d.with_panel(c.table_panel(
        "Actions", [storesql.ACTIONS], w=24, h=9,
        description="The control audit log: who changed what, why (alert), and the outcome."))
    return c.number_panels(d.build())
