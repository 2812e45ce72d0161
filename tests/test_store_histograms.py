"""Latency histograms in the store (migration 0005): the SQL functions equal llmsla.histogram's,
and quantiles of merged counts (5 s windows, 1 m / 1 h roll-ups, a whole range) are within 1 % of
numpy's exact quantiles of the raw values.

Runs on the embedded PostgreSQL (plain flavour) or on ``LLMSLA_TEST_DSN`` (a TimescaleDB: the
continuous aggregates are refreshed before they are read).
"""

from __future__ import annotations

import datetime as dt
import random

import numpy as np
import psycopg
import pytest
from test_store import window_row
from test_store_rollups import _floor

from llmsla import histogram as H
from llmsla import names
from llmsla.store import connect
from llmsla.store.maintenance import materialize_rollups
from llmsla.store.migrate import migrate
from llmsla.store.rollups import QUANTILES

UTC = dt.UTC
QS = (0.0, 0.01, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0)


def test_sql_quantile_and_sum_equal_python(pg_dsn: str, cfg) -> None:
    rng = np.random.default_rng(11)
    hists = [H.Hist.of(rng.lognormal(rng.uniform(0, 12), rng.uniform(0.05, 3), int(rng.integers(1, 400))))
             for _ in range(60)]
    hists.append(H.Hist.of([0.0, 1e12]))  # both clamped end buckets
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        for typ in ("integer[]", "bigint[]"):
            for h in hists:
                qs = [*QS, float(rng.uniform())]
                got = conn.execute(
                    f"SELECT {', '.join(f'llmsla_hist_quantile(%s::{typ}, %s)' for _ in qs)}",
                    [x for q in qs for x in (h.literal(), q)],
                ).fetchone()
                assert list(got) == [h.quantile(q) for q in qs], (typ, h.literal()[:40])
            # the aggregate: the sum of the stored arrays, NULL rows and empty arrays ignored
            literals = [h.literal() for h in hists[:25]] + [None, "{}"]
            lower, total = conn.execute(
                f"SELECT array_lower(s, 1), s FROM (SELECT llmsla_hist_sum(h::{typ}) AS s FROM unnest(%s::text[]) AS u(h)) x",
                (literals,),
            ).fetchone()
            assert H.Hist.from_array(lower, total) == H.merge(hists[:25])
            for p in (50, 95, 99):
                got = conn.execute(f"SELECT llmsla_hist_p{p}(h::{typ}) FROM unnest(%s::text[]) AS u(h)", (literals,)).fetchone()[0]
                assert got == H.merge(hists[:25]).quantile(p / 100)
        assert conn.execute("SELECT llmsla_hist_quantile(NULL, 0.5), llmsla_hist_quantile('{}', 0.5), "
                            "llmsla_hist_quantile('[3:3]={0}', 0.5)").fetchone() == (None, None, None)
        with pytest.raises(psycopg.errors.RaiseException, match="q must be in"):
            conn.execute("SELECT llmsla_hist_quantile('[3:3]={1}', 1.5)")
        conn.rollback()
        with pytest.raises(psycopg.errors.RaiseException, match="outside the layout"):
            conn.execute(f"SELECT llmsla_hist_quantile('[{H.SIZE}:{H.SIZE}]={{1}}', 0.5)")


def _windows(start: dt.datetime, minutes: int, rng: random.Random) -> tuple[list[dict], dict]:
    """5 s rows with histograms of raw values, and the raw values per (bucket, replica)."""
    rows, raw = [], {}
    for i in range(minutes * 12):
        bucket = start + dt.timedelta(seconds=5 * i)
        for rep in ("r0", "r1"):
            n = rng.randint(1, 40)
            slow = 3.0 if 300 <= i < 330 and rep == "r1" else 1.0  # a slow spell: the tail moves
            ttft = [rng.lognormvariate(5.5, 0.6) * slow for _ in range(n)]
            e2e = [t + rng.lognormvariate(8, 0.8) for t in ttft]
            r = window_row(bucket, replica=rep, requests=n)
            r["ttft_count"] = n
            r["ttft_hist"], r["e2e_hist"] = H.Hist.of(ttft).literal(), H.Hist.of(e2e).literal()
            for name, vals in (("ttft", ttft), ("e2e", e2e)):  # the window's exact percentiles
                for p in (50, 95, 99):
                    r[f"{name}_p{p}_ms"] = float(np.percentile(vals, p))
            rows.append(r)
            raw[(bucket, rep)] = {"ttft": ttft, "e2e": e2e}
    return rows, raw


def _within(got: float, values: list[float], q: float) -> None:
    want = float(np.quantile(np.asarray(values), q, method="inverted_cdf"))
    assert abs(got - want) <= names.HIST_REL_ERROR * want * (1 + 1e-9), (q, got, want)


def test_rollup_quantiles_are_the_ranges_within_one_percent(pg_dsn: str, cfg) -> None:
    rng = random.Random(4)
    start = _floor(dt.datetime.now(UTC) - dt.timedelta(hours=4), 3600) + dt.timedelta(minutes=40)
    rows, raw = _windows(start, 50, rng)  # 50 minutes across an hour boundary
    with connect(pg_dsn) as conn:
        migrate(conn, cfg)
        cols = list(rows[0])
        with conn.cursor() as cur, cur.copy(f"COPY {names.T_REQUEST_WINDOWS} ({', '.join(cols)}) FROM STDIN") as cp:
            for r in rows:  # COPY, as the stream's sink writes them
                cp.write_row([r[c] for c in cols])
        conn.commit()
        materialize_rollups(conn)
        # single 5 s windows
        got = conn.execute(
            f"SELECT bucket, replica, {', '.join(f'llmsla_hist_quantile({h}, {q})' for h in ('ttft_hist', 'e2e_hist') for q in QS)} "
            f"FROM {names.T_REQUEST_WINDOWS}").fetchall()
        assert len(got) == len(rows)
        for bucket, rep, *qs in got:
            vals = raw[(bucket, rep)]
            for (h, q), v in zip([(h, q) for h in ("ttft", "e2e") for q in QS], qs, strict=True):
                _within(v, vals[h], q)
        # roll-up rows: each bucket's quantiles are that bucket's, not its worst window's
        for table, seconds in ((names.T_REQUEST_WINDOWS_1M, 60), (names.T_REQUEST_WINDOWS_1H, 3600)):
            qcols = [c for c, _, _ in QUANTILES]
            stored = conn.execute(f"SELECT bucket, replica, {', '.join(qcols)} FROM {table}").fetchall()
            groups: dict[tuple, dict[str, list[float]]] = {}
            for (bucket, rep), vals in raw.items():
                g = groups.setdefault((_floor(bucket, seconds), rep), {"ttft": [], "e2e": []})
                g["ttft"] += vals["ttft"]
                g["e2e"] += vals["e2e"]
            assert {(b, r) for b, r, *_ in stored} == set(groups)
            for bucket, rep, *qv in stored:
                for (_, h, q), v in zip(QUANTILES, qv, strict=True):
                    _within(v, groups[(bucket, rep)][h.removesuffix("_hist")], q)
        # a whole range from the 1 h roll-up, merged at query time (what the A/B report does)
        everything = [v for vals in raw.values() for v in vals["ttft"]]
        for q in (0.5, 0.95, 0.99):
            v = conn.execute(f"SELECT llmsla_hist_quantile(llmsla_hist_sum(ttft_hist), %s) FROM {names.T_REQUEST_WINDOWS_1H}",
                             (q,)).fetchone()[0]
            _within(v, everything, q)
        # the roll-up keeps the worst window's P99 beside the range's
        worst, ranged = conn.execute(
            f"SELECT max(ttft_p99_ms_max), max(ttft_p99_ms) FROM {names.T_REQUEST_WINDOWS_1H}").fetchone()
        assert worst > ranged
