"""Fleet SLA overview: is the fleet meeting its latency SLOs right now, and where is the load?

Live from Prometheus: throughput, failures, TTFT/E2E quantiles against their SLO lines, the
TTFT/E2E distributions as heatmaps of the histogram buckets (the shape a P99 line hides: a second
mode, a slow tail), GPU memory, queues and the router's choices. A history row reads the store's
windows (roll-up picked from the range) for the same SLA view beyond Prometheus' retention.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models import dashboard as dash_m

from llmsla import names, slo_catalog
from llmsla.config import Config
from llmsla.dashboards import common as c
from llmsla.dashboards import promql, storesql


def build(cfg: Config) -> dash_m.Dashboard:
    slo = slo_catalog.load(cfg)
    ttft_s, e2e_s = slo.ttft_ms / 1000, slo.e2e_ms / 1000
    to_instances = c.link_to(c.UID_INSTANCES, "P99 per instance")
    d = c.new_dashboard(
        c.UID_FLEET, "llmsla / Fleet SLA overview",
        "Live SLA view of the fleet from Prometheus; history from the store. Dashed lines are the SLOs "
        f"({slo.summary()}).",
        time_from="now-1h",
    ).with_variable(c.prometheus_datasource()).with_variable(c.store_datasource())
    for v in c.request_variables():
        d = d.with_variable(v)
    # the store's tenants and classes (the request windows' keys) for the tenancy row
    d = d.with_variable(c.query_variable(names.L_TENANT, storesql.VAR_TENANT, "Tenant"))
    d = d.with_variable(c.query_variable(names.L_CLASS, storesql.VAR_CLASS, "Class"))
    for a in c.action_annotations():
        d = d.annotation(a)
    d = d.with_row(dash.Row("Traffic and failures"))
    d = d.with_panel(c.timeseries_panel("Requests per second", [promql.QPS], unit="reqps", w=12,
                                        description="Finished requests per second by pool (every status)."))
    d = d.with_panel(c.timeseries_panel(
        "Error ratio", [promql.ERROR_RATIO], unit="percentunit", w=12, min_val=0,
        slo=c.slo_line(slo.availability.error_budget),
        description="Share of requests that ended in error or timeout; the dashed line is the error budget "
                    "of the availability SLO."))
    d = d.with_panel(c.timeseries_panel(
        "Goodput", [promql.GOODPUT_RATIO], unit="percentunit", w=24, min_val=0, max_val=1,
        slo=c.slo_line(slo.latency_target, below_is_good=False),
        description="Share of requests that succeeded within every latency objective of the SLO specs at once "
                    f"({slo.summary()}), as AIPerf's --goodput counts them; the dashed line is the strictest "
                    "latency target."))
    d = d.with_panel(c.timeseries_panel(
        "Load shedding: requests refused", [promql.SHED_RATE], unit="reqps", w=12, min_val=0,
        description="Requests answered 429 shed_by_slo per second, by pool and class: the alert receiver sheds "
                    "less protected classes while a more protected class burns its error budget."))
    d = d.with_panel(c.timeseries_panel(
        "Load shedding: share per class", [promql.SHED_SHARE], unit="percentunit", w=12, min_val=0, max_val=1,
        description="Share of each class's new requests the control API sheds in each pool (0: none); it steps "
                    "up while the page fires and back down after it resolves."))
    d = d.with_row(dash.Row("Latency"))
    d = d.with_panel(c.timeseries_panel(
        "TTFT P50 / P95 / P99", list(promql.TTFT_QUANTILES), unit="s", log_y=True, slo=c.slo_line(ttft_s),
        links=[to_instances],
        description="Time to first token from the gateway's histogram (histogram_quantile over the SLO-aligned buckets)."))
    d = d.with_panel(c.timeseries_panel(
        "E2E P50 / P95 / P99", list(promql.E2E_QUANTILES), unit="s", log_y=True, slo=c.slo_line(e2e_s),
        links=[to_instances], description="End-to-end latency (every status) from the gateway's histogram."))
    d = d.with_panel(c.heatmap_panel(
        "TTFT distribution", promql.TTFT_HEATMAP, unit="s",
        description="Requests per second in each TTFT bucket, straight from the histogram buckets (no re-bucketing). "
                    "A band above the SLO bucket is a slow tail; a second band is a second mode."))
    d = d.with_panel(c.heatmap_panel(
        "E2E distribution", promql.E2E_HEATMAP, unit="s",
        description="Requests per second in each E2E bucket, from the histogram buckets."))
    d = d.with_row(dash.Row("Capacity and routing"))
    d = d.with_panel(c.timeseries_panel(
        "GPU memory used vs total", [promql.GPU_MEM_USED, promql.GPU_MEM_TOTAL], unit="bytes", w=12, min_val=0,
        description="Per GPU (NVML): memory used and the device total."))
    d = d.with_panel(c.timeseries_panel(
        "Queue length", [promql.QUEUE_LENGTH], unit="short", w=6, min_val=0,
        description="Requests waiting for a batch slot in each worker."))
    d = d.with_panel(c.timeseries_panel(
        "In-flight requests", [promql.IN_FLIGHT], unit="short", w=6, min_val=0,
        description="Requests inside the gateway, per pool."))
    d = d.with_panel(c.timeseries_panel(
        "Router picks", [promql.ROUTER_PICKS], unit="reqps", w=12, min_val=0,
        description="Requests routed to each replica per second."))
    d = d.with_panel(c.timeseries_panel(
        "Router weights", [promql.ROUTER_WEIGHTS], unit="short", w=12, min_val=0,
        description="Operator weight of each replica (the receiver lowers it on alerts; 0 with drain)."))
    d = d.with_row(dash.Row("History from the store"))
    d = d.with_panel(c.timeseries_panel(
        "Requests per second (store)", [storesql.QPS_HISTORY], unit="reqps", w=12, min_val=0,
        description="From the windows in the store: 5 s rows up to 1 h of range, 1 m roll-ups up to a day, "
                    "1 h roll-ups beyond."))
    d = d.with_panel(c.timeseries_panel(
        "SLO attainment by pool (store)", [storesql.ATTAINMENT_BY_POOL], unit="percentunit", w=12,
        max_val=1, slo=c.slo_line(slo.latency_target, below_is_good=False),
        description="Share of requests within the TTFT / E2E objective, exact at any width (counts roll up)."))
    d = d.with_row(dash.Row("Tenants and classes (store)"))
    for by, q in ((names.L_TENANT, storesql.ATTAINMENT_BY_TENANT), (names.L_CLASS, storesql.ATTAINMENT_BY_CLASS)):
        d = d.with_panel(c.timeseries_panel(
            f"TTFT attainment and goodput by {by} (store)", [q], unit="percentunit", w=12, max_val=1,
            slo=c.slo_line(slo.latency_target, below_is_good=False),
            description=f"Per {by} (the Tenant and Class variables filter them): the share of requests within the TTFT "
                        "objective, and goodput, the share that succeeded within every latency objective at once "
                        f"({slo.summary()}). Exact at any width: the windows' counts roll up per tenant and class. "
                        "Windows written before the store counted goodput are left out of its ratio."))
    d = d.with_panel(c.table_panel(
        "Per tenant and class (store)", [storesql.TENANCY_SUMMARY], w=24, h=6,
        description="Requests, TTFT and E2E attainment and goodput per tenant and class over the range."))
    return c.number_panels(d.build())
