"""The stream job's goodput SQL holds each request to the objectives of its tenant and class, as
the gateway's counter does: the rendered predicate, evaluated by PostgreSQL on a grid of requests
around every bound, agrees with ``GoodputBounds.request_met`` row by row."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import psycopg

from llmsla import config as config_mod
from llmsla import names, slo_catalog
from llmsla.goodput import GoodputBounds
from llmsla.resources import deploy


def _scoped_bounds(tmp_path: Path) -> GoodputBounds:
    d = tmp_path / "slo"
    shutil.copytree(deploy("slo"), d, ignore=shutil.ignore_patterns("examples"))
    for f in ("ttft-interactive.yaml", "ttft-acme.yaml", "e2e-batch.yaml"):
        shutil.copy(deploy("slo") / "examples" / f, d / f)
    cfg = config_mod.load(env={})
    cfg.slo.dir = str(d)
    cfg.tenants.header = "X-Tenant"
    cfg.tenants.declared = {"acme": "interactive", "globex": "batch"}
    return GoodputBounds.from_catalog(slo_catalog.load(cfg))


def test_scoped_sql_agrees_with_the_rule_per_request(tmp_path: Path, pg_dsn: str) -> None:
    good = _scoped_bounds(tmp_path)
    assert good.tenants == {"acme"} and good.classes == {"interactive", "batch"}
    rows = [(status, ttft, e2e, out, tenant, cls) for status, ttft, e2e, out, tenant, cls in itertools.product(
        (names.STATUS_OK, names.STATUS_ERROR), (None, 250.0, 300.0, 300.5, 500.0, 700.0, 800.0, 900.0),
        (900.0, 10_000.0, 10_000.5, 30_000.0, 60_000.0, 61_000.0), (1, 2, 200),
        ("acme", "globex", "o'ther"), ("interactive", "batch", "sheddable"))]
    sql = good.sql(status_ok=f"status = '{names.STATUS_OK}'")
    assert "CASE WHEN" in sql
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TEMP TABLE r (i int, status text, ttft_ms float8, e2e_ms float8, "
                     "output_tokens int, tenant text, class text)")
        with conn.cursor().copy("COPY r FROM STDIN") as cp:
            for i, row in enumerate(rows):
                cp.write_row((i, *row))
        got = dict(conn.execute(f"SELECT i, {sql} FROM r").fetchall())
    want = {i: good.request_met(st, ttft, e2e, out, tenant=t, class_=c)
            for i, (st, ttft, e2e, out, t, c) in enumerate(rows)}
    assert sum(want.values()) and sum(not v for v in want.values())
    wrong = [rows[i] for i in want if got[i] != want[i]]
    assert not wrong, wrong[:5]
    # the scoping matters on this grid: the fleet's bounds alone judge some rows otherwise
    fleet = {i: good.request_met(st, ttft, e2e, out) for i, (st, ttft, e2e, out, _t, _c) in enumerate(rows)}
    assert fleet != want
