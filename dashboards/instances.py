"""P99 per instance: which replica is slow, since when, and is it one replica or all of them?

x = time, y = replica, colour = that replica's P99 on a log colour scale whose steps are the
SLO-aligned histogram bounds (greens under the objective, oranges to reds over it). Live rows come
from Prometheus (``histogram_quantile`` per replica); historical rows from the store's windows
(roll-up picked from the range: the worst 5 s P99 inside each bucket). Under the live rows, each
replica's engine (queue, KV cache, preemptions, prefix-cache hits; the live ``llmsla_engine_*``
gauges, like the GPU row) and its engine-measured TTFT (mean, P50, P99) beside the gateway's, from
the store's tier for the range (the engine's histogram is windowed there, not re-exported). See docs/dashboards.md.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.models import dashboard as dash_m

from llmsla import slo_catalog
from llmsla.config import Config
from llmsla.dashboards import common as c
from llmsla.dashboards import promql, storesql


def build(cfg: Config) -> dash_m.Dashboard:
    slo = slo_catalog.load(cfg)
    ttft_steps = c.log_steps(cfg.metrics.ttft_buckets, slo.ttft_ms / 1000)
    e2e_steps = c.log_steps(cfg.metrics.e2e_buckets, slo.e2e_ms / 1000)
    d = c.new_dashboard(
        c.UID_INSTANCES, "llmsla / P99 per instance",
        "TTFT and E2E P99 per replica over time; colour steps are the histogram bounds (log-spaced), red past the SLO.",
        time_from="now-3h",
    ).with_variable(c.prometheus_datasource()).with_variable(c.store_datasource())
    for v in c.request_variables():
        d = d.with_variable(v)
    for a in c.action_annotations():
        d = d.annotation(a)
    d = d.with_row(dash.Row("Live (Prometheus)"))
    d = d.with_panel(c.status_history_panel(
        "TTFT P99 per replica (live)", promql.TTFT_P99_BY_REPLICA, steps=ttft_steps,
        description="histogram_quantile(0.99) of the gateway's TTFT histogram per replica."))
    d = d.with_panel(c.status_history_panel(
        "E2E P99 per replica (live)", promql.E2E_P99_BY_REPLICA, steps=e2e_steps,
        description="histogram_quantile(0.99) of the gateway's E2E histogram per replica."))
    d = d.with_row(dash.Row("Engine"))
    d = d.with_panel(c.timeseries_panel(
        "Engine queue: waiting and running", [promql.ENGINE_WAITING, promql.ENGINE_RUNNING], unit="short", w=6,
        min_val=0,
        description="Requests waiting in each replica's engine queue and in its running batch, as the engine's own "
                    "/metrics report them (llmsla engines). A waiting queue that grows ahead of the TTFT rows above "
                    "is the earliest sign of a breach."))
    d = d.with_panel(c.timeseries_panel(
        "Engine KV-cache usage", [promql.ENGINE_KV_USAGE], unit="percentunit", w=6, min_val=0, max_val=1,
        description="Share of each replica's KV-cache blocks in use (0..1). Near 1 the engine preempts or queues."))
    d = d.with_panel(c.timeseries_panel(
        "Engine preemptions per second", [promql.ENGINE_PREEMPTIONS], unit="short", w=6, min_val=0,
        description="Requests the engine preempted (SGLang: retracted) per second, counted across engine restarts. "
                    "Preempted requests redo their prefill: TTFT and E2E pay for it."))
    d = d.with_panel(c.timeseries_panel(
        "Engine prefix-cache hit rate", [promql.ENGINE_PREFIX_HITS], unit="percentunit", w=6, min_val=0, max_val=1,
        description="Share of prompt tokens served from the prefix cache over the last scrape interval (from the "
                    "engine's counters, or its gauge where it has only a gauge). A drop means more prefill work."))
    d = d.with_panel(c.timeseries_panel(
        "Engine TTFT vs gateway TTFT per replica (store)", [storesql.ENGINE_GATEWAY_TTFT], unit="s", w=24,
        description="TTFT per replica and interval as the gateway measured it and as the engine's own histogram "
                    "did, from the store (5 s windows up to 1 h of range, 1 m roll-ups up to a day, 1 h beyond, on "
                    "both sides): the means from exact sums and counts and their difference (gap_s: the time a "
                    "request spends before the engine: gateway, network, tokenizer), and each side's P50 and P99 "
                    "of the interval from summed histograms on the store's one layout (the engine's native buckets "
                    "spread onto it, interpolating inside a bucket as histogram_quantile does). Every request of "
                    "the replica on both sides (the engine knows no model or arm). A non-streamed request counts "
                    "its E2E as TTFT at the gateway, so the gap reads true for streamed traffic."))
    d = d.with_row(dash.Row("Discovery"))
    d = d.with_panel(c.timeseries_panel(
        "Replicas known per pool and state", [promql.DISCOVERY_REPLICAS], unit="short", w=8, min_val=0,
        description="Replicas each consumer of the discovery source knows: the gateway's router (probing: joined, "
                    "no healthy probe yet; serving; draining: left the answer, in-flight requests finishing) and "
                    "llmsla engines (serving: its last scrape worked; probing: not yet, or failing). A gap between "
                    "the two, or replicas stuck in probing, is a replica the fleet has but cannot use."))
    d = d.with_panel(c.timeseries_panel(
        "Discovery failures by reason", [promql.DISCOVERY_FAILURES], unit="short", w=8, min_val=0,
        description="Rounds in which the source could not answer and the last set was kept: missing or unreadable "
                    "file, a name that does not resolve or times out, an answer naming no replica."))
    d = d.with_panel(c.timeseries_panel(
        "Seconds since the last discovery answer", [promql.DISCOVERY_AGE], unit="s", w=8, min_val=0,
        description="How old each consumer's view of the fleet may be. It should stay near the discovery interval; "
                    "a steady climb means the source stopped answering and the fleet is frozen at its last set."))
    d = d.with_row(dash.Row("GPU health beside TTFT burn (live)"))
    d = d.with_panel(c.timeseries_panel(
        "TTFT burn rate per replica (5 m)", [promql.REPLICA_TTFT_BURN], unit="x", w=8, min_val=0,
        slo=c.slo_line(1.0),
        description="Each replica's TTFT SLI error ratio over 5 m divided by the SLO's error budget: above the "
                    "dashed line (1) the replica spends budget faster than the SLO allows."))
    d = d.with_panel(c.timeseries_panel(
        "GPU clock throttling", [promql.GPU_THROTTLE], unit="short", w=8, min_val=0, max_val=1,
        description="1 while NVML reports a clock throttle reason on the GPU: power cap, thermal or hardware "
                    "slowdown, power brake, sync boost, board limit (idle and operator-set clocks left out). A "
                    "throttled GPU under a replica whose TTFT burn rises is the cause to look at first."))
    d = d.with_panel(c.timeseries_panel(
        "GPU XID errors", [promql.GPU_XIDS], unit="short", w=8, min_val=0,
        description="Critical XID events per GPU and code in each interval (NVML events). 13/43: an application "
                    "fault; 48/63/64/94/95: memory errors; 74: NVLink; 79: GPU fell off the bus; 31: MMU fault."))
    d = d.with_row(dash.Row("History (store)"))
    d = d.with_panel(c.status_history_panel(
        "TTFT P99 per replica (store)", storesql.TTFT_P99_HISTORY, steps=ttft_steps,
        description="Worst 5 s-window TTFT P99 per replica in each interval, from the store (5 s table up to 1 h "
                    "of range, 1 m roll-up up to a day, 1 h roll-up beyond)."))
    d = d.with_panel(c.status_history_panel(
        "E2E P99 per replica (store)", storesql.E2E_P99_HISTORY, steps=e2e_steps,
        description="Worst 5 s-window E2E P99 per replica in each interval, from the store."))
    d = d.with_panel(c.timeseries_panel(
        "TTFT P99 per replica (store, lines)", [storesql.TTFT_P99_HISTORY], unit="s", w=24, log_y=True,
        slo=c.slo_line(slo.ttft_ms / 1000), links=[c.link_to(c.UID_FLEET, "Fleet SLA overview")],
        description="The same history as lines, for comparing replicas at one instant."))
    return c.number_panels(d.build())
