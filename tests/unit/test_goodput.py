"""The goodput rule (llmsla.goodput): one definition for the gateway's counter and the store's
windows; the stream job's SQL rendering of it is checked against the pandas reference in
tests/streaming/test_windows.py."""

from __future__ import annotations

from llmsla import names
from llmsla.goodput import GoodputBounds


def test_request_met_applies_every_bound_at_once() -> None:
    b = GoodputBounds(ttft_ms=800.0, tpot_ms=100.0, e2e_ms=10_000.0)
    assert b.request_met(names.STATUS_OK, 100.0, 1000.0, 11)  # TPOT 90 ms
    assert not b.request_met(names.STATUS_OK, 900.0, 1000.0, 2)  # TTFT over
    assert not b.request_met(names.STATUS_OK, 100.0, 11_000.0, 2)  # E2E over
    assert not b.request_met(names.STATUS_OK, 100.0, 2100.0, 11)  # TPOT 200 ms
    assert b.request_met(names.STATUS_OK, 800.0, 10_000.0, 1)  # on the bounds, no TPOT
    assert b.request_met(names.STATUS_OK, None, 700.0, 5)  # not streamed: TTFT is E2E
    assert not b.request_met(names.STATUS_OK, None, 900.0, 5)
    assert not b.request_met(names.STATUS_ERROR, 100.0, 200.0, 3)  # failed


def test_an_sli_without_an_objective_is_not_checked() -> None:
    assert GoodputBounds(None, None, None).request_met(names.STATUS_OK, 1e9, 1e9, 1000)
    assert not GoodputBounds(None, None, None).request_met(names.STATUS_TIMEOUT, 1.0, 1.0, 2)


def test_sql_names_every_bound_as_a_double() -> None:
    sql = GoodputBounds(800.0, 25.0, 10_000.0).sql(status_ok="status = 'ok'")
    assert "status = 'ok'" in sql and "<= 0.8E0" in sql and "<= 10.0E0" in sql and "<= 0.025E0" in sql
    assert GoodputBounds(None, None, None).sql(status_ok="ok_") == "(ok_)"
