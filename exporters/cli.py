"""``llmsla gpu``, and the process helpers of ``llmsla gateway`` (whose object graph the
composition root builds: ``llmsla.app.gateway_cli``).

Heavy imports (prometheus_client, NVML) happen inside the handlers: with ``--workers N`` the
gateway's parent must set ``PROMETHEUS_MULTIPROC_DIR`` *before* any process imports
prometheus_client, and it imports this module.
"""

from __future__ import annotations

import argparse
from typing import Any

from llmsla import argtypes


def register(subparsers: Any) -> None:
    g = subparsers.add_parser("gpu", help="NVML GPU collector: /metrics and GpuSample events")
    g.add_argument("--host", type=argtypes.host, help="listen address (gpu.host)")
    g.add_argument("--port", type=argtypes.port0, help="listen port (gpu.port); 0 = a free one")
    g.add_argument("--once", action="store_true", help="take one sample, print it as JSON, exit")
    g.set_defaults(handler=gpu_main)


def tune_gc() -> None:
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
        signals = {str(i): s.to_dict() for i, s in sorted(col.last_signals.items())}
        print(json.dumps({"up": ok, "reason": col.reason, "samples": [s.to_dict() for s in samples],
                          "signals": signals}, indent=2))
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
