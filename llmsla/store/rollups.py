"""The 1-minute and 1-hour roll-ups of ``request_windows``, from one column list.

Plain PostgreSQL gets tables kept current by a trigger (views before migration 0004); TimescaleDB
gets continuous aggregates (``time_bucket``). Both expose the same names and columns. Counts and
sums roll up exactly, so attainment (``ttft_within_slo / requests``) and means (``ttft_sum_ms /
ttft_count``, ITL pooled variance from ``itl_sumsq_ms2``) are exact at any width. A percentile
cannot be merged from percentiles: since migration 0005 the roll-ups sum the windows' latency
histograms (``ttft_hist``, ``e2e_hist``; :mod:`llmsla.histogram`) and their ``*_p50/p95/p99_ms``
are the bucket's own quantiles from the summed counts; the worst 5 s window's P99
(``*_p99_ms_max``) stays beside them.

The column set is versioned: migrations 0001 and 0004 render the shape they had
(``hist=False``), 0005 adds the histogram columns, so replaying the migrations on an empty
database builds exactly what an upgraded one has.
"""

from __future__ import annotations

from llmsla import names

#: Bucket origin of the plain flavour's date_bin (epoch-aligned like time_bucket).
ORIGIN = "TIMESTAMPTZ '2000-01-01 00:00:00+00'"
KEYS = ("model", "pool", "replica", "arm")

ROLLUPS: dict[str, str] = {
    names.T_REQUEST_WINDOWS_1M: "1 minute",
    names.T_REQUEST_WINDOWS_1H: "1 hour",
}

_SUMS = (
    "requests", "ok", "errors", "timeouts", "cancelled", "rejected", "prompt_tokens",
    "output_tokens", "ttft_within_slo", "e2e_within_slo", "ttft_count", "ttft_sum_ms",
    "e2e_sum_ms", "itl_n", "itl_sum_ms", "itl_sumsq_ms2",
)
_MAXES = ("ttft_p99_ms", "e2e_p99_ms", "queue_p99_ms", "ttft_slo_ms", "e2e_slo_ms")
#: Histogram columns (migration 0005): summed by ``llmsla_hist_sum``.
HISTS = (names.C_TTFT_HIST, names.C_E2E_HIST)
#: Quantile columns of the roll-ups from the summed histograms: (column, histogram, q).
QUANTILES: tuple[tuple[str, str, float], ...] = tuple(
    (f"{h.removesuffix('_hist')}_p{round(q * 100)}_ms", h, q) for h in HISTS for q in (0.5, 0.95, 0.99)
)


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
    cols = [f"{bucket} AS bucket", "model", "pool", "replica", "arm", "count(*) AS windows"]
    cols += [f"sum({c}) AS {c}" for c in _SUMS]
    cols += [f"max({c}) AS {c}_max" if c.endswith("_p99_ms") else f"max({c}) AS {c}" for c in _MAXES]
    if hist:
        cols += [f"{a} AS {c}" for a, c in zip(_hist_aggregates(), _hist_columns(), strict=True)]
    return (
        "SELECT " + ",\n       ".join(cols) + f"\nFROM {names.T_REQUEST_WINDOWS}\n"
        f"GROUP BY {bucket}, model, pool, replica, arm"
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
    cols = ["windows", *_SUMS, *(f"{c}_max" if c.endswith("_p99_ms") else c for c in _MAXES)]
    return cols + _hist_columns() if hist else cols


def _aggregates(*, from_rollup: bool, hist: bool = True) -> list[str]:
    """Aggregate expressions for :func:`rollup_columns`, from 5 s rows or from a finer roll-up."""
    out = ["sum(windows)" if from_rollup else "count(*)"]
    out += [f"sum({c})" for c in _SUMS]
    for c in _MAXES:
        src = f"{c}_max" if c.endswith("_p99_ms") and from_rollup else c
        out.append(f"max({src})")
    return out + _hist_aggregates() if hist else out


def _upsert(target: str, source: str, width: str, *, from_rollup: bool, keys_from: str, hist: bool = True) -> str:
    """Re-aggregate the ``width`` groups named by ``keys_from`` (rows with bucket + keys) from
    ``source`` into ``target``; one index range scan per touched group (LATERAL)."""
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


def hist_functions_ddl() -> str:
    """The histogram SQL functions: ``llmsla_hist_add`` (the sum of two), the aggregate
    ``llmsla_hist_sum``, ``llmsla_hist_quantile(h, q)`` (:func:`llmsla.histogram.quantile`'s
    definition, with the same bucket values rendered in) and the per-quantile aggregates
    ``llmsla_hist_p50/p95/p99`` the roll-ups use (plain aggregates, valid in a continuous
    aggregate; one state shared with the sum)."""
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
    stmts.append("""CREATE OR REPLACE FUNCTION llmsla_hist_quantile(h bigint[], q double precision) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v CONSTANT double precision[] := '{@VALUES@}';
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
            RETURN v[i + 1];
        END IF;
    END LOOP;
    RETURN NULL;
END $$""".replace("@VALUES@", values).replace("@LAST@", str(len(names.HIST_VALUES_MS) - 1)))
    for q in (0.5, 0.95, 0.99):
        stmts.append(f"CREATE OR REPLACE FUNCTION llmsla_hist_final_p{round(q * 100)}(s bigint[]) RETURNS double precision\n"
                     f"LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT llmsla_hist_quantile(s, {q!r}) $$")
    for in_type in ("integer[]", "bigint[]"):
        common = "SFUNC = llmsla_hist_add, STYPE = bigint[], COMBINEFUNC = llmsla_hist_add, PARALLEL = SAFE"
        stmts.append(f"CREATE OR REPLACE AGGREGATE llmsla_hist_sum({in_type}) ({common})")
        for q in (0.5, 0.95, 0.99):
            p = round(q * 100)
            stmts.append(f"CREATE OR REPLACE AGGREGATE llmsla_hist_p{p}({in_type}) ({common}, FINALFUNC = llmsla_hist_final_p{p})")
    return ";\n\n".join(stmts) + ";"
