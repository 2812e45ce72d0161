"""``llmsla gateway``: the instrumented proxy, its ``--workers N`` supervisor and, with
``--control-port``, the control API on the gateway's own control plane.

Why in the composition root: the command builds the gateway's object graph (control plane,
recorder, audit log on the store) with ``llmsla.app.wiring``, the one place that may import
every component. Heavy imports happen inside the handlers: with ``--workers N`` the parent must
set ``PROMETHEUS_MULTIPROC_DIR`` *before* any process imports prometheus_client.
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
from llmsla.exporters.cli import run_loop, tune_gc


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


def _apply(args: argparse.Namespace, cfg: Any) -> None:
    from llmsla.config import set_value

    if args.host is not None:  # checked by argtypes.host
        cfg.gateway.host = args.host
    if args.port is not None:  # 0 (a free port) is a command-line value only, not the key's
        cfg.gateway.port = args.port
    if args.upstream:  # the checks the keys declare, as in the file
        set_value(cfg, "gateway.upstreams", list(args.upstream), "--upstream")
    if args.pool:
        set_value(cfg, "gateway.pool", args.pool, "--pool")
    if args.workers is not None:
        set_value(cfg, "gateway.workers", args.workers, "--workers")


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


def _serve_one(cfg: Any, *, reuse_port: bool, control_port: int | None = None) -> int:
    from llmsla.app import wiring
    from llmsla.control import api
    from llmsla.control.audit import AuditLog
    from llmsla.httpkit import Limits
    from llmsla.redaction import redact
    from llmsla.store import open_store

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # with the control API, every change it makes is audited in the store's action_log (the
        # embedded PostgreSQL unless store.dsn is set): the log exists before the control plane
        store = audit = None
        if control_port is not None:
            store = await asyncio.to_thread(open_store, cfg)
            audit = AuditLog(store.dsn)
        control = None
        try:
            gw = await wiring.start_gateway(cfg, reuse_port=reuse_port, audit=audit)
            tune_gc()
            print(f"llmsla gateway pid {os.getpid()} listening on {gw.url} -> "
                  f"{', '.join(map(redact, cfg.gateway.upstreams))} ({type(loop).__module__.split('.')[0]} loop)",
                  flush=True)
            try:
                if control_port is not None:  # the control API on the gateway's own control plane
                    plane, limits = gw.gateway.plane, Limits.from_config(cfg)
                    app = api.make_app(plane.router, plane.distill, token=cfg.control.token, limits=limits,
                                       rollout=plane.rollout, shed=plane.shed)
                    control = await api.start(app, cfg.control.host, control_port, limits)
                    print(f"llmsla gateway control API on {control.url}", flush=True)
                await stop.wait()
            finally:
                if control is not None:
                    await control.stop()
                await gw.stop()
        finally:
            if audit is not None:
                audit.flush(10.0)
            if store is not None:
                store.close()

    run_loop(main())
    return 0


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
