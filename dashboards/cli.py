"""``llmsla dashboards build`` and ``llmsla report``."""

from __future__ import annotations

import argparse
import datetime as dt
import re
from pathlib import Path

from llmsla.config import Config

_RELATIVE = re.compile(r"^now(?:-(\d+)([smhdw]))?$")
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("dashboards", help="Grafana dashboards as code")
    ds = d.add_subparsers(dest="dashboards_cmd", required=True, metavar="ACTION")
    b = ds.add_parser("build", help="write deploy/grafana: dashboard JSON, datasource and dashboard provisioning")
    b.add_argument("--out", default=None, help="output folder (default deploy/grafana)")
    b.add_argument("--check", action="store_true", help="exit 2 naming the stale files instead of writing")
    b.set_defaults(handler=cmd_build)

    r = sub.add_parser("report", help="self-contained HTML report with the dashboards' key panels")
    r.add_argument("--from", dest="start", required=True, metavar="TIME",
                   help="start: ISO 8601 (2025-01-31T12:00:00Z), epoch seconds, or now-6h / now-2d")
    r.add_argument("--to", dest="end", default="now", metavar="TIME", help="end (same forms; default now)")
    r.add_argument("--out", required=True, metavar="FILE", help="HTML file to write")
    r.add_argument("--prometheus", metavar="URL",
                   help="Prometheus base URL for the live panels (heatmaps, GPU memory); without it they say so")
    r.add_argument("--scrape-interval", type=float, default=15.0, metavar="S",
                   help="Prometheus scrape interval, for $__rate_interval (default 15)")
    r.add_argument("--title", default="llmsla SLA report")
    r.set_defaults(handler=cmd_report)


def cmd_build(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla.extras import require

    require("dashboards", "llmsla dashboards build")  # one line, not a ModuleNotFoundError
    from llmsla.dashboards import build
    from llmsla.errors import CliError
    from llmsla.resources import LOCAL, deploy

    # --check compares with the installed dashboards when there is no deploy/grafana here
    out = Path(args.out) if args.out else (deploy("grafana") if args.check else LOCAL / "grafana")
    if args.check:
        stale = build.stale(cfg, out)
        if stale:
            raise CliError(f"stale dashboard files: {', '.join(stale)}; run `llmsla dashboards build`")
        print(f"{out}: up to date")
        return 0
    for path in build.write(cfg, out):
        print(f"wrote {path}")
    return 0


def parse_time(option: str, text: str, *, now: dt.datetime) -> dt.datetime:
    """``--from``/``--to``: ISO 8601 (a naive time is UTC), epoch seconds, ``now`` or ``now-<n><s|m|h|d|w>``."""
    from llmsla.errors import CliError

    text = text.strip()
    m = _RELATIVE.match(text)
    if m:
        return now - dt.timedelta(seconds=int(m.group(1) or 0) * _UNITS_S.get(m.group(2) or "s", 1))
    try:
        return dt.datetime.fromtimestamp(float(text), dt.UTC)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        ts = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(f"{option}: cannot read {text!r} as a time; use ISO 8601 (2025-01-31T12:00:00Z), "
                       "epoch seconds, or now-6h") from None
    return ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)


def cmd_report(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla.extras import require

    require("dashboards", "llmsla report")
    from llmsla.dashboards.macros import TimeRange
    from llmsla.errors import CliError

    now = dt.datetime.now(dt.UTC)
    start = parse_time("--from", args.start, now=now)
    end = parse_time("--to", args.end, now=now)
    if end <= start:
        raise CliError(f"--from ({start.isoformat()}) must be before --to ({end.isoformat()})")
    if args.scrape_interval <= 0:
        raise CliError("--scrape-interval must be positive")
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
