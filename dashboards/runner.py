"""Run a dashboard query as Grafana would, against Prometheus' HTTP API or the store.

Used by ``llmsla report`` and by the tests that prove every query: the query text is expanded by
:mod:`~llmsla.dashboards.macros` exactly as Grafana expands it, then sent to the same backend.
Prometheus range queries use Grafana's step (the panel interval) and its start/end alignment to
the step; ``format: heatmap`` results get Grafana's post-processing (series sorted by ``le``,
cumulative counts turned into per-bucket counts).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

import psycopg

from llmsla.dashboards.macros import TimeRange, Variable, expand_promql, expand_sql
from llmsla.dashboards.query import PromQuery, SqlQuery


class QueryError(RuntimeError):
    """The backend refused the query; the message names the query and says why."""


@dataclass
class Series:
    """One Prometheus series: labels, timestamps (epoch s) and values (NaN kept)."""

    labels: dict[str, str]
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


@dataclass
class Table:
    """A SQL result: column names in order and rows."""

    columns: list[str]
    rows: list[tuple]


# -- Prometheus -----------------------------------------------------------------------------------
def _get(url: str, timeout_s: float = 30.0) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            data = json.load(r)
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        try:
            data = json.loads(body)
        except ValueError:
            raise QueryError(f"Prometheus HTTP {exc.code}: {body[:300]}") from None
    except OSError as exc:
        raise QueryError(f"Prometheus at {url.split('/api/')[0]} unreachable: {exc}") from None
    if data.get("status") != "success":
        raise QueryError(f"Prometheus: {data.get('errorType')}: {data.get('error')}")
    return data["data"]


def prom_range(base_url: str, q: PromQuery, rng: TimeRange, interval_ms: int,
               variables: Mapping[str, Variable] | None = None, *, scrape_interval_s: float = 15.0) -> list[Series]:
    """``q`` over ``rng`` at Grafana's step; an instant query at ``rng.end`` for ``instant``."""
    expr = expand_promql(q.expr, rng, interval_ms, variables, scrape_interval_s=scrape_interval_s)
    base = base_url.rstrip("/")
    try:
        if q.instant:
            data = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": rng.end.timestamp()}))
            return [Series(r["metric"], [float(r["value"][0])], [float(r["value"][1])]) for r in data["result"]]
        step = interval_ms / 1000
        start = math.floor(rng.start.timestamp() / step) * step  # Grafana aligns the range to the step
        end = math.floor(rng.end.timestamp() / step) * step
        data = _get(f"{base}/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": expr, "start": start, "end": end, "step": step}))
    except QueryError as exc:
        raise QueryError(f"{q.key}: {exc} (query: {expr})") from None
    out = [Series(r["metric"], [float(t) for t, _ in r["values"]], [float(v) for _, v in r["values"]])
           for r in data["result"]]
    return heatmap_buckets(out) if q.fmt == "heatmap" else out


def heatmap_buckets(series: list[Series]) -> list[Series]:
    """Grafana's ``format: heatmap`` transform: order by ``le`` and subtract each bucket's lower
    neighbour, so every series holds the count of its own bucket (no re-bucketing)."""
    def le(s: Series) -> float:
        return float(s.labels.get("le", "inf").replace("+Inf", "inf"))

    ordered = sorted(series, key=le)
    if not ordered:
        return []
    times = sorted({t for s in ordered for t in s.times})
    grid = [dict(zip(s.times, s.values, strict=True)) for s in ordered]
    out = []
    for i, s in enumerate(ordered):
        vals = []
        for t in times:
            v = grid[i].get(t, math.nan)
            below = grid[i - 1].get(t, 0.0) if i else 0.0
            vals.append(v - below if not math.isnan(v) and not math.isnan(below) else v)
        out.append(Series(s.labels, list(times), vals))
    return out


def prom_label_values(base_url: str, q: PromQuery, rng: TimeRange, variables: Mapping[str, Variable] | None = None) -> list[str]:
    """A ``label_values(metric{...}, label)`` variable query, as Grafana's Prometheus datasource
    runs it (``/api/v1/label/<label>/values`` with ``match[]``)."""
    inner = q.expr.strip()
    if not (inner.startswith("label_values(") and inner.endswith(")")):
        raise QueryError(f"{q.key}: not a label_values() variable query")
    body = expand_promql(inner[len("label_values("):-1], rng, 1000, variables)
    match, _, label = body.rpartition(",")
    params: dict[str, float | str] = {"start": rng.start.timestamp(), "end": rng.end.timestamp()}
    if match.strip():
        params["match[]"] = match.strip()
    data = _get(f"{base_url.rstrip('/')}/api/v1/label/{label.strip()}/values?" + urllib.parse.urlencode(params))
    return sorted(data)


# -- store ----------------------------------------------------------------------------------------
def expanded_sql(q: SqlQuery, rng: TimeRange, interval_ms: int, variables: Mapping[str, Variable] | None = None,
                 *, timescaledb: bool = False) -> str:
    return expand_sql(q.sql, rng, interval_ms, variables, timescaledb=timescaledb)


def sql(conn: psycopg.Connection, q: SqlQuery, rng: TimeRange, interval_ms: int,
        variables: Mapping[str, Variable] | None = None, *, timescaledb: bool = False) -> Table:
    """Run ``q`` on ``conn`` with Grafana's expansion; the statement is read-only."""
    text = expanded_sql(q, rng, interval_ms, variables, timescaledb=timescaledb)
    try:
        with conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            cur = conn.execute(text)
            rows = cur.fetchall()
            columns = [d.name for d in cur.description or []]
    except psycopg.Error as exc:
        raise QueryError(f"{q.key}: {str(exc).strip()}") from None
    return Table(columns, rows)
