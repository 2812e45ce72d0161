"""The real job writes each 5 s request window's TTFT and E2E histograms (computed on the JVM by
streaming/java/.../Histogram.java on names.HIST_BOUNDS_MS), and quantiles from merged counts are
within names.HIST_REL_ERROR of the exact quantiles over the spool: single windows, the 1 m and 1 h
roll-ups, and a whole range summed at query time."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import numpy as np
import psycopg

from llmsla import histogram as H
from llmsla import names
from llmsla.store.maintenance import materialize_rollups
from llmsla.streaming import synth

from .conftest import publish, start_stream

UTC = dt.UTC
QS = (0.5, 0.95, 0.99)


def _within(got: float | None, values: list[float], q: float) -> None:
    want = float(np.quantile(np.asarray(values), q, method="inverted_cdf"))
    assert got is not None and abs(got - want) <= names.HIST_REL_ERROR * want * (1 + 1e-9), (q, got, want)


def test_job_histograms_give_quantiles_within_one_percent(cfg, spool_dirs, tmp_path: Path) -> None:
    hour = (int(time.time()) // 3600 - 2) * 3_600_000  # a whole clock hour, two hours ago
    keys = synth.Keys(models=("m",), pools=("east",), replicas=2, arms=("control", "treatment"))  # 4 series
    cols = synth.request_columns(24_000, start_ms=hour + 1000, span_ms=3_600_000 - 2000, seed=11, keys=keys)
    lines = list(synth.request_lines(cols, keys))
    publish(spool_dirs[names.SPOOL_REQUESTS], "0000000000001-hist.jsonl", lines)
    proc = start_stream(cfg, "--once", "--kinds", names.SPOOL_REQUESTS, log=tmp_path / "stream.log",
                        watermark_delay_s=1)
    assert proc.wait(timeout=300) == 0, (tmp_path / "stream.log").read_text()[-4000:]

    raw: dict[tuple, dict[str, list[float]]] = {}  # (bucket ms, labels) -> raw values
    for line in lines:
        d = json.loads(line)
        key = (d["ts_ms"] - d["ts_ms"] % (names.REQUEST_WINDOW_S * 1000), *(d[label] for label in names.REQUEST_LABELS))
        g = raw.setdefault(key, {"ttft": [], "e2e": []})
        if d.get("ttft_ms") is not None:
            g["ttft"].append(float(d["ttft_ms"]))
        g["e2e"].append(float(d["e2e_ms"]))
    labels = ", ".join(names.REQUEST_LABELS)
    with psycopg.connect(cfg.store.dsn) as conn:
        rows = conn.execute(f"SELECT bucket, {labels}, ttft_hist::text, e2e_hist::text FROM {names.T_REQUEST_WINDOWS}").fetchall()
        assert len(rows) == len(raw)
        for bucket, *rest in rows:
            key = (int(bucket.timestamp() * 1000), *rest[:-2])
            vals = raw[key]
            ttft, e2e = H.Hist.parse(rest[-2]), H.Hist.parse(rest[-1])
            # the same counts as Python's bucketing of the raw values
            assert ttft == H.Hist.of(vals["ttft"]) and e2e == H.Hist.of(vals["e2e"]), key
            for q in QS:
                if vals["ttft"]:
                    _within(ttft.quantile(q), vals["ttft"], q)
                _within(e2e.quantile(q), vals["e2e"], q)
        materialize_rollups(conn)  # TimescaleDB: the hour as materialised, not only real-time
        # the 1 h roll-up: one row per series for the hour, its quantiles the hour's
        stored = conn.execute(
            f"SELECT {labels}, ttft_p50_ms, ttft_p95_ms, ttft_p99_ms, e2e_p50_ms, e2e_p95_ms, e2e_p99_ms "
            f"FROM {names.T_REQUEST_WINDOWS_1H} WHERE bucket = %s", (dt.datetime.fromtimestamp(hour / 1000, UTC),)).fetchall()
        series: dict[tuple, dict[str, list[float]]] = {}
        for key, vals in raw.items():
            g = series.setdefault(key[1:], {"ttft": [], "e2e": []})
            g["ttft"] += vals["ttft"]
            g["e2e"] += vals["e2e"]
        assert {tuple(r[:len(names.REQUEST_LABELS)]) for r in stored} == set(series)
        for r in stored:
            vals = series[tuple(r[:len(names.REQUEST_LABELS)])]
            for (h, q), v in zip([(h, q) for h in ("ttft", "e2e") for q in QS], r[len(names.REQUEST_LABELS):], strict=True):
                _within(v, vals[h], q)
        # the whole hour, every series, merged at query time from the 5 s windows and from the 1 m roll-up
        everything = [v for vals in raw.values() for v in vals["e2e"]]
        for table in (names.T_REQUEST_WINDOWS, names.T_REQUEST_WINDOWS_1M):
            for q in QS:
                v = conn.execute(f"SELECT llmsla_hist_quantile(llmsla_hist_sum(e2e_hist), %s) FROM {table}", (q,)).fetchone()[0]
                _within(v, everything, q)
