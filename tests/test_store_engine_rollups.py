"""Engine roll-ups (migration 0015): ``engine_windows_1m`` and ``engine_windows_1h`` equal a
Python reference of the same 5 s rows (sums, maxima of maxima, means weighted by samples, the
mean TTFT from summed sums and counts) through many-row inserts, replays that lower values and
the backfill of a store migrated before 0015. On TimescaleDB (``LLMSLA_TEST_DSN``) the same
equalities hold for the continuous aggregates after a refresh."""

from __future__ import annotations

import datetime as dt
import math
import random

import psycopg

from llmsla import histogram as H
from llmsla import names
from llmsla.store import connect, schema
from llmsla.store.engine_rollups import COLUMNS, ENGINE_ROLLUPS, KEYS
from llmsla.store.maintenance import materialize_rollups
from llmsla.store.migrate import migrate, recorded_flavor

UTC = dt.UTC
M1, H1 = names.T_ENGINE_WINDOWS_1M, names.T_ENGINE_WINDOWS_1H
T = names.T_ENGINE_WINDOWS
VALUES = (*schema.ENGINE_VALUES, *schema.ENGINE_HISTS)
HIST = names.C_ENGINE_TTFT_HIST


def _floor(ts: dt.datetime, seconds: int) -> dt.datetime:
    epoch = int(ts.timestamp())
    return dt.datetime.fromtimestamp(epoch - epoch % seconds, UTC)


def engine_rows(rng: random.Random, start: dt.datetime, n: int) -> list[dict]:
    """Three replicas per 5 s window: a vLLM one with every value, an SGLang one without the
    preemption counter or the TTFT histogram (null, never 0), a third whose windows carry 1 to
    3 samples (the weights of the means differ) and a restart."""
    rows = []
    for i in range(n):
        for rep, engine in (("r0", "vllm"), ("r1", "sglang"), ("r2", "vllm")):
            samples = rng.randint(1, 3) if rep == "r2" else 1
            count = float(rng.randint(0, 9))
            row = {
                "bucket": start + dt.timedelta(seconds=5 * i), "pool": "default", "replica": rep, "engine": engine,
                "samples": samples,
                "waiting_mean": rng.uniform(0, 20), "running_mean": rng.uniform(0, 64), "kv_usage_mean": rng.random(),
                "preemptions": None if rep == "r1" else float(rng.randint(0, 3)),
                "prefix_cache_hit_rate_mean": rng.random(),
                "engine_ttft_count": None if rep == "r1" else count,
                "engine_ttft_sum_ms": None if rep == "r1" else count * rng.uniform(20, 400),
                "counter_resets": int(rep == "r2" and i == n // 2),
            }
            for g in ("waiting", "running", "kv_usage"):
                row[f"{g}_max"] = row[f"{g}_mean"] * rng.uniform(1, 1.5)
            c, s = row["engine_ttft_count"], row["engine_ttft_sum_ms"]
            row["engine_ttft_mean_ms"] = s / c if c else None
            row[HIST] = (H.Hist.of(rng.lognormvariate(5, 1) for _ in range(int(c))).literal()
                         if rep != "r1" and i % 7 != 3 else None)  # some windows without (before 0015)
            rows.append(row)
    return rows


def reference(rows: list[dict], seconds: int) -> dict[tuple, dict]:
    """Roll-up of ``rows`` (the latest per key) into ``seconds`` buckets, written out per rule."""
    latest = {(r["bucket"], *(r[k] for k in KEYS)): r for r in rows}
    groups: dict[tuple, list[dict]] = {}
    for (bucket, *keys), r in latest.items():
        groups.setdefault((_floor(bucket, seconds), *keys), []).append(r)
    out = {}
    for key, rs in groups.items():
        g: dict[str, float | None] = {"windows": float(len(rs))}
        for c, rule in schema.ENGINE_VALUE_ROLLUP.items():
            vals = [r[c] for r in rs if r[c] is not None]
            if rule == schema.SUM:
                g[c] = float(sum(vals)) if vals else None
            elif rule == schema.MAX:
                g[c] = float(max(vals)) if vals else None
            elif rule == schema.WMEAN:
                weight = sum(r["samples"] for r in rs if r[c] is not None)
                g[c] = sum(r[c] * r["samples"] for r in rs if r[c] is not None) / weight if weight else None
        hist = H.merge([H.Hist.parse(r[HIST]) for r in rs])
        g[HIST] = None if hist == H.EMPTY else hist  # type: ignore[assignment]
        num, den = schema.ENGINE_RATIOS["engine_ttft_mean_ms"]
        s, n = g[num], g[den]
        g["engine_ttft_mean_ms"] = s / n if s is not None and n else None
        out[key] = g
    return out


def stored(conn: psycopg.Connection, table: str) -> dict[tuple, dict]:
    """A roll-up's rows (refreshed first on TimescaleDB); a histogram as a :class:`Hist`."""
    materialize_rollups(conn, (table,))
    cols = [f"array_lower({c}, 1), {c}" if c == HIST else c for c in COLUMNS]
    rows = conn.execute(f"SELECT bucket, {', '.join(KEYS)}, {', '.join(cols)} FROM {table}").fetchall()
    n = 1 + len(KEYS)
    out = {}
    for r in rows:
        vals, it = {}, iter(r[n:])
        for c in COLUMNS:
            if c == HIST:
                lower, counts = next(it), next(it)
                vals[c] = None if counts is None else H.Hist.from_array(lower, counts)
            else:
                v = next(it)
                vals[c] = None if v is None else float(v)
        out[tuple(r[:n])] = vals
    return out


def assert_rollup(got: dict[tuple, dict], rows: list[dict], seconds: int) -> None:
    want = reference(rows, seconds)
    assert got.keys() == want.keys()
    for key, g in got.items():
        assert g.keys() == want[key].keys()
        for c, v in g.items():
            w = want[key][c]
            if v is None or w is None or isinstance(w, H.Hist):
                assert v == w, (key, c, v, w)
            else:
                assert math.isclose(v, w, rel_tol=1e-9), (key, c, v, w)


def insert(conn: psycopg.Connection, rows: list[dict], *, upsert: bool = False, hist: bool = True) -> None:
    """Many rows in one statement, as the stream job's sink writes a window (``upsert``: a replay;
    ``hist=False``: a store before 0015, which has no histogram column)."""
    cols = [c for c in schema.ENGINE_COLUMNS if hist or c != HIST]
    types = {"bucket": "timestamptz", "samples": "int8", "counter_resets": "int8",
             **dict.fromkeys((*KEYS, HIST), "text")}
    sql = (f"INSERT INTO {T} ({', '.join(cols)}) SELECT "
           + ", ".join(f"{c}::integer[]" if c == HIST else c for c in cols) + " FROM unnest("
           + ", ".join(f"%s::{types.get(c, 'float8')}[]" for c in cols) + f") AS u({', '.join(cols)})")
    if upsert:
        sql += (f" ON CONFLICT (bucket, {', '.join(KEYS)}) DO UPDATE SET "
                + ", ".join(f"{c} = EXCLUDED.{c}" for c in VALUES if c in cols))
    conn.execute(sql, [[r[c] for r in rows] for c in cols])
    conn.commit()


def test_engine_rollups_equal_reference_through_replays(pg_dsn: str, cfg) -> None:
    start = _floor(dt.datetime.now(UTC) - dt.timedelta(hours=3), 3600) + dt.timedelta(minutes=58)
    rows = engine_rows(random.Random(5), start, 40)  # 3 min 20 s across an hour boundary
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        for i in range(0, len(rows), 3):  # one window per statement, as the sink writes them
            insert(conn, rows[i:i + 3])
        assert_rollup(stored(conn, M1), rows, 60)
        assert_rollup(stored(conn, H1), rows, 3600)
        # a replay lowers the maxima and changes the counts: a maximum falls back, sums move
        rng = random.Random(6)
        replay = [dict(r, waiting_max=r["waiting_mean"], kv_usage_max=0.0, samples=r["samples"] + 1,
                       **{HIST: H.Hist.of([1.0]).literal() if r[HIST] else None},
                       engine_ttft_count=None if r["engine_ttft_count"] is None else 1.0,
                       preemptions=None if r["preemptions"] is None else float(rng.randint(0, 1)))
                  for r in rows[::4]]
        insert(conn, replay, upsert=True)
        assert_rollup(stored(conn, M1), rows + replay, 60)
        assert_rollup(stored(conn, H1), rows + replay, 3600)
        # the sanity of the reference itself: an hour weighs r2's windows by their samples
        h = reference(rows + replay, 3600)
        r2 = [g for k, g in h.items() if k[2] == "r2"]
        assert r2 and all(g["samples"] > g["windows"] for g in r2)


def test_migration_0015_backfills_rows_stored_before(pg_dsn: str, cfg) -> None:
    """A store at 0014 with engine windows: migrating builds the roll-ups from them, and later
    windows are added to the same groups (plain: the trigger; TimescaleDB: the aggregates)."""
    start = _floor(dt.datetime.now(UTC) - dt.timedelta(hours=5), 3600) + dt.timedelta(minutes=59)
    rows = engine_rows(random.Random(9), start, 30)
    old, new = [dict(r, **{HIST: None}) for r in rows[:45]], rows[45:]
    with connect(pg_dsn) as conn:
        migrate(conn, cfg, upto=14)
        assert conn.execute("SELECT to_regclass(%s)", (M1,)).fetchone() == (None,)
        insert(conn, old, hist=False)
        applied = migrate(conn, cfg).applied
        assert applied == ["0015_engine_rollups"], applied
        assert_rollup(stored(conn, M1), old, 60)
        assert_rollup(stored(conn, H1), old, 3600)
        insert(conn, new)
        assert_rollup(stored(conn, M1), old + new, 60)
        assert_rollup(stored(conn, H1), old + new, 3600)
        if recorded_flavor(conn) == "timescale":
            got = {v for (v,) in conn.execute(
                "SELECT view_name FROM timescaledb_information.continuous_aggregates").fetchall()}
            assert set(ENGINE_ROLLUPS) <= got
        else:
            kinds = dict(conn.execute("SELECT relname, relkind FROM pg_class WHERE relname = ANY(%s)",
                                      (list(ENGINE_ROLLUPS),)).fetchall())
            assert kinds == dict.fromkeys(ENGINE_ROLLUPS, "r")
