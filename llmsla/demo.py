"""``llmsla demo``: the main job on the embedded defaults, end to end on one machine.

Stages run in order, each shown with progress: start the store and migrate it; then, when those
components are installed, simulate fleet traffic into the spool and window it with the
streaming job into the store; finally report what landed. Every stage uses the same code paths
as production; only the defaults (embedded PostgreSQL, spool directory, local mini-cluster)
differ.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmsla import config as config_mod


@dataclass
class DemoContext:
    cfg: config_mod.Config
    args: argparse.Namespace
    dsn: str = ""
    facts: dict[str, Any] = field(default_factory=dict)


Stage = Callable[[DemoContext], str]


def stage_store(ctx: DemoContext) -> str:
    from llmsla.store import open_store, redact
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

    info = store_status(ctx.dsn)
    ctx.facts["status"] = info
    rows = {t: v["rows"] for t, v in info["tables"].items()}
    return "tables: " + ", ".join(f"{t}={n}" for t, n in rows.items())


def stages() -> list[tuple[str, Stage]]:
    return [
        ("store: start and migrate", stage_store),
        ("store: status", stage_status),
    ]


def cmd_demo(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    from rich.console import Console

    console = Console()
    if args.workdir:
        work = Path(args.workdir).resolve()
        cfg.spool.dir = cfg.spool.dir or str(work / "spool")
        cfg.store.data_dir = cfg.store.data_dir or str(work / "pg")
        cfg.stream.checkpoint_dir = cfg.stream.checkpoint_dir or str(work / "checkpoints")
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
    p.set_defaults(handler=cmd_demo)
