"""An independent reference for the streaming job: the same lines, judged by the event contract
(``llmsla.events``) and aggregated with pandas/numpy instead of Flink SQL.

Percentiles use numpy's default ``linear`` method: position ``p * (n - 1)`` between the sorted
values, interpolated linearly. That is the definition of Flink's ``PERCENTILE`` (its accumulator
computes ``p * (n - 1) + 1`` as a 1-based rank and interpolates between floor and ceil).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from llmsla import histogram as H
from llmsla import names
from llmsla.events import ALL_EVENT_TYPES, EventError
from llmsla.streaming import sql

WINDOW_MS = {k: v * 1000 for k, v in sql.WINDOW_OF_KIND.items()}


@dataclass
class Judged:
    """Lines of one kind split into usable events and dead letters (raw, category)."""

    usable: list = field(default_factory=list)
    dead: list[tuple[str, str]] = field(default_factory=list)


def judge(kind: str, lines: Iterable[str], *, delay_ms: int, now_ms: int, max_future_ms: int,
          max_past_ms: int, wm_interval_ms: int = 200) -> Judged:
    """Replay the job's decisions over lines in read order.

    The watermark the job has seen before a line is somewhere in
    ``[max_ts - delay - interval, max_ts - delay]`` (periodic emission); a line whose window
    end falls in that band could go either way, so the test data must avoid it (asserted)."""
    out = Judged()
    cls = ALL_EVENT_TYPES[kind]
    width = WINDOW_MS[kind]
    max_ts: int | None = None
    for raw in lines:
        try:
            ev = cls.from_json(raw)
        except EventError as exc:
            out.dead.append((raw, "parse" if exc.field == "<record>" else "schema"))
            continue
        ts = ev.ts_ms
        if ts > now_ms + max_future_ms:
            out.dead.append((raw, "future"))
            continue
        if ts < now_ms - max_past_ms:
            out.dead.append((raw, "past"))
            continue
        if max_ts is not None:
            wm_hi = max_ts - delay_ms
            wm_lo = wm_hi - wm_interval_ms - 1
            # engine samples are late once the watermark passed the sample itself (sql.ORDERED_KINDS)
            last = ts if kind in sql.ORDERED_KINDS else ts - ts % width + width - 1
            assert not (wm_lo < last <= wm_hi), f"test data is ambiguous about lateness: {raw}"
            if last <= wm_lo:
                out.dead.append((raw, "late"))
                max_ts = max(max_ts, ts)
                continue
        max_ts = ts if max_ts is None else max(max_ts, ts)
        out.usable.append(ev)
    return out


def _bucket(ts: pd.Series, width_ms: int) -> pd.Series:
    return pd.to_datetime(ts - ts % width_ms, unit="ms", utc=True)


def _pct(values: pd.Series, q: float) -> float | None:
    v = values.dropna().to_numpy(dtype=float)
    return float(np.percentile(v, q * 100)) if len(v) else None


def _goodput(g: pd.DataFrame, ttft_slo: float, e2e_slo: float, tpot_slo: float | None) -> int:
    """AIPerf's --goodput, restated: ok, TTFT (E2E without a first token), E2E and, where the
    request has one, TPOT = (E2E - TTFT) / (output tokens - 1) each within its objective (ms)."""
    ok = g.status == names.STATUS_OK
    ttft = g.ttft_ms.fillna(g.e2e_ms)
    good = ok & (ttft <= ttft_slo) & (g.e2e_ms <= e2e_slo)
    if tpot_slo is not None:
        has = g.ttft_ms.notna() & (g.output_tokens >= 2)
        tpot = (g.e2e_ms - g.ttft_ms).clip(lower=0) / (g.output_tokens - 1).where(has, 1)
        good &= ~has | (tpot <= tpot_slo)
    return int(good.sum())


def request_windows(events: list, *, ttft_slo: float, e2e_slo: float, tpot_slo: float | None = None) -> pd.DataFrame:
    w = WINDOW_MS[names.SPOOL_REQUESTS]
    df = pd.DataFrame([
        {**{k: getattr(e, k) for k in ("ts_ms", "model", "pool", "replica", "arm", "tenant", "status",
                                       "prompt_tokens", "output_tokens", "queue_ms", "e2e_ms")},
         "class": e.class_, "ttft_ms": e.ttft_ms, "itl_n": e.itl_ms.n, "itl_mean": e.itl_ms.mean,
         "itl_std": e.itl_ms.std}
        for e in events
    ])
    df["bucket"] = _bucket(df["ts_ms"], w)
    rows = []
    for key, g in df.groupby(["bucket", *names.REQUEST_SERIES_LABELS], sort=True):
        n = len(g)
        itl_n = int(g["itl_n"].sum())
        itl_sum = float((g["itl_n"] * g["itl_mean"]).sum())
        itl_sumsq = float((g["itl_n"] * (g["itl_std"] ** 2 + g["itl_mean"] ** 2)).sum())
        mean = itl_sum / itl_n if itl_n else None
        ttft = g["ttft_ms"].dropna()
        rows.append({
            "bucket": key[0], "model": key[1], "pool": key[2], "replica": key[3], "arm": key[4],
            "tenant": key[5], "class": key[6], "requests": n,
            "ok": int((g.status == names.STATUS_OK).sum()),
            "errors": int((g.status == names.STATUS_ERROR).sum()),
            "timeouts": int((g.status == names.STATUS_TIMEOUT).sum()),
            "cancelled": int((g.status == names.STATUS_CANCELLED).sum()),
            "rejected": int((g.status == names.STATUS_REJECTED).sum()),
            "qps": n / (w / 1000),
            "ttft_p50_ms": _pct(g.ttft_ms, 0.5), "ttft_p95_ms": _pct(g.ttft_ms, 0.95),
            "ttft_p99_ms": _pct(g.ttft_ms, 0.99),
            "e2e_p50_ms": _pct(g.e2e_ms, 0.5), "e2e_p95_ms": _pct(g.e2e_ms, 0.95),
            "e2e_p99_ms": _pct(g.e2e_ms, 0.99),
            "itl_mean_ms": mean,
            "itl_jitter_ms": math.sqrt(max(itl_sumsq / itl_n - mean * mean, 0.0)) if itl_n else None,
            "queue_p99_ms": _pct(g.queue_ms, 0.99),
            "prompt_tokens": int(g.prompt_tokens.sum()), "output_tokens": int(g.output_tokens.sum()),
            "output_tps": float(g.output_tokens.sum()) / (w / 1000),
            "ttft_slo_ms": ttft_slo, "e2e_slo_ms": e2e_slo,
            "ttft_within_slo": int((ttft <= ttft_slo).sum()),
            "e2e_within_slo": int((g.e2e_ms <= e2e_slo).sum()),
            "ttft_count": len(ttft), "ttft_sum_ms": float(ttft.sum()), "e2e_sum_ms": float(g.e2e_ms.sum()),
            "itl_n": itl_n, "itl_sum_ms": itl_sum, "itl_sumsq_ms2": itl_sumsq,
            "goodput": _goodput(g, ttft_slo, e2e_slo, tpot_slo),
            names.C_TTFT_HIST: H.Hist.of(ttft).literal(), names.C_E2E_HIST: H.Hist.of(g.e2e_ms).literal(),
        })
    return pd.DataFrame(rows, columns=list(sql.REQUEST_COLUMNS))


def policy_windows(events: list) -> pd.DataFrame:
    w = WINDOW_MS[names.SPOOL_POLICY]
    df = pd.DataFrame([{k: getattr(e, k) for k in ("ts_ms", "zone", "policy_id", "trace_id", "temperature", "duration_ms")} for e in events])
    df["bucket"] = _bucket(df["ts_ms"], w)
    rows = []
    for key, g in df.groupby(["bucket", "zone", "policy_id"], sort=True):
        lat = g.groupby("trace_id")["ts_ms"].agg(lambda s: float(s.max() - s.min()))
        rows.append({
            "bucket": key[0], "zone": key[1], "policy_id": key[2], "decisions": len(g),
            "traces": len(lat), "temperature_mean": float(g.temperature.mean()),
            "temperature_jitter": float(np.std(g.temperature.to_numpy())),
            "latency_p50_ms": _pct(lat, 0.5), "latency_p99_ms": _pct(lat, 0.99),
            "decide_p99_ms": _pct(g.duration_ms, 0.99),
        })
    return pd.DataFrame(rows, columns=list(sql.POLICY_COLUMNS))


def gpu_windows(events: list) -> pd.DataFrame:
    w = WINDOW_MS[names.SPOOL_GPU]
    df = pd.DataFrame([{k: getattr(e, k) for k in ("ts_ms", "node", "gpu", "mem_used_bytes", "mem_total_bytes", "util", "temp_c", "power_w")} for e in events])
    df["bucket"] = _bucket(df["ts_ms"], w)
    rows = []
    for key, g in df.groupby(["bucket", "node", "gpu"], sort=True):
        rows.append({
            "bucket": key[0], "node": key[1], "gpu": int(key[2]), "samples": len(g),
            "mem_used_max_bytes": int(g.mem_used_bytes.max()),
            "mem_used_mean_bytes": float(g.mem_used_bytes.astype(float).mean()),
            "mem_total_bytes": int(g.mem_total_bytes.max()), "util_mean": float(g.util.mean()),
            "temp_max_c": float(g.temp_c.max()), "power_mean_w": float(g.power_w.mean()),
        })
    return pd.DataFrame(rows, columns=list(sql.GPU_COLUMNS))


def native_values_ms(le_s: list[float], per_bucket: list[int]) -> list[float]:
    """Where the engine TTFT windows place a native histogram's observations (docs/engines.md):
    the ``c`` of bucket ``(lo, hi]`` at ``lo + (hi - lo) * (k + 0.5) / c``, the first bucket from
    0, the +Inf bucket's at the highest finite bound; in ms."""
    bounds = [b * 1000.0 for b in le_s]
    out: list[float] = []
    for j, c in enumerate(per_bucket):
        if j == len(bounds):
            out += [bounds[-1]] * c
            continue
        lo, hi = (bounds[j - 1] if j else 0.0), bounds[j]
        out += [lo + (hi - lo) * (k + 0.5) / c for k in range(c)]
    return out


def _native_increase(cur: dict | None, prev: dict | None, reset: int) -> list[float] | None:
    """A sample's TTFT histogram increase as values (None: not known, as for a counter)."""
    if cur is None or prev is None or not cur["le"]:
        return None
    def per_bucket(h: dict) -> list[int]:
        cum = [*h["counts"], h["count"]]
        return [c - (cum[i - 1] if i else 0) for i, c in enumerate(cum)]
    now, before = per_bucket(cur), per_bucket(prev)
    if reset == 1 or cur["le"] != prev["le"] or any(a < b for a, b in zip(now, before, strict=True)):
        return native_values_ms(cur["le"], now)
    return native_values_ms(cur["le"], [a - b for a, b in zip(now, before, strict=True)])


def engine_windows(events: list) -> pd.DataFrame:
    """Per replica in time order, each counter's increase since the previous sample (the sample's
    own value where ``counter_reset`` is 1 or the counter went down; unknown for the first sample
    or after a sample without it), summed per 5 s window; gauges as mean and max; the TTFT
    histogram's increases placed by :func:`native_values_ms` and counted on the layout (``java``:
    the pure-SQL fallback has no histograms)."""
    w = WINDOW_MS[names.SPOOL_ENGINE]
    recs = []
    for e in events:
        recs.append({"ts_ms": e.ts_ms, "pool": e.pool, "replica": e.replica, "engine": e.engine,
                     "waiting": e.waiting, "running": e.running, "kv_usage": e.kv_usage,
                     "hit_rate": e.prefix_cache_hit_rate, "reset": e.counter_reset,
                     "preempt": e.preemptions_total, "ttft": e.ttft,
                     "ttft_sum": e.ttft["sum"] if e.ttft else None,
                     "ttft_count": float(e.ttft["count"]) if e.ttft else None})
    df = pd.DataFrame(recs).sort_values("ts_ms", kind="stable")
    increases = []
    for _, g in df.groupby(["pool", "replica", "engine"], sort=False):
        prev = None
        for idx, h, reset in zip(g.index, g["ttft"], g["reset"], strict=True):
            increases.append((idx, _native_increase(h, prev, reset)))
            prev = h
    df["d_ttft_values"] = pd.Series(dict(increases), dtype=object)
    for c in ("preempt", "ttft_sum", "ttft_count"):
        deltas = []
        for _, g in df.groupby(["pool", "replica", "engine"], sort=False):
            prev = None
            for idx, v, reset in zip(g.index, g[c], g["reset"], strict=True):
                v = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
                if v is None or prev is None:
                    d = None
                elif reset == 1 or v < prev:
                    d = v
                else:
                    d = v - prev
                deltas.append((idx, d))
                prev = v
        df["d_" + c] = pd.Series(dict(deltas), dtype=object)
    df["bucket"] = _bucket(df["ts_ms"], w)

    def num(series: pd.Series) -> list[float]:
        return [float(x) for x in series if x is not None and not (isinstance(x, float) and math.isnan(x))]

    def mean(series: pd.Series) -> float | None:
        v = num(series)
        return float(np.mean(v)) if v else None

    def top(series: pd.Series) -> float | None:
        v = num(series)
        return max(v) if v else None

    def total(series: pd.Series) -> float | None:
        v = num(series)
        return float(sum(v)) if v else None

    rows = []
    for key, g in df.groupby(["bucket", "pool", "replica", "engine"], sort=True):
        count, tsum = total(g.d_ttft_count), total(g.d_ttft_sum)
        rows.append({
            "bucket": key[0], "pool": key[1], "replica": key[2], "engine": key[3], "samples": len(g),
            "waiting_mean": mean(g.waiting), "waiting_max": top(g.waiting),
            "running_mean": mean(g.running), "running_max": top(g.running),
            "kv_usage_mean": mean(g.kv_usage), "kv_usage_max": top(g.kv_usage),
            "preemptions": total(g.d_preempt), "prefix_cache_hit_rate_mean": mean(g.hit_rate),
            "engine_ttft_count": count, "engine_ttft_sum_ms": None if tsum is None else tsum * 1000,
            "engine_ttft_mean_ms": tsum * 1000 / count if count else None,
            "counter_resets": int(g.reset.sum()),
            names.C_ENGINE_TTFT_HIST: H.Hist.of(v for vs in g.d_ttft_values if vs for v in vs).literal(),
        })
    return pd.DataFrame(rows, columns=list(sql.ENGINE_COLUMNS))


HIST_COLUMNS = (names.C_TTFT_HIST, names.C_E2E_HIST, names.C_ENGINE_TTFT_HIST)


def fetch(conn, table: str) -> pd.DataFrame:
    cols = sql.TABLE_COLUMNS[table]
    keys = sql.TABLE_KEYS[table]
    select = ", ".join(f"{c}::text" if c in HIST_COLUMNS else c for c in cols)  # arrays keep their bounds as text
    rows = conn.execute(f"SELECT {select} FROM {table} ORDER BY {', '.join(keys)}").fetchall()
    return pd.DataFrame(rows, columns=list(cols))


def assert_frames_equal(got: pd.DataFrame, want: pd.DataFrame, table: str, *, rel: float = 1e-9) -> None:
    """Same keys, integer columns identical, floats equal to ``rel`` (summation order differs)."""
    keys = list(sql.TABLE_KEYS[table])
    got = got.sort_values(keys).reset_index(drop=True)
    want = want.sort_values(keys).reset_index(drop=True)
    gk = [tuple(r) for r in got[keys].itertuples(index=False)]
    wk = [tuple(r) for r in want[keys].itertuples(index=False)]
    assert gk == wk, f"{table}: window keys differ: missing {sorted(set(wk) - set(gk))[:3]}, extra {sorted(set(gk) - set(wk))[:3]}"
    for col in sql.TABLE_COLUMNS[table]:
        if col in keys:
            continue
        for i, (a, b) in enumerate(zip(got[col], want[col], strict=True)):
            if b is None or (isinstance(b, float) and math.isnan(b)):
                assert a is None or (isinstance(a, float) and math.isnan(a)), f"{table}.{col} row {gk[i]}: {a!r} != None"
            elif isinstance(b, str):
                assert a == b, f"{table}.{col} row {gk[i]}: {a!r} != {b!r}"
            elif isinstance(b, int | np.integer):
                assert int(a) == int(b), f"{table}.{col} row {gk[i]}: {a!r} != {b!r}"
            else:
                assert a is not None and math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-9), \
                    f"{table}.{col} row {gk[i]}: {a!r} != {b!r}"


def dead_letters(conn) -> list[tuple[str, str, str, str]]:
    """(source, file name, category, raw) of every dead letter, sorted."""
    rows = conn.execute("SELECT source, file, reason, raw FROM dead_letters").fetchall()
    return sorted((s, (f or "").rsplit("/", 1)[-1], r.split(":", 1)[0], raw) for s, f, r, raw in rows)


def ms_to_ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def dumps(obj: dict) -> str:
    return json.dumps(obj, separators=(",", ":"))


def judge_writers(kind: str, writers: dict[str, list[str | bytes]], *, delay_ms: int, now_ms: int,
                  max_future_ms: int, max_past_ms: int, margin_ms: int = 1000) -> Judged:
    """The job's decisions on a spool of several writers, by the watermark's definition rather than
    by any read order: the watermark never passes an event that is within ``delay`` of its own
    writer's progress (each writer's lines in the order it wrote them), and it passes an event whose
    window ended more than ``delay`` before the first event of every writer (once anything was read
    after it). Test data must have no event in between (asserted), so the verdict does not depend
    on timing."""
    out = Judged()
    cls = ALL_EVENT_TYPES[kind]
    width = WINDOW_MS[kind]
    judged: list[tuple[str | bytes, object]] = []
    firsts: list[int] = []
    for lines in writers.values():
        first = None
        for raw in lines:
            try:
                ev = cls.from_json(raw)
            except EventError as exc:
                judged.append((raw, "parse" if exc.field == "<record>" else "schema"))
                continue
            if ev.ts_ms > now_ms + max_future_ms:
                judged.append((raw, "future"))
            elif ev.ts_ms < now_ms - max_past_ms:
                judged.append((raw, "past"))
            else:
                judged.append((raw, ev))
                first = ev.ts_ms if first is None else first
        if first is not None:
            firsts.append(first)
    floor = min(firsts) - delay_ms
    running: dict[str, int] = {}
    by_raw = dict(judged)
    for name, lines in writers.items():
        for raw in lines:
            verdict = by_raw[raw]
            if isinstance(verdict, str):
                out.dead.append((raw, verdict))
                continue
            ts = verdict.ts_ms
            last = ts - ts % width + width - 1
            top = running.get(name)
            if last + margin_ms <= floor:
                out.dead.append((raw, "late"))
            else:
                assert top is None or ts > top - delay_ms + margin_ms, f"ambiguous about lateness: {raw!r}"
                out.usable.append(verdict)
            running[name] = ts if top is None else max(top, ts)
    return out
