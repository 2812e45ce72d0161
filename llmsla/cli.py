"""The ``llmsla`` command line.

Each component adds its subcommands from a small ``cli`` module of its own, listed in
``COMMANDS``; those modules import their heavy dependencies (torch, pyflink) inside the handler,
so ``llmsla --help`` stays fast. A handler gets the parsed arguments and the loaded
:class:`~llmsla.config.Config` and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

from llmsla import config as config_mod

#: subcommand registrars: "module:function", each called with the subparsers object.
REGISTRARS: tuple[str, ...] = (
    "llmsla.doctor:register",
    "llmsla.demo:register",
    "llmsla.admin:register",
    "llmsla.exporters.cli:register",
    "llmsla.exporters.worker_cli:register",
    "llmsla.streaming.cli:register",
    "llmsla.control.cli:register",
    "llmsla.fleet.cli:register",
    "llmsla.dashboards.cli:register",
)

Handler = Callable[[argparse.Namespace, config_mod.Config], int]


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmsla",
        description="SLA observability and control for LLM inference fleets.",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML config file (default: $LLMSLA_CONFIG)")
    parser.add_argument("--dsn", help="PostgreSQL/TimescaleDB DSN (default: $LLMSLA_DSN, else embedded)")
    parser.add_argument("--data-dir", help="data dir of the embedded PostgreSQL")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for spec in REGISTRARS:
        module_name, func = spec.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # component not installed in this build
            raise
        getattr(module, func)(sub)
    return parser


def load_config(args: argparse.Namespace) -> config_mod.Config:
    cfg = config_mod.load(args.config)
    if args.dsn:
        cfg.store.dsn = args.dsn
    if args.data_dir:
        cfg.store.data_dir = args.data_dir
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Any = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        cfg = load_config(args)
        return int(handler(args, cfg) or 0)
    except (CliError, config_mod.ConfigError) as exc:
        print(f"llmsla: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    # `python -m llmsla.cli` runs this file as __main__, a second module object: call the one
    # components import, so their `CliError` is the class `main` catches
    from llmsla.cli import main as _main

    sys.exit(_main())
