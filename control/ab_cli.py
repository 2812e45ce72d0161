"""``llmsla ab report``: the A/B attribution report of one experiment over a time range.

Reads the store's 1-minute roll-up (and the audited weight changes in ``action_log``), prints a
table (or JSON), writes the results into ``ab_results`` for the dashboards, and with
``--sequential --rollback`` (or ``ab.auto_rollback``) sets a failing arm's weight to 0 through the
control API. See docs/ab.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from llmsla import argtypes, names
from llmsla.config import Config


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("ab", help="A/B experiments: the attribution report")
    sub = p.add_subparsers(dest="ab_command", metavar="SUBCOMMAND")
    r = sub.add_parser("report", help="per-arm SLA, sample-ratio test, effects with intervals, verdicts, breach attribution",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--experiment", required=True, help="experiment key ([ab.experiments.<key>])")
    r.add_argument("--from", dest="start", type=argtypes.time, default="-1h", metavar="TIME",
                   help="range start: ISO 8601 time, epoch seconds, or an offset such as --from=-6h "
                        "(-30m, -7d, now-6h; default -1h)")
    r.add_argument("--to", dest="end", type=argtypes.time, default="now", metavar="TIME",
                   help="range end: the same forms, or now (default)")
    r.add_argument("--sequential", action="store_true",
                   help="always-valid mode: confidence sequences, safe to re-run (peek) as often as you like")
    r.add_argument("--rollback", action="store_true",
                   help="with --sequential: set a failing arm's weight to 0 through the control API (also ab.auto_rollback)")
    r.add_argument("--json", metavar="FILE", type=argtypes.output_file_or_stdout, help="write the report as JSON to FILE ('-' = stdout, no table)")
    r.add_argument("--no-results", action="store_true", help="do not write rows into ab_results")
    r.add_argument("--by", choices=(names.L_TENANT, names.L_CLASS),
                   help="cut the report by the requests' tenant or class: the same statistics per arm within each "
                        "group (a table per group, a summary of all); writes no ab_results rows, never rolls back")
    r.set_defaults(handler=report)
    p.set_defaults(handler=lambda args, cfg: (p.print_help(), 2)[1])


def report(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla import experiments as specs
    from llmsla.control import ab_data, ab_report
    from llmsla.errors import CliError
    from llmsla.store import open_store

    exps = specs.parse(cfg.ab.experiments)
    exp = exps.get(args.experiment)
    if exp is None:
        raise CliError(f"--experiment: unknown experiment {args.experiment!r} (configured: {', '.join(exps) or 'none'}; "
                       "see [ab.experiments] in docs/ab.md)")
    start, end = args.start, args.end
    if end <= start:
        raise CliError(f"--from/--to: the range is empty ({start.isoformat()} .. {end.isoformat()})")
    # the report holds per-minute arrays over the range: bound it by what the store keeps, before
    # anything is allocated (a --from of year 1 asked for 31.8 GiB)
    max_days = ab_data.max_range_days(cfg)
    if end - start > dt.timedelta(days=max_days):
        raise CliError(f"--from/--to: the range is {(end - start).total_seconds() / 86400:,.1f} days; at most {max_days} "
                       "(the store keeps its 1-minute roll-up store.retention_days x "
                       f"{ab_data.ROLLUP_RETENTION_FACTOR} days)")
    rollback = args.rollback or cfg.ab.auto_rollback
    if args.by and args.rollback:
        raise CliError("--by: a report cut by tenant or class never rolls back (leave out --rollback; the report "
                       "of the whole experiment decides)")
    rollback = rollback and not args.by
    if rollback and not args.sequential:
        raise CliError("--rollback (or ab.auto_rollback) needs --sequential: only the always-valid mode may act on a "
                       "report that is re-run while the experiment goes on")
    settings = ab_report.Settings.from_config(cfg)
    store = open_store(cfg)
    try:
        with store.connect() as conn:
            data = ab_data.from_store(conn, exp, start, end, failed=settings.failed)
            weights, stable = ab_data.weights_timeline(conn, exp, data.start, data.minutes)
            if args.by:
                cuts = []
                for value in ab_data.cut_values(conn, exp, start, end, args.by):
                    part = ab_data.from_store(conn, exp, start, end, failed=settings.failed, cut=(args.by, value))
                    cuts.append((value, part, ab_report.analyze(
                        part, settings, shares=ab_data.expected_shares(exp, weights), srm_minutes=stable,
                        sequential=args.sequential, end=end)))
                return _print_cuts(args, exp.key, cuts)
            rep = ab_report.analyze(data, settings, shares=ab_data.expected_shares(exp, weights), srm_minutes=stable,
                                    sequential=args.sequential, end=end)
            if rollback:
                rep.rollbacks = roll_back(cfg, rep)
            if not args.no_results:
                ab_report.write_results(conn, rep)
                conn.commit()
    finally:
        store.close()
    out = rep.to_json()
    if args.json == "-":
        print(json.dumps(out, indent=2))
    else:
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=2)
        print_report(rep, data)
    return 0


def _print_cuts(args: argparse.Namespace, experiment: str, cuts: list[tuple[str, Any, Any]]) -> int:
    """The report per tenant or class: JSON (``{"by", "groups": [{<by>: value, ...report}]}``) or,
    per group, the whole report's tables, then one summary table of every group and arm."""
    from rich.console import Console
    from rich.table import Table

    out = {"experiment": experiment, "by": args.by,
           "groups": [{args.by: value, **rep.to_json()} for value, _, rep in cuts]}
    if args.json == "-":
        print(json.dumps(out, indent=2))
        return 0
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    console = Console(file=sys.stdout, width=160)
    if not cuts:
        console.print(f"no requests of experiment {experiment} in the range: nothing to cut by {args.by}")
        return 0
    for value, data, rep in cuts:
        console.rule(f"{args.by} = {value}")
        print_report(rep, data)
    t = Table(title=f"each arm by {args.by}")
    for col in (args.by, "arm", "requests", "TTFT P99 ms", "E2E P99 ms", "TTFT att.", "E2E att.", "availability"):
        t.add_column(col, justify="left" if col in (args.by, "arm") else "right")
    for value, _, rep in cuts:
        for a in rep.arms:
            q = a.quantiles_ms
            t.add_row(value, a.arm, f"{a.requests:,}", _fmt(q[names.AB_METRIC_TTFT_P99]), _fmt(q[names.AB_METRIC_E2E_P99]),
                      _fmt(a.ttft_attainment, "%"), _fmt(a.e2e_attainment, "%"), _fmt(a.availability, "%"))
    console.print(t)
    return 0


def roll_back(cfg: Config, rep: Any) -> list[dict[str, Any]]:
    """Set each failing arm's weight to 0 through the control API (audited there); never the
    control arm, never on a sample-ratio mismatch (the comparison itself is not to be trusted)."""
    import asyncio

    from llmsla.control_client import ControlClient
    from llmsla.redaction import redact

    if rep.srm["flagged"]:
        return []
    todo = [(arm, [c.metric for c in rep.comparisons if c.arm == arm and c.verdict == "fail"])
            for arm in rep.failing_arms() if arm != rep.control]

    async def run() -> list[dict[str, Any]]:
        # one attempt, as before: the report is re-run (and the rollback with it) on its schedule
        urls = cfg.control.client_urls()
        client = ControlClient(urls, cfg.control.token, timeout_s=cfg.ab.control_timeout_s, retries=1,
                               actor="llmsla ab report")
        out = []
        try:
            for arm, failing in todo:
                why = f"always-valid test failed: {', '.join(failing)} ({rep.start} .. {rep.end})"
                res = await client.set_arm_weight(rep.experiment, arm, 0, why)
                rec: dict[str, Any] = {"arm": arm, "metrics": failing, "url": redact(res.url or urls[0]),
                                       "status": res.status or None, "ok": res.ok}
                if not res.ok:
                    rec["error"] = res.error
                out.append(rec)
        finally:
            await client.close()
        return out

    return asyncio.run(run()) if todo else []


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if unit == "%":
            return f"{100 * v:.2f} %"
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.4g}"
    return str(v)


def print_report(rep: Any, data: Any, file: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table


    console = Console(file=file or sys.stdout, width=160)
    console.print(f"[bold]A/B report[/bold] {rep.experiment}  {rep.start} .. {rep.end}  ({rep.mode}; control: {rep.control})")
    t = Table(title="arms")
    for col in ("arm", "requests", "share", "expected", "TTFT P50/P95/P99 ms", "E2E P50/P95/P99 ms",
                "mean ITL ms", "TTFT att.", "E2E att.", "availability", "minutes meeting SLO"):
        t.add_column(col, justify="right" if col != "arm" else "left")
    for a in rep.arms:
        q = a.quantiles_ms
        t.add_row(a.arm, f"{a.requests:,}", _fmt(a.share, "%"), _fmt(a.expected_share, "%"),
                  " / ".join(_fmt(q[m]) for m in (names.AB_METRIC_TTFT_P50, names.AB_METRIC_TTFT_P95, names.AB_METRIC_TTFT_P99)),
                  " / ".join(_fmt(q[m]) for m in (names.AB_METRIC_E2E_P50, names.AB_METRIC_E2E_P95, names.AB_METRIC_E2E_P99)),
                  _fmt(a.itl_mean_ms), _fmt(a.ttft_attainment, "%"), _fmt(a.e2e_attainment, "%"), _fmt(a.availability, "%"),
                  _fmt(a.minutes_meeting_slo, "%"))
    console.print(t)
    srm = rep.srm
    colour = "red" if srm["flagged"] else "green"
    console.print(f"sample-ratio test: p = {srm['p_value']:.3g} (chi-square {srm['chi2']:.2f}, over-dispersion "
                  f"{srm['dispersion']:.1f}) [{colour}]{'MISMATCH: no comparison can be trusted' if srm['flagged'] else 'split ok'}[/{colour}]")
    c = Table(title="each arm against control" + (" (always-valid)" if rep.mode == "sequential" else ""))
    for col in ("arm", "metric", "value", "control", "effect", "interval", "p", "effect size", "verdict"):
        c.add_column(col, justify="left" if col in ("arm", "metric", "verdict") else "right")
    style = {"pass": "green", "fail": "red", "inconclusive": "yellow"}
    for x in rep.comparisons:
        lat = x.metric in names.AB_LATENCY_METRICS
        unit = "" if lat else "%"
        rel = f" ({100 * x.relative:+.1f} %)" if x.relative is not None else ""
        c.add_row(x.arm, x.metric, _fmt(x.value, unit), _fmt(x.baseline, unit),
                  (_fmt(x.effect) if lat else (f"{100 * x.effect:+.2f} pp" if x.effect is not None else "-")) + rel,
                  f"[{_fmt(x.ci_low) if lat else _pp(x.ci_low)}, {_fmt(x.ci_high) if lat else _pp(x.ci_high)}]",
                  _fmt(x.p_value), _fmt(x.effect_size),
                  f"[{style[x.verdict]}]{x.verdict}[/{style[x.verdict]}]" + (f" ({x.reason})" if x.reason else ""))
    console.print(c)
    if rep.breaches:
        b = Table(title="SLA-breach intervals")
        for col in ("from", "to", "minutes", "SLIs", "attainment", "accounted for by"):
            b.add_column(col)
        for x in rep.breaches:
            b.add_row(x.start, x.end, str(x.minutes), ", ".join(x.slis),
                      ", ".join(f"{k} {100 * v:.2f} %" for k, v in x.attainment.items()),
                      ", ".join(x.attributed) or "fleet-wide (no arm worse than the rest)")
        console.print(b)
    else:
        console.print("no SLA-breach interval in the range")
    for r in rep.rollbacks:
        console.print(f"rollback of {r['arm']}: {'done' if r.get('ok') else 'FAILED'} ({r.get('status')}) {r.get('error', '')}")


def _pp(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:+.2f} pp"
