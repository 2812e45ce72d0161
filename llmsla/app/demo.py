"""``llmsla demo``: the whole closed loop on one machine, on the embedded defaults.

The embedded PostgreSQL; the fleet simulator replaying the Azure conversation trace (a history
replayed at once, then real time) with a ramp fault on one replica and its router's control API;
the PyFlink job windowing the spool into the store; Prometheus evaluating the burn-rate rules
generated from the SLO specs; Alertmanager routing to the receiver, which acts on the simulator's
router and distillation controls; the forecaster scoring the store's windows online and alerting
the same receiver. Each is the ``llmsla`` command an operator runs (llmsla/app/demo_stack.py),
with every window scaled by one factor so an hour of burn-rate window is a minute here. At the
end: a summary from the data (llmsla/app/demo_story.py), the HTML report and the dashboards.
With --real, two reference workers behind the gateway take the simulator's place, sent the same
trace as real requests in real time (llmsla/app/demo_real.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from llmsla import argtypes, names, slo_catalog
from llmsla import config as config_mod
from llmsla.app import demo_real
from llmsla.app.demo_stack import DemoError, Proc, Scale, Stack, prom_query
from llmsla.app.demo_story import (
    TRACE,
    Story,
    Summary,
    Timeline,
    audited,
    exact_latency,
    first_breaches,
    lead_s,
    traffic_share,
)

log = logging.getLogger("llmsla.demo")
#: The demo's A/B experiment (demo_config): LADR (control) against round robin.
EXPERIMENT = "routing"


def demo_config(work: Path, stack: Stack, receiver_port: int, *, real: bool = False) -> str:
    """The children's config: the demo's spool, checkpoints, forecaster dir and ports; streaming
    and scoring cadences tightened for a run of minutes; with ``real``, the workers, the gateway
    and the objectives of a run on them (llmsla/app/demo_real.py)."""
    extra = demo_real.config_section(demo_real.worker_ports(stack)) if real else ""
    return f"""# written by llmsla demo for the processes it starts
[spool]
dir = "{work / 'spool'}"
segment_max_age_s = 1.0

[stream]
checkpoint_dir = "{work / 'checkpoints'}"
checkpoint_interval_s = 5.0
monitor_interval_s = 0.5
sink_flush_s = 0.5
idle_timeout_s = 3.0
metrics_port = {stack.port('stream-metrics')}

[forecast]
dir = "{work / 'forecast'}"
# a drained replica's forecast alert resolves after this long without traffic (default 60 s),
# so the receiver can restore it within the minutes of the demo
idle_s = 20.0
port = {stack.port('forecast')}
interval_s = 5.0
lag_s = 8.0
receiver_url = "http://127.0.0.1:{receiver_port}/v1/alerts"

[receiver]
tick_s = 0.5

# llmsla engines: the replicas' own /metrics for the dashboards' engine row; a replica that is not
# up yet (the simulator starts last) is retried every 2 s, not after a backoff of up to 30 s
[engine]
port = {stack.port('engines')}
backoff_max_s = 2.0

# A candidate routing policy against the default, on half the users each (sessions are the
# units). A run of minutes is far below the default sample size, so verdicts need fewer requests
# here (the default 5000 is what docs/ab-calibration.md measured power at).
[ab]
min_requests = 1000

[ab.experiments.{EXPERIMENT}]
seed = 1
pool = "{names.DEFAULT_POOL}"
coverage = 1.0
control = "ladr"

[ab.experiments.{EXPERIMENT}.arms.ladr]
weight = 1

[ab.experiments.{EXPERIMENT}.arms.round-robin]
weight = 1
route_policy = "round_robin"
{extra}"""


def _p99_by(prom: str, by: str) -> dict[str, float]:
    q = (f"histogram_quantile(0.99, sum by (le, {by}) (rate({names.REQUEST_TTFT_SECONDS}_bucket"
         f"{{{names.L_POOL}=\"{names.DEFAULT_POOL}\"}}[20s])))")
    return {r["metric"].get(by, ""): float(r["value"][1]) * 1000 for r in prom_query(prom, q)
            if r["value"][1] not in ("NaN", "+Inf")}


def _status_line(stack: Stack, story: Story, t_live: float, acted: int, job: str) -> str:
    prom = stack.urls["prometheus"]
    a, b = (x - story.history_s for x in story.fault_window_s)
    crash = story.crash_start * story.live_s
    phase = ("before the fault" if t_live < a else f"{story.replica} slowing down" if t_live < crash
             else f"{story.replica} down" if t_live < b else "after the fault")
    total = prom_query(prom, f"sum({names.REQUESTS}_total{{job=\"{job}\"}})")
    p99 = _p99_by(prom, names.L_REPLICA)
    firing = sorted({r["metric"].get("alertname", "") for r in prom_query(
        prom, f'{names.ALERTS}{{alertstate="{names.ALERTSTATE_FIRING}"}}')})
    risk = prom_query(prom, f"max({names.FORECAST_RISK})")
    parts = [f"live {int(t_live) // 60}:{int(t_live) % 60:02d}/{int(story.live_s) // 60}:{int(story.live_s) % 60:02d}",
             phase, f"{int(float(total[0]['value'][1])) if total else 0:,} requests"]
    if p99:
        parts.append("TTFT p99 " + " ".join(f"{r}={v:,.0f}ms" for r, v in sorted(p99.items())))
    if risk:
        parts.append(f"forecast risk {float(risk[0]['value'][1]):.2f}")
    parts.append(f"firing: {', '.join(firing) if firing else 'none'}")
    parts.append(f"receiver actions: {acted}")
    return " | ".join(parts)


def _actions_so_far(dsn: str, since_ms: int) -> int:
    from llmsla.store import connect
    from llmsla.store.connection import scalar

    with connect(dsn) as conn:
        return scalar(conn, f"SELECT count(*) FROM {names.T_ACTION_LOG} WHERE source = 'alert_receiver' "
                      "AND action <> 'alert' AND ts >= to_timestamp(%s / 1000.0)", (since_ms,))


def follow(stack: Stack, story: Story, console: Any, proc: Proc, *, live_at: float, job: str) -> None:
    """Until ``proc`` (the load) ends: a status line every second, the alerting rules loaded
    ``story.arm_alerts_s`` into the live part (which starts at the time.time() ``live_at``)."""
    started_ms = int(time.time() * 1000)
    last_print = -1e9
    armed = False
    with console.status("live") as status:
        while proc.alive():
            stack.check_alive()
            t_live = time.time() - live_at
            if not armed and t_live >= story.arm_alerts_s:
                stack.arm_alerts()
                armed = True
            line = _status_line(stack, story, max(0.0, t_live), _actions_so_far(stack.dsn, started_ms), job)
            status.update(line)
            if not console.is_terminal and t_live - last_print >= 15:
                console.print(line)
                last_print = t_live
            time.sleep(1.0)


def engine_upstreams(fleet_metrics_port: int | None) -> list[str]:
    """What the demo's ``llmsla engines`` scrapes: for a real fleet (None) nothing given, so the
    gateway's replicas from the demo config (ids r0, r1 like the gateway's); for the simulator,
    each replica of the story's fleet on its metrics port (``/replicas/<id>``; ids r0, r1, ...
    in the simulator's order, which ``--upstream`` order gives again)."""
    if fleet_metrics_port is None:
        return []
    from llmsla.fleet.engine import fleet
    from llmsla.fleet.scenarios import TRACES

    base = f"http://127.0.0.1:{fleet_metrics_port}/replicas"
    return [f"{r.pool}={base}/{r.id}" for r in fleet(TRACES[TRACE].fleet)]


def start_engines(stack: Stack, real: bool) -> dict[str, list[str]]:
    """``llmsla engines`` for the dashboards' engine row; returns its scrape job."""
    port = stack.port("engines")
    ups = engine_upstreams(None if real else stack.port("fleet-metrics"))
    args = [a for u in ups for a in ("--upstream", u)]
    stack.llmsla("engines", "engines", *args, ready_url=f"http://127.0.0.1:{port}/healthz", timeout_s=120)
    return {"engines": [f"127.0.0.1:{port}"]}


def run_story(stack: Stack, story: Story, console: Any) -> dict[str, Any]:
    """Start the simulator last (everything that watches it is up), follow it to its end."""
    work = stack.workdir
    sim_json = work / "simulation.json"
    control_port = stack.port("control")
    sim = stack.llmsla("simulate", "simulate", *story.simulate_args(), "--spool", str(work / "spool"),
                       "--control-port", str(control_port), "--metrics-port", str(stack.port("fleet-metrics")),
                       "--json", str(sim_json),
                       ready_url=f"http://127.0.0.1:{control_port}/healthz", timeout_s=120)
    follow(stack, story, console, sim, live_at=time.time(), job="fleet")
    if sim.popen.returncode != 0:
        raise DemoError(f"the simulator exited with {sim.popen.returncode} (see {sim.log}):\n{sim.tail()}")
    return json.loads(sim_json.read_text())


def run_story_real(stack: Stack, story: Story, console: Any, fleet: demo_real.Fleet) -> dict[str, Any]:
    """Start the trace replay against the gateway, drive r1's fault at the story's times, follow
    the replay to its end; the run's facts with the fault label (what was applied when)."""
    proc, start_ms, replay_json = demo_real.start_replay(stack, fleet, story.live_s, story.seed)
    start = start_ms / 1000.0
    live = story.live_s
    driver = demo_real.FaultDriver(fleet.admin_urls[story.replica], stack.env[demo_real.ADMIN_TOKEN_ENV], start,
                                   ramp_s=story.fault_start * live, crash_s=story.crash_start * live,
                                   end_s=story.fault_end * live, factor=story.factor)
    driver.start_thread()
    try:
        follow(stack, story, console, proc, live_at=start, job="gateway")
    finally:
        driver.stop()
    if proc.popen.returncode != 0:
        raise DemoError(f"the trace replay exited with {proc.popen.returncode} (see {proc.log}):\n{proc.tail()}")
    labels = demo_real.write_labels(stack.workdir / "spool", start_ms, driver.labels(story.replica))
    return demo_real.run_summary(start_ms, fleet, driver, story.replica, replay_json, labels)


def wait_for_windows(dsn: str, until_ms: int, timeout_s: float) -> None:
    """Until the stream job has stored windows up to ``until_ms`` (the last one stays open
    until later events: a continuous job's newest window closes on the next data)."""
    from llmsla.store import connect
    from llmsla.store.connection import scalar

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with connect(dsn) as conn:
            newest = scalar(conn, f"SELECT extract(epoch FROM max(bucket)) * 1000 FROM {names.T_REQUEST_WINDOWS}")
        if newest is not None and newest >= until_ms - 2 * names.REQUEST_WINDOW_S * 1000:
            return
        time.sleep(1.0)


def summarize(stack: Stack, cfg: config_mod.Config, story: Story, sim: dict[str, Any]) -> tuple[Summary, Timeline]:
    from llmsla.store import connect
    from llmsla.store.connection import scalar

    tl = Timeline.of(story, sim)
    s = Summary()
    s.requests, s.latency = exact_latency(stack.workdir / "spool", tl, story.replica)
    with connect(stack.dsn) as conn:
        s.windows = {t: scalar(conn, f"SELECT count(*) FROM {t} WHERE bucket >= to_timestamp(%s / 1000.0)",
                                (tl.start_ms,))
                     for t in (names.T_REQUEST_WINDOWS, names.T_POLICY_WINDOWS, names.T_GPU_WINDOWS)}
        s.breaches = first_breaches(conn, cfg, tl, story.replica)
        s.alerts, s.actions = audited(conn, tl.live_ms, tl.end_ms)
        first_action = min((a["ts_ms"] for a in s.actions if a["target"].endswith(f"/{story.replica}")),
                           default=None)
        s.share = {
            "before the fault": traffic_share(conn, story.replica, tl.live_ms, tl.fault_start_ms),
            "fault, before any action": traffic_share(conn, story.replica, tl.fault_start_ms,
                                                      first_action or tl.fault_end_ms),
            "fault, after the first action": (traffic_share(conn, story.replica, first_action, tl.fault_end_ms)
                                              if first_action and first_action < tl.fault_end_ms else None),
            "after the fault": traffic_share(conn, story.replica, tl.fault_end_ms, tl.end_ms),
        }
    for a in s.alerts:
        a["lead_s"] = lead_s(a, s.breaches, story.replica)
        a["after_fault_s"] = (a["ts_ms"] - tl.fault_start_ms) / 1000.0
    for a in s.actions:
        a["after_fault_s"] = (a["ts_ms"] - tl.fault_start_ms) / 1000.0
    return s, tl


def print_summary(console: Any, s: Summary, tl: Timeline, story: Story) -> None:
    from rich.table import Table

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f} ms"

    when = (f"{story.history_s:g} s of history, {story.live_s:g} s live" if story.history_s
            else f"{story.live_s:g} s live, no history: real workers run in real time only")
    console.print(f"\n[bold]{s.requests:,} requests[/] ({when}), "
                  f"windows in the store: " + ", ".join(f"{t} {n:,}" for t, n in s.windows.items()))
    lat = Table(title=f"P99 latency, exact over every RequestEvent ({story.replica} ramps to x{story.factor:g}, "
                      "then crashes)")
    for col in ("", "before", "during", "after"):
        lat.add_column(col, justify="right")
    for scope in ("pool", story.replica):
        for metric in ("ttft_p99_ms", "e2e_p99_ms"):
            phases = s.latency.get(scope, {})
            lat.add_row(f"{scope} {metric.split('_')[0].upper()}",
                        *(ms(phases.get(p, {}).get(metric)) for p in ("before", "during", "after")))
    console.print(lat)
    if s.breaches:
        console.print("first SLO breach (trailing 60 s below objective): " + ", ".join(
            f"{k} at {(v - tl.fault_start_ms) / 1000:+.0f} s" for k, v in sorted(s.breaches.items(), key=lambda kv: kv[1])))
    def short(target: str) -> str:
        scope, _, name = target.partition(":")
        return name.split("/", 1)[-1] if scope == names.SCOPE_REPLICA else f"pool {name}" if scope == names.SCOPE_POOL else "-"

    alerts = Table(title="alerts the receiver got (time after the fault began; lead: how long before "
                         "the breach of its SLO on its target)")
    for col in ("at", "alert", "from", "status", "target", "decision", "lead"):
        alerts.add_column(col, no_wrap=col == "alert")
    static = sorted({a["alertname"] for a in s.alerts if a["source"] == names.SOURCE_STATIC and a["status"] == "firing"})
    for a in s.alerts:
        if a["source"] == names.SOURCE_STATIC:
            continue
        lead = "-" if a["lead_s"] is None or a["status"] != "firing" else f"{a['lead_s']:+.0f} s"
        alerts.add_row(f"{a['after_fault_s']:+.0f} s", a["alertname"] or "", f"{a['source']} {a['severity']}",
                       a["status"] or "", short(a["target"]), a["decision"] or "", lead)
    console.print(alerts)
    if static:
        console.print(f"static rules also fired (tickets, no action): {', '.join(static)}")
    acts = Table(title="what the receiver did through the control API")
    for col in ("at", "action", "target", "decision", "outcome", "detail"):
        acts.add_column(col)
    for a in s.actions:
        request = a["params"].get("request") or {}
        detail = ", ".join(f"{k} {v}" for k, v in request.items() if k != "replica")
        acts.add_row(f"{a['after_fault_s']:+.0f} s", a["action"], short(a["target"]), a["decision"] or "",
                     a["outcome"], detail)
    console.print(acts)
    console.print(f"{story.replica}'s share of the pool's requests: " + ", ".join(
        f"{k} {'-' if v is None else f'{v * 100:.1f} %'}" for k, v in s.share.items()))


def ab_report(stack: Stack, tl: Timeline) -> dict[str, Any] | None:
    """``llmsla ab report`` over the whole run (history and live part), its JSON."""
    import datetime as dt

    out = stack.workdir / "ab-report.json"
    iso = [dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat() for ms in (tl.start_ms, tl.end_ms)]
    proc = stack.llmsla("ab-report", "ab", "report", "--experiment", EXPERIMENT, "--from", iso[0], "--to", iso[1],
                        "--json", str(out))
    if proc.popen.wait(timeout=300) != 0 or not out.exists():
        log.warning("llmsla ab report failed (see %s)", proc.log)
        return None
    return json.loads(out.read_text())


def print_ab(console: Any, rep: dict[str, Any]) -> None:
    from rich.table import Table

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.2f} %"

    t = Table(title=f"A/B '{rep['experiment']}' ({rep['mode']}): {rep['control']} vs the rest, whole run")
    for col in ("arm", "requests", "TTFT met", "E2E met", "available", "E2E p99", "verdicts"):
        t.add_column(col)
    verdicts: dict[str, dict[str, list[str]]] = {}
    for c in rep["comparisons"]:
        verdicts.setdefault(c["arm"], {}).setdefault(c["verdict"], []).append(c["metric"])

    def said(arm: str) -> str:
        by = verdicts.get(arm)
        if not by:
            return "(control)"
        return "; ".join(f"{v}: {', '.join(m)}" if v != "inconclusive" else f"inconclusive: {len(m)}"
                         for v, m in sorted(by.items()))

    for a in rep["arms"]:
        p99 = a["quantiles_ms"].get("e2e_p99_ms")
        t.add_row(a["arm"], f"{a['requests']:,}", pct(a["ttft_attainment"]), pct(a["e2e_attainment"]),
                  pct(a["availability"]), "-" if p99 is None else f"{p99:,.0f} ms",
                  said(a["arm"]))
    console.print(t)
    for b in rep["breaches"]:
        console.print(f"SLA breach {b['start'][11:19]}-{b['end'][11:19]} ({', '.join(b['slis'])}): "
                      f"{', '.join(b['attributed']) if b['attributed'] else 'fleet-wide'}")


def write_outputs(stack: Stack, tl: Timeline) -> dict[str, str]:
    """The HTML report (Prometheus still up for its live panels) and the dashboards as JSON."""
    import datetime as dt

    work = stack.workdir
    iso = dt.datetime.fromtimestamp(tl.start_ms / 1000, dt.UTC).isoformat()
    report = work / "report.html"
    dashboards = work / "dashboards"
    stack.llmsla("report", "report", "--from", iso, "--out", str(report), "--prometheus", stack.urls["prometheus"],
                 "--scrape-interval", f"{stack.scale.scrape_s:g}").popen.wait(timeout=300)
    stack.llmsla("dashboards", "dashboards", "build", "--out", str(dashboards)).popen.wait(timeout=300)
    out = {}
    if report.exists():
        out["report"] = str(report)
    if dashboards.is_dir():
        out["dashboards"] = str(dashboards)
    return out


def forget_receiver_state(dsn: str) -> None:
    """A rerun acts on a new fleet (a new simulator or new workers, every router fresh): the
    receiver's per-target state from the last run (hold-downs, replicas it drained) must not
    restore or hold anything here. Its audit rows stay in ``action_log``, with the windows."""
    from llmsla.store import connect
    from llmsla.store.connection import scalar

    with connect(dsn) as conn:
        if scalar(conn, "SELECT to_regclass(%s)", (names.T_RECEIVER_STATE,)) is not None:
            conn.execute(f"DELETE FROM {names.T_RECEIVER_STATE}")
            conn.commit()


def cmd_demo(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    from rich.console import Console

    from llmsla.redaction import redact
    from llmsla.store import open_store

    if args.minutes < 2:
        from llmsla.errors import CliError

        raise CliError(f"--minutes: at least 2 (the fault starts at 20 % of the live part, after the alerting "
                       f"rules load {Story(live_s=120).arm_alerts_s:g} s in), got {args.minutes:g}")
    from llmsla import extras

    # the whole loop runs: name a missing extra now, not minutes in as a component's traceback
    for extra in ("stream", "forecast", "dashboards", *(() if cfg.store.dsn else ("embedded",)),
                  *(("worker",) if args.real else ())):
        extras.require(extra, "llmsla demo")
    console = Console(width=None if sys.stdout.isatty() else 120)
    work = Path(args.workdir).resolve() if args.workdir else config_mod.default_data_dir() / "demo"
    work.mkdir(parents=True, exist_ok=True)
    # Third-party warnings and our own log lines go to a file, not the terminal.
    (work / "logs").mkdir(exist_ok=True)
    handler = logging.FileHandler(work / "logs" / "demo.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.captureWarnings(True)
    py_warnings = logging.getLogger("py.warnings")
    py_warnings.addHandler(handler)
    py_warnings.propagate = False
    # A rerun starts a new event-time stream: the last run's spool and checkpoints go, the store stays.
    for old in ("spool", "checkpoints", "prometheus", "alertmanager", "forecast/online"):
        shutil.rmtree(work / old, ignore_errors=True)
    cfg.store.data_dir = cfg.store.data_dir or str(work / "pg")
    real = bool(args.real)
    story = (Story(live_s=args.minutes * 60, history_s=0.0, factor=demo_real.FACTOR) if real
             else Story(live_s=args.minutes * 60))
    t0 = time.monotonic()
    store = open_store(cfg, keep_running=args.keep)
    forget_receiver_state(store.dsn)
    where = f"embedded PostgreSQL in {store.data_dir}" if store.embedded else redact(store.dsn)
    stack = Stack.prepare(work, store.dsn, Scale(), "")
    receiver_port = stack.port("receiver")
    stack.config_file.write_text(demo_config(work, stack, receiver_port, real=real))
    # the objectives every child judges by (--real sets its own), for the summary's breaches too
    demo_cfg = config_mod.load(path=stack.config_file, env={})
    facts: dict[str, Any] = {"workdir": str(work), "store": where, "mode": "real" if real else "simulated"}
    try:
        fleet = None
        if real:
            with console.status("starting two reference workers and the gateway"):
                fleet = demo_real.start_fleet(stack)
        with console.status("starting the stream job, Prometheus, Alertmanager, the receiver and the forecaster"):
            stack.llmsla("stream", "stream", ready_url=f"http://127.0.0.1:{stack.port('stream-metrics')}/metrics")
            engines = start_engines(stack, real)
            jobs = fleet.scrape_jobs(stack) if fleet is not None else {
                "fleet": [f"127.0.0.1:{stack.port('fleet-metrics')}"]}
            stack.start_alerting(receiver_port, stack.port("control"), {**jobs, **engines})
            stack.llmsla("forecast", "forecast", "serve",
                         ready_url=f"http://127.0.0.1:{stack.port('forecast')}/metrics", timeout_s=120)
        console.print(f"[green]✓[/] stack up in {time.monotonic() - t0:.0f} s: {where}; Prometheus "
                      f"{stack.urls['prometheus']}, Alertmanager {stack.urls['alertmanager']}, logs in {work / 'logs'}")
        if fleet is not None:
            console.print(f"  gateway {fleet.gateway_url} -> {', '.join(f'{r} {u}' for r, u in fleet.worker_urls.items())}"
                          f" (reference workers); SLOs for them: {slo_catalog.load(demo_cfg).summary()}")
            console.print(f"  windows x{stack.scale.factor:.4g} (1 h of burn-rate window = "
                          f"{3600 * stack.scale.factor:g} s); the Azure conv trace as real requests, "
                          f"{story.live_s:g} s live: {story.replica} slows down (ramp to x{story.factor:g}), then crashes")
            sim = run_story_real(stack, story, console, fleet)
        else:
            console.print(f"  windows x{stack.scale.factor:.4g} (1 h of burn-rate window = "
                          f"{3600 * stack.scale.factor:g} s); {story.history_s:g} s of Azure conv history, then "
                          f"{story.live_s:g} s live: {story.replica} slows down (ramp to x{story.factor:g}), then crashes")
            sim = run_story(stack, story, console)
        tl = Timeline.of(story, sim)
        with console.status("waiting for the last windows and alerts"):
            wait_for_windows(stack.dsn, tl.end_ms, timeout_s=30)
            time.sleep(stack.scale.seconds(10) * 2)  # Alertmanager's batching + the receiver's tick
        summary, tl = summarize(stack, demo_cfg, story, sim)
        print_summary(console, summary, tl, story)
        with console.status("A/B attribution report"):
            facts["ab"] = ab_report(stack, tl)
        if facts["ab"]:
            print_ab(console, facts["ab"])
        with console.status("writing the report and the dashboards"):
            facts["outputs"] = write_outputs(stack, tl)
        for what, path in facts["outputs"].items():
            console.print(f"{what}: {path}")
        facts.update({"summary": asdict(summary), "timeline": asdict(tl), "real" if real else "simulation": sim})
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: stopping every component (data kept in "
                      f"{work})")
        facts["interrupted"] = True
    finally:
        with console.status("stopping"):
            stack.close()
            store.close()  # stops the embedded server this demo started, unless --keep
        logging.getLogger().removeHandler(handler)
        py_warnings.removeHandler(handler)
        handler.close()
    if args.json:
        Path(args.json).write_text(json.dumps(facts, indent=2, default=str))
    console.print(f"[bold green]demo finished[/] in {time.monotonic() - t0:.0f} s")
    return 130 if facts.get("interrupted") else 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole closed loop on one machine (embedded defaults)",
                       description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--workdir", type=argtypes.writable_dir, help="the demo's store, spool, logs and outputs (default: <user data dir>/demo)")
    p.add_argument("--keep", action="store_true", help="leave the embedded PostgreSQL running afterwards "
                   "(`llmsla --data-dir <workdir>/pg store stop` stops it)")
    p.add_argument("--json", metavar="FILE", type=argtypes.output_file, help="also write the run's facts and summary as JSON")
    p.add_argument("--minutes", type=argtypes.number(float, above=0, maximum=24 * 60), default=4.0, help="minutes of live traffic after the history (default 4, at least 2)")
    p.add_argument("--real", action="store_true",
                   help="two reference workers behind the gateway, sent the trace as real requests in real time, "
                        "instead of the fleet simulator (docs/demo.md)")
    p.set_defaults(handler=cmd_demo)
