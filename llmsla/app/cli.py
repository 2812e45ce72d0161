"""The ``llmsla`` command line.

Each component adds its subcommands from a small ``cli`` module of its own, listed in
``COMMANDS``; those modules import their heavy dependencies (torch, pyflink) inside the handler,
so ``llmsla --help`` stays fast. A handler gets the parsed arguments and the loaded
:class:`~llmsla.config.Config` and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from llmsla import argtypes
from llmsla import config as config_mod
from llmsla.errors import UserError

#: subcommand registrars: "module:function", each called with the subparsers object.
REGISTRARS: tuple[str, ...] = (
    "llmsla.app.doctor:register",
    "llmsla.app.demo:register",
    "llmsla.admin:register",
    "llmsla.app.gateway_cli:register",
    "llmsla.exporters.cli:register",
    "llmsla.worker.cli:register",
    "llmsla.streaming.cli:register",
    "llmsla.streaming.cluster_cli:register",
    "llmsla.app.control_cli:register",
    "llmsla.control.ab_cli:register",
    "llmsla.fleet.cli:register",
    "llmsla.app.forecast_cli:register",
    "llmsla.app.engines_cli:register",
    "llmsla.alerting.cli:register",
    "llmsla.dashboards.cli:register",
    "llmsla.app.k8s.cli:register",
)

Handler = Callable[[argparse.Namespace, config_mod.Config], int]


class Parser(argparse.ArgumentParser):
    """llmsla's parser: a relative time may follow its option as a word of its own (``--from -14d``)."""

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: Any = None) -> tuple[Any, list[str]]:
        return super().parse_known_args(argtypes.attach_relative_times(list(sys.argv[1:] if args is None else args)),
                                        namespace)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="llmsla",
        description="SLA observability and control for LLM inference fleets.",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML config file (default: $LLMSLA_CONFIG)")
    parser.add_argument("--dsn", help="PostgreSQL/TimescaleDB DSN (default: $LLMSLA_DSN, else embedded)")
    parser.add_argument("--data-dir", type=argtypes.writable_dir,
                        help="data dir of the embedded PostgreSQL (created if missing)")
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
        config_mod.set_value(cfg, "store.dsn", args.dsn, "--dsn")
    if args.data_dir:
        config_mod.set_value(cfg, "store.data_dir", str(args.data_dir), "--data-dir")
    return cfg


def setup_logging(secrets: set[str]) -> None:
    """One stderr handler; every record it prints is scrubbed of the configuration's secrets.
    Commands that want more (the stream job) lower the root level themselves."""
    from llmsla.redaction import ScrubFilter

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(ScrubFilter(secrets))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Any = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    from llmsla.redaction import scrub

    secrets: set[str] = set()
    try:
        cfg = load_config(args)
        secrets = config_mod.secrets(cfg)
        setup_logging(secrets)
        return int(handler(args, cfg) or 0)
    except UserError as exc:
        print(f"llmsla: error: {scrub(str(exc), secrets)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `llmsla config show | head`: the reader left, nothing to report
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception:  # a bug: show the traceback, but never a credential it may carry
        print(scrub(traceback.format_exc(), secrets), file=sys.stderr, end="")
        return 1
