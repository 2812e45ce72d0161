"""Plain-PostgreSQL roll-up tables (migration 0003): kept exact by the trigger on request_windows.

The reference is computed here in Python from the same 5 s rows; replays that rewrite a window
with other values, concurrent writers, the backfill of a store migrated before 0003 and the
roll-ups' longer retention are each checked. On TimescaleDB (``LLMSLA_TEST_DSN``) the same
equalities hold for the continuous aggregates after a refresh.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import threading
import time

import psycopg
from test_store import insert_windows, window_row

from llmsla import histogram as H
from llmsla import names
from llmsla.store import connect, schema
from llmsla.store.maintenance import (
    ROLLUP_RETENTION_FACTOR,
    apply_retention,
    materialize_rollups,
    policy_runs,
)
from llmsla.store.migrate import load_migrations, migrate, recorded_flavor
from llmsla.store.rollups import HISTS, KEYS, QUANTILES, ROLLUPS, rollup_columns

UTC = dt.UTC
M1, H1 = names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H


def _floor(ts: dt.datetime, seconds: int) -> dt.datetime:
    epoch = int(ts.timestamp())
    return dt.datetime.fromtimestamp(epoch - epoch % seconds, UTC)


def reference(rows: list[dict], seconds: int) -> dict[tuple, dict]:
    """Roll-up of ``rows`` (latest value per key) into ``seconds`` buckets, computed in Python.
    A row without tenant or class is the default's (a writer that does not name them); a
    window's goodput may be NULL (written before migration 0013), which a sum skips."""
    defaults = {names.L_TENANT: names.DEFAULT_TENANT, names.L_CLASS: names.DEFAULT_CLASS}
    latest = {(r["bucket"], *(r.get(k, defaults.get(k)) for k in KEYS)): r for r in rows}
    out: dict[tuple, dict] = {}
    quantile_cols = {c for c, _, _ in QUANTILES}
    for (bucket, *keys), r in latest.items():
        g = out.setdefault((_floor(bucket, seconds), *keys), {c: 0 for c in rollup_columns()})
        g["windows"] += 1
        for c in rollup_columns():
            if c == "windows" or c in quantile_cols:
                continue
            if c in HISTS:  # summed counts of the same buckets
                g[c] = H.merge([g[c] or H.EMPTY, H.Hist.parse(r.get(c))])
            elif c.endswith("_max") or c.endswith("_slo_ms"):
                src = c.removesuffix("_max")
                g[c] = max(g[c], r[src])
            elif c == "goodput":
                g[c] = g.get("_goodput_seen") and g[c]
                if r.get(c) is not None:
                    g[c] = (g[c] or 0) + r[c]
                g["_goodput_seen"] = True
            else:
                g[c] += r[c]
    for g in out.values():  # the bucket's quantiles from its summed counts (None without any)
        g.pop("_goodput_seen", None)
        for h in HISTS:
            g[h] = g[h] if g[h] != H.EMPTY else None
        for c, h, q in QUANTILES:
            g[c] = None if g[h] is None else g[h].quantile(q)
    return out


def assert_realtime_caggs(conn: psycopg.Connection, views) -> None:
    """TimescaleDB: each roll-up is a continuous aggregate with real-time aggregation on."""
    got = dict(conn.execute("SELECT view_name, materialized_only FROM timescaledb_information.continuous_aggregates"
                            ).fetchall())
    assert {v: got.get(v) for v in views} == dict.fromkeys(views, False)


def stored(conn: psycopg.Connection, table: str, *, refresh: bool = True) -> dict[tuple, dict]:
    """A roll-up's rows as the queries read them (refreshed first unless ``refresh`` is off)."""
    if refresh:
        materialize_rollups(conn, (table,))
    cols = rollup_columns()
    exprs = [f"array_lower({c}, 1), {c}" if c in HISTS else c for c in cols]
    n = 1 + len(KEYS)
    rows = conn.execute(f"SELECT bucket, {', '.join(KEYS)}, {', '.join(exprs)} FROM {table}").fetchall()
    out = {}
    for r in rows:
        vals, it = {}, iter(r[n:])
        for c in cols:
            if c in HISTS:
                lower, counts = next(it), next(it)
                vals[c] = None if counts is None else H.Hist.from_array(lower, counts)
            else:
                v = next(it)
                vals[c] = None if v is None else float(v)
        out[tuple(r[:n])] = vals
    return out


def as_float(d: dict[tuple, dict]) -> dict[tuple, dict]:
    return {k: {c: v if v is None or isinstance(v, H.Hist) else float(v) for c, v in g.items()} for k, g in d.items()}


def assert_rollup(got: dict[tuple, dict], rows: list[dict], seconds: int) -> None:
    """Counts, maxima and histograms equal; float sums equal up to summation order (1 h = sum of
    1 m sums); quantiles equal (the same function of the same counts)."""
    want = as_float(reference(rows, seconds))
    assert got.keys() == want.keys()
    for key, g in got.items():
        assert g.keys() == want[key].keys()
        for c, v in g.items():
            w = want[key][c]
            if v is None or w is None or isinstance(v, H.Hist):
                assert v == w, (key, c, v, w)
            else:
                assert math.isclose(v, w, rel_tol=1e-12), (key, c, v, w)


#: (tenant, class) of the random rows' series: several tenants and classes per replica.
TENANCY = ((names.DEFAULT_TENANT, names.DEFAULT_CLASS), ("acme", "interactive"), ("acme", "batch"),
           ("globex", "sheddable"))


def random_rows(rng: random.Random, start: dt.datetime, n: int, replicas: int = 3) -> list[dict]:
    """``replicas`` series per 5 s window, each of one of the TENANCY pairs (so a minute and an
    hour hold several tenants' and classes' groups per replica), goodput NULL in some windows."""
    rows = []
    for i in range(n):
        for rep in range(replicas):
            r = window_row(start + dt.timedelta(seconds=5 * i), replica=f"r{rep}", requests=rng.randint(2, 50))
            r[names.L_TENANT], r[names.L_CLASS] = TENANCY[(i // 3 + rep) % len(TENANCY)]
            r["goodput"] = None if i % 5 == 1 else rng.randint(0, r["ok"])
            r["ttft_p99_ms"] = rng.uniform(50, 5000)
            r["e2e_p99_ms"] = rng.uniform(500, 30000)
            r["queue_p99_ms"] = rng.uniform(0, 100)
            r["ttft_sum_ms"] = rng.uniform(0, 1e5)
            if i % 7 != 3:  # some windows without histograms (written before migration 0005)
                r["ttft_hist"] = H.Hist.of(rng.lognormvariate(5, 1) for _ in range(r["ttft_count"])).literal()
                r["e2e_hist"] = H.Hist.of(rng.lognormvariate(8, 1) for _ in range(r["requests"])).literal()
            else:
                r["ttft_hist"] = r["e2e_hist"] = None
            rows.append(r)
    return rows


def test_rollup_tables_equal_reference_through_replays(pg_dsn: str, cfg) -> None:
    rng = random.Random(3)
    start = _floor(dt.datetime.now(UTC) - dt.timedelta(hours=3), 3600) + dt.timedelta(minutes=59)
    rows = random_rows(rng, start, 30)  # 2.5 minutes across an hour boundary, 3 replicas
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        insert_windows(conn, rows[:40])  # one row per statement
        with conn.cursor() as cur:  # and many rows in one statement, as the sink writes them
            cols = list(rows[0])
            def typ(c: str) -> str:
                if c == "bucket":
                    return "timestamptz"
                return "text" if c in (*KEYS, *HISTS) else "float8"
            cur.execute(
                f"INSERT INTO {names.T_REQUEST_WINDOWS} ({', '.join(cols)}) SELECT "
                + ", ".join(f"{c}::integer[]" if c in HISTS else c for c in cols) + " FROM unnest("
                + ", ".join(f"%s::{typ(c)}[]" for c in cols) + f") AS u({', '.join(cols)})",
                [[r[c] for r in rows[40:]] for c in cols],
            )
        conn.commit()
        assert_rollup(stored(conn, M1), rows, 60)
        assert_rollup(stored(conn, H1), rows, 3600)
        # a replay rewrites some windows with lower P99s and other counts: the maxima fall again
        # (plain: the trigger re-aggregates; TimescaleDB: the upsert invalidates the buckets and
        # the refresh that stored() runs, as the refresh policy would, re-materialises them)
        replay = [dict(r, ttft_p99_ms=1.0, requests=1, e2e_hist=H.Hist.of([1.0]).literal()) for r in rows[::4]]
        cols = list(rows[0])
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols if c not in ("bucket", *KEYS))
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {names.T_REQUEST_WINDOWS} ({', '.join(cols)}) VALUES ({', '.join('%s' for _ in cols)}) "
                f"ON CONFLICT (bucket, {', '.join(KEYS)}) DO UPDATE SET {updates}",
                [tuple(r[c] for c in cols) for r in replay],
            )
        conn.commit()
        assert_rollup(stored(conn, M1), rows + replay, 60)
        assert_rollup(stored(conn, H1), rows + replay, 3600)


def test_newest_minutes_are_answered_before_they_are_materialised(pg_dsn: str, cfg) -> None:
    """Real-time aggregation: the refresh policy has materialised the 1 m roll-up up to three
    minutes ago and the 1 h one up to the current hour; the newest rows are in both answers all
    the same (TimescaleDB: from the 5 s rows past each watermark; plain: the trigger's rows)."""
    hour = _floor(dt.datetime.now(UTC) - dt.timedelta(hours=3), 3600)
    rows = random_rows(random.Random(8), hour + dt.timedelta(minutes=20), 72)  # 6 minutes
    cut = hour + dt.timedelta(minutes=23)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        timescale = recorded_flavor(conn) == "timescale"
        insert_windows(conn, [r for r in rows if r["bucket"] < cut])
        conn.commit()
        if timescale:  # what the policy's runs would have done by now
            conn.autocommit = True
            conn.execute("CALL refresh_continuous_aggregate(%s, NULL, %s)", (M1, cut))
            conn.execute("CALL refresh_continuous_aggregate(%s, NULL, %s)", (H1, hour))
            conn.autocommit = False
            marks = dict(conn.execute(  # microseconds since the epoch; the lowest value when none
                "SELECT user_view_name, _timescaledb_functions.cagg_watermark(mat_hypertable_id) "
                "FROM _timescaledb_catalog.continuous_agg WHERE user_view_name IN (%s, %s)", (M1, H1)).fetchall())
            assert marks[M1] == int(cut.timestamp()) * 10**6 and marks[H1] <= int(hour.timestamp()) * 10**6
        insert_windows(conn, [r for r in rows if r["bucket"] >= cut])
        conn.commit()
        assert_rollup(stored(conn, M1, refresh=False), rows, 60)
        assert_rollup(stored(conn, H1, refresh=False), rows, 3600)
        if timescale:  # and the refresh that follows changes nothing in the answer
            assert_rollup(stored(conn, M1), rows, 60)
            assert_rollup(stored(conn, H1), rows, 3600)


def test_concurrent_writers_of_one_minute_both_count(pg_dsn: str, cfg) -> None:
    """Plain: the trigger's advisory lock, B waits for A, then re-aggregates with A's committed
    row. TimescaleDB: no trigger, so B never waits; the continuous aggregate counts both. (A row
    committed first creates the chunk: TimescaleDB serialises the first writers of a new chunk.)"""
    minute = _floor(dt.datetime.now(UTC) - dt.timedelta(hours=1), 60)
    seed = [window_row(minute + dt.timedelta(seconds=10))]
    a_rows, b_rows = [window_row(minute)], [window_row(minute + dt.timedelta(seconds=5))]
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        timescale = recorded_flavor(conn) == "timescale"
        insert_windows(conn, seed)
        conn.commit()
    a, b = connect(pg_dsn), connect(pg_dsn)
    try:
        insert_windows(a, a_rows)  # A holds the roll-up lock until it commits
        done = threading.Event()

        def writer_b() -> None:
            insert_windows(b, b_rows)
            b.commit()
            done.set()

        t = threading.Thread(target=writer_b)
        t.start()
        if timescale:
            assert done.wait(10), "no roll-up lock on TimescaleDB: B commits while A is open"
        else:
            assert not done.wait(1.0), "B must wait for A's roll-up lock"
        a.commit()
        t.join(10)
        assert done.is_set()
        with connect(pg_dsn) as conn:
            assert_rollup(stored(conn, M1), seed + a_rows + b_rows, 60)
    finally:
        a.close()
        b.close()


def test_store_migrated_before_0003_is_backfilled(pg_dsn: str, cfg) -> None:
    """Plain only: its roll-ups were views before 0004 and became trigger-kept tables. TimescaleDB's
    were continuous aggregates from 0001 on (asserted here; its upgrade: test_store_migrations)."""
    rows = random_rows(random.Random(5), _floor(dt.datetime.now(UTC) - dt.timedelta(hours=2), 60), 20)
    # no such columns before 0005 and 0013: the upgrade reads those rows as the default tenant's
    # and class's, goodput unknown
    rows = [{k: v for k, v in r.items() if k not in (*HISTS, *schema.REQUEST_ADDED_0013)} for r in rows]
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        if recorded_flavor(conn) == "timescale":
            assert_realtime_caggs(conn, ROLLUPS)
            return
    # a fresh database at schema version 2 (views), with rows, then the upgrade
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute("DROP SCHEMA public CASCADE")
        admin.execute("CREATE SCHEMA public")
    with connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {names.T_MIGRATIONS} (version integer PRIMARY KEY, name text NOT NULL, "
                     "flavor text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        for m in load_migrations():
            if m.version < 4:
                conn.execute(m.sql("plain"))
                conn.execute(f"INSERT INTO {names.T_MIGRATIONS} (version, name, flavor) VALUES (%s, %s, 'plain')",
                             (m.version, m.name))
        conn.execute(f"SELECT llmsla_ensure_partitions('{names.T_REQUEST_WINDOWS}', 'bucket', current_date - 1, current_date)")
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = %s", (M1,)).fetchone() == ("v",)
        insert_windows(conn, rows)
        assert migrate(conn, cfg).applied == [f"{m.version:04d}_{m.name}" for m in load_migrations() if m.version >= 4]
        for table in ROLLUPS:
            assert conn.execute("SELECT relkind FROM pg_class WHERE relname = %s", (table,)).fetchone() == ("r",)
        conn.autocommit = False
        assert_rollup(stored(conn, M1), rows, 60)
        assert_rollup(stored(conn, H1), rows, 3600)


def test_materialize_waits_for_a_policy_run_that_took_the_replay(pg_dsn: str, cfg) -> None:
    """A replay read right after ``materialize_rollups`` is in the roll-up. On TimescaleDB a refresh
    policy's run that overlaps the call may take the replay's invalidations first and materialise
    them in a later transaction: the call must wait for that run, or it returns with the bucket
    still stale (what a bare refresh does here: it returns at once and reads 10). The run is held
    on a lock of the materialised bucket's chunk until two seconds after the call starts."""
    bucket = _floor(dt.datetime.now(UTC) - dt.timedelta(hours=3), 3600) + dt.timedelta(minutes=10)
    with connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, cfg)
        insert_windows(conn, [window_row(bucket, requests=10)])
        materialize_rollups(conn, (H1,))
        assert conn.execute(f"SELECT sum(requests) FROM {H1}").fetchone()[0] == 10
        if recorded_flavor(conn) != "timescale":  # the trigger keeps the table current
            conn.execute(f"UPDATE {names.T_REQUEST_WINDOWS} SET requests = 99")
            materialize_rollups(conn, (H1,))
            assert conn.execute(f"SELECT sum(requests) FROM {H1}").fetchone()[0] == 99
            return
        # every policy paused (the migration scheduled their first runs), none left running
        conn.execute("SELECT alter_job(job_id, scheduled => false) FROM timescaledb_information.jobs "
                     "WHERE proc_name = 'policy_refresh_continuous_aggregate'")
        deadline = time.monotonic() + 60
        while policy_runs(conn):
            assert time.monotonic() < deadline, "a refresh policy run did not end"
            time.sleep(0.05)
        conn.execute(f"UPDATE {names.T_REQUEST_WINDOWS} SET requests = 99")  # the replay: an invalidation
        chunk, job = conn.execute(
            "SELECT format('%%I.%%I', k.chunk_schema, k.chunk_name), j.job_id "
            "FROM timescaledb_information.continuous_aggregates c "
            "JOIN timescaledb_information.chunks k ON k.hypertable_schema = c.materialization_hypertable_schema "
            "AND k.hypertable_name = c.materialization_hypertable_name "
            "JOIN timescaledb_information.jobs j ON j.hypertable_name = c.view_name "
            "AND j.proc_name = 'policy_refresh_continuous_aggregate' WHERE c.view_name = %s", (H1,)).fetchone()
        with psycopg.connect(pg_dsn) as blocker:
            # the run's materialisation writes the bucket's chunk and waits on this; reads do not
            blocker.execute(f"LOCK TABLE {chunk} IN SHARE MODE")
            conn.execute("SELECT alter_job(%s, scheduled => true, next_start => now())", (job,))
            while not policy_runs(conn, H1):
                assert time.monotonic() < deadline, "the refresh policy did not start"
                time.sleep(0.05)
            time.sleep(1.0)  # its first transaction, which takes the invalidations, is done
            release = threading.Timer(2.0, blocker.rollback)
            release.start()
            try:
                materialize_rollups(conn, (H1,))
                got = conn.execute(f"SELECT sum(requests) FROM {H1}").fetchone()[0]
            finally:
                release.join()
        assert got == 99
        assert policy_runs(conn, H1) == 0


def test_rollups_outlive_the_5s_partitions(pg_dsn: str, cfg) -> None:
    now = dt.datetime.now(UTC)
    old = _floor(now - dt.timedelta(days=cfg.store.retention_days + 2), 3600)
    ancient = old - dt.timedelta(days=cfg.store.retention_days * ROLLUP_RETENTION_FACTOR)
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        if recorded_flavor(conn) == "timescale":
            # the materialised minutes and hours survive drop_chunks of their 5 s rows; the
            # roll-ups' own retention is a policy per continuous aggregate (tests/test_store.py)
            insert_windows(conn, [window_row(old)])
            conn.commit()
            materialize_rollups(conn)
            apply_retention(conn, cfg, flavor="timescale", now=now)
            conn.commit()
            assert conn.execute(f"SELECT count(*) FROM {names.T_REQUEST_WINDOWS}").fetchone()[0] == 0
            for table in ROLLUPS:
                assert [r[0] for r in conn.execute(f"SELECT bucket FROM {table}")] == [
                    _floor(old, 60 if table == M1 else 3600)]
            return
        insert_windows(conn, [window_row(old), window_row(ancient)])
        conn.commit()
        conn.execute(f"SELECT llmsla_ensure_partitions('{names.T_REQUEST_WINDOWS}', 'bucket', %s, %s)",
                     (ancient.date(), old.date()))
        apply_retention(conn, cfg, flavor="plain", now=now)
        conn.commit()
        assert conn.execute(f"SELECT count(*) FROM {names.T_REQUEST_WINDOWS}").fetchone()[0] == 0
        for table in ROLLUPS:  # the 5 s rows are gone; the roll-up keeps the one inside 4x retention
            assert [r[0] for r in conn.execute(f"SELECT bucket FROM {table}")] == [
                _floor(old, 60 if table == M1 else 3600)]
