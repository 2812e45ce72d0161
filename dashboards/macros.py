"""Grafana's query-time substitutions, reproduced so a dashboard query runs the same without Grafana.

The tests and ``llmsla report`` execute the dashboards' own query text; this module turns it
into what Grafana would send, frontend variables first, then the backend's global and PostgreSQL
macros, following Grafana's own sources (``templateSrv``, ``sqleng``, ``macros.go``) and checked
against its ``macros_test.go``. Fill modes are refused rather than imitated.
See docs/dashboards.md#queries-one-definition-grafanas-expansion-safe-variables.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

UTC = dt.UTC


class MacroError(ValueError):
    """A query Grafana would reject (unknown macro, missing argument, bad interval)."""


@dataclass(frozen=True)
class TimeRange:
    """A dashboard time range (UTC)."""

    start: dt.datetime
    end: dt.datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("TimeRange needs timezone-aware datetimes")
        if self.end <= self.start:
            raise ValueError(f"empty time range: {self.start.isoformat()} .. {self.end.isoformat()}")

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @classmethod
    def last(cls, seconds: float, *, now: dt.datetime | None = None) -> TimeRange:
        end = (now or dt.datetime.now(UTC)).astimezone(UTC)
        return cls(end - dt.timedelta(seconds=seconds), end)


@dataclass(frozen=True)
class Variable:
    """A template variable's current value. ``multi``/``include_all`` decide the default format,
    as in Grafana; pass every option's value when "All" is selected (no custom all value)."""

    values: tuple[str, ...]
    multi: bool = True
    include_all: bool = True

    @classmethod
    def of(cls, *values: str, multi: bool = True, include_all: bool = True) -> Variable:
        return cls(tuple(values), multi, include_all)

    @property
    def value(self) -> str | list[str]:
        """Grafana's value: a list for a multi-value variable, else one string."""
        return list(self.values) if self.multi else (self.values[0] if self.values else "")


# -- Grafana's interval arithmetic (@grafana/data rangeutil, grafana-plugin-sdk-go gtime) ---------
_ROUND_STEPS_MS = (
    (10, 1), (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000),
    (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000), (45000, 30000),
    (90000, 60000), (210000, 120000), (450000, 300000), (750000, 600000), (1050000, 900000),
    (1500000, 1200000), (2700000, 1800000), (5400000, 3600000), (9000000, 7200000),
    (16200000, 10800000), (32400000, 21600000), (86400000, 43200000), (604800000, 86400000),
    (1814400000, 604800000), (3628800000, 2592000000),
)


def round_interval_ms(interval_ms: float) -> int:
    """``rangeutil.roundInterval``: the "nice" interval Grafana uses for a raw one."""
    for below, value in _ROUND_STEPS_MS:
        if interval_ms < below:
            return value
    return 31536000000


def calculate_interval_ms(rng: TimeRange, max_data_points: int, min_interval: str | None = None) -> int:
    """``rangeutil.calculateInterval``: ``$__interval`` for a panel of ``max_data_points``."""
    interval = round_interval_ms(rng.seconds * 1000 / max_data_points)
    low = parse_interval_s(min_interval) * 1000 if min_interval else 1
    return int(max(interval, low))


def format_interval(interval_ms: float) -> str:
    """``gtime.FormatInterval``: the largest whole unit (``90 s`` is ``1m``)."""
    ms = int(interval_ms)
    for unit, size in (("y", 31536000000), ("d", 86400000), ("h", 3600000), ("m", 60000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            return f"{ms // size}{unit}"
    return "1ms"


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DATE_UNIT = re.compile(r"^(\d+)([dwMy])$")
_DAY_S = 86400.0
_YEAR_S = _DAY_S * 365.25  # gtime: the Julian year; a month is a twelfth of it


def parse_interval_s(text: str) -> float:
    """``gtime.ParseInterval`` in seconds: ``5m``, ``1h30m`` (Go durations) or ``2d``/``1w``/``1M``/``1y``."""
    m = _DATE_UNIT.match(text)
    if m:
        n, unit = int(m.group(1)), m.group(2)
        return n * {"d": _DAY_S, "w": 7 * _DAY_S, "M": _YEAR_S / 12, "y": _YEAR_S}[unit]
    s = text
    sign = -1.0 if s.startswith("-") else 1.0
    s = s.lstrip("+-")
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    for part in _GO_DURATION.finditer(s):
        if part.start() != pos:
            break
        total += float(part.group(1)) * _GO_UNITS[part.group(2)]
        pos = part.end()
    if not s or pos != len(s):
        raise MacroError(f"error parsing interval {text}")
    return sign * total


def go_float(value: float) -> str:
    """Go's ``fmt`` ``%v`` of a float64 (``strconv.FormatFloat(v, 'g', -1, 64)``): the shortest
    round-trip digits, in ``%e`` form (two-digit exponent) when the decimal exponent is < -4 or
    >= 6 (``eprec = 6`` for the shortest precision): ``300``, ``0.02``, ``1.0368e+06``."""
    if value == 0:
        return "0"
    if math.isinf(value) or math.isnan(value):
        return {math.inf: "+Inf", -math.inf: "-Inf"}.get(value, "NaN")
    sign, digits, exp = Decimal(repr(float(value))).normalize().as_tuple()
    ds = "".join(map(str, digits))
    x = len(ds) + int(exp) - 1  # decimal exponent of the first digit
    neg = "-" if sign else ""
    if x < -4 or x >= 6:
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{neg}{mant}e{'-' if x < 0 else '+'}{abs(x):02d}"
    if x >= len(ds) - 1:
        return neg + ds + "0" * (x - len(ds) + 1)
    if x >= 0:
        return neg + ds[: x + 1] + "." + ds[x + 1:]
    return neg + "0." + "0" * (-x - 1) + ds


def rfc3339nano(ts: dt.datetime) -> str:
    """Go's ``time.RFC3339Nano`` of a UTC time: fraction with trailing zeros trimmed, ``Z``."""
    ts = ts.astimezone(UTC)
    frac = f"{ts.microsecond:06d}".rstrip("0")
    return ts.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


# -- frontend: template variables ----------------------------------------------------------------
# templateSrv's variable regex: $var | [[var:fmt]] | ${var.fieldPath:fmt}
_VARIABLE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")
_REGEX_META = re.compile(r"[\\^$*+?.()|\[\]{}/]")


def _quote_literal(v: str) -> str:
    """``PostgresQueryModel.quoteLiteral``."""
    return "'" + v.replace("'", "''") + "'"


def _sql_default(var: Variable) -> str:
    value = var.value
    if isinstance(value, list):
        return ",".join(_quote_literal(v) for v in value)
    if var.multi or var.include_all:
        return _quote_literal(value)
    return value.replace("'", "''")


def _prom_regular_escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("'", "\\\\'")


def _prom_regex_escape(v: str) -> str:
    v = v.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]+?.()|]", lambda m: "\\\\" + m.group(0), v)


def _prom_default(var: Variable) -> str:
    """``PrometheusDatasource.interpolateQueryExpr`` (classic escaping)."""
    value = var.value
    if not var.multi and not var.include_all:
        return _prom_regular_escape(value) if isinstance(value, str) else ",".join(value)
    if isinstance(value, str):
        return _prom_regex_escape(value)
    escaped = [_prom_regex_escape(v) for v in value]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def _sqlstring(values: list[str]) -> str:
    """``${var:sqlstring}``: ``'`` doubled and, as Grafana does, ``"`` turned into ``\\"``."""
    return ",".join("'" + re.sub(r"'|\"", lambda m: "''" if m.group(0) == "'" else '\\"', v) + "'" for v in values)


def _format(var: Variable, fmt: str, default: str) -> str:
    values = list(var.values)
    if fmt == "sqlstring":
        return _sqlstring(values)
    if fmt == "csv":
        return ",".join(values)
    if fmt == "pipe":
        return "|".join(values)
    if fmt == "raw":
        return ",".join(values) if var.multi else (values[0] if values else "")
    if fmt == "regex":
        escaped = [_REGEX_META.sub(lambda m: "\\" + m.group(0), v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    raise MacroError(f"variable format {fmt!r} is not reproduced here (use the default, sqlstring, csv, pipe, raw or regex)")


def interpolate(text: str, variables: Mapping[str, Variable], *, dialect: str) -> str:
    """Replace template variables as Grafana's frontend does for a ``dialect`` ("sql" or
    "prometheus") datasource; unknown names (macros) stay as they are."""
    default = {"sql": _sql_default, "prometheus": _prom_default}[dialect]

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        var = variables.get(name)
        if var is None:
            return m.group(0)
        if m.group(5):
            raise MacroError(f"${{{name}.{m.group(5)}}}: field paths are not reproduced here")
        return _format(var, fmt, dialect) if fmt else default(var)

    return _VARIABLE.sub(repl, text)


# -- backend: PostgreSQL datasource ----------------------------------------------------------------
_MACRO = re.compile(r"\$([_a-zA-Z0-9]+)\(([^\)]*)\)")


def _time_group(args: list[str], *, timescaledb: bool) -> str:
    if len(args) < 2:
        raise MacroError("macro __timeGroup needs time column and interval and optional fill value")
    if len(args) == 3:
        raise MacroError("fill modes of $__timeGroup are applied by Grafana to the result; not reproduced here")
    try:
        seconds = parse_interval_s(args[1].strip("'"))
    except MacroError:
        raise MacroError(f"error parsing interval {args[1]}") from None
    if timescaledb:
        return f"time_bucket('{seconds:.3f}s',{args[0]})"
    s = go_float(seconds)
    return f"floor(extract(epoch from {args[0]})/{s})*{s}"


def _evaluate(name: str, args: list[str], rng: TimeRange, *, timescaledb: bool) -> str:
    frm, to = rfc3339nano(rng.start), rfc3339nano(rng.end)
    needs_col = {"__time", "__timeEpoch", "__timeFilter", "__unixEpochFilter", "__unixEpochNanoFilter"}
    if name in needs_col and (not args or not args[0]):
        raise MacroError(f"missing time column argument for macro {name}")
    start_ns = int(rng.start.timestamp()) * 10**9 + rng.start.microsecond * 1000
    end_ns = int(rng.end.timestamp()) * 10**9 + rng.end.microsecond * 1000
    match name:
        case "__time":
            return f'{args[0]} AS "time"'
        case "__timeEpoch":
            return f'extract(epoch from {args[0]}) as "time"'
        case "__timeFilter":
            return f"{args[0]} BETWEEN '{frm}' AND '{to}'"
        case "__timeFrom":
            return f"'{frm}'"
        case "__timeTo":
            return f"'{to}'"
        case "__timeGroup":
            return _time_group(args, timescaledb=timescaledb)
        case "__timeGroupAlias":
            return _time_group(args, timescaledb=timescaledb) + ' AS "time"'
        case "__unixEpochFilter":
            return f"{args[0]} >= {math.floor(rng.start.timestamp())} AND {args[0]} <= {math.floor(rng.end.timestamp())}"
        case "__unixEpochNanoFilter":
            return f"{args[0]} >= {start_ns} AND {args[0]} <= {end_ns}"
        case "__unixEpochNanoFrom":
            return str(start_ns)
        case "__unixEpochNanoTo":
            return str(end_ns)
        case "__unixEpochGroup" | "__unixEpochGroupAlias":
            if len(args) < 2:
                raise MacroError(f"macro {name} needs time column and interval and optional fill value")
            s = go_float(parse_interval_s(args[1].strip("'")))
            alias = ' AS "time"' if name.endswith("Alias") else ""
            return f"floor(({args[0]})/{s})*{s}{alias}"
    raise MacroError(f'unknown macro "{name}"')


def expand_sql(raw_sql: str, rng: TimeRange, interval_ms: int, variables: Mapping[str, Variable] | None = None,
               *, timescaledb: bool = False) -> str:
    """The SQL the PostgreSQL datasource runs for ``raw_sql`` over ``rng`` at ``interval_ms``."""
    sql = interpolate(raw_sql, variables or {}, dialect="sql")
    sql = sql.replace("$__interval_ms", str(int(interval_ms)))
    sql = sql.replace("$__interval", format_interval(interval_ms))
    sql = sql.replace("$__unixEpochFrom()", str(math.floor(rng.start.timestamp())))
    sql = sql.replace("$__unixEpochTo()", str(math.floor(rng.end.timestamp())))
    out: list[str] = []
    pos = 0
    for m in _MACRO.finditer(sql):
        name = m.group(1)
        if name == "__timeGroup" and sql[m.end():m.end() + 1] == ",":
            name = "__timeGroupAlias"  # pre-5.3 compatibility, as in macros.go
        args = [a.strip(" ") for a in m.group(2).split(",")]
        out.append(sql[pos:m.start()])
        out.append(_evaluate(name, args, rng, timescaledb=timescaledb))
        pos = m.end()
    out.append(sql[pos:])
    return "".join(out)


def rate_interval_ms(interval_ms: int, scrape_interval_s: float) -> int:
    """Grafana's ``$__rate_interval``: max(interval + scrape interval, 4 x scrape interval)."""
    scrape_ms = int(scrape_interval_s * 1000)
    return max(interval_ms + scrape_ms, 4 * scrape_ms)


def expand_promql(expr: str, rng: TimeRange, interval_ms: int, variables: Mapping[str, Variable] | None = None,
                  *, scrape_interval_s: float = 15.0) -> str:
    """The PromQL Grafana sends for ``expr``: variables, ``$__rate_interval``, ``$__interval``,
    ``$__range`` (Prometheus durations in whole milliseconds or larger units)."""
    scoped = {
        "__rate_interval": prom_duration(rate_interval_ms(interval_ms, scrape_interval_s)),
        "__interval": prom_duration(interval_ms),
        "__range": prom_duration(int(rng.seconds * 1000)),
    }
    for name, value in scoped.items():
        expr = re.sub(rf"\$\{{{name}\}}|\${name}(?!\w)", value, expr)
    return interpolate(expr, variables or {}, dialect="prometheus")


def prom_duration(ms: int) -> str:
    """A Prometheus duration for ``ms`` (``1m30s`` style, exact)."""
    if ms <= 0:
        raise MacroError("a Prometheus duration must be positive")
    out = []
    for unit, size in (("d", 86400000), ("h", 3600000), ("m", 60000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            out.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(out)
