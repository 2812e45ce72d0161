"""``llmsla demo``: the main job on the embedded defaults, end to end on one machine.

Stages run in order, each shown with progress: start the store and migrate it; then, when those
components are installed, simulate fleet traffic into the spool and window it with the
streaming job into the store; finally report what landed. Every stage uses the same code paths
as production; only the defaults (embedded PostgreSQL, spool directory, local mini-cluster)
differ.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmsla import config as config_mod
from llmsla import names, spool


@dataclass
class DemoContext:
    cfg: config_mod.Config
    args: argparse.Namespace
    dsn: str = ""
    facts: dict[str, Any] = field(default_factory=dict)


Stage = Callable[[DemoContext], str]


def stage_store(ctx: DemoContext) -> str:
    from llmsla.redaction import redact
    from llmsla.store import open_store
    from llmsla.store.migrate import migrate

    handle = open_store(ctx.cfg, migrate=False, keep_running=ctx.args.keep)
    ctx.facts["_store_handle"] = handle
    ctx.dsn = handle.dsn
    with handle.connect() as conn:
        result = migrate(conn, ctx.cfg)
    where = f"embedded PostgreSQL in {handle.data_dir}" if handle.embedded else redact(handle.dsn)
    ctx.facts["store"] = {"where": where, "flavor": result.flavor, "applied": result.applied,
                          "server_version": result.server_version}
    return f"{where}: PostgreSQL {result.server_version}, schema {result.flavor}, applied {result.applied or 'nothing new'}"


def stage_status(ctx: DemoContext) -> str:
    from llmsla.admin import store_status

    info = store_status(ctx.facts["_store_handle"])
    ctx.facts["status"] = info
    rows = {t: v["rows"] for t, v in info["tables"].items()}
    return "tables: " + ", ".join(f"{t}={n}" for t, n in rows.items())


def live_config(cfg: config_mod.Config) -> config_mod.Config:
    """The live stage's own pool and spool: its events are 'now' while the simulated trace lies
    in the recent past, and one event-time stream must not mix the two (the older would be late)."""
    live = copy.deepcopy(cfg)
    live.gateway.pool = live.worker.zone = "live"
    live.spool.dir = str(cfg.spool_dir().parent / "spool-live")
    return live


def stage_live(ctx: DemoContext) -> str:
    """Real inference through the real gateway, scraped by a real Prometheus."""
    import asyncio

    from llmsla import names, services
    from llmsla.exporters import gateway
    from llmsla.worker.server import WorkerThread

    try:
        services.find_binary("prometheus")
    except services.MissingBinary as exc:
        return f"skipped: {exc}"
    cfg = live_config(ctx.cfg)
    workers = [WorkerThread(cfg) for _ in range(2)]
    urls = [w.start() for w in workers]
    cfg.gateway.upstreams = urls
    requests = ctx.args.live_requests
    work = Path(ctx.cfg.spool_dir()).parent / "demo-prometheus"

    async def drive() -> dict[str, Any]:
        import aiohttp

        async with gateway.serve(cfg, "127.0.0.1", 0) as gw:
            prom = services.start_prometheus(
                work, config_yaml=services.scrape_config({"gateway": [f"127.0.0.1:{gw.port}"]}, interval_s=0.5))
            try:
                async with aiohttp.ClientSession() as session:
                    sem = asyncio.Semaphore(8)

                    async def one(i: int) -> None:
                        body = {"model": cfg.worker.model, "prompt": "Four score and seven years " * (1 + i % 5),
                                "max_tokens": 4 + i % 24, "stream": i % 2 == 0}
                        async with sem, session.post(f"{gw.url}/v1/completions", json=body) as resp:
                            await resp.read()

                    await asyncio.gather(*(one(i) for i in range(requests)))
                async with aiohttp.ClientSession() as session:

                    async def query(q: str) -> float | None:
                        async with session.get(f"{prom.url}/api/v1/query", params={"query": q}) as resp:
                            result = (await resp.json())["data"]["result"]
                        return float(result[0]["value"][1]) if result else None

                    total, deadline = None, time.monotonic() + 30
                    while total != requests and time.monotonic() < deadline:  # until scraped
                        await asyncio.sleep(0.5)
                        total = await query(f"sum({names.REQUESTS}_total)")
                    p99 = await query(f"histogram_quantile(0.99, sum by (le) ({names.REQUEST_TTFT_SECONDS}_bucket))")
                if total is None or p99 is None:
                    raise RuntimeError(f"Prometheus did not scrape the gateway; see {prom.log}")
                return {"requests": total, "ttft_p99_s": p99}
            finally:
                prom.stop()

    try:
        facts = asyncio.run(drive())
    finally:
        for w in workers:
            w.stop()
    ctx.facts["live"] = facts
    return (f"{int(facts['requests'])} real completions via gateway -> 2 reference workers; "
            f"Prometheus histogram_quantile(0.99) TTFT = {facts['ttft_p99_s'] * 1000:.0f} ms")


def stage_simulate(ctx: DemoContext) -> str:
    """Fleet traffic from the Azure conversation trace with a labelled slowdown fault."""
    from llmsla.app.cli import build_parser

    out = Path(ctx.cfg.spool_dir()).parent / "demo-simulation.json"
    minutes = ctx.args.minutes
    argv = ["simulate", "--trace", "azure_conv", "--duration", str(minutes * 60), "--fleet", "6b:4",
            "--policy", ctx.cfg.control.route_policy, "--spool", str(ctx.cfg.spool_dir()),
            "--fault", f"slowdown:r1:{minutes * 20}:{minutes * 40}:4", "--json", str(out)]
    args = build_parser().parse_args(argv)
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        rc = args.handler(args, ctx.cfg)
    if rc:
        raise RuntimeError(f"simulate exited {rc}")
    summary = json.loads(out.read_text())
    ctx.facts["simulation"] = summary
    ev = summary.get("events", {})
    return (f"{minutes} min of the Azure conv trace on 4 x 6B ({summary['policy']}), slowdown x4 on r1 "
            f"for the middle third; {ev.get('requests', 0)} RequestEvents, {ev.get('gpu', 0)} GpuSamples "
            f"into {ctx.cfg.spool_dir()}")


def stage_stream(ctx: DemoContext) -> str:
    """The PyFlink job over everything the spool holds now (bounded run), into the store."""
    from llmsla.store import connect
    from llmsla.streaming.job import JobOptions, run

    for cfg in (ctx.cfg, live_config(ctx.cfg)):  # the simulated past, then the live traffic
        if any(spool.published_segments(cfg.spool_dir(), kind) for kind in names.SPOOL_KINDS):
            for kind in names.SPOOL_KINDS:  # the file source wants every kind's directory
                (cfg.spool_dir() / kind).mkdir(parents=True, exist_ok=True)
            run(cfg, JobOptions(bounded=True, dsn=ctx.dsn, resume=False))
    with connect(ctx.dsn) as conn:
        counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                  for t in (names.T_REQUEST_WINDOWS, names.T_POLICY_WINDOWS, names.T_GPU_WINDOWS, names.T_DEAD_LETTERS)}
    ctx.facts["windows"] = counts
    return ", ".join(f"{t}={n}" for t, n in counts.items())


def stage_report(ctx: DemoContext) -> str:
    """What an SRE would look at first: per-replica TTFT P99 and SLO attainment from the store."""
    from rich.console import Console
    from rich.table import Table

    from llmsla.store import connect

    sql = f"""
        SELECT replica, sum(requests) AS requests,
               max(ttft_p99_ms) AS worst_ttft_p99_ms,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_p99_ms) AS median_ttft_p99_ms,
               sum(ttft_within_slo)::float / nullif(sum(requests), 0) AS ttft_attainment,
               sum(errors + timeouts)::float / nullif(sum(requests), 0) AS error_ratio
        FROM {names.T_REQUEST_WINDOWS} WHERE pool = %s AND bucket >= to_timestamp(%s / 1000.0)
        GROUP BY replica ORDER BY replica"""
    start_ms = ctx.facts.get("simulation", {}).get("start_ms", 0)  # this run only; the store keeps earlier ones
    with connect(ctx.dsn) as conn:
        rows = conn.execute(sql, (names.DEFAULT_POOL, start_ms)).fetchall()
    table = Table(title=f"simulated fleet: request windows by replica (TTFT SLO {ctx.cfg.slo.ttft_ms:g} ms)")
    for col in ("replica", "requests", "worst 5 s TTFT P99", "median 5 s TTFT P99", "TTFT SLO met", "errors"):
        table.add_column(col, justify="right")
    for rep, n, worst, median, att, err in rows:
        table.add_row(rep, f"{n}", f"{worst or 0:,.0f} ms", f"{median or 0:,.0f} ms",
                      f"{(att or 0) * 100:.2f} %", f"{(err or 0) * 100:.2f} %")
    Console().print(table)
    ctx.facts["report"] = [list(r) for r in rows]
    fault = ctx.facts.get("simulation", {}).get("faults", [{}])[0]
    if not fault:
        return f"{len(rows)} replicas"
    by_phase = f"""
        SELECT (bucket >= to_timestamp(%(s)s / 1000.0) AND bucket < to_timestamp(%(e)s / 1000.0)) AS during,
               max(e2e_p99_ms), sum(e2e_within_slo)::float / nullif(sum(requests), 0)
        FROM {names.T_REQUEST_WINDOWS}
        WHERE pool = %(pool)s AND replica = %(rep)s AND bucket >= to_timestamp(%(t0)s / 1000.0) GROUP BY 1"""
    with connect(ctx.dsn) as conn:
        phases = {r[0]: r[1:] for r in conn.execute(
            by_phase, {"s": fault["start_ms"], "e": fault["end_ms"], "pool": names.DEFAULT_POOL,
                       "rep": fault["replica"], "t0": start_ms})}
    during, outside = phases.get(True, (None, None)), phases.get(False, (None, None))
    ctx.facts["fault_effect"] = {"during": during, "outside": outside}
    return (f"{fault['replica']} under the injected x{fault['factor']:g} {fault['kind']}: worst 5 s E2E P99 "
            f"{during[0] or 0:,.0f} ms vs {outside[0] or 0:,.0f} ms outside the labelled window")


def stages() -> list[tuple[str, Stage]]:
    return [
        ("store: start and migrate", stage_store),
        ("live: worker + gateway + Prometheus", stage_live),
        ("fleet: simulate trace replay with a fault", stage_simulate),
        ("stream: PyFlink windows spool -> store", stage_stream),
        ("report: SLO per replica from the store", stage_report),
        ("store: status", stage_status),
    ]


def cmd_demo(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    from rich.console import Console

    console = Console()
    # The demo's events go to a spool of its own, emptied first: a rerun must not mix the last
    # run's (older) simulated trace into this run's event-time stream. The store is the
    # configured one (embedded by default), so `llmsla store status` shows the demo's windows.
    work = Path(args.workdir).resolve() if args.workdir else config_mod.default_data_dir() / "demo"
    if args.workdir:
        cfg.store.data_dir = cfg.store.data_dir or str(work / "pg")
    cfg.spool.dir = str(work / "spool")
    cfg.stream.checkpoint_dir = str(work / "checkpoints")
    for old in (work / "spool", work / "spool-live", work / "checkpoints"):
        shutil.rmtree(old, ignore_errors=True)
    ctx = DemoContext(cfg=cfg, args=args)
    t0 = time.monotonic()
    try:
        for title, stage in stages():
            with console.status(f"[bold]{title}[/] ..."):
                started = time.monotonic()
                summary = stage(ctx)
            console.print(f"[green]✓[/] {title} [dim]({time.monotonic() - started:.1f}s)[/]\n    {summary}")
    finally:
        handle = ctx.facts.pop("_store_handle", None)
        if handle is not None and not args.keep:
            handle.close()
    console.print(f"[bold green]demo finished[/] in {time.monotonic() - t0:.1f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(ctx.facts, indent=2, default=str))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job end to end on the embedded defaults")
    p.add_argument("--workdir", help="keep the demo's store, spool and checkpoints here (default: user data dir)")
    p.add_argument("--keep", action="store_true", help="leave the embedded PostgreSQL running afterwards")
    p.add_argument("--json", metavar="FILE", help="also write the demo's facts as JSON")
    p.add_argument("--minutes", type=int, default=20, help="minutes of trace to simulate (default 20)")
    p.add_argument("--live-requests", type=int, default=200, help="real requests through the gateway (default 200)")
    p.set_defaults(handler=cmd_demo)
