"""Summaries of a simulation run (exact quantiles over the per-request rows)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmsla import names
from llmsla.fleet.engine import RequestRow, SimResult


def pct(values: list[float], q: float) -> float | None:
    """Exact quantile (numpy 'linear'); None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def summarize(res: SimResult, *, rows: list[RequestRow] | None = None) -> dict[str, Any]:
    """Latency quantiles (all finished requests: a timeout counts at its timeout), status counts,
    throughput, KV and preemptions."""
    rows = res.rows if rows is None else rows
    status: dict[str, int] = {}
    for r in rows:
        status[r.status] = status.get(r.status, 0) + 1
    e2e = [r.e2e_ms for r in rows if r.status != names.STATUS_REJECTED]
    ttft = [r.ttft_ms for r in rows if r.ttft_ms is not None]
    queue = [r.queue_ms for r in rows if r.status != names.STATUS_REJECTED]
    span = max((r.end_s for r in rows), default=0.0) - min((r.arrival_s for r in rows), default=0.0)
    ok_tokens = sum(r.output_tokens for r in rows if r.status == names.STATUS_OK)
    reps = res.replicas
    return {
        "requests": len(rows),
        "status": status,
        "ok_ratio": status.get(names.STATUS_OK, 0) / len(rows) if rows else None,
        "e2e_p50_ms": pct(e2e, 50), "e2e_p99_ms": pct(e2e, 99),
        "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
        "queue_p99_ms": pct(queue, 99),
        "output_tok_s": ok_tokens / span if span > 0 else None,
        "preemptions": sum(v["preemptions"] for v in reps.values()),
        "kv_peak_ratio": max((v["kv_peak_ratio"] for v in reps.values()), default=0.0),
        "kv_peak_gib": sum(v["kv_peak_bytes"] for v in reps.values()) / (1 << 30),
        "sim_s": res.end_s,
        "wall_s": res.wall_s,
    }


def per_replica(res: SimResult) -> list[dict[str, Any]]:
    out = []
    by: dict[str, list[RequestRow]] = {}
    for r in res.rows:
        by.setdefault(r.replica, []).append(r)
    for rid, st in res.replicas.items():
        rows = by.get(rid, [])
        out.append({
            "replica": rid, "model": st["model"], "requests": len(rows),
            "e2e_p99_ms": pct([r.e2e_ms for r in rows], 99),
            "ttft_p99_ms": pct([r.ttft_ms for r in rows if r.ttft_ms is not None], 99),
            "errors": sum(r.status == names.STATUS_ERROR for r in rows),
            "timeouts": sum(r.status == names.STATUS_TIMEOUT for r in rows),
            "preemptions": st["preemptions"], "busy_ratio": st["busy_s"] / res.end_s if res.end_s else 0.0,
            "kv_peak_ratio": st["kv_peak_ratio"],
        })
    return out
