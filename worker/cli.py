"""``llmsla worker``: run the reference CPU inference worker (OpenAI-compatible, streaming)."""

from __future__ import annotations

import argparse
from typing import Any

from llmsla import argtypes


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "worker",
        help="run the reference CPU worker (tiny torch LM, continuous batching, OpenAI API)",
        description="Serve /v1/completions, /v1/chat/completions (SSE streaming), /v1/models, "
        "/healthz and /metrics from a tiny byte-level transformer on CPU. Flags override [worker].",
    )
    p.add_argument("--host", type=argtypes.host, help="listen address (worker.host; loopback by default)")
    p.add_argument("--port", type=argtypes.port0, help="listen port (worker.port; 0 = any free port)")
    p.add_argument("--model", type=argtypes.key("worker.model"), help="model name served (worker.model)")
    p.add_argument("--max-batch", type=argtypes.key("worker.max_batch"), help="continuous-batching limit (worker.max_batch)")
    p.add_argument("--seed", type=argtypes.key("worker.seed"), help="seed of the deterministic weights (worker.seed)")
    p.add_argument("--train-steps", type=argtypes.key("worker.train_steps"),
                   help="warm-up training steps on bundled text (worker.train_steps)")
    p.add_argument("--temperature-policy", type=argtypes.key("worker.temperature_policy"),
                   help="default temperature policy (worker.temperature_policy)")
    p.add_argument("--policy", dest="temperature_policy", action=argtypes.OldSpelling, new="--temperature-policy",
                   type=argtypes.key("worker.temperature_policy"))
    p.add_argument("--admin-port", type=argtypes.key("worker.admin_port"), metavar="PORT",
                   help="serve the fault-injection endpoint POST /admin/fault on 127.0.0.1:PORT (worker.admin_port; "
                        "bearer token worker.admin_token / LLMSLA_WORKER_ADMIN_TOKEN)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, cfg: Any) -> int:
    from llmsla import extras

    extras.require("worker", "llmsla worker")
    import asyncio
    import signal

    from llmsla.config import set_value
    from llmsla.worker.server import serve

    w = cfg.worker
    if args.host is not None:
        w.host = args.host
    if args.port is not None:  # 0 (a free port) is a command-line value only, not the key's
        w.port = args.port
    for key in ("model", "max_batch", "seed", "train_steps", "temperature_policy", "admin_port"):
        value = getattr(args, key)
        if value is not None:
            set_value(cfg, f"worker.{key}", value, f"--{key.replace('_', '-')}")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with serve(cfg) as running:
            print(f"llmsla worker: serving {w.model} at {running.url} (max_batch={w.max_batch})", flush=True)
            if running.admin_url:
                print(f"llmsla worker: fault injection at {running.admin_url}/admin/fault", flush=True)
            await stop.wait()

    asyncio.run(main())
    return 0
