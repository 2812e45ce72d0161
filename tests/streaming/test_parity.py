"""Both paths on the same spool: the default Java path (llmsla-json format, Percentiles aggregate,
both outputs planned together) and the pure-SQL fallback (no javac, or stream.java_parser = false:
JSON_VALUE, Flink's PERCENTILE, one UNION ALL) must write identical tables, dead letters and their
reasons included."""

from __future__ import annotations

import math
import time
from pathlib import Path

import psycopg

from llmsla import names
from llmsla.streaming import sql

from .conftest import publish, start_stream
from .test_windows import DELAY_MS, _gpu, _policy, _requests

TABLES = (names.T_REQUEST_WINDOWS, names.T_POLICY_WINDOWS, names.T_GPU_WINDOWS)


def _snapshot(dsn: str) -> dict[str, list[tuple]]:
    with psycopg.connect(dsn) as conn:
        # the latency histograms are the Java path's (Histogram.java); the fallback writes none
        cols = {t: [c for c in sql.TABLE_COLUMNS[t] if c not in (names.C_TTFT_HIST, names.C_E2E_HIST)] for t in TABLES}
        out = {t: conn.execute(f"SELECT {', '.join(cols[t])} FROM {t} ORDER BY "
                               f"{', '.join(sql.TABLE_KEYS[t])}").fetchall() for t in TABLES}
        out[names.T_DEAD_LETTERS] = conn.execute(
            f"SELECT source, file, reason, raw, fingerprint FROM {names.T_DEAD_LETTERS} ORDER BY fingerprint").fetchall()
    return out


def _run(cfg, log: Path, **stream: object) -> None:
    proc = start_stream(cfg, "--once", "--fresh", log=log, watermark_delay_s=DELAY_MS / 1000, **stream)
    rc = proc.wait(timeout=240)
    assert rc == 0, log.read_text()[-4000:]


def test_sql_fallback_writes_identical_tables(cfg, spool_dirs, tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    start = now - 600_000
    for kind, lines in ((names.SPOOL_REQUESTS, _requests(now, start)), (names.SPOOL_POLICY, _policy(start)),
                        (names.SPOOL_GPU, _gpu(start))):
        publish(spool_dirs[kind], "0000000000001-test.jsonl", lines)

    _run(cfg, tmp_path / "java.log")
    java = _snapshot(cfg.store.dsn)
    assert all(java[t] for t in (*TABLES, names.T_DEAD_LETTERS)), {t: len(r) for t, r in java.items()}
    with psycopg.connect(cfg.store.dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join((*TABLES, names.T_DEAD_LETTERS))}")

    _run(cfg, tmp_path / "sql.log", java_parser="false")
    assert "stream.java_parser = false" in (tmp_path / "sql.log").read_text()
    fallback = _snapshot(cfg.store.dsn)
    for table, rows in java.items():
        assert len(fallback[table]) == len(rows), table
        for a, b in zip(fallback[table], rows, strict=True):
            assert len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True)), (table, a, b)


def _same(x: object, y: object) -> bool:
    """Exact, except floats: the window operator's local/global pre-aggregation groups partial sums
    by when watermarks arrive (wall-clock timing), so the last bit may differ between ANY two runs,
    on either path, and the two percentile implementations interpolate with differently ordered
    arithmetic. Each parsed value is identical (test_json_format); counts, keys, text exact."""
    if isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-9)
    return x == y
