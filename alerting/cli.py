"""``llmsla slo generate`` and ``llmsla receiver``: the alerting subcommands (one registrar)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from llmsla import argtypes
from llmsla.config import Config


def register(subparsers: Any) -> None:
    slo = subparsers.add_parser("slo", help="SLO specs -> Prometheus burn-rate rules and rule tests")
    ss = slo.add_subparsers(dest="slo_command", metavar="ACTION")
    g = ss.add_parser("generate", help="write deploy/prometheus/rules and tests from deploy/slo/*.yaml")
    g.add_argument("--specs", type=argtypes.input_dir, default=None,
                   help="directory of SLO specs: openslo/v1, openslo/v1alpha, Sloth prometheus/v1 "
                        "(default slo.dir: deploy/slo, else the installed defaults)")
    g.add_argument("--rules-out", type=argtypes.writable_dir, default=Path("deploy/prometheus/rules"))
    g.add_argument("--tests-out", type=argtypes.writable_dir, default=Path("deploy/prometheus/tests"))
    g.add_argument("--default-slo-period", default="30d",
                   help="period of Sloth prometheus/v1 specs (they carry none; Sloth's flag of the same name)")
    g.add_argument("--window-scale", type=argtypes.positive_float, default=1.0,
                   help="test profile: multiply every window and `for` (e.g. 0.004 makes 1h 14.4 s); "
                        "rule tests are only written at 1")
    g.add_argument("--scrape-interval-s", type=argtypes.positive_duration_s, default=None,
                   help="with --window-scale: refuse a scale whose 5m window holds fewer than 4 scrapes")
    g.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files are stale")
    g.set_defaults(handler=cmd_generate)
    slo.set_defaults(handler=lambda args, cfg: (slo.print_help(), 2)[1])

    r = subparsers.add_parser("receiver", help="Alertmanager webhook receiver acting on the control API")
    r.add_argument("--host", type=argtypes.host, help="listen address (receiver.host; loopback by default)")
    r.add_argument("--port", type=argtypes.port0, help="listen port (receiver.port; 0 = a free one)")
    r.add_argument("--action-policy", type=argtypes.input_file, metavar="FILE",
                   help="action policy file: alerts -> actions (receiver.action_policy; default: the built-in one)")
    r.add_argument("--policy", dest="action_policy", action=argtypes.OldSpelling, new="--action-policy",
                   type=argtypes.input_file)
    r.add_argument("--control-url", action="append", metavar="URL", help="control API base URL (repeatable; control.urls)")
    r.add_argument("--check-policy", action="store_true", help="validate the action policy file and exit")
    r.add_argument("--duration-s", type=argtypes.duration_s, default=0.0, help="stop after this long (0 = until SIGTERM)")
    r.set_defaults(handler=cmd_receiver)


def cmd_generate(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla import generated, slo_catalog
    from llmsla.alerting import generate as G
    from llmsla.errors import CliError
    from llmsla.resources import deploy
    from llmsla.yamlsrc import SourceError

    period = args.default_slo_period
    if not (period.endswith("d") and period[:-1].isdigit() and int(period[:-1]) > 0):
        raise CliError(f"--default-slo-period: expected whole days like 30d, got {period!r}")
    specs = args.specs or slo_catalog.specs_dir(cfg)
    if args.check:  # compare with the committed (or installed) files when none are here
        args.rules_out = args.rules_out if args.rules_out.exists() else deploy("prometheus/rules")
        args.tests_out = args.tests_out if args.tests_out.exists() else deploy("prometheus/tests")
    try:
        out = G.generate(cfg, specs_dir=specs, period_days=int(period[:-1]), rules_dir=args.rules_out,
                         tests_dir=args.tests_out if args.window_scale == 1 else None,
                         window_scale=args.window_scale, scrape_interval_s=args.scrape_interval_s)
    except (SourceError, ValueError) as exc:
        raise CliError(str(exc)) from None
    for name, reason in sorted(out.skipped.items()):
        print(f"rule tests for SLO {name} skipped: {reason}")
    dirs = [args.rules_out] + ([args.tests_out] if args.window_scale == 1 else [])
    return generated.run(out.files, check=args.check, command=G.GENERATOR.command,
                         owned=G.generated_on_disk(dirs), summary=f"{len(out.specs)} SLOs")


def cmd_receiver(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla.alerting.serve import main

    return main(args, cfg)
