"""``llmsla dashboards build`` and ``llmsla report``."""

from __future__ import annotations

import argparse
from pathlib import Path

from llmsla import argtypes
from llmsla.config import Config


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("dashboards", help="Grafana dashboards as code")
    ds = d.add_subparsers(dest="dashboards_cmd", required=True, metavar="ACTION")
    b = ds.add_parser("build", help="write deploy/grafana: dashboard JSON, datasource and dashboard provisioning")
    b.add_argument("--out", type=argtypes.writable_dir, default=None, help="output folder (default deploy/grafana)")
    b.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the stale files")
    b.set_defaults(handler=cmd_build)

    r = sub.add_parser("report", help="self-contained HTML report with the dashboards' key panels")
    r.add_argument("--from", dest="start", required=True, metavar="TIME", type=argtypes.time,
                   help="start: ISO 8601 (2025-01-31T12:00:00Z), epoch seconds, or now-6h / now-2d / -6h")
    r.add_argument("--to", dest="end", default="now", metavar="TIME", type=argtypes.time,
                   help="end (same forms; default now)")
    r.add_argument("--out", required=True, metavar="FILE", type=argtypes.output_file, help="HTML file to write")
    r.add_argument("--prometheus", metavar="URL", type=argtypes.url,
                   help="Prometheus base URL for the live panels (heatmaps, GPU memory); without it they say so")
    r.add_argument("--scrape-interval", type=argtypes.positive_duration_s, default=15.0, metavar="S",
                   help="Prometheus scrape interval, for $__rate_interval (default 15)")
    r.add_argument("--title", default="llmsla SLA report")
    r.set_defaults(handler=cmd_report)


def cmd_build(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla.extras import require

    require("dashboards", "llmsla dashboards build")  # one line, not a ModuleNotFoundError
    from llmsla import generated
    from llmsla.dashboards import build
    from llmsla.resources import LOCAL, deploy

    # --check compares with the installed dashboards when there is no deploy/grafana here
    out = Path(args.out) if args.out else (deploy("grafana") if args.check else LOCAL / "grafana")
    return generated.run(build.files(cfg, out), check=args.check, command=build.GENERATOR.command,
                         owned=build.owned(out))


def cmd_report(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla.extras import require

    require("dashboards", "llmsla report")
    from llmsla.dashboards.macros import TimeRange
    from llmsla.errors import CliError

    start, end = args.start, args.end
    if end <= start:
        raise CliError(f"--from ({start.isoformat()}) must be before --to ({end.isoformat()})")
    from llmsla.dashboards import report
    from llmsla.store import open_store

    handle = open_store(cfg, migrate=False)  # read-only: a reporting user needs no DDL rights
    try:
        path = report.write(Path(args.out), cfg, dsn=handle.dsn, rng=TimeRange(start, end), prometheus_url=args.prometheus,
                            scrape_interval_s=args.scrape_interval, title=args.title)
    except report.ReportError as exc:
        raise CliError(str(exc)) from None
    finally:
        handle.close()
    print(f"wrote {path}")
    return 0
