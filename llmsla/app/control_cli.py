"""``llmsla control serve``: the control API over a router of the gateway's replicas.

In a deployment the gateway hosts these routes on its own router (``api.add_routes``); this
standalone server is for operating a router without a gateway (demos, the simulator, drills).
Its control plane is the gateway's, built by the same function (``llmsla.app.wiring``) from the
same replica list (``llmsla.replicas``), so replica ids mean the same replica in both.
"""

from __future__ import annotations

import argparse
from typing import Any

from llmsla import argtypes
from llmsla.config import Config


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("control", help="router and distillation control API")
    sub = p.add_subparsers(dest="control_command", metavar="SUBCOMMAND")
    s = sub.add_parser("serve", help="serve the control API (127.0.0.1:control.port by default)")
    s.add_argument("--host", type=argtypes.host, help="listen address (default control.host)")
    s.add_argument("--port", type=argtypes.port0, help="listen port (default control.port; 0 = any free port)")
    s.add_argument("--upstream", action="append", default=None, metavar="URL",
                   help="replica base URL (repeatable; default gateway.upstreams)")
    s.add_argument("--duration-s", type=argtypes.duration_s, default=0.0, help="stop after this long (0 = until Ctrl-C)")
    s.set_defaults(handler=serve)
    p.set_defaults(handler=lambda args, cfg: (p.print_help(), 2)[1])


def serve(args: argparse.Namespace, cfg: Config) -> int:
    import asyncio
    import contextlib
    import signal
    import sys

    from llmsla.app import wiring
    from llmsla.config import set_value
    from llmsla.control import api
    from llmsla.control.audit import AuditLog
    from llmsla.errors import CliError
    from llmsla.httpkit import Limits
    from llmsla.replicas import replicas_from_config
    from llmsla.store import open_store

    if args.upstream is not None:  # the check gateway.upstreams declares, as in the file
        set_value(cfg, "gateway.upstreams", list(args.upstream), "--upstream")
    if not cfg.gateway.upstreams:
        raise CliError("no replicas: pass --upstream URL or set gateway.upstreams")
    replicas = replicas_from_config(cfg)
    host = cfg.control.host if args.host is None else args.host
    port = cfg.control.port if args.port is None else args.port
    # every change is audited in the store's action_log: the embedded PostgreSQL by default
    store = open_store(cfg)
    audit = AuditLog(store.dsn)
    # A/B weight and coverage changes: applied here and broadcast to the gateways (Redis stream)
    plane = wiring.control_plane(cfg, replicas, audit=audit)
    router = plane.router
    if not cfg.control.token:
        print("llmsla control: control.token is empty - every write will be refused (503)")

    async def run() -> None:
        import aiohttp

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # stop cleanly: pending audit rows are written
            loop.add_signal_handler(sig, stop.set)
        app = api.make_app(router, plane.distill, token=cfg.control.token, limits=Limits.from_config(cfg),
                           rollout=plane.rollout, shed=plane.shed)
        served = await api.start(app, host, port, Limits.from_config(cfg))
        session = aiohttp.ClientSession()
        prober = plane.prober
        prober.start(session)
        print(f"llmsla control API on {served.url} ({len(replicas)} replicas, policy {router.policy})",
              flush=True)
        try:
            if args.duration_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.duration_s)
            else:
                await stop.wait()
        finally:
            await prober.stop()
            await session.close()
            await served.stop()
            if not audit.flush(10.0):
                print("llmsla control: some audit rows could not be written to the store", file=sys.stderr)
            plane.close()

    try:
        asyncio.run(run())
    finally:
        store.close()  # an embedded server this API started stops with it
    return 0
