"""``llmsla simulate``: replay a trace or a synthetic load through a simulated fleet.

Events go through the gateway's recorders into the spool (``--spool`` or ``spool.dir``), so a
running ``llmsla stream`` job, the dashboards and the forecaster consume them unchanged; the
fault labels are written next to them (``<spool>/labels/``).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from llmsla import argtypes
from llmsla.config import Config


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="simulate a fleet (trace replay / synthetic load, fault injection) into the spool",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    load = p.add_argument_group("load")
    load.add_argument("--trace", help="azure_code, azure_conv, mooncake or a trace file path")
    load.add_argument("--load", choices=("poisson", "bursty", "burst"), help="synthetic load instead of a trace")
    load.add_argument("--rate", type=argtypes.positive_float, default=5.0, help="synthetic: mean requests/s (default 5)")
    load.add_argument("--duration", type=argtypes.positive_duration_s, help="seconds of load (synthetic default 300; trace: all)")
    load.add_argument("--start", type=argtypes.duration_s, default=0.0, help="trace: skip this many seconds first")
    load.add_argument("--prompt", type=argtypes.positive_int, default=512, help="synthetic: mean prompt tokens")
    load.add_argument("--output", type=argtypes.positive_int, default=128, help="synthetic: mean output tokens")
    load.add_argument("--sigma", type=argtypes.non_negative_float, default=0.0, help="synthetic: log-normal sigma of token counts (0 = fixed)")
    load.add_argument("--burst-n", type=argtypes.positive_int, default=800, help="burst: requests arriving together")
    load.add_argument("--time-scale", type=argtypes.positive_float, default=1.0, help="multiply arrival times (0.5 = twice as fast)")
    load.add_argument("--rate-mult", type=argtypes.positive_float, default=1.0, help="multiply the request rate, keeping the duration")
    load.add_argument("--sessions", type=argtypes.non_negative_float, default=0.0, metavar="TURNS",
                      help="group requests into sessions (A/B units) of this mean number of turns (0 = each request its own unit)")
    load.add_argument("--think-s", type=argtypes.duration_s, default=30.0, help="sessions: mean seconds between a session's turns")
    fl = p.add_argument_group("fleet")
    fl.add_argument("--fleet", default="6b:8", help="replicas, e.g. 6b:8 or 70b/teacher:1,6b/student:2 or 6b:4,canary=6b:4 "
                    "(a named pool gets requests only through an A/B arm; default 6b:8)")
    fl.add_argument("--route-policy", type=argtypes.key("control.route_policy"),
                    help="routing policy (default control.route_policy)")
    fl.add_argument("--policy", dest="route_policy", action=argtypes.OldSpelling, new="--route-policy",
                    type=argtypes.key("control.route_policy"))
    fl.add_argument("--tenant-mix", default="", metavar="TENANT[/CLASS]:WEIGHT,...",
                    help="each request's tenant and class drawn with these weights, e.g. "
                         "acme/interactive:3,globex/batch:1,default:1 (CLASS defaults to interactive); "
                         "default: every request the default tenant's and class's")
    fl.add_argument("--student-share", type=argtypes.fraction, help="share of requests for role 'student' (0..1)")
    fl.add_argument("--timeout-s", type=argtypes.key("gateway.request_timeout_s"), help="request timeout (default gateway.request_timeout_s)")
    fl.add_argument("--fault", action="append", default=[], metavar="KIND:REPLICA:START:END[:FACTOR]",
                    help="inject a fault (slowdown|memory|crash|jitter); repeatable")
    out = p.add_argument_group("output")
    out.add_argument("--spool", type=argtypes.writable_dir, help="spool directory (default spool.dir)")
    out.add_argument("--no-events", action="store_true", help="do not write events (summary only)")
    out.add_argument("--labels", type=argtypes.output_file, help="fault label file (default <spool>/labels/sim-<start_ms>.json)")
    out.add_argument("--start-ms", type=argtypes.epoch_ms, help="epoch ms of simulated time 0 (default: ends now)")
    out.add_argument("--seed", type=argtypes.non_negative_int, default=0)
    out.add_argument("--realtime", type=argtypes.non_negative_float, default=0.0, metavar="X",
                     help="pace the run at X simulated seconds per wall second (live demos)")
    out.add_argument("--metrics-port", type=argtypes.port0,
                     help="serve the recorders' Prometheus metrics on 127.0.0.1:PORT while running (with --live-from: from the live part on)")
    out.add_argument("--live-from", type=argtypes.duration_s, default=0.0, metavar="S",
                     help="with --realtime: simulated seconds replayed as fast as they compute before the "
                          "paced part, which then starts now (history first, then live)")
    out.add_argument("--control-port", type=argtypes.port0, metavar="PORT",
                     help="serve the control API for the simulator's router and distillation controls on "
                          "control.host:PORT while it runs (bearer token control.token; a paced run only)")
    out.add_argument("--json", type=argtypes.output_file_or_stdout, help="write the summary as JSON to this file ('-' = stdout)")
    p.set_defaults(handler=run)

    r = subparsers.add_parser(
        "replay",
        help="replay a trace as real streaming chat requests against an OpenAI-compatible URL (real time)",
        description="Send a trace's arrivals (built as `llmsla simulate` builds them) to URL/v1/chat/completions "
                    "in real time, open loop, request sizes scaled to the endpoint; see docs/fleet.md.",
    )
    r.add_argument("--url", required=True, type=argtypes.url, help="base URL of the endpoint, e.g. the gateway's http://127.0.0.1:8000")
    r.add_argument("--trace", default="azure_conv", help="azure_code, azure_conv, mooncake or a trace file path")
    r.add_argument("--duration", type=argtypes.positive_duration_s, required=True, help="seconds of load (after --time-scale)")
    r.add_argument("--start", type=argtypes.duration_s, default=0.0, help="skip this many trace seconds first")
    r.add_argument("--time-scale", type=argtypes.positive_float, default=1.0, help="multiply arrival times (2 = half the rate, stretched)")
    r.add_argument("--rate-mult", type=argtypes.positive_float, default=1.0, help="multiply the request rate, keeping the duration")
    r.add_argument("--sessions", type=argtypes.non_negative_float, default=0.0, metavar="TURNS",
                   help="group requests into sessions (sent as the OpenAI `user`, the A/B unit) of this mean number of turns")
    r.add_argument("--think-s", type=argtypes.duration_s, default=30.0, help="sessions: mean seconds between a session's turns")
    r.add_argument("--prompt-scale", type=argtypes.positive_float, default=1.0, help="prompt characters per trace prompt token")
    r.add_argument("--output-scale", type=argtypes.positive_float, default=1.0, help="generated tokens per trace output token")
    r.add_argument("--max-prompt-chars", type=argtypes.positive_int, default=8192, help="cap on a prompt's characters")
    r.add_argument("--max-tokens", type=argtypes.positive_int, default=1024, help="cap on a request's max_tokens")
    r.add_argument("--model", type=argtypes.label, default="llmsla-tiny", help="model name sent (default llmsla-tiny, the reference worker's)")
    r.add_argument("--start-at-ms", type=argtypes.epoch_ms, help="epoch ms of the first arrival's t = 0 (default: now)")
    r.add_argument("--timeout-s", type=argtypes.positive_duration_s, default=60.0, help="give up on one request after this long")
    r.add_argument("--seed", type=argtypes.non_negative_int, default=0)
    r.add_argument("--json", type=argtypes.output_file, help="write the summary (sent, HTTP statuses, lateness) to this file")
    r.set_defaults(handler=run_replay)


def build_load(args: argparse.Namespace) -> tuple[list, dict | None]:
    from llmsla.errors import CliError
    from llmsla.fleet import traces, workload

    rng = random.Random(args.seed + 100)
    if bool(args.trace) == bool(args.load):
        raise CliError("give exactly one of --trace or --load")
    report = None
    if args.trace:
        try:
            arrivals, rep = traces.load(args.trace)
        except (OSError, ValueError) as exc:
            raise CliError(str(exc)) from None
        report = rep.to_dict()
        if rep.skipped:
            print(f"llmsla simulate: {rep.summary()}", file=sys.stderr)
        arrivals = workload.window(arrivals, start_s=args.start, duration_s=args.duration)
    else:
        prompt = workload.TokenDist(args.prompt, args.sigma)
        output = workload.TokenDist(args.output, args.sigma)
        duration = args.duration or 300.0
        if args.load == "poisson":
            arrivals = workload.poisson(args.rate, duration, prompt, output, rng)
        elif args.load == "bursty":
            arrivals = workload.bursty(args.rate, duration, prompt, output, rng)
        else:
            arrivals = workload.burst(args.burst_n, prompt, output, rng)
    try:
        arrivals = workload.scale(arrivals, time_scale=args.time_scale, rate=args.rate_mult, rng=rng)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not arrivals:
        raise CliError("the load is empty (check --start/--duration)")
    return arrivals, report


def run(args: argparse.Namespace, cfg: Config) -> int:
    import threading

    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from llmsla import names
    from llmsla.control import api
    from llmsla.control.audit import AuditLog
    from llmsla.control.distill import DistillControls
    from llmsla.control.rollout import Rollout
    from llmsla.control.router import params_from_config
    from llmsla.control.shed import ShedControls
    from llmsla.errors import CliError
    from llmsla.fleet import engine, faults, stats, tenancy, vllm_view, workload
    from llmsla.fleet.sink import RecorderSink
    from llmsla.httpkit import BackgroundServer, Limits, add_metrics
    from llmsla.store import open_store

    arrivals, trace_report = build_load(args)
    if args.sessions:
        try:
            arrivals = workload.sessions(arrivals, random.Random(args.seed + 3), mean_turns=args.sessions,
                                         think_s=args.think_s)
        except ValueError as exc:
            raise CliError(f"--sessions/--think-s: {exc}") from None
    if args.control_port is not None and args.realtime <= 0:
        raise CliError("--control-port needs a paced run (--realtime X): an unpaced one is over before anyone acts")
    # with the control API, its changes are audited in the store's action_log (the configured or
    # the embedded PostgreSQL): the log exists before the controls it audits
    store = open_store(cfg) if args.control_port is not None else None
    audit = AuditLog(store.dsn) if store is not None else None
    try:
        fault_list = [faults.parse(s) for s in args.fault]
        replicas = engine.fleet(args.fleet)
        # the experiments of [ab], applied as the gateway does; named pools are arms' pools
        rollout = Rollout.from_config(cfg, audit=audit) if cfg.ab.experiments else None
        pools = {r.pool for r in replicas}
        entry = [names.DEFAULT_POOL] if len(pools) > 1 and names.DEFAULT_POOL in pools else None
        sim_cfg = engine.SimConfig(
            replicas=replicas,
            rollout=rollout,
            entry_pools=entry,
            policy=args.route_policy or cfg.control.route_policy,
            router_params=params_from_config(cfg),  # control.ladr_*, as the gateway's router
            seed=args.seed,
            timeout_s=args.timeout_s or cfg.gateway.request_timeout_s,
            max_concurrency=cfg.gateway.max_concurrency,
            max_in_flight=cfg.gateway.max_in_flight,
            gpu_interval_s=cfg.gpu.interval_s,
            student_share=args.student_share,
            tenant_mix=tenancy.parse_mix(args.tenant_mix) if args.tenant_mix else (),
        )
        registry = CollectorRegistry()
        # the pools' student share and schedule, changed by the control API while a paced run goes
        distill = DistillControls.from_config(cfg, sorted({rc.pool for rc in sim_cfg.replicas}), audit=audit,
                                              registry=registry)
        # the classes each pool sheds, set over the same control API (the receiver's class rule)
        shed = ShedControls(cfg.tenants.classes, distill.pools(), audit=audit, registry=registry)
        lock = threading.RLock() if args.control_port is not None else None
        sim = engine.Simulator(sim_cfg, registry=registry, distill=distill, lock=lock, shed=shed)
    except BaseException as exc:
        if store is not None:
            store.close()
        if isinstance(exc, ValueError):
            raise CliError(str(exc)) from None
        raise
    spool_dir = Path(args.spool) if args.spool else cfg.spool_dir()
    sink = None if args.no_events else RecorderSink(cfg, spool_dir=spool_dir, registry=registry)
    # each replica's own vLLM series beside the simulator's /metrics, read by `llmsla engines`
    engine_regs = vllm_view.attach(sim, lock) if args.metrics_port is not None else {}
    background = BackgroundServer() if args.metrics_port is not None or args.control_port is not None else None
    try:
        limits = Limits.from_config(cfg)
        metrics_port = args.metrics_port

        def open_metrics() -> None:
            app = web.Application()
            add_metrics(app, registry)
            vllm_view.add_routes(app, engine_regs)
            assert background is not None  # made above whenever a port is asked for
            served = background.serve(app, "127.0.0.1", metrics_port, limits)
            print(f"simulator /metrics on {served.url}/metrics, each replica's vllm:* on "
                  f"{served.url}/replicas/<id>/metrics", file=sys.stderr, flush=True)

        # a paced run with history opens /metrics when the live part begins: a scrape during the
        # history replay would see minutes of traffic in one interval (a burn-rate spike)
        live_metrics = metrics_port is not None and args.realtime > 0 and args.live_from > 0
        if metrics_port is not None and not live_metrics:
            open_metrics()
        if args.control_port is not None:
            app = api.make_app(sim.router, distill, token=cfg.control.token, limits=limits, lock=lock, rollout=rollout,
                               shed=shed)
            assert background is not None  # made above whenever a port is asked for
            served = background.serve(app, cfg.control.host, args.control_port, limits)
            print(f"simulator control API on {served.url}", file=sys.stderr, flush=True)

        wall = [time.monotonic()]

        def progress(t: float) -> None:  # a line every 5 s of wall time on long runs
            if time.monotonic() - wall[0] >= 5.0:
                wall[0] = time.monotonic()
                print(f"  simulated {t:,.0f} s of {arrivals[-1].t:,.0f}", file=sys.stderr)

        res = sim.run(arrivals, faults=fault_list, sink=sink, start_ms=args.start_ms,
                      pace=args.realtime, live_from_s=args.live_from, progress=progress,
                      on_live=open_metrics if live_metrics else None)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    finally:
        if sink is not None:
            sink.close()
        if background is not None:
            background.close()
        if store is not None:
            distill.audit.flush(10.0)
            store.close()
    summary: dict[str, Any] = {
        "fleet": args.fleet, "policy": sim_cfg.policy, "router_params": res.router["params"], "seed": args.seed,
        "start_ms": res.start_ms,
        "trace": trace_report, "faults": faults.labels(fault_list, res.start_ms),
        **stats.summarize(res),
    }
    if rollout is not None:  # requests per arm label (an experiment's units, forced ones, default)
        summary["arms"] = dict(sorted(collections.Counter(row.arm for row in res.rows).items()))
    if sink is not None:
        summary["spool"] = str(spool_dir)
        summary["events"] = {"requests": sink.n_requests, "gpu": sink.n_gpu}
        if fault_list or args.labels:
            path = Path(args.labels) if args.labels else spool_dir / "labels" / f"sim-{res.start_ms}.json"
            summary["labels"] = str(faults.write_labels(path, fault_list, res.start_ms))
    _print(summary, stats.per_replica(res), sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        text = json.dumps(summary, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


def run_replay(args: argparse.Namespace, cfg: Config) -> int:
    import asyncio
    import dataclasses

    from llmsla.errors import CliError
    from llmsla.fleet import replay

    try:
        fit = replay.Fit(args.prompt_scale, args.output_scale, args.max_prompt_chars, args.max_tokens)
        requests = replay.trace_plan(args.trace, fit, duration_s=args.duration, start_s=args.start,
                                     time_scale=args.time_scale, rate=args.rate_mult, sessions=args.sessions,
                                     think_s=args.think_s, seed=args.seed)
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    if not requests:
        raise CliError("the load is empty (check --start/--duration)")
    span = requests[-1].t or 1.0
    print(f"llmsla replay: {len(requests)} requests over {span:,.0f} s ({len(requests) / span:.2f}/s) "
          f"-> {args.url}", flush=True)
    res = asyncio.run(replay.replay(args.url, requests, model=args.model, start_ms=args.start_at_ms,
                                    timeout_s=args.timeout_s))
    summary = res.summary()
    print(f"llmsla replay: sent {summary['sent']}, completed {summary['completed']}, HTTP {summary['statuses']}, "
          f"late p99 {summary['late_p99_s'] or 0:.3f} s", flush=True)
    if args.json:
        replay.write_summary(args.json, res, {"url": args.url, "trace": args.trace, "duration_s": args.duration,
                                              "time_scale": args.time_scale, "rate_mult": args.rate_mult,
                                              "fit": dataclasses.asdict(fit)})
    return 0


def _print(summary: dict[str, Any], replicas: list[dict[str, Any]], out: Any) -> None:
    def p(*a: Any) -> None:
        print(*a, file=out)

    def f(v: Any) -> str:
        return "-" if v is None else (f"{v:,.1f}" if isinstance(v, float) else str(v))

    p(f"simulated {summary['requests']} requests on {summary['fleet']} ({summary['policy']}) "
          f"in {summary['wall_s']:.2f} s wall for {summary['sim_s']:,.0f} s simulated")
    p(f"  status {summary['status']}  P50/P99 E2E {f(summary['e2e_p50_ms'])}/{f(summary['e2e_p99_ms'])} ms"
          f"  P50/P99 TTFT {f(summary['ttft_p50_ms'])}/{f(summary['ttft_p99_ms'])} ms"
          f"  preemptions {summary['preemptions']}")
    for r in replicas:
        p(f"  {r['replica']:>5} {r['model']:>5}  req {r['requests']:>6}  P99 E2E {f(r['e2e_p99_ms']):>10} ms"
              f"  err {r['errors']}  timeout {r['timeouts']}  preempt {r['preemptions']}"
              f"  busy {r['busy_ratio']:.0%}  kv peak {r['kv_peak_ratio']:.0%}")
    if "labels" in summary:
        p(f"  fault labels: {summary['labels']}")
    if "spool" in summary:
        p(f"  events: {summary['events']} -> {summary['spool']}")
