"""Grafana's PostgreSQL query as a grafana-foundation-sdk data-query variant.

The SDK ships query types for Prometheus, Loki and others but none for the PostgreSQL datasource,
so panels reading the store need one: a :class:`cog.variants.Dataquery` with the fields Grafana's
SQL query editor writes (``rawSql``, ``format``, ``editorMode``, ``rawQuery``), registered with the
SDK runtime under the plugin id so ``Dashboard.from_json`` turns such targets back into this class
instead of an opaque ``UnknownDataquery``.
"""

from __future__ import annotations

import typing

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import dashboard

from llmsla import names

FORMATS = ("time_series", "table")


class Dataquery(cogvariants.Dataquery):
    """One SQL target of a panel (or of an annotation)."""

    def __init__(self, raw_sql: str = "", format_val: str = "time_series", ref_id: str = "",
                 datasource: dashboard.DataSourceRef | None = None, editor_mode: str = "code",
                 raw_query: bool = True, hide: bool | None = None) -> None:
        if format_val not in FORMATS:
            raise ValueError(f"PostgreSQL query format must be one of {FORMATS}, not {format_val!r}")
        self.raw_sql = raw_sql
        self.format_val = format_val
        self.ref_id = ref_id
        self.datasource = datasource
        self.editor_mode = editor_mode
        self.raw_query = raw_query
        self.hide = hide

    def to_json(self) -> dict[str, object]:
        payload: dict[str, object] = {
            "refId": self.ref_id,
            "rawSql": self.raw_sql,
            "format": self.format_val,
            "editorMode": self.editor_mode,
            "rawQuery": self.raw_query,
        }
        if self.datasource is not None:
            payload["datasource"] = self.datasource
        if self.hide is not None:
            payload["hide"] = self.hide
        return payload

    @classmethod
    def from_json(cls, data: dict[str, typing.Any]) -> typing.Self:
        unknown = set(data) - {"refId", "rawSql", "format", "editorMode", "rawQuery", "datasource", "hide"}
        if unknown:
            raise ValueError(f"unknown PostgreSQL query fields: {sorted(unknown)}")
        ds = data.get("datasource")
        return cls(
            raw_sql=data.get("rawSql", ""), format_val=data.get("format", "time_series"), ref_id=data.get("refId", ""),
            datasource=dashboard.DataSourceRef.from_json(ds) if ds is not None else None,
            editor_mode=data.get("editorMode", "code"), raw_query=data.get("rawQuery", True), hide=data.get("hide"),
        )


class DataqueryBuilder(cogbuilder.Builder[Dataquery]):
    """Builder in the SDK's style: ``DataqueryBuilder().raw_sql(...).format("table")``."""

    def __init__(self) -> None:
        self._internal = Dataquery()

    def build(self) -> Dataquery:
        return self._internal

    def raw_sql(self, sql: str) -> typing.Self:
        self._internal.raw_sql = sql
        return self

    def format(self, fmt: str) -> typing.Self:
        if fmt not in FORMATS:
            raise ValueError(f"PostgreSQL query format must be one of {FORMATS}, not {fmt!r}")
        self._internal.format_val = fmt
        return self

    def ref_id(self, ref_id: str) -> typing.Self:
        self._internal.ref_id = ref_id
        return self

    def datasource(self, ref: dashboard.DataSourceRef) -> typing.Self:
        self._internal.datasource = ref
        return self


def register() -> None:
    """Register the variant (idempotent); call before ``Dashboard.from_json``."""
    cogruntime.register_dataquery_variant(
        cogruntime.DataqueryConfig(identifier=names.GRAFANA_POSTGRES_TYPE, from_json_hook=Dataquery.from_json)
    )
