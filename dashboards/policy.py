"""Temperature policy: what temperature the sampling policy chose, how steady, how fast.

From the store's 60 s ``policy_windows`` (one row per zone and policy a minute, so even 7 days
need no roll-up): decision-weighted mean temperature, its jitter (pooled population std across the
windows of each interval, exact from per-window mean, std and count), the policy's per-trace
latency and decide-time P99 (worst window), and decisions per zone.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dash_m

from llmsla.config import Config
from llmsla.dashboards import common as c
from llmsla.dashboards import storesql


def build(cfg: Config) -> dash_m.Dashboard:
    d = c.new_dashboard(
        c.UID_POLICY, "llmsla / Temperature policy",
        "Temperature-policy decisions from the store (60 s windows per zone and policy).",
        time_from="now-6h",
    ).with_variable(c.store_datasource())
    d = d.with_variable(c.query_variable("zone", storesql.VAR_ZONE, "Zone"))
    d = d.with_variable(c.query_variable("policy_id", storesql.VAR_POLICY_ID, "Policy"))
    d = d.with_panel(c.timeseries_panel(
        "Temperature", [storesql.POLICY_TEMPERATURE], unit="short", w=12, min_val=0,
        description="Decision-weighted mean temperature per zone/policy."))
    d = d.with_panel(c.timeseries_panel(
        "Temperature jitter", [storesql.POLICY_JITTER], unit="short", w=12, min_val=0,
        description="Population std of the temperatures decided in each interval (pooled exactly across windows)."))
    d = d.with_panel(c.timeseries_panel(
        "Policy latency P99", [storesql.POLICY_LATENCY, storesql.POLICY_DECIDE], unit="ms", w=12, min_val=0,
        description="Per-trace policy latency P99 and decide-time P99 per zone (worst 60 s window in each interval)."))
    d = d.with_panel(c.timeseries_panel(
        "Decisions per zone", [storesql.POLICY_DECISIONS], unit="short", w=12, min_val=0,
        description="Policy decisions per interval and zone."))
    return c.number_panels(d.build())
