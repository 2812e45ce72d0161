"""The job's Flink SQL, generated from the event contracts and the configuration.

A good record never touches Python: lines are parsed on the JVM (the ``llmsla-json`` format, not
Flink's ``json``, which silently skips a bad line) and validity is decided in SQL; only rejected
lines reach Python, where the contract names the reason. Lateness is checked before the shuffle,
so every record lands in exactly one place (a window or a dead letter), and allowed lateness is
folded into the watermark so a window row in the store is final.
See docs/streaming.md#time-watermarks-lateness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmsla import names, slo_catalog
from llmsla.config import Config
from llmsla.events import ALL_EVENT_TYPES, ITL_FIELDS, MAX_STRING_CHARS, Field
from llmsla.goodput import GoodputBounds
from llmsla.store import rollups, schema

#: Output kind of dead letters in the unioned output stream.
DEAD_LETTERS = names.T_DEAD_LETTERS

#: Columns the job writes, per target table, in payload order: a window row's payload is its
#: line of COPY text (:func:`_copy_line`), which the sink COPYs as is.
#: (The tables' column lists: :mod:`llmsla.store.schema`.)
REQUEST_COLUMNS = schema.REQUEST_COLUMNS
POLICY_COLUMNS = schema.POLICY_COLUMNS
GPU_COLUMNS = schema.GPU_COLUMNS
ENGINE_COLUMNS = schema.ENGINE_COLUMNS
#: Dead-letter payload: spool kind, file, verdict (invalid|future|past|late), the format's problem
#: (json_error; null on the fallback), and the raw line's bytes in base64: the line as read, even
#: when it is not UTF-8 or holds a NUL, so the sink asks the contract about the exact bytes.
DEAD_COLUMNS: tuple[str, ...] = ("source", "file", "verdict", "problem", "raw_base64")

#: The job's 1 m roll-up rows (Java path): the roll-up's key, its values up to the histograms,
#: and the quantiles of the summed histograms (computed on the JVM, HistogramQuantile.java).
MINUTE_COLUMNS: tuple[str, ...] = (*schema.REQUEST_KEYS, *rollups.VALUE_COLUMNS,
                                   *(c for c, _, _ in rollups.QUANTILES))

TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    names.T_REQUEST_WINDOWS: REQUEST_COLUMNS,
    names.T_REQUEST_WINDOWS_1M: MINUTE_COLUMNS,
    names.T_POLICY_WINDOWS: POLICY_COLUMNS,
    names.T_GPU_WINDOWS: GPU_COLUMNS,
    names.T_ENGINE_WINDOWS: ENGINE_COLUMNS,
}
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    names.T_REQUEST_WINDOWS: schema.REQUEST_KEYS,
    names.T_REQUEST_WINDOWS_1M: schema.REQUEST_KEYS,
    names.T_POLICY_WINDOWS: schema.POLICY_KEYS,
    names.T_GPU_WINDOWS: schema.GPU_KEYS,
    names.T_ENGINE_WINDOWS: schema.ENGINE_KEYS,
}
# the sink finds a row's key in the leading fields of its line (StoreWriter._window_rows)
assert all(TABLE_COLUMNS[t][:len(k)] == k for t, k in TABLE_KEYS.items())
WINDOW_OF_KIND: dict[str, int] = {
    names.SPOOL_REQUESTS: names.REQUEST_WINDOW_S,
    names.SPOOL_POLICY: names.POLICY_WINDOW_S,
    names.SPOOL_GPU: names.GPU_WINDOW_S,
    names.SPOOL_ENGINE: names.ENGINE_WINDOW_S,
}

_DOUBLE_MAX = "1.7976931348623157E308"


@dataclass(frozen=True)
class JobSql:
    """Everything the job executes, in order: the source tables, the views (registered as Table
    objects, so that both outputs read one shared plan node), then the two outputs."""

    ddl: list[str]
    views: list[tuple[str, str]]
    window_query: str
    dead_letter_query: str


def _sv(path: str) -> str:
    return f"JSON_VALUE(line, '$.{path}')"


def _int(path: str) -> str:
    return f"TRY_CAST({_sv(path)} AS BIGINT)"


def _num(path: str) -> str:
    return f"TRY_CAST({_sv(path)} AS DOUBLE)"


def _str_ok(col: str, java: bool) -> str:
    """A storable, non-empty string (llmsla.events._check_string / string_problem).

    Java path: the llmsla-json format already rejects a string with a NUL, a lone surrogate or more
    than MAX_STRING_CHARS code points (CHAR_LENGTH would count UTF-16 units: an emoji twice).
    Fallback: the same rules with Java regular expressions (they see a surrogate pair as one code
    point, so the class matches lone surrogates only); the code-point count is taken only for
    strings long enough to need it."""
    if java:  # a BYTES column (_SQL_TYPE)
        # `> X''`, not `<> X''`: inside `col IS NULL OR ...` (an optional field) the planner folds
        # `<>` into SEARCH(col, Sarg[(-inf..X''), (X''..+inf); NULL AS TRUE]), which Flink's code
        # for a BINARY point gets wrong: true for X'' (an empty tenant was windowed). A range
        # bound is compared correctly, and every non-empty byte string is > X''.
        return f"({col} IS NOT NULL AND {col} > X'')"
    n = MAX_STRING_CHARS
    return (f"({col} IS NOT NULL AND {col} <> '' AND CHAR_LENGTH({col}) <= {2 * n} "
            f"AND NOT REGEXP({col}, '[\\x{{0}}\\x{{D800}}-\\x{{DFFF}}]') AND (CHAR_LENGTH({col}) <= {n} OR "
            f"CHAR_LENGTH(REGEXP_REPLACE({col}, '[\\x{{10000}}-\\x{{10FFFF}}]', '_')) <= {n}))")


def _num_ok(col: str, lo: float | None = 0, hi: float | None = None) -> str:
    parts = [f"{col} IS NOT NULL", f"ABS({col}) <= {_DOUBLE_MAX}"]
    if lo is not None:
        parts.append(f"{col} >= {lo!r}")
    if hi is not None:
        parts.append(f"{col} <= {hi!r}")
    return "(" + " AND ".join(parts) + ")"


def _int_ok(col: str, lo: int | None = 0, hi: int | None = None) -> str:
    return (f"({col} IS NOT NULL" + (f" AND {col} >= {lo}" if lo is not None else "")
            + (f" AND {col} <= {hi}" if hi is not None else "") + ")")


#: Percentile sets the window queries use. On the Java path each is one registered instance of
#: streaming/java/.../Percentiles.java (see percentile_function); otherwise Flink's PERCENTILE.
PERCENTILE_SETS: tuple[tuple[float, ...], ...] = ((0.5, 0.95, 0.99), (0.5, 0.99), (0.99,))


def percentile_function(ps: tuple[float, ...]) -> str:
    """SQL name of the Java aggregate for a percentile set, e.g. LLMSLA_P50_P95_P99."""
    return "LLMSLA_" + "_".join("P" + f"{p * 100:g}".replace(".", "_") for p in ps)


#: SQL name of the histogram aggregate (streaming/java/.../Histogram.java on names.HIST_BOUNDS_MS).
HISTOGRAM_FUNCTION = "LLMSLA_HIST"
#: SQL name of the sum of histogram texts (streaming/java/.../HistogramSum.java).
HISTOGRAM_SUM_FUNCTION = "LLMSLA_HIST_SUM"
#: SQL name of a histogram text's quantile (streaming/java/.../HistogramQuantile.java on
#: names.HIST_VALUES_MS): ``LLMSLA_HIST_QUANTILE(hist, q)``.
HISTOGRAM_QUANTILE_FUNCTION = "LLMSLA_HIST_QUANTILE"
#: SQL name of the byte-exact base64 of a BYTES value (streaming/java/.../Base64Bytes.java).
BASE64_FUNCTION = "LLMSLA_BASE64"


def _histogram(col: str, java: bool) -> str:
    """The window's counts per bucket of the store's fixed layout, as PostgreSQL array text
    (``[lo:hi]={...}``), computed on the JVM. Without javac (the pure-SQL fallback) there is no
    histogram: NULL (the roll-ups' range quantiles and the A/B report need the Java path)."""
    return f"{HISTOGRAM_FUNCTION}({col})" if java else "CAST(NULL AS STRING)"


def _percentiles(col: str, ps: tuple[float, ...], java: bool) -> str:
    """Exact percentiles of ``col`` (linear at p·(n−1)), as an array when several, else a scalar."""
    assert ps in PERCENTILE_SETS, ps
    if java:
        call = f"{percentile_function(ps)}({col})"
        return call if len(ps) > 1 else f"{call}[1]"
    arg = f"ARRAY[{', '.join(map(repr, ps))}]" if len(ps) > 1 else repr(ps[0])
    return f"PERCENTILE({col}, {arg})"


def _text(value: str, java: bool) -> str:
    """A literal to compare a string column with: its UTF-8 bytes on the Java path (BYTES)."""
    return f"X'{value.encode().hex()}'" if java else "'" + value.replace("'", "''") + "'"


def _in(col: str, values: tuple[str, ...], java: bool) -> str:
    # as text: Flink pads the binary literals of a list to one length (X'6f6b' to X'6f6b000000')
    col = f"CAST({col} AS STRING)" if java else col
    return f"{col} IN ({', '.join(_text(v, False) for v in values)})"


# The parse spec of a kind, derived from its contract (llmsla.events FIELDS): (column, JSON path,
# type) with type s string, i integer, n number, v schema version (an integer that must not be an
# explicit null), r the raw string of a nullable number's path (to tell "absent/null" from "not a
# number" on the fallback). An ``itl`` field becomes one column per member (ITL_FIELDS). Both parse
# paths, the Java format's options and the validity predicate derive from it; a field added to or
# changed in FIELDS reaches the job without an edit here (tests/streaming/test_contract_schema.py).
#: SQL names for fields whose own name is a Flink SQL keyword or longer than the queries use.
_COLUMN_OF: dict[str, str] = {"trigger": "trigger_", "mem_used_bytes": "mem_used", "mem_total_bytes": "mem_total",
                              "running": "running_n", "waiting": "waiting_n"}
_TYPE_OF = {"int": "i", "number": "n", "string": "s"}


def _column(field: Field) -> str:
    return _COLUMN_OF.get(field.name, field.name)


def _raw_column(field: Field) -> str:
    return f"{_column(field).removesuffix('_ms')}_raw"


def _hist_columns(f: Field) -> tuple[str, str]:
    """The columns of a ``hist`` field the job reads: its sum and count (the format checks the
    rest of it, llmsla-json.histograms)."""
    return f"{f.name}_sum", f"{f.name}_count"


#: ``hist`` fields whose native buckets the job also reads (the Java path; one STRING column
#: ``<name>_buckets``, NativeHistogram.encode's text): the engine's TTFT, windowed into
#: engine_windows.engine_ttft_hist. The pure-SQL fallback has no histograms (NULL), as for requests.
NATIVE_BUCKET_FIELDS: frozenset[str] = frozenset({"ttft"})


def _spec(kind: str) -> list[tuple[str, str, str]]:
    spec = [("v", "v", "v")]
    for f in ALL_EVENT_TYPES[kind].FIELDS:
        if f.type == "itl":
            spec += [(f"itl_{m.name}", f"{f.name}.{m.name}", _TYPE_OF[m.type]) for m in ITL_FIELDS]
            continue
        if f.type == "hist":
            hsum, hcount = _hist_columns(f)
            spec += [(hsum, f"{f.name}.sum", "n"), (hcount, f"{f.name}.count", "i")]
            if f.name in NATIVE_BUCKET_FIELDS:
                spec.append((f"{f.name}_buckets", f"{f.name}.buckets", "h"))
            continue
        if f.type == "strings":  # checked by the format (llmsla-json.string-lists), not stored
            continue
        if f.nullable:
            spec.append((_raw_column(f), f.name, "r"))
        spec.append((_column(f), f.name, _TYPE_OF[f.type]))
    return spec


_SQL_EXTRACT = {"s": _sv, "v": _sv, "r": _sv, "i": _int, "n": _num, "h": lambda path: "CAST(NULL AS STRING)"}

def fallback_columns(kind: str) -> list[tuple[str, str]]:
    """Pure-SQL parse (the fallback without javac): one JSON_VALUE per column, (name, expression)."""
    return [(col, _SQL_EXTRACT[t](path)) for col, path, t in _spec(kind)]

#: The Java table format (streaming/java, built by streaming/jar.py) and its two extra columns.
JAVA_FORMAT = "llmsla-json"
JSON_ERROR = "json_error"
# Strings as BYTES (their UTF-8): the planner deep-copies a STRING column at every Calc that reads
# it, once per row, and passes byte arrays on by reference (SpoolJsonDeserializer.stringValue).
# They are compared with _text literals and become text where a row is written (_copy_field).
_SQL_TYPE = {"s": "BYTES", "v": "BIGINT", "i": "BIGINT", "n": "DOUBLE", "h": "STRING"}


def format_columns(kind: str) -> list[tuple[str, str]]:
    """The typed columns the llmsla-json format fills for a kind: (name, SQL type)."""
    return [(col, _SQL_TYPE[t]) for col, _, t in _spec(kind) if t != "r"]


def format_options(kind: str) -> str:
    """WITH options of the llmsla-json format: columns named unlike their JSON path, and the
    schema version, which may be absent but not an explicit null."""
    spec = _spec(kind)
    paths = ",".join(f"{col}={path}" for col, path, t in spec if t != "r" and col != path)
    not_null = ",".join(col for col, _, t in spec if t == "v")
    fields = ALL_EVENT_TYPES[kind].FIELDS
    lists = "".join(f"'{JAVA_FORMAT}.{option}' = '{','.join(f.name for f in fields if f.type == typ)}', "
                    for option, typ in (("histograms", "hist"), ("string-lists", "strings"))
                    if any(f.type == typ for f in fields))
    return (f"'format' = '{JAVA_FORMAT}', {lists}'{JAVA_FORMAT}.paths' = '{paths}', "
            f"'{JAVA_FORMAT}.not-null' = '{not_null}', '{JAVA_FORMAT}.error-column' = '{JSON_ERROR}', "
            f"'{JAVA_FORMAT}.time-column' = 'rt=ts_ms', '{JAVA_FORMAT}.max-string-chars' = '{MAX_STRING_CHARS}'")


def _relations(kind: str, java: bool) -> tuple[str, ...]:
    """Cross-field rules, mirroring each event's ``_check_relations`` (and ItlSummary's max >=
    mean); the only checks not derived from FIELDS, since they are code there. Tests feed the same
    bad lines to the contract and to both parse paths."""
    return {
        names.SPOOL_REQUESTS: (
            "(itl_n = 0 OR itl_max >= itl_mean)", "(ttft_ms IS NULL OR ttft_ms <= e2e_ms)", "queue_ms <= e2e_ms",
            f"NOT (status = {_text(names.STATUS_OK, java)} AND ttft_ms IS NULL AND output_tokens > 0)",
        ),
        names.SPOOL_POLICY: (),
        names.SPOOL_GPU: ("mem_used <= mem_total",),
        names.SPOOL_ENGINE: (),
    }[kind]


def _field_checks(f: Field, java: bool) -> list[str]:
    """A field's own checks, from its declaration: type, non-null, bounds, enum, storable string."""
    col = _column(f)
    if f.type == "itl":
        return [_int_ok(f"itl_{m.name}", _bound(m.minimum)) if m.type == "int"
                else _num_ok(f"itl_{m.name}", m.minimum, m.maximum) for m in ITL_FIELDS]
    if f.type == "hist":
        # the Java format checked the whole object (bounds, cumulative counts); the fallback reads
        # only sum and count, both there or both absent (it is more lenient, docs/streaming.md)
        hsum, hcount = _hist_columns(f)
        return [f"(({hsum} IS NULL) = ({hcount} IS NULL))", f"({hsum} IS NULL OR ABS({hsum}) <= {_DOUBLE_MAX})",
                f"({hcount} IS NULL OR {hcount} >= 0)"]
    if f.type == "strings":
        return []  # the Java format checks the list (llmsla-json.string-lists)
    if f.type == "string":
        checks = [_str_ok(col, java), *([_in(col, f.enum, java)] if f.enum else [])]
        if not f.optional:
            return checks
        # a field with a default may be absent (or null): the reader takes the default (f.default).
        # Java: a null column is exactly that (any other non-string is a json_error). Fallback:
        # JSON_VALUE is null for an array or an object too, which the contract rejects; JSON_EXISTS
        # is false only for an absent or null value.
        absent = f"{col} IS NULL" if java else f"NOT JSON_EXISTS(line, '$.{f.name}')"
        return [f"({absent} OR {' AND '.join(checks)})"]
    if f.type == "int":
        check = _int_ok(col, _bound(f.minimum), _bound(f.maximum))
        return [f"({_raw_column(f)} IS NULL OR {check})" if f.nullable else check]
    check = _num_ok(col, f.minimum, f.maximum)
    return [f"({_raw_column(f)} IS NULL OR {check})" if f.nullable else check]


def _bound(value: float | None) -> int | None:
    return None if value is None else int(value)


def _valid(kind: str, java: bool) -> str:
    """Validity of a kind's typed columns; ``{v_ok}`` is the schema-version check of the parse path."""
    checks = ["{v_ok}"]
    for f in ALL_EVENT_TYPES[kind].FIELDS:
        checks += _field_checks(f, java)
    return " AND ".join([*checks, *_relations(kind, java)])


def source_table(kind: str) -> str:
    return f"spool_{kind}"


def _interval(seconds: float) -> str:
    """A day-to-second interval literal (a SECOND literal overflows past 99 s; Flink allows only
    the default day precision, so bounds are capped at 99 days)."""
    ms = round(min(max(0.0, seconds), 99 * 86400.0) * 1000)
    days, ms = divmod(ms, 86_400_000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    sec, ms = divmod(ms, 1000)
    return f"INTERVAL '{days} {h:02d}:{m:02d}:{sec:02d}.{ms:03d}' DAY TO SECOND(3)"


#: The spool source of the Java path (streaming/java: SpoolTableFactory).
SPOOL_CONNECTOR = "llmsla-spool"


def _ms(seconds: float) -> str:
    """A duration option (capped like _interval, so the source and the SQL checks agree)."""
    return f"{round(min(max(0.0, seconds), 99 * 86400.0) * 1000)} ms"


def source_ddl(cfg: Config, kind: str, *, bounded: bool, java: bool = True) -> str:
    """The source table of a kind and its watermark.

    Java path, spool: the ``llmsla-spool`` connector (streaming/java) reads each writer's segments
    in order and emits the watermark itself (``SOURCE_WATERMARK()``): per reader, the minimum over
    its active writers' progress and its unread segments' starts, minus the delay; a backlog of any
    size and order lands in its windows. Kafka: the Kafka connector with the same per-row watermark
    expression as before (per-partition watermarks, min-combined by Flink). Fallback (no javac):
    Flink's filesystem connector, raw lines, that expression; it reads the segments one scan finds
    in no set order, so a backlog of several writers gives ``late`` dead letters (documented).
    With ``java`` the llmsla-json format parses each line once into typed columns plus the raw line
    and its JSON-shape problem."""
    s = cfg.stream
    delay_s = s.watermark_delay_s + s.allowed_lateness_s
    delay_ms = round(delay_s * 1000)
    # The watermark operator rejects a null rowtime: unusable timestamps become 0 (1970), which
    # the range check keeps out of the watermark and the checked view sends to dead letters. The
    # Java format fills `rt` itself (a computed column would add a Calc that copies every row).
    rt = "rt TIMESTAMP_LTZ(3)" if java else f"rt AS TO_TIMESTAMP_LTZ(COALESCE(TRY_CAST({_sv('ts_ms')} AS BIGINT), 0), 3)"
    in_range = (
        f"rt BETWEEN NOW() - {_interval(s.max_past_s)} AND NOW() + {_interval(s.max_future_s)}"
    )
    watermark = f"CASE WHEN {in_range} THEN rt - {_interval(delay_ms / 1000)} END"
    fmt = format_options(kind) if java else "'format' = 'raw'"
    # BYTES on the Java path: the planner deep-copies a STRING column at every Calc that reads it,
    # once per row (TypeCheckUtils.isMutable), and passes byte arrays on by reference; only a dead
    # letter ever reads the line or the file (dead_letter_query)
    columns = ["line BYTES" if java else "line STRING"]
    if java:
        columns += [f"{JSON_ERROR} STRING", *(f"{col} {typ}" for col, typ in format_columns(kind))]
    if s.source == "kafka":
        topic = f"{s.kafka_topic_prefix}{kind}"
        meta = "`file` AS CAST(NULL AS STRING)"  # Kafka records have no file; the topic says where
        conn = (
            f"'connector' = 'kafka', 'topic' = '{topic}', 'properties.bootstrap.servers' = "
            f"'{s.kafka_bootstrap}', 'properties.group.id' = 'llmsla-stream', "
            f"'scan.startup.mode' = 'group-offsets', 'properties.auto.offset.reset' = 'earliest', {fmt}"
        )
    elif java:
        path = (cfg.spool_dir() / kind).resolve().as_uri()
        meta = "`file` BYTES NOT NULL METADATA FROM 'file.path' VIRTUAL"
        watermark = "SOURCE_WATERMARK()"
        conn = (
            f"'connector' = '{SPOOL_CONNECTOR}', 'path' = '{path}', 'bounded' = '{str(bounded).lower()}', "
            f"'monitor-interval' = '{max(1, round(s.monitor_interval_s * 1000))} ms', "
            f"'watermark-delay' = '{_ms(delay_s)}', 'watermark-interval' = '{s.watermark_interval_ms} ms', "
            f"'idle-timeout' = '{_ms(s.idle_timeout_s)}', 'max-past' = '{_ms(s.max_past_s)}', "
            f"'max-future' = '{_ms(s.max_future_s)}', {fmt}"
        )
    else:
        path = (cfg.spool_dir() / kind).resolve().as_uri()
        meta = "`file` STRING METADATA FROM 'file.path' VIRTUAL"  # nullable: see checked_query
        conn = f"'connector' = 'filesystem', 'path' = '{path}', {fmt}"
        if not bounded:
            conn += f", 'source.monitor-interval' = '{max(1, round(s.monitor_interval_s * 1000))} ms'"
    cols = ",\n  ".join([*columns, rt, meta] if java else [*columns, meta, rt])  # scan order: no reordering Calc
    return (
        f"CREATE TEMPORARY TABLE {source_table(kind)} (\n"
        f"  {cols},\n"
        f"  WATERMARK FOR rt AS {watermark}\n"
        f") WITH ({conn})"
    )


def checked_query(cfg: Config, kind: str, *, java: bool = True) -> str:
    """Typed columns plus ``verdict``: '' (use it), invalid, future, past or late.

    ``java``: the source's typed columns feed the predicates, and a line with a JSON-shape
    problem (not one object, wrong JSON type, unknown or repeated field) is invalid. Otherwise one
    JSON_VALUE per column (the pure-SQL fallback)."""
    s = cfg.stream
    window_ms = WINDOW_OF_KIND[kind] * 1000
    if java:
        valid = f"{JSON_ERROR} IS NULL AND " + _valid(kind, java).replace("{v_ok}", "(v IS NULL OR v = 1)")
        typed = ", ".join(col for col, _ in format_columns(kind))
        # an `r` column (ttft_raw) tells "absent or null" from "not a number" on the fallback;
        # here a non-number is a json_error, so it is the typed column itself
        spec = _spec(kind)
        typed_of = {path: col for col, path, t in spec if t != "r"}
        aliases = "".join(f", {typed_of[path]} AS {col}" for col, path, t in spec if t == "r")
        inner = f"SELECT line, `file`, rt, {JSON_ERROR}, {typed}{aliases}\n  FROM {source_table(kind)}"
    else:
        valid = _valid(kind, java).replace("{v_ok}", "(v IS NULL OR v = '1')")
        # RAND() makes each parsed column non-deterministic, so the planner cannot merge this
        # Calc into the checks above it: merging would inline every JSON_VALUE at each of its ~5
        # uses (measured: ~150 JSON parses per line instead of 20, 6x slower end to end).
        cols = ",\n    ".join(f"CASE WHEN RAND() < 2 THEN {expr} END AS {name}" for name, expr in fallback_columns(kind))
        # blank lines (only space, tab, CR: llmsla.spool.is_blank) are skipped, as by the format
        inner = (f"SELECT line, `file`, rt,\n    {cols}\n"
                 f"  FROM {source_table(kind)} WHERE REGEXP(line, '[^ \\t\\r]')")
    # The fallback plans both outputs as one tree: `line IS NOT NULL AND file IS NOT NULL` (always
    # true) makes the window output read the columns the dead letters need, so the planner keeps one
    # watermark assigner instead of one per output (two could disagree about what is late). On
    # the Java path the outputs are planned together and share this view as one block.
    if not java:
        valid = f"{valid} AND line IS NOT NULL AND `file` IS NOT NULL"
    # late: the watermark has closed the record's window; for engine samples, the watermark has
    # passed the record itself, because their counter increases are taken in event-time order by
    # an OVER aggregation, which drops a record behind its watermark (engine_deltas_query)
    late_at = ("rt" if kind in ORDERED_KINDS else
               f"TO_TIMESTAMP_LTZ(ts_ms - MOD(ts_ms, {window_ms}) + {window_ms - 1}, 3)")
    return f"""SELECT *,
  CASE
    WHEN ({valid}) IS NOT TRUE THEN 'invalid'
    WHEN rt > NOW() + {_interval(s.max_future_s)} THEN 'future'
    WHEN rt < NOW() - {_interval(s.max_past_s)} THEN 'past'
    WHEN CURRENT_WATERMARK(rt) IS NOT NULL
         AND {late_at} <= CURRENT_WATERMARK(rt)
      THEN 'late'
    ELSE ''
  END AS verdict
FROM (
  {inner}
)"""


def _json_array(cols: list[str]) -> str:
    return "JSON_ARRAY(" + ", ".join(cols) + " NULL ON NULL)"


#: Label columns of the window tables: the only text a window row carries besides its
#: histograms (whose array text holds digits, brackets, ``:``, ``=`` and commas only).
TEXT_COLUMNS = frozenset({*names.REQUEST_SERIES_LABELS, names.L_ZONE, names.L_POLICY_ID, names.L_NODE, names.L_ENGINE})
_TAB, _LF, _CR = (f"U&'\\{ord(c):04X}'" for c in "\t\n\r")


def _copy_field(expr: str, column: str) -> str:
    """One field of a COPY text line: the time as a UTC ``timestamptz`` literal, a label with
    backslash, tab, newline and carriage return escaped, a number as Flink casts it (``1.0E-4``,
    ``NaN``, ``Infinity``: all read by PostgreSQL), NULL as ``\\N``. A label is BYTES on the Java
    path (_SQL_TYPE): the CAST reads its UTF-8 (valid: the format checked it)."""
    if column == "bucket":  # epoch ms; table.local-time-zone is UTC (job.flink_settings)
        text = f"CONCAT(DATE_FORMAT(TO_TIMESTAMP_LTZ({expr}, 3), 'yyyy-MM-dd HH:mm:ss.SSS'), '+00')"
    elif column in TEXT_COLUMNS:
        text = f"REPLACE(CAST({expr} AS STRING), '\\', '\\\\')"
        for char, escape in ((_TAB, "\\t"), (_LF, "\\n"), (_CR, "\\r")):
            text = f"REPLACE({text}, {char}, '{escape}')"
    else:
        text = f"CAST({expr} AS STRING)"
    return f"COALESCE({text}, '\\N')"  # also types the line NOT NULL, like the dead letters' payload


def _copy_line(columns: tuple[str, ...], exprs: list[str] | None = None) -> str:
    """A window row as one line of PostgreSQL's COPY text format (without its newline), built
    on the JVM so the sink writes a window's lines into COPY as they come (StoreWriter): no
    decoding, no per-value conversion in Python (~24 of ~28 µs of the sink's CPU per row).
    ``exprs``: the SQL of each column's value where it is not the column's own name."""
    exprs = list(columns) if exprs is None else exprs
    assert len(exprs) == len(columns)
    return f"CONCAT_WS({_TAB}, " + ", ".join(_copy_field(e, c) for e, c in zip(exprs, columns, strict=True)) + ")"


def request_stats_query(cfg: Config, java: bool = True) -> str:
    """One row per 5 s window and labels: its ``window_time`` as ``stats_time`` (a window over it
    has a ``window_time`` of its own) and the values of :data:`REQUEST_COLUMNS`, typed (the
    payloads and the minute roll-up rows read them)."""
    w = names.REQUEST_WINDOW_S
    slos = slo_catalog.load(cfg)  # within-SLO counts against the specs' thresholds
    ttft_slo, e2e_slo = float(slos.ttft_ms), float(slos.e2e_ms)
    # tenant and class are optional on the wire: a line without them (written before tenants)
    # is the default tenant's and class's, as the event contract reads it
    labels = {names.L_TENANT: f"COALESCE({names.L_TENANT}, {_text(names.DEFAULT_TENANT, java)})",
              names.L_CLASS: f"COALESCE(`{names.L_CLASS}`, {_text(names.DEFAULT_CLASS, java)})"}
    # goodput by each request's own objectives: a spec that targets its tenant or class wins
    goodput = GoodputBounds.from_catalog(slos).sql(
        status_ok=f"status = {_text(names.STATUS_OK, java)}", tenant=labels[names.L_TENANT],
        class_=labels[names.L_CLASS], text=lambda v: _text(v, java))
    keys = ", ".join([*names.REQUEST_LABELS, *labels.values()])
    inner = f"""SELECT model, pool, replica, arm, {', '.join(f'{e} AS `{c}`' for c, e in labels.items())}, window_time,
    MIN(ts_ms) - MOD(MIN(ts_ms), {w * 1000}) AS bucket,
    COUNT(*) AS requests,
    COUNT(*) FILTER (WHERE status = {_text(names.STATUS_OK, java)}) AS ok,
    COUNT(*) FILTER (WHERE status = {_text(names.STATUS_ERROR, java)}) AS errors,
    COUNT(*) FILTER (WHERE status = {_text(names.STATUS_TIMEOUT, java)}) AS timeouts,
    COUNT(*) FILTER (WHERE status = {_text(names.STATUS_CANCELLED, java)}) AS cancelled,
    COUNT(*) FILTER (WHERE status = {_text(names.STATUS_REJECTED, java)}) AS rejected,
    {_percentiles('ttft_ms', (0.5, 0.95, 0.99), java)} AS ttft_p,
    {_percentiles('e2e_ms', (0.5, 0.95, 0.99), java)} AS e2e_p,
    {_percentiles('queue_ms', (0.99,), java)} AS queue_p99,
    SUM(prompt_tokens) AS prompt_tokens,
    SUM(output_tokens) AS output_tokens,
    COUNT(*) FILTER (WHERE ttft_ms <= {ttft_slo!r}) AS ttft_within,
    COUNT(*) FILTER (WHERE e2e_ms <= {e2e_slo!r}) AS e2e_within,
    COUNT(*) FILTER (WHERE {goodput}) AS goodput,
    COUNT(ttft_ms) AS ttft_count,
    {_histogram('ttft_ms', java)} AS ttft_hist,
    {_histogram('e2e_ms', java)} AS e2e_hist,
    COALESCE(SUM(ttft_ms), 0.0) AS ttft_sum,
    SUM(e2e_ms) AS e2e_sum,
    SUM(itl_n) AS itl_n,
    SUM(itl_n * itl_mean) AS itl_sum,
    SUM(itl_n * (itl_std * itl_std + itl_mean * itl_mean)) AS itl_sumsq
  FROM TABLE(TUMBLE(TABLE usable_{names.SPOOL_REQUESTS}, DESCRIPTOR(rt), INTERVAL '{w}' SECOND))
  GROUP BY window_start, window_end, window_time, {keys}"""
    itl_mean = "CASE WHEN itl_n > 0 THEN itl_sum / itl_n END"
    itl_jitter = (
        f"CASE WHEN itl_n > 0 THEN SQRT(GREATEST(itl_sumsq / itl_n - ({itl_mean}) * ({itl_mean}), 0.0)) END"
    )
    exprs = [
        "bucket", "model", "pool", "replica", "arm", "tenant", "class", "requests", "ok", "errors", "timeouts",
        "cancelled", "rejected", f"CAST(requests AS DOUBLE) / {w}", "ttft_p[1]", "ttft_p[2]",
        "ttft_p[3]", "e2e_p[1]", "e2e_p[2]", "e2e_p[3]", itl_mean, itl_jitter, "queue_p99",
        "prompt_tokens", "output_tokens", f"CAST(output_tokens AS DOUBLE) / {w}",
        f"{ttft_slo!r}", f"{e2e_slo!r}", "ttft_within", "e2e_within", "ttft_count", "ttft_sum",
        "e2e_sum", "itl_n", "itl_sum", "itl_sumsq", "goodput", "ttft_hist", "e2e_hist",
    ]
    assert len(exprs) == len(REQUEST_COLUMNS)
    cols = ", ".join(e if e == c else f"{e} AS {c}" for e, c in zip(exprs, REQUEST_COLUMNS, strict=True))
    return f"SELECT window_time AS stats_time, {cols} FROM (\n  {inner}\n)"


def request_windows_query(stats_view: str) -> str:
    """One row per 5 s window and labels: ``window_time, payload`` (batched by :func:`build`)."""
    return f"SELECT stats_time AS window_time, {_copy_line(REQUEST_COLUMNS)} AS payload FROM {stats_view}"


def request_minutes_query(stats_view: str) -> str:
    """The 1 m roll-up rows of the 5 s windows (Java path): ``window_time, payload`` with
    :data:`MINUTE_COLUMNS`. A cascaded window on the 5 s rows' ``window_time``: it closes when the
    watermark passes the minute, after every 5 s window of it was emitted (they are final), so a
    minute row is complete and is written as is (the store's trigger no longer sums each 5 s
    window into its minute, docs/streaming.md). The quantile columns come from the summed
    histograms, with ``llmsla_hist_quantile``'s definition (HistogramQuantile.java), so the store
    computes none of them for the job's minutes."""
    m = 60
    aggs = {"windows": "COUNT(*)", **{c: f"SUM({c})" for c in rollups.SUMS},
            **{col: f"MAX({src})" for col, src in rollups.maxes()},
            **{h: f"{HISTOGRAM_SUM_FUNCTION}({h})" for h in rollups.HISTS}}
    quantiles = {c: f"{HISTOGRAM_QUANTILE_FUNCTION}({h}, {q!r}E0)" for c, h, q in rollups.QUANTILES}
    keys = ", ".join(f"`{k}`" for k in schema.REQUEST_KEYS[1:])
    assert [*aggs, *quantiles] == list(MINUTE_COLUMNS[len(schema.REQUEST_KEYS):])
    inner = (f"SELECT window_time, MIN(bucket) - MOD(MIN(bucket), {m * 1000}) AS bucket, "
             f"{keys},\n    "
             + ",\n    ".join(f"{a} AS {c}" for c, a in aggs.items())
             + f"\n  FROM TABLE(TUMBLE(TABLE {stats_view}, DESCRIPTOR(stats_time), INTERVAL '{m}' SECOND))\n"
             f"  GROUP BY window_start, window_end, window_time, {keys}")
    exprs = [quantiles.get(c, c) for c in MINUTE_COLUMNS]
    return f"SELECT window_time, {_copy_line(MINUTE_COLUMNS, exprs)} AS payload FROM (\n  {inner}\n)"


POLICY_TRACES_VIEW = "policy_traces"


def policy_traces_query() -> str:
    """Per (window, zone, policy, trace): latency = max(ts) - min(ts) of the trace's spans."""
    w = names.POLICY_WINDOW_S
    return f"""SELECT zone, policy_id, trace_id, window_time AS trace_rt,
  CAST(MAX(ts_ms) - MIN(ts_ms) AS DOUBLE) AS latency
FROM TABLE(TUMBLE(TABLE usable_{names.SPOOL_POLICY}, DESCRIPTOR(rt), INTERVAL '{w}' SECOND))
GROUP BY zone, policy_id, trace_id, window_start, window_end, window_time"""


def policy_windows_query(cfg: Config, java: bool = True) -> str:
    w = names.POLICY_WINDOW_S
    src = f"TABLE(TUMBLE(TABLE usable_{names.SPOOL_POLICY}, DESCRIPTOR(rt), INTERVAL '{w}' SECOND))"
    decisions = f"""SELECT zone, policy_id, window_start, window_end,
      MIN(ts_ms) - MOD(MIN(ts_ms), {w * 1000}) AS bucket,
      COUNT(*) AS decisions, AVG(temperature) AS t_mean, STDDEV_POP(temperature) AS t_std,
      {_percentiles('duration_ms', (0.99,), java)} AS decide_p99
    FROM {src}
    GROUP BY zone, policy_id, window_start, window_end"""
    traces = f"""SELECT zone, policy_id, window_start, window_end, COUNT(*) AS traces,
      {_percentiles('latency', (0.5, 0.99), java)} AS lat_p
    FROM TABLE(TUMBLE(TABLE {POLICY_TRACES_VIEW}, DESCRIPTOR(trace_rt), INTERVAL '{w}' SECOND))
    GROUP BY zone, policy_id, window_start, window_end"""
    cols = ["d.bucket", "d.zone", "d.policy_id", "d.decisions", "t.traces", "d.t_mean", "d.t_std",
            "t.lat_p[1]", "t.lat_p[2]", "d.decide_p99"]
    assert len(cols) == len(POLICY_COLUMNS)
    return f"""SELECT '{names.T_POLICY_WINDOWS}' AS kind, {_copy_line(POLICY_COLUMNS, cols)} AS payload
FROM ({decisions}) d JOIN ({traces}) t
  ON d.window_start = t.window_start AND d.window_end = t.window_end
 AND d.zone = t.zone AND d.policy_id = t.policy_id"""


def gpu_windows_query(cfg: Config, java: bool = True) -> str:
    """One row per 5 s window and GPU: ``window_time, payload`` (batched by :func:`build`)."""
    w = names.GPU_WINDOW_S
    inner = f"""SELECT node, gpu, window_time,
    MIN(ts_ms) - MOD(MIN(ts_ms), {w * 1000}) AS bucket,
    COUNT(*) AS samples, MAX(mem_used) AS mem_max, AVG(CAST(mem_used AS DOUBLE)) AS mem_mean,
    MAX(mem_total) AS mem_total, AVG(util) AS util_mean, MAX(temp_c) AS temp_max,
    AVG(power_w) AS power_mean
  FROM TABLE(TUMBLE(TABLE usable_{names.SPOOL_GPU}, DESCRIPTOR(rt), INTERVAL '{w}' SECOND))
  GROUP BY window_start, window_end, window_time, node, gpu"""
    cols = ["bucket", "node", "gpu", "samples", "mem_max", "mem_mean", "mem_total", "util_mean",
            "temp_max", "power_mean"]
    assert len(cols) == len(GPU_COLUMNS)
    return f"SELECT window_time, {_copy_line(GPU_COLUMNS, cols)} AS payload FROM (\n  {inner}\n)"


#: Kinds read in event-time order per series before they are windowed (their late rule is the
#: record's own time, checked_query).
ORDERED_KINDS: frozenset[str] = frozenset({names.SPOOL_ENGINE})
ENGINE_DELTAS_VIEW = "engine_deltas"
#: EngineSample counters whose increase the window sums: (column, its increase's name).
ENGINE_COUNTERS: tuple[tuple[str, str], ...] = (
    ("preemptions_total", "d_preempt"), ("ttft_sum", "d_ttft_sum"), ("ttft_count", "d_ttft_count"))


#: SQL name of the increase of an engine's histogram on the store's layout
#: (streaming/java/.../NativeHistogram.java on names.HIST_BOUNDS_MS).
NATIVE_HISTOGRAM_FUNCTION = "LLMSLA_NATIVE_HIST_DELTA"


def engine_deltas_query(java: bool = True) -> str:
    """Each usable engine sample with the increase of each counter since the replica's previous
    sample (event-time order; an OVER aggregation, which keeps the time attribute for the window).

    Reset-safe, as the contract says (llmsla.events.EngineSample): where ``counter_reset`` is 1, or
    the counter went down, the sample's value is the increase; the replica's first sample, or one
    after a sample without that counter, has no known increase (null). The TTFT histogram's
    increase, per bucket by the same rule and spread onto the store's layout, is computed on the
    JVM (NativeHistogram.java; null on the pure-SQL fallback)."""
    over = "OVER (PARTITION BY pool, replica, engine ORDER BY rt)"
    lagged = [c for c, _ in ENGINE_COUNTERS] + (["ttft_buckets"] if java else [])
    lags = ", ".join(f"LAG({c}) {over} AS prev_{c}" for c in lagged)
    inner = f"SELECT *, {lags} FROM usable_{names.SPOOL_ENGINE}"
    deltas = ", ".join(
        f"CASE WHEN {c} IS NULL OR prev_{c} IS NULL THEN CAST(NULL AS DOUBLE) "
        f"WHEN counter_reset = 1 OR {c} < prev_{c} THEN CAST({c} AS DOUBLE) "
        f"ELSE CAST({c} - prev_{c} AS DOUBLE) END AS {d}"
        for c, d in ENGINE_COUNTERS)
    hist = (f"{NATIVE_HISTOGRAM_FUNCTION}(ttft_buckets, prev_ttft_buckets, CAST(counter_reset AS INT))" if java
            else "CAST(NULL AS STRING)")
    return (f"SELECT rt, ts_ms, pool, replica, engine, waiting_n, running_n, kv_usage, prefix_cache_hit_rate, "
            f"counter_reset, {deltas}, {hist} AS d_ttft_hist\nFROM (\n  {inner}\n)")


def engine_windows_query(cfg: Config, java: bool = True) -> str:
    """One row per 5 s window and (pool, replica, engine): ``window_time, payload``. Gauges as
    mean and max over the window's samples (null when the engine exposes none); preemptions and
    the engine's TTFT count and sum as the increases of samples in the window (engine_deltas_query);
    TTFT mean = sum / count of those increases, in ms (the histogram's sum is in seconds); the
    TTFT histogram as the sum of its increases on the store's layout (null on the fallback)."""
    w = names.ENGINE_WINDOW_S
    hist = f"{HISTOGRAM_SUM_FUNCTION}(d_ttft_hist)" if java else "CAST(NULL AS STRING)"
    inner = f"""SELECT pool, replica, engine, window_time,
    MIN(ts_ms) - MOD(MIN(ts_ms), {w * 1000}) AS bucket,
    COUNT(*) AS samples, AVG(waiting_n) AS waiting_mean, MAX(waiting_n) AS waiting_max,
    AVG(running_n) AS running_mean, MAX(running_n) AS running_max,
    AVG(kv_usage) AS kv_usage_mean, MAX(kv_usage) AS kv_usage_max,
    SUM(d_preempt) AS preemptions, AVG(prefix_cache_hit_rate) AS hit_rate_mean,
    SUM(d_ttft_count) AS ttft_count, SUM(d_ttft_sum) * 1000 AS ttft_sum_ms,
    SUM(counter_reset) AS counter_resets, {hist} AS ttft_hist
  FROM TABLE(TUMBLE(TABLE {ENGINE_DELTAS_VIEW}, DESCRIPTOR(rt), INTERVAL '{w}' SECOND))
  GROUP BY window_start, window_end, window_time, pool, replica, engine"""
    cols = ["bucket", "pool", "replica", "engine", "samples", "waiting_mean", "waiting_max", "running_mean",
            "running_max", "kv_usage_mean", "kv_usage_max", "preemptions", "hit_rate_mean", "ttft_count",
            "ttft_sum_ms", "CASE WHEN ttft_count > 0 THEN ttft_sum_ms / ttft_count END", "counter_resets", "ttft_hist"]
    assert len(cols) == len(ENGINE_COLUMNS)
    return f"SELECT window_time, {_copy_line(ENGINE_COLUMNS, cols)} AS payload FROM (\n  {inner}\n)"


def dead_letter_query(kind: str, java: bool = True) -> str:
    problem = JSON_ERROR if java else "CAST(NULL AS STRING)"
    # the Java path's line and file are BYTES (source_ddl): the line's base64 byte for byte (a CAST
    # to STRING would replace invalid UTF-8); a path is text
    raw, file = (f"{BASE64_FUNCTION}(line)", "CAST(`file` AS STRING)") if java else ("TO_BASE64(line)", "`file`")
    cols = [f"'{kind}'", file, "verdict", problem, raw]
    return (
        f"SELECT '{DEAD_LETTERS}' AS kind, {_json_array(cols)} AS payload "
        f"FROM checked_{kind} WHERE verdict <> ''"
    )


#: The 5 s request windows, typed: read by their payloads and by the minute roll-up rows.
REQUEST_STATS_VIEW = f"{names.SPOOL_REQUESTS}_window_stats"
WINDOW_QUERIES: dict[str, Callable[[Config, bool], str]] = {
    names.SPOOL_REQUESTS: lambda cfg, java: request_windows_query(REQUEST_STATS_VIEW),
    names.SPOOL_POLICY: policy_windows_query,
    names.SPOOL_GPU: gpu_windows_query,
    names.SPOOL_ENGINE: engine_windows_query,
}
#: kinds whose window rows reach the sink batched, one element per window: (table, window seconds).
#: The policy windows join two windowed streams (no time attribute survives the join), and are
#: few (one row a minute per zone and policy): one element per row.
BATCHED: dict[str, tuple[str, int]] = {
    names.SPOOL_REQUESTS: (names.T_REQUEST_WINDOWS, names.REQUEST_WINDOW_S),
    names.SPOOL_GPU: (names.T_GPU_WINDOWS, names.GPU_WINDOW_S),
    names.SPOOL_ENGINE: (names.T_ENGINE_WINDOWS, names.ENGINE_WINDOW_S),
}
#: Tables whose output elements each carry a whole window's rows (:func:`batched_query`; the 1 m
#: roll-up's too): the sink writes such an element at once, in its own transaction.
WINDOW_BATCH_TABLES: frozenset[str] = frozenset({t for t, _ in BATCHED.values()} | {names.T_REQUEST_WINDOWS_1M})
#: between the rows of a batched payload: a COPY text line never holds a raw newline (a label's
#: is escaped, :func:`_copy_field`)
ROW_SEPARATOR = "\n"


def batched_query(table: str, rows_view: str, window_s: int) -> str:
    """All rows of a window in one output element: their payloads joined by newlines.

    Every element costs the Python sink operator a hand-over from the JVM and state writes; with
    256 label combinations a window is one element instead of 256 (what that saves on 2 busy
    cores is within the machine's noise: docs/streaming.md). A cascaded window on the rows'
    ``window_time`` closes on the watermark that emitted them, so the batch adds no latency, and a
    replayed window is the same batch again (the sink upserts rows on their keys)."""
    sep = f"U&'\\{ord(ROW_SEPARATOR):04X}'"
    return (f"SELECT '{table}' AS kind, LISTAGG(payload, {sep}) AS payload\n"
            f"FROM TABLE(TUMBLE(TABLE {rows_view}, DESCRIPTOR(window_time), INTERVAL '{window_s}' SECOND))\n"
            "GROUP BY window_start, window_end")


def build(cfg: Config, kinds: tuple[str, ...] = names.SPOOL_ALL_KINDS, *, bounded: bool, java: bool = True) -> JobSql:
    """Sources and views for every kind, and the two outputs (all window rows; all dead letters).

    ``java`` needs the jar of streaming/java on the classpath (the llmsla-json format) and the
    PERCENTILE_SETS functions registered; otherwise the pure-SQL parse and Flink's PERCENTILE."""
    ddl: list[str] = []
    views: list[tuple[str, str]] = []
    windows: list[str] = []
    dead: list[str] = []
    for kind in kinds:
        ddl.append(source_ddl(cfg, kind, bounded=bounded, java=java))
        views += [(f"checked_{kind}", checked_query(cfg, kind, java=java)),
                  (f"usable_{kind}", f"SELECT * FROM checked_{kind} WHERE verdict = ''")]
        if kind == names.SPOOL_POLICY:
            views.append((POLICY_TRACES_VIEW, policy_traces_query()))
        if kind == names.SPOOL_REQUESTS:
            views.append((REQUEST_STATS_VIEW, request_stats_query(cfg, java)))
        if kind == names.SPOOL_ENGINE:
            views.append((ENGINE_DELTAS_VIEW, engine_deltas_query(java)))
        query = WINDOW_QUERIES[kind](cfg, java)
        if kind in BATCHED:
            table, window_s = BATCHED[kind]
            views.append((f"{kind}_window_rows", query))
            query = batched_query(table, f"{kind}_window_rows", window_s)
        windows.append(query)
        if kind == names.SPOOL_REQUESTS and java:  # without javac: no histograms to sum
            views.append((f"{kind}_minute_rows", request_minutes_query(REQUEST_STATS_VIEW)))
            windows.append(batched_query(names.T_REQUEST_WINDOWS_1M, f"{kind}_minute_rows", 60))
        dead.append(dead_letter_query(kind, java))
    def output(queries: list[str]) -> str:  # one row type for both outputs (they are unioned)
        union = "\nUNION ALL\n".join(f"({q})" for q in queries)
        return f"SELECT CAST(kind AS STRING) AS kind, CAST(payload AS STRING) AS payload FROM (\n{union}\n)"

    return JobSql(ddl=ddl, views=views, window_query=output(windows), dead_letter_query=output(dead))
