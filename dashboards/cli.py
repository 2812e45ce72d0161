"""``llmsla dashboards build``."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmsla.config import Config


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("dashboards", help="Grafana dashboards as code")
    ds = d.add_subparsers(dest="dashboards_cmd", required=True, metavar="ACTION")
    b = ds.add_parser("build", help="write deploy/grafana: dashboard JSON, datasource and dashboard provisioning")
    b.add_argument("--out", default="deploy/grafana", help="output folder (default deploy/grafana)")
    b.add_argument("--check", action="store_true", help="exit 2 naming the stale files instead of writing")
    b.set_defaults(handler=cmd_build)


def cmd_build(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla.cli import CliError
    from llmsla.dashboards import build

    out = Path(args.out)
    if args.check:
        stale = build.stale(cfg, out)
        if stale:
            raise CliError(f"stale dashboard files: {', '.join(stale)}; run `llmsla dashboards build`")
        print(f"{out}: up to date")
        return 0
    for path in build.write(cfg, out):
        print(f"wrote {path}")
    return 0
