"""``llmsla report``: the dashboards' key panels as one self-contained HTML file.

For users without Grafana (and for incident write-ups): the same query definitions the
dashboards use (:mod:`~llmsla.dashboards.promql`, :mod:`~llmsla.dashboards.storesql`), expanded and
run as Grafana runs them (:mod:`~llmsla.dashboards.runner`), drawn with matplotlib into PNGs
inlined as ``data:`` URIs. No script, font or stylesheet is fetched: the file opens offline.
Variables are "All", listed the way each dashboard lists them (Prometheus ``label_values`` for the
live panels, the store's distinct values for the history). A panel without data says so and
which component provides it. The closing section states what the data shows (where the heatmaps
leave the SLO bucket, which replica's P99 crossed the objective and when, the control actions).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psycopg

from llmsla import names, slo_catalog
from llmsla.config import Config
from llmsla.dashboards import promql, runner, storesql
from llmsla.dashboards.macros import TimeRange, Variable, calculate_interval_ms
from llmsla.dashboards.query import Pending, PromQuery, SqlQuery
from llmsla.store import connect

MAX_POINTS = 240  # columns per chart (Grafana's maxDataPoints for a ~1100 px panel)


class ReportError(RuntimeError):
    """The report cannot be made (store unreachable, a query refused); the message says why."""


@dataclass
class Section:
    title: str
    sources: list[str]
    image: bytes | None = None
    note: str = ""
    table: str = ""


@dataclass
class Context:
    cfg: Config
    conn: psycopg.Connection
    rng: TimeRange
    prometheus_url: str | None
    scrape_interval_s: float
    prom_vars: dict[str, Variable] = field(default_factory=dict)
    store_vars: dict[str, Variable] = field(default_factory=dict)
    annotations: list[tuple[float, str]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    #: the SLO catalog of ``cfg``, read once for every section
    slo: slo_catalog.Catalog = field(init=False)

    def __post_init__(self) -> None:
        self.slo = slo_catalog.load(self.cfg)

    @property
    def store_interval_ms(self) -> int:
        return calculate_interval_ms(self.rng, MAX_POINTS)

    @property
    def prom_interval_ms(self) -> int:
        return calculate_interval_ms(self.rng, MAX_POINTS, f"{int(self.scrape_interval_s * 1000)}ms")

    def sql(self, q: SqlQuery) -> runner.Table | None:
        """Rows of ``q``, or None when a variable it uses has no value (Grafana: nothing to show)."""
        if any(f"${v}" in q.sql and not var.values for v, var in self.store_vars.items()):
            return None
        return runner.sql(self.conn, q, self.rng, self.store_interval_ms, self.store_vars)

    def prom(self, q: PromQuery) -> list[runner.Series]:
        assert self.prometheus_url
        return runner.prom_range(self.prometheus_url, q, self.rng, self.prom_interval_ms, self.prom_vars,
                                 scrape_interval_s=self.scrape_interval_s)


def _fmt_t(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S")


def _no_data(q: PromQuery | SqlQuery) -> str:
    p: Pending | None = q.pending
    return f"No data in this range{f' (provided by {p.component}: {p.artefact})' if p else ''}."


# -- variables ------------------------------------------------------------------------------------
def resolve_variables(ctx: Context) -> None:
    for label, q in zip(names.REQUEST_LABELS, (storesql.VAR_MODEL, storesql.VAR_POOL, storesql.VAR_REPLICA, storesql.VAR_ARM),
                        strict=True):
        ctx.store_vars[label] = Variable(tuple(r[0] for r in runner.sql(ctx.conn, q, ctx.rng, ctx.store_interval_ms).rows))
    for name, q in (("zone", storesql.VAR_ZONE), ("experiment", storesql.VAR_EXPERIMENT),
                    (names.L_TENANT, storesql.VAR_TENANT), (names.L_CLASS, storesql.VAR_CLASS)):
        ctx.store_vars[name] = Variable(tuple(r[0] for r in runner.sql(ctx.conn, q, ctx.rng, ctx.store_interval_ms).rows))
    if ctx.store_vars["zone"].values:
        pol = runner.sql(ctx.conn, storesql.VAR_POLICY_ID, ctx.rng, ctx.store_interval_ms, ctx.store_vars)
        ctx.store_vars["policy_id"] = Variable(tuple(r[0] for r in pol.rows))
    else:
        ctx.store_vars["policy_id"] = Variable(())
    if ctx.prometheus_url:
        for label, pq in zip(names.REQUEST_LABELS, (promql.VAR_MODEL, promql.VAR_POOL, promql.VAR_REPLICA, promql.VAR_ARM),
                             strict=True):
            ctx.prom_vars[label] = Variable(tuple(runner.prom_label_values(ctx.prometheus_url, pq, ctx.rng, ctx.prom_vars)))


def load_annotations(ctx: Context) -> None:
    for q in (storesql.ALERT_ANNOTATIONS, storesql.ACTION_ANNOTATIONS):
        t = ctx.sql(q)
        for row in t.rows if t else []:
            ctx.annotations.append((row[0].timestamp(), row[1]))
    ctx.annotations.sort()


# -- panels ---------------------------------------------------------------------------------------
def heatmap_section(ctx: Context, q: PromQuery, title: str, objective_s: float) -> Section:
    from llmsla.dashboards import figures

    sec = Section(title, [f"Prometheus · {q.key}"])
    if not ctx.prometheus_url:
        sec.note = "Drawn from Prometheus' histogram buckets: pass --prometheus URL."
        return sec
    series = ctx.prom(q) if all(ctx.prom_vars.get(v, Variable(())).values for v in names.REQUEST_LABELS) else []
    times = sorted({t for s in series for t in s.times})
    if not series or not times:
        sec.note = _no_data(q)
        return sec
    bounds = [float(s.labels["le"].replace("+Inf", "inf")) for s in series]
    rates = np.array([[dict(zip(s.times, s.values, strict=True)).get(t, math.nan) for t in times] for s in series])
    sec.image = figures.bucket_heatmap(times, bounds, rates, title=title, objective=objective_s, annotations=ctx.annotations)
    totals = np.nansum(rates, axis=0)
    busy = totals > 0
    if busy.any():
        sec.note = heatmap_finding(times, bounds, rates, objective_s)
        ctx.findings.append(f"{title}: {sec.note}")
    return sec


def heatmap_finding(times: list[float], bounds: list[float], rates: np.ndarray, objective_s: float) -> str:
    """Where the distribution sits, where its tail reaches furthest, and how much lies past the SLO."""
    totals = np.nansum(rates, axis=0)
    busy = np.flatnonzero(totals > 0)
    occupied = np.where(np.nan_to_num(rates) > 0, np.arange(len(bounds))[:, None], -1)
    top = occupied.max(axis=0)  # highest occupied bucket per column
    j = int(busy[np.argmax(top[busy])])
    mode = bounds[int(np.nanargmax(np.nansum(rates, axis=1)))]
    typical = bounds[int(np.median(top[busy]))]
    above = np.nansum(rates[[b > objective_s for b in bounds]], axis=0)
    share = np.divide(above, totals, out=np.zeros_like(above), where=totals > 0)
    text = (f"Most requests fall in the bucket up to {mode:g} s; the tail usually ends in the bucket up to {typical:g} s "
            f"and reaches furthest, up to {bounds[top[j]]:g} s, at {_fmt_t(times[j])}.")
    if share[busy].max() > 0:
        k = int(busy[np.argmax(share[busy])])
        text += (f" The share past the {objective_s:g} s SLO bound peaks at {share[k]:.1%} at {_fmt_t(times[k])} "
                 f"(median {np.median(share[busy]):.1%}).")
    else:
        text += f" No request is past the {objective_s:g} s SLO bound."
    return text


def replica_section(ctx: Context, q: SqlQuery, title: str, objective_s: float) -> Section:
    from llmsla.dashboards import figures

    sec = Section(title, [f"store · {q.key}"])
    t = ctx.sql(q)
    if not t or not t.rows:
        sec.note = _no_data(q)
        return sec
    times = sorted({float(r[0]) for r in t.rows})
    replicas = sorted({r[1] for r in t.rows})
    idx_t, idx_r = {v: i for i, v in enumerate(times)}, {v: i for i, v in enumerate(replicas)}
    grid = np.full((len(replicas), len(times)), np.nan)
    for time_s, rep, val in t.rows:
        if val is not None:
            grid[idx_r[rep], idx_t[float(time_s)]] = float(val)
    sec.image = figures.replica_map(times, replicas, grid, title=title, objective=objective_s, annotations=ctx.annotations)
    notes = []
    for i, rep in enumerate(replicas):
        over = [j for j in range(len(times)) if grid[i, j] > objective_s]
        if not over:
            continue
        others = np.delete(grid, i, axis=0)[:, over]
        others_med = float(np.nanmedian(others)) if others.size and not np.isnan(others).all() else math.nan
        notes.append(f"{rep} is above the {objective_s:g} s objective in {len(over)} of {len(times)} intervals, "
                     f"{_fmt_t(times[over[0]])}-{_fmt_t(times[over[-1]])}, worst {np.nanmax(grid[i, over]):.2f} s"
                     + (f" while the other replicas' median was {others_med:.2f} s" if math.isfinite(others_med) else ""))
    i, j = map(int, np.unravel_index(np.nanargmax(grid), grid.shape))
    others = np.delete(grid[:, j], i)
    peak = (f"Highest: {replicas[i]} {grid[i, j]:.2f} s at {_fmt_t(times[j])}"
            + (f" (other replicas' median then {np.nanmedian(others):.2f} s)" if np.isfinite(others).any() else "") + ". ")
    sec.note = peak + ("; ".join(notes) + "." if notes else f"Every replica stays within the {objective_s:g} s objective.")
    ctx.findings.append(f"{title}: {sec.note}")
    return sec


def _series_by_metric(t: runner.Table, col: int = 2) -> dict[str, tuple[list[float], list[float]]]:
    out: dict[str, tuple[list[float], list[float]]] = {}
    for row in t.rows:
        ts, vs = out.setdefault(str(row[1]), ([], []))
        ts.append(float(row[0]))
        vs.append(math.nan if row[col] is None else float(row[col]))
    return out


def lines_section(ctx: Context, q: SqlQuery, title: str, ylabel: str, objective: float | None = None,
                  col: int = 2, log_y: bool = False) -> Section:
    from llmsla.dashboards import figures

    sec = Section(title, [f"store · {q.key}"])
    t = ctx.sql(q)
    if not t or not t.rows:
        sec.note = _no_data(q)
        return sec
    sec.image = figures.lines(_series_by_metric(t, col), title=title, ylabel=ylabel, objective=objective,
                              log_y=log_y, annotations=ctx.annotations)
    return sec


def gpu_section(ctx: Context) -> Section:
    from llmsla.dashboards import figures

    qs = (promql.GPU_MEM_USED, promql.GPU_MEM_TOTAL)
    sec = Section("GPU memory used vs total", [f"Prometheus · {q.key}" for q in qs])
    if not ctx.prometheus_url:
        sec.note = "Live GPU gauges come from Prometheus: pass --prometheus URL."
        return sec
    series: dict[str, tuple[list[float], list[float]]] = {}
    styles = {}
    for q, kind in zip(qs, ("used", "total"), strict=True):
        for s in ctx.prom(q):
            name = f"{s.labels.get(names.L_INSTANCE, '?')} GPU {s.labels.get(names.L_GPU, '?')} {kind}"
            series[name] = (s.times, [v / 2**30 for v in s.values])
            styles[name] = "--" if kind == "total" else "-"
    if not series:
        sec.note = _no_data(promql.GPU_MEM_USED)
        return sec
    sec.image = figures.lines(series, title=sec.title, ylabel="GiB", styles=styles, annotations=ctx.annotations)
    return sec


def arms_section(ctx: Context) -> Section:
    from llmsla.dashboards import figures

    q = storesql.ARM_SUMMARY
    sec = Section("SLA attainment per arm", [f"store · {q.key}", f"store · {storesql.ATTAINMENT_BY_ARM.key}"])
    t = ctx.sql(q)
    if not t or not t.rows:
        sec.note = _no_data(q)
        return sec
    arms = [r[0] for r in t.rows]
    slo = ctx.slo
    sec.image = figures.bars(arms, {"TTFT": [r[3] or 0 for r in t.rows], "E2E": [r[4] or 0 for r in t.rows]},
                             title=sec.title, ylabel="share within SLO", objective=slo.latency_target)
    sec.table = _table(["arm", "requests", "share", "TTFT attainment", "E2E attainment", "error ratio"],
                       [[r[0], f"{int(r[1]):,}", f"{r[2]:.1%}", f"{r[3]:.2%}", f"{r[4]:.2%}", f"{r[5]:.2%}"] for r in t.rows])
    worst = min(t.rows, key=lambda r: r[3])
    ctx.findings.append(f"SLA attainment: lowest TTFT attainment {worst[3]:.2%} on arm {worst[0]} "
                        f"(objective {slo.required(slo_catalog.SLI_TTFT).target:.2%}).")
    return sec


def tenancy_section(ctx: Context) -> Section:
    q = storesql.TENANCY_SUMMARY
    sec = Section("SLA attainment per tenant and class", [f"store · {q.key}"])
    t = ctx.sql(q)
    if not t or not t.rows:
        sec.note = _no_data(q)
        return sec

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.2%}"

    sec.table = _table(["tenant", "class", "requests", "TTFT attainment", "E2E attainment", "goodput"],
                       [[r[0], r[1], f"{int(r[2]):,}", pct(r[3]), pct(r[4]), pct(r[5])] for r in t.rows])
    worst = min(t.rows, key=lambda r: r[3] if r[3] is not None else 2.0)
    if worst[3] is not None:
        ctx.findings.append(f"Tenants: lowest TTFT attainment {worst[3]:.2%} for tenant {worst[0]}, class {worst[1]}.")
    return sec


def actions_section(ctx: Context) -> Section:
    q = storesql.ACTIONS
    sec = Section("Control actions (action_log)", [f"store · {q.key}"])
    t = ctx.sql(q)
    if not t or not t.rows:
        sec.note = "No control action in this range."
        return sec
    sec.table = _table(["time (UTC)", "source", "actor", "action", "target", "reason", "outcome"],
                       [[r[0].strftime("%Y-%m-%d %H:%M:%S"), r[1], r[2], r[3], r[4], r[6], r[8]] for r in t.rows[:50]])
    sec.note = "Dotted vertical lines on the charts mark these actions."
    ctx.findings.append(f"Control actions: {len(t.rows)} in the range, first at {t.rows[-1][0].strftime('%H:%M:%S')} "
                        f"({t.rows[-1][3]} {t.rows[-1][4]}: {t.rows[-1][8]}).")
    return sec


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


#: the gap column of ``instances.engine_gateway_ttft``: time spent before the engine (gateway,
#: network, tokenizer), per replica; no data until ``llmsla engines`` feeds the stream job
ENGINE_GAP_TITLE = "Time before the engine per replica"


def engine_gap_section(ctx: Context) -> Section:
    """The gap (gateway - engine mean TTFT) per replica as lines, and beside it both sides' TTFT
    percentiles per replica: the median over the range's intervals of each interval's P50 and the
    worst interval's P99 (a percentile of the range cannot be merged from the intervals'; each
    interval's comes from summed histograms on the store's layout, docs/dashboards.md)."""
    from llmsla.dashboards import figures

    q = storesql.ENGINE_GATEWAY_TTFT
    sec = Section(ENGINE_GAP_TITLE, [f"store · {q.key}"])
    t = ctx.sql(q)
    if not t or not t.rows:
        sec.note = _no_data(q)
        return sec
    sec.image = figures.lines(_series_by_metric(t, 4), title=ENGINE_GAP_TITLE, ylabel="gateway - engine mean TTFT, s",
                              annotations=ctx.annotations)
    cols = {c: i for i, c in enumerate(q.columns)}
    rows = []
    for metric in sorted({str(r[1]) for r in t.rows}):
        mine = [r for r in t.rows if str(r[1]) == metric]

        def stat(col: str, worst: bool, rows_: list = mine) -> str:
            vs = [float(r[cols[col]]) for r in rows_ if r[cols[col]] is not None]
            if not vs:
                return "–"
            return f"{(max(vs) if worst else statistics.median(vs)) * 1000:.0f} ms"
        rows.append([metric, stat("gateway_p50_s", False), stat("engine_p50_s", False),
                     stat("gateway_p99_s", True), stat("engine_p99_s", True)])
    sec.table = _table(["replica", "gateway P50 (median interval)", "engine P50 (median interval)",
                        "gateway P99 (worst interval)", "engine P99 (worst interval)"], rows)
    return sec


def build_sections(ctx: Context) -> list[Section]:
    slo = ctx.slo
    steps: list[Callable[[], Section]] = [
        lambda: heatmap_section(ctx, promql.TTFT_HEATMAP, "TTFT distribution (heatmap)", slo.ttft_ms / 1000),
        lambda: heatmap_section(ctx, promql.E2E_HEATMAP, "E2E distribution (heatmap)", slo.e2e_ms / 1000),
        lambda: replica_section(ctx, storesql.TTFT_P99_HISTORY, "TTFT P99 per instance", slo.ttft_ms / 1000),
        lambda: replica_section(ctx, storesql.E2E_P99_HISTORY, "E2E P99 per instance", slo.e2e_ms / 1000),
        lambda: engine_gap_section(ctx),
        lambda: lines_section(ctx, storesql.QPS_HISTORY, "Requests per second", "req/s"),
        lambda: gpu_section(ctx),
        lambda: arms_section(ctx),
        lambda: tenancy_section(ctx),
        lambda: lines_section(ctx, storesql.POLICY_JITTER, "Temperature jitter", "std of temperature"),
        lambda: lines_section(ctx, storesql.RISK_HISTORY, "Forecast risk per target", "risk", objective=0.8),
        lambda: actions_section(ctx),
    ]
    return [step() for step in steps]


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1180px;color:#222}
h1{margin-bottom:.2em}.meta{color:#666}section{border-top:1px solid #ddd;padding:.6em 0}
img{max-width:100%;display:block}.src{color:#888;font-size:.85em}table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}.note{margin:.3em 0}"""


def render_html(title: str, ctx: Context, sections: list[Section]) -> str:
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p class='meta'>{ctx.rng.start:%Y-%m-%d %H:%M:%S} to {ctx.rng.end:%Y-%m-%d %H:%M:%S} UTC · "
             f"SLOs: {html.escape(ctx.slo.summary())} · Prometheus: "
             f"{html.escape(ctx.prometheus_url or 'not given')} · variables: All</p>"]
    for i, s in enumerate(sections):
        parts.append(f"<section id='panel-{i}'><h2>{html.escape(s.title)}</h2>")
        parts.append(f"<div class='src'>{html.escape(' · '.join(s.sources))}</div>")
        if s.image:
            b64 = base64.b64encode(s.image).decode()
            parts.append(f"<img alt='{html.escape(s.title)}' src='data:image/png;base64,{b64}'>")
        if s.note:
            parts.append(f"<p class='note'>{html.escape(s.note)}</p>")
        parts.append(s.table + "</section>")
    findings = "".join(f"<li>{html.escape(f)}</li>" for f in ctx.findings) or "<li>No data in this range.</li>"
    parts.append(f"<section id='closing'><h2>What this shows</h2><ul>{findings}</ul>"
                 "<p class='note'>Heatmaps: colour is requests per second in each latency bucket of the gateway's "
                 "SLO-aligned histogram; the dashed line is the SLO bound. P99 maps: one row per replica, the worst "
                 "5 s-window P99 in each interval, log colour scale with the objective marked on the colour bar.</p>"
                 "</section></body></html>")
    return "".join(parts)


def write(path: Path, cfg: Config, *, dsn: str, rng: TimeRange, prometheus_url: str | None = None,
          scrape_interval_s: float = 15.0, title: str = "llmsla SLA report") -> Path:
    """Render the report for ``rng`` into ``path`` (one file, images inline)."""
    try:
        conn = connect(dsn)
    except Exception as exc:
        raise ReportError(str(exc)) from None
    with conn:
        ctx = Context(cfg, conn, rng, prometheus_url, scrape_interval_s)
        try:
            resolve_variables(ctx)
            load_annotations(ctx)
            sections = build_sections(ctx)
        except runner.QueryError as exc:
            raise ReportError(str(exc)) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(title, ctx, sections))
    return path
