"""One definition per panel query: the text Grafana runs and what its panel expects back.

Dashboards put :attr:`PromQuery.expr` / :attr:`SqlQuery.sql` into their JSON verbatim; ``llmsla
report`` runs the very same objects; the tests run each of them against a real Prometheus or the
store and check the result against what is declared here (labels of each series, columns in
order). Every query is registered by its ``key`` so a test can find the definition of any query a
dashboard JSON contains, and fail on one that has none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypeVar


@dataclass(frozen=True)
class Pending:
    """The data comes from another component's artefact that a deployment must load first (the
    SLO recording rules into Prometheus); until it does the panel shows "no data", and the
    dashboard's description names what to load."""

    component: str  # e.g. "alerting (`llmsla slo generate`)"
    artefact: str  # what must exist before the data can: e.g. "Sloth recording rules"


@dataclass(frozen=True)
class PromQuery:
    """A PromQL panel or variable query with Grafana's variables (``$model``, ``$__rate_interval``)."""

    key: str
    expr: str
    legend: str = ""
    fmt: str = "time_series"  # time_series | heatmap | table
    instant: bool = False
    labels: tuple[str, ...] = ()  # labels every returned series carries
    pending: Pending | None = None

    @property
    def metrics(self) -> set[str]:
        """Metric and recording-rule names the expression reads."""
        return set(_PROM_NAME.findall(self.expr)) - _PROM_WORDS


@dataclass(frozen=True)
class SqlQuery:
    """A store query with Grafana's PostgreSQL macros (``$__timeFilter`` ...) and variables."""

    key: str
    sql: str
    columns: tuple[str, ...]  # result columns, in order
    fmt: str = "time_series"  # time_series | table
    pending: Pending | None = None
    tables: tuple[str, ...] = field(default=())  # filled from the SQL when not given

    def __post_init__(self) -> None:
        if not self.tables:
            found = {a or b for a, b in _SQL_TABLE.findall(self.sql)}
            object.__setattr__(self, "tables", tuple(sorted(found)))


Query = PromQuery | SqlQuery

#: Every query by key (dashboards, the report and the tests look them up here).
REGISTRY: dict[str, Query] = {}


_Q = TypeVar("_Q", PromQuery, SqlQuery)


def register(q: _Q) -> _Q:
    if q.key in REGISTRY and REGISTRY[q.key] != q:
        raise ValueError(f"two queries named {q.key!r}")
    REGISTRY[q.key] = q
    return q


_PROM_NAME = re.compile(r"\b(ALERTS|slo:[a-z_]+:[a-z0-9_]+|llmsla_[a-z0-9_]+(?::[a-z0-9_]+)*)\b")
_PROM_WORDS: set[str] = set()
_SQL_TABLE = re.compile(r"\bFROM\s+([a-z_][a-z0-9_]*)|\bJOIN\s+([a-z_][a-z0-9_]*)", re.IGNORECASE)

#: Pending producers, named once.
SLOTH_RULES = Pending("alerting (`llmsla slo generate`)", "Sloth recording rules (slo:*) loaded by Prometheus")


def base_metric(name: str) -> str:
    """The family a series name belongs to (``_bucket``/``_sum``/``_count``/``_total`` removed)."""
    for suffix in ("_bucket", "_sum", "_count", "_total"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
