"""A/B attribution: does an arm meet the SLA worse than control, and is the split itself sound?

Per-arm SLO attainment from the store's windows (the ``arm`` label is part of every window key),
each arm's traffic share, and the A/B attribution's results from ``ab_results``: the P95
difference to the baseline with its confidence interval, the sample-ratio-mismatch test, and a
verdict per experiment, arm and metric (an SRM invalidates the others).
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dash_m

from llmsla import slo_catalog
from llmsla.config import Config
from llmsla.dashboards import common as c
from llmsla.dashboards import storesql


def build(cfg: Config) -> dash_m.Dashboard:
    d = c.new_dashboard(
        c.UID_AB, "llmsla / A/B attribution",
        "SLA attainment per arm from the store's windows; effects, intervals, SRM and verdicts from ab_results.",
        time_from="now-24h",
    ).with_variable(c.store_datasource())
    for name, q, label in (("model", storesql.VAR_MODEL, "Model"), ("pool", storesql.VAR_POOL, "Pool"),
                           ("replica", storesql.VAR_REPLICA, "Replica"), ("arm", storesql.VAR_ARM, "Arm")):
        d = d.with_variable(c.query_variable(name, q, label))
    d = d.with_variable(c.query_variable("experiment", storesql.VAR_EXPERIMENT, "Experiment"))
    d = d.with_panel(c.timeseries_panel(
        "SLO attainment per arm", [storesql.ATTAINMENT_BY_ARM], unit="percentunit", w=16, max_val=1,
        slo=c.slo_line(slo_catalog.load(cfg).latency_target, below_is_good=False),
        description="Share of each arm's requests within the TTFT / E2E objective (exact counts from the windows)."))
    d = d.with_panel(c.bargauge_panel(
        "Traffic share per arm", [storesql.ARM_SUMMARY], unit="percentunit", w=8, min_val=0, max_val=1,
        description="Observed share of requests per arm over the range; compare with the configured split (SRM)."))
    d = d.with_panel(c.table_panel(
        "Per-arm summary", [storesql.ARM_SUMMARY], w=24, h=6,
        description="Requests, share, TTFT/E2E attainment and error ratio per arm over the range."))
    d = d.with_panel(c.timeseries_panel(
        "P95 difference vs baseline (with interval)", [storesql.P95_DIFF], unit="ms", w=12,
        slo=c.thresholds([(None, "green"), (0, "red")]),
        description="effect = arm P95 - baseline P95 and its confidence interval (ci_low, ci_high); "
                    "an interval wholly above 0 is a regression."))
    d = d.with_panel(c.timeseries_panel(
        "Sample-ratio mismatch p-value", [storesql.SRM], unit="short", w=12, log_y=True,
        slo=c.thresholds([(None, "red"), (0.001, "green")]),
        description="Chi-square test of the observed split against the configured one; below 0.001 the "
                    "assignment is broken and no effect can be trusted."))
    d = d.with_panel(c.table_panel(
        "Verdicts", [storesql.VERDICTS], w=24, h=8,
        description="Latest result per experiment, arm and metric: better / worse / no difference from the "
                    "interval (lower is better for latency metrics), and the SRM check."))
    return c.number_panels(d.build())
