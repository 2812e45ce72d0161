"""``llmsla worker``: run the reference CPU inference worker (OpenAI-compatible, streaming)."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "worker",
        help="run the reference CPU worker (tiny torch LM, continuous batching, OpenAI API)",
        description="Serve /v1/completions, /v1/chat/completions (SSE streaming), /v1/models, "
        "/healthz and /metrics from a tiny byte-level transformer on CPU. Flags override [worker].",
    )
    p.add_argument("--host", help="listen address (worker.host; loopback by default)")
    p.add_argument("--port", type=int, help="listen port (worker.port; 0 = any free port)")
    p.add_argument("--model", help="model name served (worker.model)")
    p.add_argument("--max-batch", type=int, help="continuous-batching limit (worker.max_batch)")
    p.add_argument("--seed", type=int, help="seed of the deterministic weights (worker.seed)")
    p.add_argument("--train-steps", type=int, help="warm-up training steps on bundled text (worker.train_steps)")
    p.add_argument("--policy", help="default temperature policy (worker.policy)")
    p.add_argument("--admin-port", type=int, metavar="PORT",
                   help="serve the fault-injection endpoint POST /admin/fault on 127.0.0.1:PORT (worker.admin_port; "
                        "bearer token worker.admin_token / LLMSLA_WORKER_ADMIN_TOKEN)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, cfg: Any) -> int:
    from llmsla import extras

    extras.require("worker", "llmsla worker")
    import asyncio
    import signal

    from llmsla.config import check_host, check_port
    from llmsla.errors import CliError
    from llmsla.temperature import SCHEDULES
    from llmsla.worker.server import serve

    w = cfg.worker
    for attr, key in (("host", "host"), ("port", "port"), ("model", "model"), ("max_batch", "max_batch"),
                      ("seed", "seed"), ("train_steps", "train_steps"), ("policy", "policy"),
                      ("admin_port", "admin_port")):
        value = getattr(args, attr)
        if value is not None:
            setattr(w, key, value)
    if w.max_batch < 1:
        raise CliError(f"--max-batch must be >= 1, got {w.max_batch}")
    if args.host is not None:
        check_host(w.host, "--host")
    if args.port is not None:
        check_port(w.port, "--port", allow_zero=True)
    if args.admin_port is not None:
        check_port(w.admin_port, "--admin-port")
    if w.policy not in SCHEDULES:
        raise CliError(f"--policy must be one of {', '.join(SCHEDULES)}, got {w.policy!r}")

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
