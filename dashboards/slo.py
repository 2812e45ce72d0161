"""SLO and error budget: how much budget is left, how fast it burns, and what is firing.

Reads the recording rules Sloth generates (``slo:*``, names in ``llmsla.names``; ``llmsla slo
generate`` writes them): SLI, burn rate per multiwindow pair, period budget remaining, and
Prometheus' own ``ALERTS`` series for what fires. Until those rules are loaded the panels show
"no data".
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models import dashboard as dash_m

from llmsla import names, slo_catalog
from llmsla.config import Config
from llmsla.dashboards import common as c
from llmsla.dashboards import promql


def _window(cfg: Config) -> str:
    """The SLOs' compliance window in words: their common one, else each its own."""
    days = {o.window_days for o in slo_catalog.load(cfg).objectives}
    return f"{days.pop()}-day" if len(days) == 1 else "SLO's own"


def build(cfg: Config) -> dash_m.Dashboard:
    d = c.new_dashboard(
        c.UID_SLO, "llmsla / SLO and error budget",
        "Sloth SLO recording rules: SLI, burn rates per window, budget remaining over the SLO period, firing alerts.",
        time_from="now-24h",
    ).with_variable(c.prometheus_datasource())
    d = d.with_variable(c.query_variable(names.L_MODEL, promql.VAR_MODEL, "Model"))
    d = d.with_variable(c.query_variable(names.L_POOL, promql.VAR_POOL, "Pool"))
    d = d.with_variable(c.query_variable(names.L_SLOTH_SLO, promql.VAR_SLO, "SLO"))
    d = d.with_row(dash.Row("Budget"))
    d = d.with_panel(c.stat_panel(
        "Error budget remaining", [promql.BUDGET_REMAINING], unit="percentunit", w=8,
        steps=c.thresholds([(None, "red"), (0.25, "orange"), (0.5, "green")]),
        description=f"Share of the {_window(cfg)} error budget not yet spent (slo:period_error_budget_remaining:ratio)."))
    d = d.with_panel(c.stat_panel(
        "Current burn rate", [promql.CURRENT_BURN_RATE], unit="x", w=8,
        steps=c.thresholds([(None, "green"), (1, "orange"), (6, "red")]),
        description="Error rate over the last 5 m relative to the budget rate; 1 spends exactly the budget."))
    d = d.with_panel(c.stat_panel(
        "Burn rate over the period", [promql.PERIOD_BURN_RATE], unit="x", w=8,
        steps=c.thresholds([(None, "green"), (1, "red")]),
        description="Average burn rate over the whole SLO period."))
    d = d.with_row(dash.Row("SLI and burn"))
    d = d.with_panel(c.timeseries_panel(
        "SLI (good ratio, 5 m)", [promql.SLI, promql.OBJECTIVE], unit="percentunit", w=12,
        description="1 - slo:sli_error:ratio_rate5m per SLO, with the objective."))
    d = d.with_panel(c.timeseries_panel(
        "Burn rate per window", list(promql.BURN_RATES), unit="x", w=12, log_y=True,
        slo=c.thresholds([(None, "green"), (1, "orange"), (6, "red"), (14.4, "dark-red")]),
        description="SLI error ratio over each window divided by the error budget; the multiwindow alerts "
                    "page at 14.4x (1 h + 5 m) and 6x (6 h + 30 m)."))
    d = d.with_panel(c.timeseries_panel(
        "Budget remaining over time", [promql.BUDGET_REMAINING], unit="percentunit", w=24,
        slo=c.thresholds([(None, "red"), (0, "green")]),
        description="slo:period_error_budget_remaining:ratio; below 0 the SLO is broken for the period."))
    d = d.with_row(dash.Row("Alerts"))
    d = d.with_panel(c.table_panel(
        "Firing alerts", [promql.FIRING_ALERTS],
        description="ALERTS{alertstate=\"firing\"} now, with severity and SLO labels."))
    return c.number_panels(d.build())
