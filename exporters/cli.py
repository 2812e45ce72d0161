"""``llmsla gateway`` and ``llmsla gpu``: the exporters' subcommands.

Heavy imports (aiohttp apps, prometheus_client) happen inside the handlers: with ``--workers N``
the parent must set ``PROMETHEUS_MULTIPROC_DIR`` *before* any process imports prometheus_client.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from llmsla import argtypes


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("gateway", help="instrumented OpenAI-compatible proxy in front of the upstreams")
    p.add_argument("--host", type=argtypes.host, help="listen address (gateway.host)")
    p.add_argument("--port", type=argtypes.port0, help="listen port (gateway.port); 0 = a free one")
    p.add_argument("--upstream", action="append", metavar="URL", help="replica base URL; repeat (gateway.upstreams)")
    p.add_argument("--pool", type=argtypes.key("gateway.pool"), help="pool name of the upstreams (gateway.pool)")
    p.add_argument("--workers", type=argtypes.key("gateway.workers"),
                   help="processes sharing the port with SO_REUSEPORT (gateway.workers)")
    p.add_argument("--control-port", type=argtypes.port0, metavar="PORT",
                   help="also serve the control API for this gateway's router on control.host:PORT "
                        "(loopback by default; bearer token control.token); single-process only")
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=gateway_main)

    g = subparsers.add_parser("gpu", help="NVML GPU collector: /metrics and GpuSample events")
    g.add_argument("--host", type=argtypes.host, help="listen address (gpu.host)")
    g.add_argument("--port", type=argtypes.port0, help="listen port (gpu.port); 0 = a free one")
    g.add_argument("--once", action="store_true", help="take one sample, print it as JSON, exit")
    g.set_defaults(handler=gpu_main)


def _apply(args: argparse.Namespace, cfg: Any) -> None:
    from llmsla.config import set_value

    if args.host is not None:
        cfg.gateway.host = args.host
    if args.port is not None:
        cfg.gateway.port = args.port
    if args.upstream:  # the checks the keys declare, as in the file
        set_value(cfg, "gateway.upstreams", list(args.upstream), "--upstream")
    if args.pool:
        set_value(cfg, "gateway.pool", args.pool, "--pool")
    if args.workers is not None:
        cfg.gateway.workers = args.workers


def gateway_main(args: argparse.Namespace, cfg: Any) -> int:
    _apply(args, cfg)
    if not cfg.gateway.upstreams:
        from llmsla.errors import CliError

        raise CliError("no upstreams: pass --upstream URL or set gateway.upstreams / LLMSLA_GATEWAY_UPSTREAMS")
    from llmsla import names
    from llmsla.spool import SpoolWriter

    # the request spool takes writes, or nothing starts (each worker checks again)
    SpoolWriter.from_config(cfg, names.SPOOL_REQUESTS, background=False).close()
    if cfg.gateway.workers > 1:
        if args.control_port is not None:
            from llmsla.errors import CliError

            raise CliError("--control-port needs a single gateway process; with --workers N share "
                           "the router through control.redis_url and run `llmsla control serve`")
        return _supervise(args, cfg)
    return _serve_one(cfg, reuse_port=args.reuse_port, control_port=getattr(args, "control_port", None))


async def _start_control(cfg: Any, gateway: Any, port: int) -> tuple[Any, Any, Any]:
    """The control API on the gateway's own router and distillation controls, on its own
    loopback listener; its audit rows go to the store's action_log (the embedded PostgreSQL
    unless store.dsn is set)."""
    from llmsla.control import api
    from llmsla.control.audit import AuditLog
    from llmsla.httpkit import Limits
    from llmsla.store import open_store

    store = await asyncio.to_thread(open_store, cfg)
    audit = gateway.distill.audit = gateway.rollout.audit = AuditLog(store.dsn)
    limits = Limits.from_config(cfg)
    app = api.make_app(gateway.router, gateway.distill, token=cfg.control.token, limits=limits,
                       rollout=gateway.rollout)
    served = await api.start(app, cfg.control.host, port, limits)
    return served, audit, store


def _serve_one(cfg: Any, *, reuse_port: bool, control_port: int | None = None) -> int:
    import asyncio

    from llmsla.exporters import gateway
    from llmsla.redaction import redact

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        gw = await gateway.start(cfg, reuse_port=reuse_port)
        _tune_gc()
        print(f"llmsla gateway pid {os.getpid()} listening on {gw.url} -> {', '.join(map(redact, cfg.gateway.upstreams))}"
              f" ({type(loop).__module__.split('.')[0]} loop)", flush=True)
        control = None
        if control_port is not None:
            control = await _start_control(cfg, gw.gateway, control_port)
            print(f"llmsla gateway control API on {control[0].url}", flush=True)
        try:
            await stop.wait()
        finally:
            if control is not None:
                served, audit, store = control
                await served.stop()
                audit.flush(10.0)
                store.close()
            await gw.stop()

    run_loop(main())
    return 0


def _tune_gc() -> None:
    """Keep the cyclic GC off the request path: everything alive after startup (modules, the
    app, metric children) is frozen out of collections, and a young collection runs every 20k
    allocations instead of 700 (a proxied stream allocates a few hundred objects, nearly all
    freed by reference counting; a full collection of the startup heap takes ~17 ms here)."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


def run_loop(coro: Any) -> Any:
    """``asyncio.run`` on uvloop when it is installed (a faster loop and socket layer: the
    gateway's per-request overhead is mostly event-loop and syscall work), else on asyncio."""
    import asyncio

    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _supervise(args: argparse.Namespace, cfg: Any) -> int:
    """Start ``workers`` single-process gateways on one port (SO_REUSEPORT) sharing a fresh
    prometheus multiprocess directory; restart nothing, stop all on TERM/INT or first exit."""
    from llmsla.exposition import MULTIPROC_ENV  # this parent records no metric itself
    from llmsla.services import free_port

    own_dir = None
    mp_dir = os.environ.get(MULTIPROC_ENV)
    if not mp_dir:
        mp_dir = own_dir = tempfile.mkdtemp(prefix="llmsla-prom-")
    port = cfg.gateway.port or free_port(cfg.gateway.host)
    env = {**os.environ, MULTIPROC_ENV: mp_dir}
    argv = [sys.executable, "-m", "llmsla"]
    if args.config:
        argv += ["--config", args.config]
    argv += ["gateway", "--host", cfg.gateway.host, "--port", str(port), "--workers", "1", "--reuse-port",
             "--pool", cfg.gateway.pool]
    for u in cfg.gateway.upstreams:
        argv += ["--upstream", u]
    procs = [subprocess.Popen(argv, env=env) for _ in range(cfg.gateway.workers)]
    stopping = False

    def _stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    rc = 0
    try:
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.2)
        rc = next((p.returncode for p in procs if p.returncode), 0)
    finally:
        from prometheus_client import multiprocess

        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            os.environ.setdefault(MULTIPROC_ENV, mp_dir)
            multiprocess.mark_process_dead(p.pid, mp_dir)
        if own_dir:
            shutil.rmtree(own_dir, ignore_errors=True)
    return rc


def gpu_main(args: argparse.Namespace, cfg: Any) -> int:
    import asyncio
    import json

    from prometheus_client import CollectorRegistry

    from llmsla import names
    from llmsla.exporters.gpu import GpuCollector
    from llmsla.spool import SpoolWriter

    if args.host is not None:
        cfg.gpu.host = args.host
    if args.port is not None:
        cfg.gpu.port = args.port
    registry = CollectorRegistry()  # this exporter shows the GPU series and nothing else
    if args.once:
        col = GpuCollector(cfg, registry=registry)
        ok = col.start()
        samples = col.sample() if ok else []
        col.close()
        print(json.dumps({"up": ok, "reason": col.reason, "samples": [s.to_dict() for s in samples]}, indent=2))
        return 0 if ok else 1

    from llmsla.httpkit import Limits, serve_exporter

    spool = SpoolWriter.from_config(cfg, names.SPOOL_GPU, registry=registry)
    col = GpuCollector(cfg, registry=registry, spool=spool)
    try:
        asyncio.run(serve_exporter(registry, cfg.gpu.host, cfg.gpu.port, Limits.from_config(cfg), col.run,
                                   banner=lambda url: f"llmsla gpu listening on {url}/metrics"))
    finally:
        spool.close()
    return 0
