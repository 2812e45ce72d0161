"""The job's schema is derived from the event contract: a field added to ``FIELDS`` or a range
changed there reaches the source DDL, both parse paths and the validity predicate without an edit
in streaming/sql.py, and the derived predicate checks every declared bound."""

from __future__ import annotations

import dataclasses

import pytest

from llmsla import config as config_mod
from llmsla import names
from llmsla.events import EVENT_TYPES, Field, PolicyEvent, RequestEvent
from llmsla.streaming import sql


def _conjuncts(kind: str, java: bool) -> set[str]:
    return set(sql._valid(kind, java).split(" AND "))


@pytest.mark.parametrize("java", [True, False])
def test_a_new_field_reaches_the_ddl_the_parse_and_the_checks(monkeypatch: pytest.MonkeyPatch, java: bool) -> None:
    added = Field("cached_tokens", "int", "prompt tokens served from the prefix cache", minimum=0)
    monkeypatch.setattr(RequestEvent, "FIELDS", (*RequestEvent.FIELDS, added))
    cfg = config_mod.load(env={})
    ddl = sql.source_ddl(cfg, names.SPOOL_REQUESTS, bounded=True, java=java)
    query = sql.checked_query(cfg, names.SPOOL_REQUESTS, java=java)
    assert "cached_tokens >= 0" in sql._valid(names.SPOOL_REQUESTS, java)
    if java:
        assert "cached_tokens BIGINT" in ddl
        assert ("cached_tokens", "BIGINT") in sql.format_columns(names.SPOOL_REQUESTS)
    else:
        assert "JSON_VALUE(line, '$.cached_tokens')" in query
    assert "cached_tokens" in query


def test_a_changed_range_reaches_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = tuple(dataclasses.replace(f, maximum=2.0) if f.name == "temperature" else f for f in PolicyEvent.FIELDS)
    before = _conjuncts(names.SPOOL_POLICY, True)
    monkeypatch.setattr(PolicyEvent, "FIELDS", fields)
    after = _conjuncts(names.SPOOL_POLICY, True)
    assert {c for c in after - before} == {"temperature <= 2.0)"}, after ^ before


def test_every_declared_bound_and_enum_is_checked() -> None:
    for kind, cls in EVENT_TYPES.items():
        predicate = sql._valid(kind, java=True)
        columns = dict(sql.format_columns(kind))
        for f in cls.FIELDS:
            if f.type == "itl":
                continue
            col = sql._column(f)
            assert col in columns, (kind, f.name)
            if f.minimum is not None:
                assert f"{col} >= {int(f.minimum) if f.type == 'int' else f.minimum!r}" in predicate, (kind, f.name)
            if f.maximum is not None:
                assert f"{col} <= {f.maximum!r}" in predicate, (kind, f.name)
            if f.enum:
                assert all(f"'{v}'" in predicate for v in f.enum), (kind, f.name)
            if f.type == "string":
                assert f"{col} > X''" in predicate, (kind, f.name)  # a BYTES column (sql._SQL_TYPE)
