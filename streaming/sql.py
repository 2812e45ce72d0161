"""The job's Flink SQL, generated from the event contracts and the configuration.

Why this shape:

* Each spool kind is read as ``raw`` lines (plus the ``file.path`` metadata), not with the
  ``json`` format: the json format silently skips a line it cannot parse or convert, and a dead
  letter needs the raw line. Fields are pulled with ``JSON_VALUE`` on the JVM, so a good record
  never touches Python.
* Validity is decided in SQL on the typed columns (nulls, ranges, enums, cross-field rules of
  ``llmsla.events``). Only rejected lines go to Python, where the contract itself names the reason.
* The watermark ignores timestamps outside ``[now - max_past, now + max_future]``: one line
  stamped next year must not make every later record late.
* A record is *late* when its window has already been emitted: ``window_end - 1 ms <=
  CURRENT_WATERMARK(rt)``. The window operator sits after a shuffle, so its watermark is never
  ahead of the one seen here; a record kept here is therefore never dropped there, and every
  record lands in exactly one place: a window or a dead letter.
* Allowed lateness is folded into the watermark delay: window TVFs emit once, so a window row in
  the store is final and never revised.
* Every output is encoded as ``(kind, JSON array of the target table's columns)`` and unioned,
  so one Python operator writes all tables (fewer Python workers on a small machine).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmsla import names
from llmsla.config import Config
from llmsla.events import POLICY_ACTIONS

#: Output kind of dead letters in the unioned output stream.
DEAD_LETTERS = names.T_DEAD_LETTERS

#: Columns the job writes, per target table, in payload order (the sink COPYs them as is).
REQUEST_COLUMNS: tuple[str, ...] = (
    "bucket", "model", "pool", "replica", "arm", "requests", "ok", "errors", "timeouts",
    "cancelled", "rejected", "qps", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p50_ms",
    "e2e_p95_ms", "e2e_p99_ms", "itl_mean_ms", "itl_jitter_ms", "queue_p99_ms", "prompt_tokens",
    "output_tokens", "output_tps", "ttft_slo_ms", "e2e_slo_ms", "ttft_within_slo", "e2e_within_slo",
    "ttft_count", "ttft_sum_ms", "e2e_sum_ms", "itl_n", "itl_sum_ms", "itl_sumsq_ms2",
)
POLICY_COLUMNS: tuple[str, ...] = (
    "bucket", "zone", "policy_id", "decisions", "traces", "temperature_mean", "temperature_jitter",
    "latency_p50_ms", "latency_p99_ms", "decide_p99_ms",
)
GPU_COLUMNS: tuple[str, ...] = (
    "bucket", "node", "gpu", "samples", "mem_used_max_bytes", "mem_used_mean_bytes",
    "mem_total_bytes", "util_mean", "temp_max_c", "power_mean_w",
)
#: Dead-letter payload: spool kind, file, verdict (invalid|future|past|late), raw line.
DEAD_COLUMNS: tuple[str, ...] = ("source", "file", "verdict", "raw")

TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    names.T_REQUEST_WINDOWS: REQUEST_COLUMNS,
    names.T_POLICY_WINDOWS: POLICY_COLUMNS,
    names.T_GPU_WINDOWS: GPU_COLUMNS,
}
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    names.T_REQUEST_WINDOWS: ("bucket", *names.REQUEST_LABELS),
    names.T_POLICY_WINDOWS: ("bucket", names.L_ZONE, names.L_POLICY_ID),
    names.T_GPU_WINDOWS: ("bucket", names.L_NODE, names.L_GPU),
}
WINDOW_OF_KIND: dict[str, int] = {
    names.SPOOL_REQUESTS: names.REQUEST_WINDOW_S,
    names.SPOOL_POLICY: names.POLICY_WINDOW_S,
    names.SPOOL_GPU: names.GPU_WINDOW_S,
}

_DOUBLE_MAX = "1.7976931348623157E308"


@dataclass(frozen=True)
class JobSql:
    """Everything the job executes, in order: DDL, then the one query whose rows the sink gets."""

    ddl: list[str]
    output_query: str


def _sv(path: str) -> str:
    return f"JSON_VALUE(line, '$.{path}')"


def _int(path: str) -> str:
    return f"TRY_CAST({_sv(path)} AS BIGINT)"


def _num(path: str) -> str:
    return f"TRY_CAST({_sv(path)} AS DOUBLE)"


def _str_ok(col: str) -> str:
    return f"({col} IS NOT NULL AND CHAR_LENGTH({col}) BETWEEN 1 AND 256)"


def _num_ok(col: str, lo: float | None = 0, hi: float | None = None) -> str:
    parts = [f"{col} IS NOT NULL", f"ABS({col}) <= {_DOUBLE_MAX}"]
    if lo is not None:
        parts.append(f"{col} >= {lo!r}")
    if hi is not None:
        parts.append(f"{col} <= {hi!r}")
    return "(" + " AND ".join(parts) + ")"


def _int_ok(col: str, lo: int | None = 0) -> str:
    return f"({col} IS NOT NULL" + (f" AND {col} >= {lo}" if lo is not None else "") + ")"


def _in(col: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join("'" + v.replace("'", "''") + "'" for v in values)
    return f"{col} IN ({quoted})"


# Per kind: (column, JSON path, type) with type s string, i integer, n number, v schema version
# (an integer that must not be an explicit null), r the raw string of a path also read as a number
# (to tell "absent/null" from "not a number"). Both parse paths derive their columns from this and
# the validity predicate below; both mirror llmsla.events FIELDS / _check_relations, and tests feed
# the same bad lines to both.
_SPEC: dict[str, list[tuple[str, str, str]]] = {
    names.SPOOL_REQUESTS: [
        ("v", "v", "v"), ("ts_ms", "ts_ms", "i"), ("trace_id", "trace_id", "s"),
        ("model", "model", "s"), ("pool", "pool", "s"), ("replica", "replica", "s"),
        ("arm", "arm", "s"), ("policy", "policy", "s"), ("prompt_tokens", "prompt_tokens", "i"),
        ("output_tokens", "output_tokens", "i"), ("queue_ms", "queue_ms", "n"),
        ("ttft_raw", "ttft_ms", "r"), ("ttft_ms", "ttft_ms", "n"), ("itl_n", "itl_ms.n", "i"),
        ("itl_mean", "itl_ms.mean", "n"), ("itl_std", "itl_ms.std", "n"),
        ("itl_max", "itl_ms.max", "n"), ("e2e_ms", "e2e_ms", "n"), ("status", "status", "s"),
    ],
    names.SPOOL_POLICY: [
        ("v", "v", "v"), ("ts_ms", "ts_ms", "i"), ("trace_id", "trace_id", "s"),
        ("span_id", "span_id", "s"), ("policy_id", "policy_id", "s"), ("zone", "zone", "s"),
        ("step", "step", "i"), ("temperature", "temperature", "n"), ("action", "action", "s"),
        ("trigger_", "trigger", "s"), ("duration_ms", "duration_ms", "n"),
    ],
    names.SPOOL_GPU: [
        ("v", "v", "v"), ("ts_ms", "ts_ms", "i"), ("node", "node", "s"), ("gpu", "gpu", "i"),
        ("uuid", "uuid", "s"), ("mem_used", "mem_used_bytes", "i"),
        ("mem_total", "mem_total_bytes", "i"), ("util", "util", "n"), ("temp_c", "temp_c", "n"),
        ("power_w", "power_w", "n"),
    ],
}

_SQL_EXTRACT = {"s": _sv, "v": _sv, "r": _sv, "i": _int, "n": _num}

#: Pure-SQL parse (the fallback without javac): one JSON_VALUE per column.
_FIELDS: dict[str, list[tuple[str, str]]] = {
    kind: [(col, _SQL_EXTRACT[t](path)) for col, path, t in spec] for kind, spec in _SPEC.items()
}

#: Names of the Java functions (streaming/java, registered by the job before the DDL).
JSON_FIELDS = "JSON_FIELDS"
JSON_LONG = "JSON_LONG"


def udf_spec(kind: str) -> tuple[str, dict[str, int]]:
    """The JSON_FIELDS spec literal of a kind and each path's 1-based slot in its result; the
    result's last slot (len + 1) is the type/unknown-field flag."""
    slots: dict[str, int] = {}
    parts: list[str] = []
    for _, path, t in _SPEC[kind]:
        if t == "r" or path in slots:
            continue
        slots[path] = len(parts) + 1
        parts.append(f"{path}:{t}")
    return ",".join(parts), slots


def _udf_fields(kind: str) -> list[tuple[str, str]]:
    _, slots = udf_spec(kind)
    cast = {"i": "BIGINT", "n": "DOUBLE"}
    out = []
    for col, path, t in _SPEC[kind]:
        ref = f"_f[{slots[path]}]"
        out.append((col, f"TRY_CAST({ref} AS {cast[t]})" if t in cast else ref))
    return out


_VALID: dict[str, str] = {
    names.SPOOL_REQUESTS: " AND ".join([
        "(v IS NULL OR v = '1')", _int_ok("ts_ms"),
        *(_str_ok(c) for c in ("trace_id", "model", "pool", "replica", "arm", "policy", "status")),
        _in("status", names.STATUSES), _int_ok("prompt_tokens"), _int_ok("output_tokens"),
        _num_ok("queue_ms"), _num_ok("e2e_ms"),
        f"(ttft_raw IS NULL OR {_num_ok('ttft_ms')})",
        _int_ok("itl_n"), _num_ok("itl_mean"), _num_ok("itl_std"), _num_ok("itl_max"),
        "(itl_n = 0 OR itl_max >= itl_mean)",
        "(ttft_ms IS NULL OR ttft_ms <= e2e_ms)", "queue_ms <= e2e_ms",
        f"NOT (status = '{names.STATUS_OK}' AND ttft_ms IS NULL AND output_tokens > 0)",
    ]),
    names.SPOOL_POLICY: " AND ".join([
        "(v IS NULL OR v = '1')", _int_ok("ts_ms"),
        *(_str_ok(c) for c in ("trace_id", "span_id", "policy_id", "zone", "action", "trigger_")),
        _in("action", POLICY_ACTIONS), _int_ok("step"), _num_ok("temperature", 0, 100),
        _num_ok("duration_ms"),
    ]),
    names.SPOOL_GPU: " AND ".join([
        "(v IS NULL OR v = '1')", _int_ok("ts_ms"), _str_ok("node"), _str_ok("uuid"),
        _int_ok("gpu"), _int_ok("mem_used"), _int_ok("mem_total"), "mem_used <= mem_total",
        _num_ok("util", 0, 1), _num_ok("temp_c", -50, 200), _num_ok("power_w"),
    ]),
}


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


def source_ddl(cfg: Config, kind: str, *, bounded: bool, udf: bool = True) -> str:
    """Raw-line source with a bounded-out-of-orderness watermark on the event time (``udf``: the
    computed ``rt`` reads ts_ms with JSON_LONG, which stops at the field, instead of JSON_VALUE)."""
    s = cfg.stream
    delay_ms = round((s.watermark_delay_s + s.allowed_lateness_s) * 1000)
    # The watermark operator rejects a null rowtime: unusable timestamps become 0 (1970), which
    # the range check keeps out of the watermark and the checked view sends to dead letters.
    ts_ms = f"{JSON_LONG}(line, 'ts_ms')" if udf else f"TRY_CAST({_sv('ts_ms')} AS BIGINT)"
    ts = f"COALESCE({ts_ms}, 0)"
    in_range = (
        f"rt BETWEEN NOW() - {_interval(s.max_past_s)} AND NOW() + {_interval(s.max_future_s)}"
    )
    if s.source == "kafka":
        topic = f"{s.kafka_topic_prefix}{kind}"
        meta = "`file` AS CAST(NULL AS STRING)"  # Kafka records have no file; the topic says where
        conn = (
            f"'connector' = 'kafka', 'topic' = '{topic}', 'properties.bootstrap.servers' = "
            f"'{s.kafka_bootstrap}', 'properties.group.id' = 'llmsla-stream', "
            "'scan.startup.mode' = 'group-offsets', 'properties.auto.offset.reset' = 'earliest', "
            "'format' = 'raw'"
        )
    else:
        path = (cfg.spool_dir() / kind).resolve().as_uri()
        meta = "`file` STRING NOT NULL METADATA FROM 'file.path' VIRTUAL"
        conn = f"'connector' = 'filesystem', 'path' = '{path}', 'format' = 'raw'"
        if not bounded:
            conn += f", 'source.monitor-interval' = '{max(1, round(s.monitor_interval_s * 1000))} ms'"
    return (
        f"CREATE TEMPORARY TABLE {source_table(kind)} (\n"
        f"  line STRING,\n  {meta},\n"
        f"  rt AS TO_TIMESTAMP_LTZ({ts}, 3),\n"
        f"  WATERMARK FOR rt AS CASE WHEN {in_range} THEN rt - {_interval(delay_ms / 1000)} END\n"
        f") WITH ({conn})"
    )


def checked_view(cfg: Config, kind: str, *, udf: bool = True) -> str:
    """Typed columns plus ``verdict``: '' (use it), invalid, future, past or late.

    ``udf``: one JSON_FIELDS call parses the line; its typed slots feed the same predicates, and a
    null result (not one JSON object) or a set flag (wrong JSON type, unknown field) is invalid.
    Otherwise one JSON_VALUE per column (the pure-SQL fallback)."""
    s = cfg.stream
    window_ms = WINDOW_OF_KIND[kind] * 1000
    # RAND() makes each parsed column non-deterministic, so the planner cannot merge this Calc
    # into the checks above it: merging would inline every JSON_VALUE at each of its ~5 uses
    # (measured: ~150 JSON parses per line instead of 20, 6x slower end to end).
    fields = _udf_fields(kind) if udf else _FIELDS[kind]
    cols = ",\n    ".join(f"CASE WHEN RAND() < 2 THEN {expr} END AS {name}" for name, expr in fields)
    valid = _VALID[kind]
    source = f"{source_table(kind)} WHERE CHAR_LENGTH(TRIM(line)) > 0"
    if udf:
        spec, slots = udf_spec(kind)
        cols += f",\n    _f IS NOT NULL AND _f[{len(slots) + 1}] IS NULL AS json_ok"
        valid = f"json_ok AND {valid}"
        # the same RAND() fence: JSON_FIELDS must stay one call, not be inlined into each column
        source = (f"(SELECT line, `file`, rt, CASE WHEN RAND() < 2 THEN {JSON_FIELDS}(line, '{spec}') END AS _f\n"
                  f"    FROM {source})")
    return f"""CREATE TEMPORARY VIEW checked_{kind} AS
SELECT *,
  CASE
    WHEN ({valid}) IS NOT TRUE THEN 'invalid'
    WHEN rt > NOW() + {_interval(s.max_future_s)} THEN 'future'
    WHEN rt < NOW() - {_interval(s.max_past_s)} THEN 'past'
    WHEN CURRENT_WATERMARK(rt) IS NOT NULL
         AND TO_TIMESTAMP_LTZ(ts_ms - MOD(ts_ms, {window_ms}) + {window_ms - 1}, 3) <= CURRENT_WATERMARK(rt)
      THEN 'late'
    ELSE ''
  END AS verdict
FROM (
  SELECT line, `file`, rt,
    {cols}
  FROM {source}
)"""


def _json_array(cols: list[str]) -> str:
    return "JSON_ARRAY(" + ", ".join(cols) + " NULL ON NULL)"


def request_windows_query(cfg: Config) -> str:
    w = names.REQUEST_WINDOW_S
    ttft_slo, e2e_slo = float(cfg.slo.ttft_ms), float(cfg.slo.e2e_ms)
    inner = f"""SELECT model, pool, replica, arm,
    MIN(ts_ms) - MOD(MIN(ts_ms), {w * 1000}) AS bucket,
    COUNT(*) AS requests,
    COUNT(*) FILTER (WHERE status = '{names.STATUS_OK}') AS ok,
    COUNT(*) FILTER (WHERE status = '{names.STATUS_ERROR}') AS errors,
    COUNT(*) FILTER (WHERE status = '{names.STATUS_TIMEOUT}') AS timeouts,
    COUNT(*) FILTER (WHERE status = '{names.STATUS_CANCELLED}') AS cancelled,
    COUNT(*) FILTER (WHERE status = '{names.STATUS_REJECTED}') AS rejected,
    PERCENTILE(ttft_ms, ARRAY[0.5, 0.95, 0.99]) AS ttft_p,
    PERCENTILE(e2e_ms, ARRAY[0.5, 0.95, 0.99]) AS e2e_p,
    PERCENTILE(queue_ms, 0.99) AS queue_p99,
    SUM(prompt_tokens) AS prompt_tokens,
    SUM(output_tokens) AS output_tokens,
    COUNT(*) FILTER (WHERE ttft_ms <= {ttft_slo!r}) AS ttft_within,
    COUNT(*) FILTER (WHERE e2e_ms <= {e2e_slo!r}) AS e2e_within,
    COUNT(ttft_ms) AS ttft_count,
    COALESCE(SUM(ttft_ms), 0.0) AS ttft_sum,
    SUM(e2e_ms) AS e2e_sum,
    SUM(itl_n) AS itl_n,
    SUM(itl_n * itl_mean) AS itl_sum,
    SUM(itl_n * (itl_std * itl_std + itl_mean * itl_mean)) AS itl_sumsq
  FROM TABLE(TUMBLE(TABLE usable_{names.SPOOL_REQUESTS}, DESCRIPTOR(rt), INTERVAL '{w}' SECOND))
  GROUP BY window_start, window_end, model, pool, replica, arm"""
    itl_mean = "CASE WHEN itl_n > 0 THEN itl_sum / itl_n END"
    itl_jitter = (
        f"CASE WHEN itl_n > 0 THEN SQRT(GREATEST(itl_sumsq / itl_n - ({itl_mean}) * ({itl_mean}), 0.0)) END"
    )
    cols = [
        "bucket", "model", "pool", "replica", "arm", "requests", "ok", "errors", "timeouts",
        "cancelled", "rejected", f"CAST(requests AS DOUBLE) / {w}", "ttft_p[1]", "ttft_p[2]",
        "ttft_p[3]", "e2e_p[1]", "e2e_p[2]", "e2e_p[3]", itl_mean, itl_jitter, "queue_p99",
        "prompt_tokens", "output_tokens", f"CAST(output_tokens AS DOUBLE) / {w}",
        f"{ttft_slo!r}", f"{e2e_slo!r}", "ttft_within", "e2e_within", "ttft_count", "ttft_sum",
        "e2e_sum", "itl_n", "itl_sum", "itl_sumsq",
    ]
    assert len(cols) == len(REQUEST_COLUMNS)
    return f"SELECT '{names.T_REQUEST_WINDOWS}' AS kind, {_json_array(cols)} AS payload FROM (\n  {inner}\n)"


POLICY_TRACES_VIEW = "policy_traces"


def policy_traces_view() -> str:
    """Per (window, zone, policy, trace): latency = max(ts) - min(ts) of the trace's spans."""
    w = names.POLICY_WINDOW_S
    return f"""CREATE TEMPORARY VIEW {POLICY_TRACES_VIEW} AS
SELECT zone, policy_id, trace_id, window_time AS trace_rt,
  CAST(MAX(ts_ms) - MIN(ts_ms) AS DOUBLE) AS latency
FROM TABLE(TUMBLE(TABLE usable_{names.SPOOL_POLICY}, DESCRIPTOR(rt), INTERVAL '{w}' SECOND))
GROUP BY zone, policy_id, trace_id, window_start, window_end, window_time"""


def policy_windows_query(cfg: Config) -> str:
    w = names.POLICY_WINDOW_S
    src = f"TABLE(TUMBLE(TABLE usable_{names.SPOOL_POLICY}, DESCRIPTOR(rt), INTERVAL '{w}' SECOND))"
    decisions = f"""SELECT zone, policy_id, window_start, window_end,
      MIN(ts_ms) - MOD(MIN(ts_ms), {w * 1000}) AS bucket,
      COUNT(*) AS decisions, AVG(temperature) AS t_mean, STDDEV_POP(temperature) AS t_std,
      PERCENTILE(duration_ms, 0.99) AS decide_p99
    FROM {src}
    GROUP BY zone, policy_id, window_start, window_end"""
    traces = f"""SELECT zone, policy_id, window_start, window_end, COUNT(*) AS traces,
      PERCENTILE(latency, ARRAY[0.5, 0.99]) AS lat_p
    FROM TABLE(TUMBLE(TABLE {POLICY_TRACES_VIEW}, DESCRIPTOR(trace_rt), INTERVAL '{w}' SECOND))
    GROUP BY zone, policy_id, window_start, window_end"""
    cols = ["d.bucket", "d.zone", "d.policy_id", "d.decisions", "t.traces", "d.t_mean", "d.t_std",
            "t.lat_p[1]", "t.lat_p[2]", "d.decide_p99"]
    assert len(cols) == len(POLICY_COLUMNS)
    return f"""SELECT '{names.T_POLICY_WINDOWS}' AS kind, {_json_array(cols)} AS payload
FROM ({decisions}) d JOIN ({traces}) t
  ON d.window_start = t.window_start AND d.window_end = t.window_end
 AND d.zone = t.zone AND d.policy_id = t.policy_id"""


def gpu_windows_query(cfg: Config) -> str:
    w = names.GPU_WINDOW_S
    inner = f"""SELECT node, gpu,
    MIN(ts_ms) - MOD(MIN(ts_ms), {w * 1000}) AS bucket,
    COUNT(*) AS samples, MAX(mem_used) AS mem_max, AVG(CAST(mem_used AS DOUBLE)) AS mem_mean,
    MAX(mem_total) AS mem_total, AVG(util) AS util_mean, MAX(temp_c) AS temp_max,
    AVG(power_w) AS power_mean
  FROM TABLE(TUMBLE(TABLE usable_{names.SPOOL_GPU}, DESCRIPTOR(rt), INTERVAL '{w}' SECOND))
  GROUP BY window_start, window_end, node, gpu"""
    cols = ["bucket", "node", "gpu", "samples", "mem_max", "mem_mean", "mem_total", "util_mean",
            "temp_max", "power_mean"]
    assert len(cols) == len(GPU_COLUMNS)
    return f"SELECT '{names.T_GPU_WINDOWS}' AS kind, {_json_array(cols)} AS payload FROM (\n  {inner}\n)"


def dead_letter_query(kind: str) -> str:
    cols = [f"'{kind}'", "`file`", "verdict", "line"]
    return (
        f"SELECT '{DEAD_LETTERS}' AS kind, {_json_array(cols)} AS payload "
        f"FROM checked_{kind} WHERE verdict <> ''"
    )


WINDOW_QUERIES = {
    names.SPOOL_REQUESTS: request_windows_query,
    names.SPOOL_POLICY: policy_windows_query,
    names.SPOOL_GPU: gpu_windows_query,
}


def build(cfg: Config, kinds: tuple[str, ...] = names.SPOOL_KINDS, *, bounded: bool, udf: bool = True) -> JobSql:
    """DDL for every kind and the union of all window and dead-letter outputs; ``udf`` needs
    JSON_FIELDS / JSON_LONG registered first (see streaming/udf.py), else the pure-SQL parse."""
    ddl: list[str] = []
    outputs: list[str] = []
    for kind in kinds:
        ddl += [source_ddl(cfg, kind, bounded=bounded, udf=udf), checked_view(cfg, kind, udf=udf),
                f"CREATE TEMPORARY VIEW usable_{kind} AS SELECT * FROM checked_{kind} WHERE verdict = ''"]
        if kind == names.SPOOL_POLICY:
            ddl.append(policy_traces_view())
        outputs += [WINDOW_QUERIES[kind](cfg), dead_letter_query(kind)]
    return JobSql(ddl=ddl, output_query="\nUNION ALL\n".join(f"({q})" for q in outputs))
