"""The 1-minute and 1-hour roll-ups of ``request_windows``, from one column list.

Tables kept current by a trigger on plain PostgreSQL, continuous aggregates on TimescaleDB, with
the same names and columns. Counts, sums and histograms roll up exactly; a percentile cannot be
merged, so the worst window's P99 stays beside the histograms' quantiles. The column set is
versioned per migration so replaying them builds exactly what an upgraded store has.
See docs/store.md#tables-llmslastoremigrations0001_coresql-names-in-llmslanamespy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from llmsla import names
from llmsla.store import schema

#: Bucket origin of the plain flavour's date_bin (epoch-aligned like time_bucket).
ORIGIN = "TIMESTAMPTZ '2000-01-01 00:00:00+00'"
KEYS: tuple[str, ...] = tuple(schema.REQUEST_KEYS[1:])

ROLLUPS: dict[str, str] = {
    names.T_REQUEST_WINDOWS_1M: "1 minute",
    names.T_REQUEST_WINDOWS_1H: "1 hour",
}

#: The 5 s columns each roll-up sums, keeps the maximum of, and merges (histograms, migration
#: 0005, summed by ``llmsla_hist_sum``): declared with the columns in :mod:`llmsla.store.schema`.
SUMS: tuple[str, ...] = schema.REQUEST_SUMS
_MAXES = schema.REQUEST_MAXES
HISTS = schema.REQUEST_HISTS
#: Quantile columns of the roll-ups from the summed histograms: (column, histogram, q).
QUANTILES: tuple[tuple[str, str, float], ...] = tuple(
    (f"{h.removesuffix('_hist')}_p{round(q * 100)}_ms", h, q) for h in HISTS for q in (0.5, 0.95, 0.99)
)




@dataclass(frozen=True)
class Shape:
    """The roll-ups' key and summed columns as of a migration. A migration's SQL is rendered
    from the shape the tables had when it ran (its frozen file must not change when a later one
    adds columns): :data:`PRE_0013` for 0001-0012, :data:`HEAD` (the module's default) after."""

    keys: tuple[str, ...]
    sums: tuple[str, ...]


#: Before migration 0013 added tenant, class and goodput (schema.REQUEST_ADDED_0013).
PRE_0013 = Shape(names.REQUEST_LABELS, tuple(c for c in schema.REQUEST_SUMS if c not in schema.REQUEST_ADDED_0013))
HEAD = Shape(KEYS, SUMS)


@contextmanager
def shaped(shape: Shape) -> Iterator[None]:
    """Render with ``shape``'s columns: the renderers below read :data:`KEYS`, :data:`SUMS` and
    :data:`VALUE_COLUMNS` when called, so migrations 0001-0012 render (and freeze) exactly as they
    did. Used by :mod:`llmsla.store.migrate` only; rendering is single-threaded."""
    global KEYS, SUMS, VALUE_COLUMNS
    saved = KEYS, SUMS, VALUE_COLUMNS
    KEYS, SUMS = shape.keys, shape.sums
    VALUE_COLUMNS = _value_columns()
    try:
        yield
    finally:
        KEYS, SUMS, VALUE_COLUMNS = saved


def _hist_aggregates() -> list[str]:
    """Aggregates of the histogram columns, the same over the 5 s table (integer[]) and a
    roll-up (bigint[]): the SQL functions are overloaded for both. One transition state per
    histogram serves its sum and its three quantiles (PostgreSQL shares it between aggregates
    with the same transition function and input)."""
    out = [f"llmsla_hist_sum({h})" for h in HISTS]
    out += [f"llmsla_hist_p{round(q * 100)}({h})" for _, h, q in QUANTILES]
    return out


def rollup_select(width: str, *, timescale: bool, hist: bool = True) -> str:
    bucket = (
        f"time_bucket(INTERVAL '{width}', bucket)"
        if timescale
        else f"date_bin(INTERVAL '{width}', bucket, {ORIGIN})"
    )
    pairs = [("bucket", f"{bucket} AS bucket"), *((k, k) for k in KEYS), ("windows", "count(*) AS windows")]
    pairs += [(c, f"sum({c}) AS {c}") for c in SUMS]
    pairs += [(f"{c}_max", f"max({c}) AS {c}_max") if c.endswith("_p99_ms") else (c, f"max({c}) AS {c}")
              for c in _MAXES]
    if hist:
        pairs += [(c, f"{a} AS {c}") for a, c in zip(_hist_aggregates(), _hist_columns(), strict=True)]
    # the order a plain store's tables have (0013 appended its columns), so both flavours agree
    expr = dict(pairs)
    cols = [expr[c] for c in schema.table_order(tuple(expr))]
    return (
        "SELECT " + ",\n       ".join(cols) + f"\nFROM {names.T_REQUEST_WINDOWS}\n"
        f"GROUP BY {bucket}, {', '.join(KEYS)}"
    )


def _hist_columns() -> list[str]:
    return [*HISTS, *(c for c, _, _ in QUANTILES)]


def rollup_ddl(*, timescale: bool, hist: bool = False) -> str:
    """Views (plain, before 0004) or continuous aggregates (TimescaleDB) of the roll-ups;
    ``hist=False`` is the shape migration 0001 created."""
    stmts = []
    for view, width in ROLLUPS.items():
        body = rollup_select(width, timescale=timescale, hist=hist)
        if timescale:
            stmts.append(
                f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view}\n"
                f"WITH (timescaledb.continuous, timescaledb.materialized_only = false) AS\n{body}\nWITH NO DATA;"
            )
        else:
            stmts.append(f"CREATE OR REPLACE VIEW {view} AS\n{body};")
    return "\n\n".join(stmts)


# -- plain PostgreSQL: materialised roll-ups -----------------------------------------------------
# A view over the 5 s table makes a 7-day panel aggregate every 5 s row (7.7M rows for 64
# replicas) and disappears with the 5 s partitions at retention. Migration 0003 therefore turns
# the plain flavour's roll-ups into tables kept current by a statement-level trigger on
# request_windows: the 1 m groups a statement touched are re-aggregated from their 5 s rows, then
# the touched 1 h groups from their 1 m rows. Re-aggregating (not adding deltas) keeps a replayed
# upsert idempotent and the *_max columns exact. TimescaleDB keeps its continuous aggregates.

#: Trigger function name (plain flavour); a later migration that adds roll-up columns re-renders it.
ROLLUP_FUNCTION = "llmsla_request_rollups"
_ROLLUP_LOCK = 0x11A5_0110  # pg_advisory_xact_lock key: one roll-up writer at a time


def rollup_columns(*, hist: bool = True) -> list[str]:
    """The roll-ups' columns after the key, in table order (``hist=False``: before 0005)."""
    cols = ["windows", *SUMS, *(f"{c}_max" if c.endswith("_p99_ms") else c for c in _MAXES)]
    return cols + _hist_columns() if hist else cols


def _aggregates(*, from_rollup: bool, hist: bool = True) -> list[str]:
    """Aggregate expressions for :func:`rollup_columns`, from 5 s rows or from a finer roll-up."""
    out = ["sum(windows)" if from_rollup else "count(*)"]
    out += [f"sum({c})" for c in SUMS]
    for c in _MAXES:
        src = f"{c}_max" if c.endswith("_p99_ms") and from_rollup else c
        out.append(f"max({src})")
    return out + _hist_aggregates() if hist else out


def _upsert(target: str, source: str, width: str, *, from_rollup: bool, keys_from: str, hist: bool = True) -> str:
    """Re-aggregate the ``width`` groups named by ``keys_from`` (rows with bucket + keys) from
    ``source`` into ``target``; one index range scan per touched group (LATERAL). The shape
    migrations 0004 and 0005 created (replayed as they were); request roll-ups add since 0007."""
    cols = rollup_columns(hist=hist)
    aggs = ", ".join(f"{a} AS {c}" for a, c in zip(_aggregates(from_rollup=from_rollup, hist=hist), cols, strict=True))
    key_eq = " AND ".join(f"s.{k} = g.{k}" for k in KEYS)
    keys = ", ".join(KEYS)
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols)
    return (
        f"INSERT INTO {target} (bucket, {keys}, {', '.join(cols)})\n"
        f"SELECT g.b, {', '.join('g.' + k for k in KEYS)}, a.*\n"
        f"FROM (SELECT DISTINCT date_bin(INTERVAL '{width}', bucket, {ORIGIN}) AS b, {keys} FROM {keys_from}) g,\n"
        f"LATERAL (SELECT {aggs} FROM {source} s\n"
        f"         WHERE s.bucket >= g.b AND s.bucket < g.b + INTERVAL '{width}' AND {key_eq}) a\n"
        f"WHERE a.windows > 0\n"
        f"ON CONFLICT (bucket, {keys}) DO UPDATE SET {sets}"
    )


def regroup_upsert(target: str, source: str, width: str, *, source_time: str, keys: tuple[str, ...],
                   columns: list[str], aggregates: list[str], keys_from: str, from_time: str) -> str:
    """Re-aggregate into ``target`` the ``width`` groups that rows of ``keys_from`` fall in, from
    ``source``: one range scan of ``source`` over the touched span, hash-joined to the touched
    groups (a per-group index lookup reads every key's rows of the span again, once per group).
    Re-aggregating, not adding deltas, keeps a replayed upsert idempotent and maxima exact."""
    bin_ = f"date_bin(INTERVAL '{width}', {{}}, {ORIGIN})"
    key_list = ", ".join(keys)
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns)
    return (
        f"WITH g AS (SELECT DISTINCT {bin_.format(from_time)} AS b, {key_list} FROM {keys_from})\n"
        f"INSERT INTO {target} (bucket, {key_list}, {', '.join(columns)})\n"
        f"SELECT g.b, {', '.join('g.' + k for k in keys)}, "
        + ", ".join(f"{a} AS {c}" for a, c in zip(aggregates, columns, strict=True)) + "\n"
        f"FROM {source} s JOIN g ON g.b = {bin_.format('s.' + source_time)} AND "
        + " AND ".join(f"s.{k} = g.{k}" for k in keys) + "\n"
        f"WHERE s.{source_time} >= (SELECT min(b) FROM g) AND s.{source_time} < (SELECT max(b) FROM g) + INTERVAL '{width}'\n"
        f"GROUP BY g.b, {', '.join('g.' + k for k in keys)}\n"
        f"ON CONFLICT (bucket, {key_list}) DO UPDATE SET {sets}"
    )


def rollup_tables_ddl() -> str:
    """Plain flavour, migration 0004: replace the roll-up views with tables, backfill them,
    install the trigger (the shape before 0005: no histogram columns)."""
    m1, h1 = names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H
    keys = ", ".join(KEYS)
    stmts = [f"DROP VIEW IF EXISTS {h1}", f"DROP VIEW IF EXISTS {m1}"]
    for table, width in ROLLUPS.items():
        # CREATE TABLE AS gives exactly the columns and types the views (and TimescaleDB's
        # continuous aggregates) expose
        stmts.append(f"CREATE TABLE {table} AS\n{rollup_select(width, timescale=False, hist=False)}\nWITH NO DATA")
        stmts.append(f"ALTER TABLE {table} ADD PRIMARY KEY (bucket, {keys})")
    stmts.append(f"INSERT INTO {m1}\n{rollup_select(ROLLUPS[m1], timescale=False, hist=False)}")
    stmts.append(_upsert(h1, m1, ROLLUPS[h1], from_rollup=True, keys_from=m1, hist=False))
    stmts.append(rollup_function_ddl(hist=False))
    for event in ("INSERT", "UPDATE"):  # a trigger with transition tables has one event
        stmts.append(
            f"CREATE TRIGGER {names.T_REQUEST_WINDOWS}_rollup_{event.lower()} AFTER {event} ON {names.T_REQUEST_WINDOWS}\n"
            f"REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION {ROLLUP_FUNCTION}()"
        )
    return ";\n\n".join(stmts) + ";"


def rollup_function_ddl(*, hist: bool = True) -> str:
    """The trigger function; the advisory lock serialises concurrent writers, and each statement
    inside it takes a fresh snapshot (READ COMMITTED), so the re-aggregation sees every row
    committed before it."""
    m1, h1 = names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H
    body = ";\n    ".join([
        f"PERFORM pg_advisory_xact_lock({_ROLLUP_LOCK})",
        _upsert(m1, names.T_REQUEST_WINDOWS, ROLLUPS[m1], from_rollup=False, keys_from="llmsla_new_rows",
                hist=hist).replace("\n", "\n    "),
        _upsert(h1, m1, ROLLUPS[h1], from_rollup=True, keys_from="llmsla_new_rows", hist=hist).replace("\n", "\n    "),
        "RETURN NULL",
    ])
    return (
        f"CREATE OR REPLACE FUNCTION {ROLLUP_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN\n    {body};\nEND $$"
    )


# -- migration 0005: latency histograms -----------------------------------------------------------
def rollup_hist_tables_ddl() -> str:
    """Plain flavour: the roll-up tables gain the histogram and quantile columns (NULL for the
    windows written before: they have no histogram), and the trigger function sums them."""
    stmts = []
    hist_types = {h: "bigint[]" for h in HISTS}
    for table in ROLLUPS:
        adds = [f"ADD COLUMN {c} {hist_types.get(c, 'double precision')}" for c in _hist_columns()]
        stmts.append(f"ALTER TABLE {table} " + ", ".join(adds))
    stmts.append(rollup_function_ddl())
    return ";\n\n".join(stmts) + ";"


#: Suffix of TimescaleDB's continuous aggregates as they were before 0005: kept (renamed, no
#: longer refreshed, aged out by their retention policy) rather than dropped with their history.
PRE_HIST_SUFFIX = "_pre0005"


def rollup_hist_caggs_ddl() -> str:
    """TimescaleDB: a continuous aggregate's query cannot be altered, so each roll-up is created
    anew with the histogram columns and materialised from the 5 s windows still kept; the old one
    is renamed and stops refreshing (its rows older than the 5 s retention survive there until
    its own retention drops them)."""
    stmts = []
    for view in ROLLUPS:
        old = f"{view}{PRE_HIST_SUFFIX}"
        stmts.append(f"ALTER MATERIALIZED VIEW {view} RENAME TO {old}")
        stmts.append(f"SELECT remove_continuous_aggregate_policy('{old}', if_exists => true)")
    stmts.append(rollup_ddl(timescale=True, hist=True).rstrip(";"))
    for view in ROLLUPS:
        stmts.append(f"CALL refresh_continuous_aggregate('{view}', NULL, NULL)")
    return ";\n\n".join(stmts) + ";"


#: The clause that gives a function the store's ``search_path`` (the one its migration ran with)
#: whatever its caller's; ``llmsla_hist_value`` has none so that it stays inlinable.
PINNED_SEARCH_PATH = "SET search_path FROM CURRENT"
#: (name, argument types) of the functions that carry :data:`PINNED_SEARCH_PATH`.
PINNED_FUNCTIONS: tuple[tuple[str, str], ...] = (
    ("llmsla_hist_quantile", "bigint[], double precision"),
    ("llmsla_hist_merge", "bigint[], bigint[], bigint[]"),
    *((f"llmsla_hist_final_p{p}", "bigint[]") for p in (50, 95, 99)),
)


def pin_search_path_ddl() -> str:
    """Migration 0010: pin the ``search_path`` of the functions a store created before it
    (0005 created them without; a continuous aggregate's refresh then failed to find
    ``llmsla_hist_quantile``)."""
    return "\n".join(f"ALTER FUNCTION {n}({a}) {PINNED_SEARCH_PATH};" for n, a in PINNED_FUNCTIONS)


def hist_functions_ddl() -> str:
    """The histogram SQL functions: ``llmsla_hist_add`` (the sum of two), the aggregate
    ``llmsla_hist_sum``, ``llmsla_hist_quantile(h, q)`` (:func:`llmsla.histogram.quantile`'s
    definition, with the same bucket values rendered in) and the per-quantile aggregates
    ``llmsla_hist_p50/p95/p99`` the roll-ups use (plain aggregates, valid in a continuous
    aggregate; one state shared with the sum).

    A function that calls another llmsla function resolves it when it runs, with the caller's
    ``search_path``; TimescaleDB materialises continuous aggregates with ``pg_catalog,
    pg_temp``, so those functions carry the store's own (:data:`PINNED_SEARCH_PATH`)."""
    values = ",".join(repr(v) for v in names.HIST_VALUES_MS)
    stmts = []
    for in_type in ("integer[]", "bigint[]"):
        stmts.append(f"""CREATE OR REPLACE FUNCTION llmsla_hist_add(s bigint[], h {in_type}) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    i integer;
    lo integer;
    hi integer;
BEGIN
    IF h IS NULL OR cardinality(h) = 0 THEN
        RETURN s;
    END IF;
    IF s IS NULL OR cardinality(s) = 0 THEN
        RETURN h::bigint[];
    END IF;
    lo := array_lower(h, 1);
    hi := array_upper(h, 1);
    IF lo < array_lower(s, 1) THEN
        s := array_fill(0::bigint, ARRAY[array_lower(s, 1) - lo], ARRAY[lo]) || s;
    END IF;
    IF hi > array_upper(s, 1) THEN
        s := s || array_fill(0::bigint, ARRAY[hi - array_upper(s, 1)]);
    END IF;
    FOR i IN lo..hi LOOP
        s[i] := s[i] + h[i];
    END LOOP;
    RETURN s;
END $$""")
    # the bucket values as an inlinable SQL function: plpgsql folds its array literal once into
    # the cached plan, where a CONSTANT array variable was parsed again on every call (~0.14 ms,
    # six times per roll-up row)
    stmts.append("CREATE OR REPLACE FUNCTION llmsla_hist_value(i integer) RETURNS double precision\n"
                 "LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT ('{@VALUES@}'::double precision[])[i + 1] $$"
                 .replace("@VALUES@", values))
    stmts.append("""CREATE OR REPLACE FUNCTION llmsla_hist_quantile(h bigint[], q double precision) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE @PINNED@ AS $$
DECLARE
    n bigint := 0;
    c bigint := 0;
    k double precision;
    i integer;
BEGIN
    IF h IS NULL OR q IS NULL OR cardinality(h) = 0 THEN
        RETURN NULL;
    END IF;
    IF q < 0 OR q > 1 THEN
        RAISE EXCEPTION 'llmsla_hist_quantile: q must be in [0, 1], got %', q;
    END IF;
    IF array_lower(h, 1) < 0 OR array_upper(h, 1) > @LAST@ THEN
        RAISE EXCEPTION 'llmsla_hist_quantile: buckets %..% outside the layout 0..@LAST@', array_lower(h, 1), array_upper(h, 1);
    END IF;
    FOR i IN array_lower(h, 1)..array_upper(h, 1) LOOP
        n := n + h[i];
    END LOOP;
    IF n = 0 THEN
        RETURN NULL;
    END IF;
    k := greatest(1, ceil(q * n));
    FOR i IN array_lower(h, 1)..array_upper(h, 1) LOOP
        c := c + h[i];
        IF c >= k THEN
            RETURN llmsla_hist_value(i);
        END IF;
    END LOOP;
    RETURN NULL;
END $$""".replace("@LAST@", str(len(names.HIST_VALUES_MS) - 1)).replace("@PINNED@", PINNED_SEARCH_PATH))
    stmts.append(_HIST_MERGE.replace("@PINNED@", PINNED_SEARCH_PATH))
    for q in (0.5, 0.95, 0.99):
        stmts.append(f"CREATE OR REPLACE FUNCTION llmsla_hist_final_p{round(q * 100)}(s bigint[]) RETURNS double precision\n"
                     f"LANGUAGE sql IMMUTABLE PARALLEL SAFE {PINNED_SEARCH_PATH} AS $$ SELECT llmsla_hist_quantile(s, {q!r}) $$")
    for in_type in ("integer[]", "bigint[]"):
        common = "SFUNC = llmsla_hist_add, STYPE = bigint[], COMBINEFUNC = llmsla_hist_add, PARALLEL = SAFE"
        stmts.append(f"CREATE OR REPLACE AGGREGATE llmsla_hist_sum({in_type}) ({common})")
        for q in (0.5, 0.95, 0.99):
            p = round(q * 100)
            stmts.append(f"CREATE OR REPLACE AGGREGATE llmsla_hist_p{p}({in_type}) ({common}, FINALFUNC = llmsla_hist_final_p{p})")
    return ";\n\n".join(stmts) + ";"


#: ``a + plus - minus`` with its P50/P95/P99 in one pass (the quantiles of ``llmsla_hist_quantile``):
#: the incremental roll-up trigger keeps a bucket's histogram and quantiles with it. Subtraction
#: (a replayed window's old counts) stays inside ``a``'s buckets and never below 0, so an
#: inconsistent roll-up cannot make the streaming sink's writes fail; zero edges are trimmed
#: (the subscripts keep the layout's bucket indices) and an all-zero histogram is NULL.
_HIST_MERGE = """CREATE OR REPLACE FUNCTION llmsla_hist_merge(a bigint[], plus bigint[], minus bigint[],
    OUT h bigint[], OUT p50 double precision, OUT p95 double precision, OUT p99 double precision)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE @PINNED@ AS $$
DECLARE
    lo integer;
    hi integer;
    i integer;
    n bigint := 0;
    c bigint := 0;
    k50 double precision;
    k95 double precision;
    k99 double precision;
BEGIN
    h := llmsla_hist_add(a, plus);
    IF h IS NULL OR cardinality(h) = 0 THEN
        h := NULL;
        RETURN;
    END IF;
    lo := array_lower(h, 1);
    hi := array_upper(h, 1);
    IF minus IS NOT NULL AND cardinality(minus) > 0 THEN
        FOR i IN greatest(lo, array_lower(minus, 1))..least(hi, array_upper(minus, 1)) LOOP
            h[i] := greatest(h[i] - minus[i], 0);
        END LOOP;
        WHILE lo <= hi AND h[lo] = 0 LOOP
            lo := lo + 1;
        END LOOP;
        WHILE hi >= lo AND h[hi] = 0 LOOP
            hi := hi - 1;
        END LOOP;
        IF lo > hi THEN
            h := NULL;
            RETURN;
        END IF;
        IF lo > array_lower(h, 1) OR hi < array_upper(h, 1) THEN
            h := ('[' || lo || ':' || hi || ']=' || h[lo:hi]::text)::bigint[];
        END IF;
    END IF;
    FOR i IN lo..hi LOOP
        n := n + h[i];
    END LOOP;
    k50 := greatest(1, ceil(0.5::double precision * n));
    k95 := greatest(1, ceil(0.95::double precision * n));
    k99 := greatest(1, ceil(0.99::double precision * n));
    FOR i IN lo..hi LOOP
        c := c + h[i];
        IF p50 IS NULL AND c >= k50 THEN
            p50 := llmsla_hist_value(i);
        END IF;
        IF p95 IS NULL AND c >= k95 THEN
            p95 := llmsla_hist_value(i);
        END IF;
        IF c >= k99 THEN
            p99 := llmsla_hist_value(i);
            EXIT;
        END IF;
    END LOOP;
END $$"""


# -- migration 0007: incremental roll-ups (plain PostgreSQL) -------------------------------------
# Re-aggregating every touched group from its rows made each flush of the streaming sink re-read
# and re-sum up to 60 one-minute histograms per series for the hour (bench/dashboards.py: twice
# the increments' cost already 10 minutes into an hour). Counts, sums and histograms add: an
# INSERT adds the new windows to their
# groups (maxima by GREATEST), an UPDATE (a replayed window) adds its new values and takes its old
# ones back, and re-aggregates only the maxima of the groups it touched (a maximum cannot be taken
# back). Both are commutative, so the order in which PostgreSQL fires the two statement triggers
# of an INSERT .. ON CONFLICT DO UPDATE does not matter. Invariant: every 5 s window is counted in
# its 1 m and 1 h groups (migration 0004 backfilled them, retention keeps roll-ups longer).

INCREMENT_FUNCTION = "llmsla_request_rollups_insert"
REPLAY_FUNCTION = "llmsla_request_rollups_update"
_QUANTILE_OUT = ("p50", "p95", "p99")


def maxes() -> list[tuple[str, str]]:
    """(roll-up column, 5 s column) of the maxima."""
    return [(f"{c}_max" if c.endswith("_p99_ms") else c, c) for c in _MAXES]


def _hist_set(h: str, target: str, plus: str, minus: str) -> str:
    """``(hist, its quantile columns) = merge(...)`` for an UPDATE SET list."""
    cols = [c for c, src, _ in QUANTILES if src == h]
    return (f"({h}, {', '.join(cols)}) = (SELECT m.h, {', '.join('m.' + o for o in _QUANTILE_OUT)} "
            f"FROM llmsla_hist_merge({target}.{h}, {plus}, {minus}) m)")


def _delta_select(width: str, *, rows: str, sign: str, values: list[str] | None = None) -> str:
    """The rows of a transition table (their ``values``; default: a 5 s row's sums, maxima and
    histograms) with their group bucket and a sign (+1 new, -1 old)."""
    if values is None:
        values = [*SUMS, *(src for _, src in maxes()), *HISTS]
    cols = ", ".join([*KEYS, *values])
    return f"SELECT {sign} AS sign, date_bin(INTERVAL '{width}', bucket, {ORIGIN}) AS b, {cols} FROM {rows}"


def _increment_sets() -> list[str]:
    """ON CONFLICT SET list adding a delta (EXCLUDED) to a roll-up row ``t``."""
    sets = ["windows = t.windows + EXCLUDED.windows"]
    sets += [f"{c} = COALESCE(t.{c} + EXCLUDED.{c}, t.{c}, EXCLUDED.{c})" for c in SUMS]
    sets += [f"{col} = GREATEST(t.{col}, EXCLUDED.{col})" for col, _ in maxes()]
    sets += [_hist_set(h, "t", f"EXCLUDED.{h}", "NULL") for h in HISTS]
    return sets


def _fresh_quantiles(target: str, width: str) -> str:
    """Set the quantiles of the groups the statement created (left NULL by the insert)."""
    keys = ", ".join(KEYS)
    fresh = " OR ".join(f"({c} IS NULL AND {src} IS NOT NULL)" for c, src, q in QUANTILES if q == 0.5)
    return (
        f"UPDATE {target} t SET {', '.join(_hist_set(h, 't', 'NULL', 'NULL') for h in HISTS)}\n"
        f"WHERE ({fresh}) AND (bucket, {keys}) IN "
        f"(SELECT date_bin(INTERVAL '{width}', bucket, {ORIGIN}), {keys} FROM llmsla_new_rows)"
    )


def _value_columns() -> list[str]:
    return ["windows", *SUMS, *(col for col, _ in maxes()), *HISTS]


VALUE_COLUMNS = _value_columns()


def _insert_increment(target: str, width: str) -> list[str]:
    """Add the new windows to their groups. A new group's quantiles are left NULL by the insert
    and set by the second statement: computing them for every row would be wasted on the rows
    that conflict (most of them: a group gets 12 or 720 windows), and a merge is the cost.
    The shape of migration 0007 (both roll-ups from the 5 s rows); 0008: :func:`_cascaded_increment`."""
    keys = ", ".join(KEYS)
    aggs = ["count(*) AS windows", *(f"sum({c}) AS {c}" for c in SUMS),
            *(f"max({src}) AS {col}" for col, src in maxes()), *(f"llmsla_hist_sum({h}) AS {h}" for h in HISTS)]
    insert = (
        f"INSERT INTO {target} AS t (bucket, {keys}, {', '.join(VALUE_COLUMNS)})\n"
        f"SELECT date_bin(INTERVAL '{width}', bucket, {ORIGIN}), {keys}, {', '.join(aggs)}\n"
        f"FROM llmsla_new_rows GROUP BY 1, {keys}\n"
        f"ON CONFLICT (bucket, {keys}) DO UPDATE SET {', '.join(_increment_sets())}"
    )
    return [insert, _fresh_quantiles(target, width)]


def _cascaded_increment() -> list[str]:
    """Migration 0008: the statement's new windows summed once into 1 m deltas, which go into
    ``request_windows_1m`` and, summed again, into ``request_windows_1h`` (one statement: a
    data-modifying CTE). 0007 summed the 5 s rows a second time for the hour: a histogram add in
    PL/pgSQL per window and histogram, the largest part of the sink's database time
    (bench/streaming.py --attribute); a 1 m delta holds up to 12 windows."""
    m1, h1 = names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H
    keys = ", ".join(KEYS)
    cols = ", ".join(VALUE_COLUMNS)
    minute = ["count(*)", *(f"sum({c})" for c in SUMS), *(f"max({src})" for _, src in maxes()),
              *(f"llmsla_hist_sum({h})" for h in HISTS)]
    hour = ["sum(windows)", *(f"sum({c})" for c in SUMS), *(f"max({col})" for col, _ in maxes()),
            *(f"llmsla_hist_sum({h})" for h in HISTS)]
    sets = ", ".join(_increment_sets())
    statement = (
        f"WITH d AS MATERIALIZED (\n"
        f"  SELECT date_bin(INTERVAL '{ROLLUPS[m1]}', bucket, {ORIGIN}) AS bucket, {keys}, "
        + ", ".join(f"{a} AS {c}" for a, c in zip(minute, VALUE_COLUMNS, strict=True)) + "\n"
        f"  FROM llmsla_new_rows GROUP BY 1, {keys}),\n"
        f"m AS (INSERT INTO {m1} AS t (bucket, {keys}, {cols})\n"
        f"      SELECT bucket, {keys}, {cols} FROM d\n"
        f"      ON CONFLICT (bucket, {keys}) DO UPDATE SET {sets})\n"
        f"INSERT INTO {h1} AS t (bucket, {keys}, {cols})\n"
        f"SELECT date_bin(INTERVAL '{ROLLUPS[h1]}', bucket, {ORIGIN}), {keys}, {', '.join(hour)}\n"
        f"FROM d GROUP BY 1, {keys}\n"
        f"ON CONFLICT (bucket, {keys}) DO UPDATE SET {sets}"
    )
    return [statement, _fresh_quantiles(m1, ROLLUPS[m1]), _fresh_quantiles(h1, ROLLUPS[h1])]


def _update_delta(target: str, width: str, max_source: str, *, source_is_rollup: bool,
                  counted: tuple[str, ...] | None = None, values: list[str] | None = None) -> str:
    """A replay: ``counted`` (default: the sums) and histograms += new - old; maxima
    re-aggregated from ``max_source`` (``values``: what the replayed rows give, :func:`_delta_select`)."""
    counted = SUMS if counted is None else counted
    keys = ", ".join(KEYS)
    d_aggs = [*(f"sum(sign * {c}) AS {c}" for c in counted),
              *(f"llmsla_hist_sum({h}) FILTER (WHERE sign > 0) AS {h}_plus" for h in HISTS),
              *(f"llmsla_hist_sum({h}) FILTER (WHERE sign < 0) AS {h}_minus" for h in HISTS)]
    max_src = [(col, col if source_is_rollup else src) for col, src in maxes()]
    x_aggs = ", ".join(f"max(s.{src}) AS {col}" for col, src in max_src)
    key_eq = " AND ".join(f"s.{k} = g.{k}" for k in KEYS)
    sets = [f"{c} = COALESCE(t.{c} + d.{c}, t.{c}, d.{c})" for c in counted]
    sets += [f"{col} = x.{col}" for col, _ in maxes()]
    sets += [_hist_set(h, "t", f"d.{h}_plus", f"d.{h}_minus") for h in HISTS]
    return (
        f"WITH d AS (SELECT b, {keys}, {', '.join(d_aggs)}\n"
        f"           FROM ({_delta_select(width, rows='llmsla_new_rows', sign='1', values=values)}\n"
        f"                 UNION ALL {_delta_select(width, rows='llmsla_old_rows', sign='-1', values=values)}) r\n"
        f"           GROUP BY b, {keys}),\n"
        f"x AS (SELECT g.b, {', '.join('g.' + k for k in KEYS)}, {x_aggs}\n"
        f"      FROM {max_source} s JOIN d g ON g.b = date_bin(INTERVAL '{width}', s.bucket, {ORIGIN}) AND {key_eq}\n"
        f"      WHERE s.bucket >= (SELECT min(b) FROM d) AND s.bucket < (SELECT max(b) FROM d) + INTERVAL '{width}'\n"
        f"      GROUP BY g.b, {', '.join('g.' + k for k in KEYS)})\n"
        f"UPDATE {target} t SET {', '.join(sets)}\n"
        f"FROM d JOIN x USING (b, {keys})\n"
        f"WHERE t.bucket = d.b AND " + " AND ".join(f"t.{k} = d.{k}" for k in KEYS)
    )


def _trigger_function(name: str, statements: list[str], *, skip_if: str | None = None) -> str:
    """A statement trigger's function: ``statements`` under the roll-up lock; none when ``skip_if``."""
    lock = f"PERFORM pg_advisory_xact_lock({_ROLLUP_LOCK})"
    skip = [f"IF {skip_if} THEN\n        RETURN NULL;\n    END IF"] if skip_if else []
    body = ";\n    ".join([*skip, lock, *(st.replace("\n", "\n    ") for st in statements), "RETURN NULL"])
    return f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$\nBEGIN\n    {body};\nEND $$"


def rollup_cascade_ddl() -> str:
    """Plain flavour, migration 0008: the insert trigger adds the hour's deltas from the minute's."""
    return _trigger_function(INCREMENT_FUNCTION, _cascaded_increment()) + ";"


def rollup_increments_ddl() -> str:
    """Plain flavour, migration 0007: the roll-up triggers become incremental."""
    m1, h1 = names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H
    t = names.T_REQUEST_WINDOWS
    # a roll-up row carries two histograms of up to a few hundred buckets: kept in the row (up to
    # a page) rather than TOASTed out of line, every incremental update rewrote them there
    stmts = [f"ALTER TABLE {table} SET (toast_tuple_target = 8160)" for table in ROLLUPS]
    stmts += [
        _trigger_function(INCREMENT_FUNCTION, [*_insert_increment(m1, ROLLUPS[m1]), *_insert_increment(h1, ROLLUPS[h1])]),
        _trigger_function(REPLAY_FUNCTION, [_update_delta(m1, ROLLUPS[m1], t, source_is_rollup=False),
                                            _update_delta(h1, ROLLUPS[h1], m1, source_is_rollup=True)]),
        f"DROP TRIGGER IF EXISTS {t}_rollup_insert ON {t}",
        f"DROP TRIGGER IF EXISTS {t}_rollup_update ON {t}",
        f"CREATE TRIGGER {t}_rollup_insert AFTER INSERT ON {t}\n"
        f"REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION {INCREMENT_FUNCTION}()",
        f"CREATE TRIGGER {t}_rollup_update AFTER UPDATE ON {t}\n"
        f"REFERENCING OLD TABLE AS llmsla_old_rows NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT "
        f"EXECUTE FUNCTION {REPLAY_FUNCTION}()",
        f"DROP FUNCTION IF EXISTS {ROLLUP_FUNCTION}()",
    ]
    return ";\n\n".join(stmts) + ";"


# -- migration 0009: the stream job writes the minutes (plain PostgreSQL) -------------------------
# Adding every 5 s window's two histograms to its minute in PL/pgSQL (~26 µs an add) was most of
# the stream sink's database time: ~0.4 s of a 0.5 s flush of 5,120 window rows (docs/streaming.md).
# The job now sums a minute's windows on the JVM (streaming/sql.py: request_minutes_query) and
# writes the complete minute itself, with WRITER_MINUTES = 'on' set in its transactions: the 5 s
# table's triggers then leave the roll-ups alone, and the 1 m table's triggers carry the minute
# rows into the hour (new - old, so a replayed minute adds nothing). Any other writer keeps the
# 5 s triggers (which also add the hour), and for it the 1 m triggers do nothing. The invariant
# stays: every 5 s window is counted once in its 1 m and 1 h groups.

#: Transaction setting of a writer that writes complete minute rows itself (the stream job's sink).
WRITER_MINUTES = "llmsla.writer_minutes"
MINUTE_INSERT_FUNCTION = "llmsla_minute_rollups_insert"
MINUTE_REPLAY_FUNCTION = "llmsla_minute_rollups_update"
_WRITER_MINUTES_ON = f"current_setting('{WRITER_MINUTES}', true) = 'on'"


def _hour_from_minutes() -> list[str]:
    """Add new minute rows to their hour (the hour half of :func:`_cascaded_increment`, from rows
    of the 1 m table instead of the statement's 1 m deltas)."""
    h1 = names.T_REQUEST_WINDOWS_1H
    keys = ", ".join(KEYS)
    hour = ["sum(windows)", *(f"sum({c})" for c in SUMS), *(f"max({col})" for col, _ in maxes()),
            *(f"llmsla_hist_sum({h})" for h in HISTS)]
    insert = (
        f"INSERT INTO {h1} AS t (bucket, {keys}, {', '.join(VALUE_COLUMNS)})\n"
        f"SELECT date_bin(INTERVAL '{ROLLUPS[h1]}', bucket, {ORIGIN}), {keys}, {', '.join(hour)}\n"
        f"FROM llmsla_new_rows GROUP BY 1, {keys}\n"
        f"ON CONFLICT (bucket, {keys}) DO UPDATE SET {', '.join(_increment_sets())}"
    )
    return [insert, _fresh_quantiles(h1, ROLLUPS[h1])]


def _hour_from_replayed_minutes() -> str:
    """A rewritten minute row: its hour's window count, sums and histograms += new - old; the
    hour's maxima re-aggregated from its minute rows (a maximum cannot be taken back)."""
    m1, h1 = names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H
    counted = ("windows", *SUMS)
    return _update_delta(h1, ROLLUPS[h1], m1, source_is_rollup=True, counted=counted, values=[*counted, *HISTS])


def writer_minutes_ddl() -> str:
    """Plain flavour, migration 0009: the 5 s triggers skip a writer's own minutes; the 1 m
    table's triggers add such a writer's minute rows to the hour."""
    m1 = names.T_REQUEST_WINDOWS_1M
    stmts = [
        *_writer_minutes_functions(),
        f"CREATE TRIGGER {m1}_hour_insert AFTER INSERT ON {m1}\n"
        f"REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION {MINUTE_INSERT_FUNCTION}()",
        f"CREATE TRIGGER {m1}_hour_update AFTER UPDATE ON {m1}\n"
        f"REFERENCING OLD TABLE AS llmsla_old_rows NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT "
        f"EXECUTE FUNCTION {MINUTE_REPLAY_FUNCTION}()",
    ]
    return ";\n\n".join(stmts) + ";"


def _writer_minutes_functions() -> list[str]:
    """The four roll-up trigger functions as of 0009 (the 5 s table's, which skip a writer's own
    minutes, and the 1 m table's, which add them to the hour), for the current shape."""
    m1, h1 = names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H
    t = names.T_REQUEST_WINDOWS
    not_writer = f"current_setting('{WRITER_MINUTES}', true) IS DISTINCT FROM 'on'"
    return [
        _trigger_function(INCREMENT_FUNCTION, _cascaded_increment(), skip_if=_WRITER_MINUTES_ON),
        _trigger_function(REPLAY_FUNCTION, [_update_delta(m1, ROLLUPS[m1], t, source_is_rollup=False),
                                            _update_delta(h1, ROLLUPS[h1], m1, source_is_rollup=True)],
                          skip_if=_WRITER_MINUTES_ON),
        _trigger_function(MINUTE_INSERT_FUNCTION, _hour_from_minutes(), skip_if=not_writer),
        _trigger_function(MINUTE_REPLAY_FUNCTION, [_hour_from_replayed_minutes()], skip_if=not_writer),
    ]


# -- migration 0013: tenant and class keys, goodput -----------------------------------------------
# The request windows and both roll-ups gain the request's tenant and class as key columns (the
# rows written before read as the defaults: names.DEFAULT_TENANT, names.DEFAULT_CLASS) and a
# goodput count (NULL before: not known). The primary keys grow by the two columns, so the
# stream job's upserts and the roll-up triggers' ON CONFLICT name them.

def _added_columns(goodput_type: str) -> str:
    return (f"ADD COLUMN {names.L_TENANT} text NOT NULL DEFAULT '{names.DEFAULT_TENANT}', "
            f"ADD COLUMN {names.L_CLASS} text NOT NULL DEFAULT '{names.DEFAULT_CLASS}', "
            f"ADD COLUMN goodput {goodput_type}")


def _new_key(table: str) -> str:
    return f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey, ADD PRIMARY KEY (bucket, {', '.join(KEYS)})"


def tenant_class_plain_ddl() -> str:
    """Plain flavour: the columns and keys on the 5 s table and the roll-up tables (sums of
    bigint are numeric there, as ``CREATE TABLE AS`` typed the others), and the trigger functions
    re-rendered with them. On a partitioned table both ALTERs reach every partition; the new
    primary key is built once per partition."""
    t = names.T_REQUEST_WINDOWS
    stmts = [f"ALTER TABLE {t} {_added_columns('bigint')}", _new_key(t)]
    for table in ROLLUPS:
        stmts += [f"ALTER TABLE {table} {_added_columns('numeric')}", _new_key(table)]
    stmts += _writer_minutes_functions()
    return ";\n\n".join(stmts) + ";"


#: Suffix of the continuous aggregates as they were before 0013 (kept like PRE_HIST_SUFFIX's).
PRE_TENANT_SUFFIX = "_pre0013"


def tenant_class_timescale_ddl() -> str:
    """TimescaleDB: the hypertable's converted chunks go back to the rowstore (its segmentby and
    primary key change; the columnstore policy, re-applied by maintenance after every migrate,
    converts them again), and the continuous aggregates are created anew with the new key, as
    0005 did (the old ones renamed, no longer refreshed)."""
    t = names.T_REQUEST_WINDOWS
    stmts = []
    for view in ROLLUPS:
        old = f"{view}{PRE_TENANT_SUFFIX}"
        stmts.append(f"ALTER MATERIALIZED VIEW {view} RENAME TO {old}")
        stmts.append(f"SELECT remove_continuous_aggregate_policy('{old}', if_exists => true)")
    stmts += [
        f"CALL remove_columnstore_policy('{t}', if_exists => true)",
        f"SELECT decompress_chunk(c, if_compressed => true) FROM show_chunks('{t}') c",
        f"ALTER TABLE {t} SET (timescaledb.enable_columnstore = false)",
        f"ALTER TABLE {t} {_added_columns('bigint')}",
        _new_key(t),
        f"ALTER TABLE {t} SET (timescaledb.enable_columnstore = true, "
        f"timescaledb.segmentby = '{', '.join(KEYS)}', timescaledb.orderby = 'bucket DESC')",
        rollup_ddl(timescale=True, hist=True).rstrip(";"),
    ]
    for view in ROLLUPS:
        stmts.append(f"CALL refresh_continuous_aggregate('{view}', NULL, NULL)")
    return ";\n\n".join(stmts) + ";"


def writer_minutes_upsert(stage: str) -> str:
    """A writer's complete minute rows (``stage``: the 1 m table's key, VALUE_COLUMNS and the
    quantile columns of their histograms, :data:`QUANTILES`) into the 1 m roll-up as they are; a
    replay rewrites the same row. Run with WRITER_MINUTES on, so the 1 m triggers add them to the
    hour. The writer computes the quantiles (the stream job on the JVM, with
    ``llmsla_hist_quantile``'s definition): computing them here in PL/pgSQL was ~40 % of the
    database's time per minute row (docs/streaming.md)."""
    m1 = names.T_REQUEST_WINDOWS_1M
    cols = ["bucket", *KEYS, *VALUE_COLUMNS, *(c for c, _, _ in QUANTILES)]
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols[1 + len(KEYS):])
    return (
        f"INSERT INTO {m1} ({', '.join(cols)})\n"
        f"SELECT {', '.join(cols)} FROM {stage}\n"
        f"ON CONFLICT (bucket, {', '.join(KEYS)}) DO UPDATE SET {sets}"
    )
