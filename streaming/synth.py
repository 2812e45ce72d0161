"""Fast synthetic spool traffic for tests and the benchmark.

Numbers come from numpy in bulk and lines are formatted with one f-string each, so millions of
valid ``RequestEvent`` lines take seconds, not minutes (``RequestEvent.to_json`` would validate
and build a dict per line). The lines are exactly what ``SpoolWriter.write`` would produce, which
``tests/streaming`` checks by parsing a sample through the contract.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from llmsla import names


@dataclass(frozen=True)
class Keys:
    """The label space: every (model, pool, replica, arm) combination gets traffic."""

    models: tuple[str, ...] = ("llama-8b", "qwen-7b")
    pools: tuple[str, ...] = ("east", "west")
    replicas: int = 4
    arms: tuple[str, ...] = ("control", "treatment")
    #: (tenant, class) pairs drawn per line after the rest (so the other columns do not change);
    #: None: the line carries neither field (a line written before tenants: the defaults). Empty:
    #: no line carries them.
    tenancy: tuple[tuple[str, str] | None, ...] = ()

    def combos(self) -> list[tuple[str, str, str, str]]:
        return [
            (m, p, f"{p}-r{r}", a)
            for m in self.models
            for p in self.pools
            for r in range(self.replicas)
            for a in self.arms
        ]


def request_columns(n: int, *, start_ms: int, span_ms: int, seed: int = 0, keys: Keys | None = None,
                    jitter_ms: int = 0) -> dict[str, np.ndarray]:
    """Column arrays of ``n`` request events with ``ts_ms`` spread over ``[start, start+span)``,
    sorted by time and then displaced by up to ``jitter_ms`` (out of order within that bound)."""
    rng = np.random.default_rng(seed)
    combos = (keys or Keys()).combos()
    ts = np.sort(rng.integers(start_ms, start_ms + span_ms, n))
    if jitter_ms:
        ts = ts - rng.integers(0, jitter_ms + 1, n)
    key = rng.integers(0, len(combos), n)
    status_idx = rng.choice(len(names.STATUSES), n, p=[0.93, 0.03, 0.02, 0.01, 0.01])
    ok = status_idx == 0
    queue = np.round(rng.exponential(20.0, n), 3)
    ttft = np.round(queue + rng.lognormal(5.5, 0.6, n), 3)
    out_tok = np.where(ok, rng.integers(1, 400, n), 0)
    itl_n = np.maximum(out_tok - 1, 0)
    itl_mean = np.where(itl_n > 0, np.round(rng.gamma(4.0, 6.0, n), 3), 0.0)
    itl_std = np.where(itl_n > 1, np.round(itl_mean * rng.uniform(0.05, 0.6, n), 3), 0.0)
    itl_max = np.round(itl_mean + 3 * itl_std, 3)
    e2e = np.round(ttft + itl_n * itl_mean + rng.uniform(0, 5, n), 3)
    out = {
        "ts_ms": ts, "key": key, "status_idx": status_idx, "ok": ok,
        "prompt_tokens": rng.integers(1, 2000, n), "output_tokens": out_tok, "queue_ms": queue,
        "ttft_ms": ttft, "itl_n": itl_n, "itl_mean": itl_mean, "itl_std": itl_std, "itl_max": itl_max,
        "e2e_ms": e2e, "trace": rng.integers(0, 2**63 - 1, n),
    }
    tenancy = (keys or Keys()).tenancy
    if tenancy:
        out["tenancy"] = rng.integers(0, len(tenancy), n)
    return out


def request_lines(cols: dict[str, np.ndarray], keys: Keys | None = None) -> Iterator[str]:
    """JSON lines (no newline) for the columns; errors/rejections carry ``ttft_ms: null``."""
    combos = (keys or Keys()).combos()
    tenancy = (keys or Keys()).tenancy
    statuses = names.STATUSES
    c = {k: v.tolist() for k, v in cols.items()}
    for i in range(len(c["ts_ms"])):
        m, p, r, a = combos[c["key"][i]]
        ttft = c["ttft_ms"][i] if c["ok"][i] else "null"
        tc = tenancy[c["tenancy"][i]] if "tenancy" in c else None
        extra = "" if tc is None else f',"tenant":"{tc[0]}","class":"{tc[1]}"'
        yield (
            f'{{"v":1,"ts_ms":{c["ts_ms"][i]},"trace_id":"{c["trace"][i]:032x}","model":"{m}",'
            f'"pool":"{p}","replica":"{r}","arm":"{a}","policy":"cosine",'
            f'"prompt_tokens":{c["prompt_tokens"][i]},"output_tokens":{c["output_tokens"][i]},'
            f'"queue_ms":{c["queue_ms"][i]},"ttft_ms":{ttft},"itl_ms":{{"n":{c["itl_n"][i]},'
            f'"mean":{c["itl_mean"][i]},"std":{c["itl_std"][i]},"max":{c["itl_max"][i]}}},'
            f'"e2e_ms":{c["e2e_ms"][i]},"status":"{statuses[c["status_idx"][i]]}"{extra}}}'
        )


def policy_lines(n: int, *, start_ms: int, span_ms: int, seed: int = 0, traces: int = 0) -> list[str]:
    """PolicyEvent lines: several decisions (spans) per trace so per-trace latency is non-zero."""
    rng = np.random.default_rng(seed)
    traces = traces or max(1, n // 4)
    trace = rng.integers(0, traces, n)
    base = start_ms + (np.arange(traces) * span_ms) // traces
    ts = base[trace] + rng.integers(0, 900, n)
    order = np.argsort(ts, kind="stable")  # in event-time order, as a span exporter writes them
    trace, ts = trace[order], ts[order]
    zones, pids = ("east", "west"), ("cosine", "entropy-adaptive")
    out = []
    for i in range(n):
        t = int(trace[i])
        out.append(json.dumps({
            "v": 1, "ts_ms": int(ts[i]), "trace_id": f"{t:032x}", "span_id": f"{i:016x}",
            "policy_id": pids[t % 2], "zone": zones[(t // 2) % 2], "step": int(i % 50),
            "temperature": round(float(rng.uniform(0.2, 1.3)), 4), "action": "set",
            "trigger": "schedule", "duration_ms": round(float(rng.exponential(0.5)), 4),
        }, separators=(",", ":")))
    return out


def gpu_lines(n: int, *, start_ms: int, span_ms: int, seed: int = 0, nodes: int = 2, gpus: int = 2) -> list[str]:
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(start_ms, start_ms + span_ms, n))
    total = 80 << 30
    out = []
    for i in range(n):
        g = int(rng.integers(0, nodes * gpus))
        out.append(json.dumps({
            "v": 1, "ts_ms": int(ts[i]), "node": f"node{g // gpus}", "gpu": g % gpus,
            "uuid": f"GPU-{g:08d}", "mem_used_bytes": int(rng.integers(0, total)),
            "mem_total_bytes": total, "util": round(float(rng.uniform(0, 1)), 4),
            "temp_c": round(float(rng.uniform(30, 90)), 2), "power_w": round(float(rng.uniform(50, 700)), 2),
        }, separators=(",", ":")))
    return out


#: vLLM's TTFT bucket bounds, seconds (a subset; vllm/v1/metrics/loggers.py): the synthetic
#: engine samples carry a histogram with native bounds, as the adapters write it.
_ENGINE_TTFT_LE = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def engine_lines(*, start_ms: int, span_ms: int, seed: int = 0, replicas: int = 3,
                 interval_ms: int = 1000, reset_at: int | None = None) -> list[str]:
    """EngineSample lines as ``llmsla engines`` spools them: one scrape per replica every
    ``interval_ms`` (with jitter), in time order. Counters and the TTFT histogram grow; replica
    ``r0``'s counters restart (``counter_reset`` = 1) at its ``reset_at``-th sample; replica ``r2``
    is an SGLang engine without a TTFT histogram or preemption counter (null, never 0)."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[int, str]] = []
    for r in range(replicas):
        sglang = r == 2
        preempt, hits, queries, ttft_sum = 0.0, 0.0, 0.0, 0.0
        counts = [0] * len(_ENGINE_TTFT_LE)
        count = 0
        for k in range(span_ms // interval_ms):
            ts = start_ms + k * interval_ms + int(rng.integers(0, interval_ms // 4)) + r
            reset = int(r == 0 and reset_at is not None and k == reset_at)
            if reset:
                preempt, hits, queries, ttft_sum, count = 0.0, 0.0, 0.0, 0.0, 0
                counts = [0] * len(_ENGINE_TTFT_LE)
            preempt += float(rng.integers(0, 3))
            new_q = float(rng.integers(0, 400))
            new_h = float(rng.integers(0, int(new_q) + 1))
            queries, hits = queries + new_q, hits + new_h
            for _ in range(int(rng.integers(0, 6))):
                v = float(rng.exponential(0.3))
                ttft_sum += v
                count += 1
                counts = [c + (v <= le) for c, le in zip(counts, _ENGINE_TTFT_LE, strict=True)]
            sample = {
                "v": 1, "ts_ms": ts, "replica": f"r{r}", "pool": "p0" if r < 2 else "p1",
                "engine": "sglang" if sglang else "vllm",
                "waiting": float(rng.integers(0, 20)), "running": float(rng.integers(0, 64)),
                "kv_usage": round(float(rng.uniform(0, 1)), 4),
                "kv_blocks_total": None if sglang else 4096, "kv_block_size": None if sglang else 16,
                "kv_capacity_tokens": 65536,
                "preemptions_total": None if sglang else preempt,
                "prefix_cache_hits_total": None if sglang else hits,
                "prefix_cache_queries_total": None if sglang else queries,
                "prefix_cache_hit_rate": round(new_h / new_q, 6) if new_q else None,
                "lora_adapters": None if sglang else ["sql-lora"],
                "counter_reset": reset,
                "ttft": None if sglang else {"le": list(_ENGINE_TTFT_LE), "counts": counts,
                                             "sum": round(ttft_sum, 6), "count": count},
                "itl": None, "e2e": None, "queue": None,
            }
            rows.append((ts, json.dumps(sample, separators=(",", ":"))))
    return [line for _, line in sorted(rows)]
