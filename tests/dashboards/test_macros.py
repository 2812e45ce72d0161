"""Grafana's query-time substitutions, checked against the expectations of Grafana's own tests
(pkg/tsdb/grafana-postgresql-datasource/macros_test.go, @grafana/data rangeutil) and, for
hostile template values, against a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import re

import psycopg
import pytest

from llmsla import names
from llmsla.dashboards import macros
from llmsla.dashboards.common import SAFE_VALUES
from llmsla.dashboards.macros import (
    MacroError,
    TimeRange,
    Variable,
    expand_promql,
    expand_sql,
    interpolate,
)
from llmsla.store import connect
from llmsla.store.migrate import migrate

UTC = dt.UTC
FROM = dt.datetime(2018, 4, 12, 18, 0, tzinfo=UTC)
RNG = TimeRange(FROM, FROM + dt.timedelta(minutes=5))


def sql(text: str, **kw) -> str:
    return expand_sql(text, RNG, kw.pop("interval_ms", 10 * 60000), **kw)


@pytest.mark.parametrize(("raw", "want"), [
    ("select $__time(time_column)", 'select time_column AS "time"'),
    ("select min($__time(time_column))", 'select min(time_column AS "time")'),
    ("WHERE $__timeFilter(time_column)", "WHERE time_column BETWEEN '2018-04-12T18:00:00Z' AND '2018-04-12T18:05:00Z'"),
    ("select $__timeFrom()", "select '2018-04-12T18:00:00Z'"),
    ("select $__timeTo()", "select '2018-04-12T18:05:00Z'"),
    ("SELECT $__timeGroup(time_column,'5m'), value", 'SELECT floor(extract(epoch from time_column)/300)*300 AS "time", value'),
    ("SELECT $__timeGroup(time_column,'5m') as time, value", "SELECT floor(extract(epoch from time_column)/300)*300 as time, value"),
    ("SELECT $__timeGroup(time_column,'5m')", "SELECT floor(extract(epoch from time_column)/300)*300"),
    ("SELECT $__timeGroupAlias(time_column,'5m')", 'SELECT floor(extract(epoch from time_column)/300)*300 AS "time"'),
    ("$__timeGroup(time_column , '5m')", "floor(extract(epoch from time_column)/300)*300"),
    ("select $__unixEpochFilter(time)", f"select time >= {int(FROM.timestamp())} AND time <= {int(FROM.timestamp()) + 300}"),
    ("SELECT $__unixEpochGroup(time_column+time_adjustment,'5m')", "SELECT floor((time_column+time_adjustment)/300)*300"),
    ("SELECT $__timeGroup(t, '12d')", "SELECT floor(extract(epoch from t)/1.0368e+06)*1.0368e+06"),  # Go's %v
    ("SELECT $__timeGroup(t, '20ms')", "SELECT floor(extract(epoch from t)/0.02)*0.02"),
    ("SELECT $__interval", "SELECT 10m"),  # sqleng.Interpolate: gtime.FormatInterval
    ("SELECT $__interval_ms", "SELECT 600000"),
])
def test_postgres_macros_as_grafana_tests_expect(raw: str, want: str) -> None:
    assert sql(raw) == want


@pytest.mark.parametrize(("raw", "want"), [
    ("GROUP BY $__timeGroup(time_column,'5m')", "GROUP BY time_bucket('300.000s',time_column)"),
    ("GROUP BY $__timeGroup(time_column , '12d')", "GROUP BY time_bucket('1036800.000s',time_column)"),
    ("GROUP BY $__timeGroup(time_column , '20ms')", "GROUP BY time_bucket('0.020s',time_column)"),
])
def test_timescaledb_time_group(raw: str, want: str) -> None:
    assert sql(raw, timescaledb=True) == want


def test_fractional_range_and_old_dates() -> None:
    rng = TimeRange(dt.datetime(1960, 2, 1, 7, 0, 0, 500000, tzinfo=UTC), dt.datetime(1980, 2, 3, 8, 0, 0, 500000, tzinfo=UTC))
    assert expand_sql("$__timeFilter(t)", rng, 1000) == "t BETWEEN '1960-02-01T07:00:00.5Z' AND '1980-02-03T08:00:00.5Z'"
    assert expand_sql("$__unixEpochFilter(t)", rng, 1000) == f"t >= {int(rng.start.timestamp()) - 1} AND t <= {int(rng.end.timestamp())}"


def test_bad_macros_are_errors() -> None:
    for raw, msg in (("$__timeFilter()", "missing time column"), ("$__timeGroup(t)", "needs time column"),
                     ("$__timeGroup(t, 'soon')", "error parsing interval"), ("$__nope(t)", 'unknown macro "__nope"'),
                     ("$__timeGroup(t, '1m', NULL)", "fill modes")):
        with pytest.raises(MacroError, match=msg):
            sql(raw)


@pytest.mark.parametrize(("span_ms", "points", "want_ms", "text"), [
    (5 * 60000, 1000, 200, "200ms"), (3600000, 1000, 5000, "5s"), (6 * 3600000, 1000, 20000, "20s"),
    (86400000, 1000, 60000, "1m"), (7 * 86400000, 1000, 600000, "10m"), (30 * 86400000, 1000, 1800000, "30m"),
])
def test_grafana_interval(span_ms: int, points: int, want_ms: int, text: str) -> None:
    rng = TimeRange(FROM, FROM + dt.timedelta(milliseconds=span_ms))
    assert macros.calculate_interval_ms(rng, points) == want_ms
    assert macros.format_interval(want_ms) == text
    assert macros.calculate_interval_ms(rng, points, "30s") == max(want_ms, 30000)


def test_interval_parsing() -> None:
    assert macros.parse_interval_s("1h30m") == 5400
    assert macros.parse_interval_s("2d") == 172800 and macros.parse_interval_s("1w") == 604800
    assert macros.parse_interval_s("1y") == 365.25 * 86400
    assert macros.parse_interval_s("250ms") == 0.25
    with pytest.raises(MacroError):
        macros.parse_interval_s("1 hour")


def test_sql_variables_as_the_frontend_formats_them() -> None:
    hostile = "x'); DROP TABLE t; --"
    multi = {"m": Variable.of("a", hostile)}
    assert interpolate("m IN ($m)", multi, dialect="sql") == "m IN ('a','x''); DROP TABLE t; --')"
    assert interpolate("m IN (${m})", multi, dialect="sql") == "m IN ('a','x''); DROP TABLE t; --')"
    assert interpolate("m IN ([[m]])", multi, dialect="sql") == "m IN ('a','x''); DROP TABLE t; --')"
    single = {"m": Variable.of(hostile, multi=False, include_all=False)}
    assert interpolate("m = '$m'", single, dialect="sql") == "m = 'x''); DROP TABLE t; --'"
    # ${var:sqlstring}: quotes always, and (as Grafana does) turns " into \"
    assert interpolate("${m:sqlstring}", {"m": Variable.of('a"b', "c'd")}, dialect="sql") == "'a\\\"b','c''d'"
    assert interpolate("$__timeFilter(x) $unknown", multi, dialect="sql") == "$__timeFilter(x) $unknown"


def test_prometheus_variables_and_intervals() -> None:
    vars_ = {"model": Variable.of("llama-3.1", "qwen"), "pool": Variable.of("p0")}
    expr = 'rate(x{model=~"$model", pool=~"$pool"}[$__rate_interval])'
    got = expand_promql(expr, RNG, 15000, vars_, scrape_interval_s=15)
    assert got == 'rate(x{model=~"(llama-3\\\\.1|qwen)", pool=~"p0"}[1m])'
    assert expand_promql("increase(x[$__interval])", RNG, 5000, scrape_interval_s=1) == "increase(x[5s])"
    assert expand_promql("x[$__rate_interval]", RNG, 1000, scrape_interval_s=0.5) == "x[2s]"


def test_hostile_values_stay_literals_in_postgresql(pg_dsn: str, cfg) -> None:
    """Every value a label can carry goes through Grafana's quoting and comes back unchanged; the
    one kind Grafana itself mangles (a value containing a macro, expanded by the backend after the
    frontend quoted it) is dropped by the dashboards' variable regex."""
    values = ["plain", "it's", "x'); DROP TABLE request_windows; --", "back\\slash", "$1 $$ $model", "ü漢字", 'a"b', ""]
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        got = [r[0] for r in conn.execute(expand_sql("SELECT unnest(ARRAY[$v]) AS v", RNG, 1000, {"v": Variable(tuple(values))}))]
        assert got == values
        assert conn.execute(f"SELECT to_regclass('{names.T_REQUEST_WINDOWS}')").fetchone()[0] is not None
        assert conn.execute("SHOW standard_conforming_strings").fetchone()[0] == "on"
        with pytest.raises(psycopg.errors.SyntaxError):  # what the quoting prevents: the raw value is SQL
            conn.execute(f"SELECT '{values[2]}'")
        mangled = expand_sql("SELECT $v", RNG, 1000, {"v": Variable.of("x$__timeFrom()")})
        assert mangled == "SELECT 'x'2018-04-12T18:00:00Z''"  # Grafana's own behaviour, reproduced
        with pytest.raises(psycopg.errors.SyntaxError):
            conn.execute(mangled)
    safe = re.compile(SAFE_VALUES.strip("/"))  # the JS regex is also a valid Python one
    assert all(safe.search(v) for v in values)
    assert not safe.search("x$__timeFrom()") and not safe.search("$__interval")
