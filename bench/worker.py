"""Reference worker: tokens/s at batch 1 and batch 16, and the cost of tracing each decision.

Anchors measured in the same run: tokens/s at batch 1 (HTTP), the bare ``policy.decide`` call,
and the engine without a tracer. Run: ``python bench/worker.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402


def http_tokens_per_second(cfg: config_mod.Config, batches: list[int], max_tokens: int, rounds: int) -> list[dict]:
    from llmsla.worker.load import measure_tokens_per_second
    from llmsla.worker.server import WorkerThread

    rows = []
    with WorkerThread(cfg) as wt:
        asyncio.run(measure_tokens_per_second(wt.url, concurrency=4, max_tokens=8, rounds=1))  # warm-up
        for b in batches:
            r = asyncio.run(measure_tokens_per_second(wt.url, concurrency=b, max_tokens=max_tokens, rounds=rounds))
            rows.append({"what": f"HTTP batch {b}", **{k: r[k] for k in ("requests", "output_tokens", "wall_s", "tokens_per_s")}})
    return rows


def engine_tokens_per_second(cfg: config_mod.Config, batch: int, max_tokens: int, traced: bool) -> float:
    """The engine alone (no HTTP), with or without decision tracing: what tracing costs a step."""
    from prometheus_client import CollectorRegistry

    from llmsla.exporters.policy_tracing import PolicyTracer
    from llmsla.temperature import PolicyParams, make_policy
    from llmsla.worker import model as lm
    from llmsla.worker.engine import Engine, GenRequest, WorkerMetrics

    reg = CollectorRegistry()
    tracer = PolicyTracer(cfg, registry=reg) if traced else None
    model = lm.build_model(cfg.worker.seed, spec=lm.ModelSpec(max_ctx=cfg.worker.max_prompt_tokens + cfg.worker.max_tokens + 1))
    engine = Engine(model, max_batch=batch, tracer=tracer, metrics=WorkerMetrics(reg, "m"))
    engine.start()

    async def go() -> float:
        loop = asyncio.get_running_loop()
        span = tracer.request_span({}) if tracer else None
        reqs = [GenRequest(tokens=lm.encode(f"bench {i}"), max_tokens=max_tokens, loop=loop, out=asyncio.Queue(),
                           policy=make_policy("cosine", PolicyParams(t_max=0.8, horizon=max_tokens)), seed=i,
                           ignore_eos=True, span=span) for i in range(batch)]
        t0 = time.perf_counter()
        for r in reqs:
            engine.submit(r)
        n = 0
        for r in reqs:
            while True:
                item = await r.out.get()
                if item[0] != "token":
                    break
                n += 1
        dt = time.perf_counter() - t0
        if span is not None:
            span.end()
        return n / dt

    try:
        return asyncio.run(go())
    finally:
        engine.stop()
        if tracer:
            tracer.shutdown()


def decision_overhead(cfg: config_mod.Config, n: int) -> list[dict]:
    """Per-decision cost on the engine thread: bare decide vs decide + span + metrics, and the
    exporter's cost per span (span -> PolicyEvent -> spool line), paid on the export thread."""
    from prometheus_client import CollectorRegistry

    from llmsla.exporters.policy_tracing import PolicyTracer
    from llmsla.temperature import PolicyParams, make_policy

    tracer = PolicyTracer(cfg, registry=CollectorRegistry())
    root = tracer.request_span({})
    pol = make_policy("entropy", PolicyParams())
    samples_bare, samples_traced = [], []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for s in range(n):
            pol.decide(s, 2.0 + (s % 7) * 0.3)
        samples_bare.append((time.perf_counter_ns() - t0) / n / 1000)
        t0 = time.perf_counter_ns()
        for s in range(n):
            a = time.time_ns()
            d = pol.decide(s, 2.0 + (s % 7) * 0.3)
            b = time.time_ns()
            tracer.record(root, pol.policy_id, "default", s, d, a, b)
        samples_traced.append((time.perf_counter_ns() - t0) / n / 1000)
    tracer.force_flush()
    exported = tracer.spool_exporter.exported
    root.end()
    tracer.shutdown()
    # the exporter's own cost, timed on captured spans (it runs on the export thread, not the engine's)
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from llmsla import names
    from llmsla.exporters.policy_tracing import SpoolPolicyExporter
    from llmsla.spool import SpoolWriter

    cap = PolicyTracer(cfg, registry=CollectorRegistry())
    mem = InMemorySpanExporter()
    cap.add_span_processor(SimpleSpanProcessor(mem))
    r2 = cap.request_span({})
    for s in range(n):
        a = time.time_ns()
        cap.record(r2, pol.policy_id, "default", s, pol.decide(s, 2.5), a, a + 1000)
    spans = [sp for sp in mem.get_finished_spans() if sp.name == names.POLICY_SPAN_NAME]
    cap.shutdown()
    with SpoolWriter(cfg.spool_dir(), names.SPOOL_POLICY, background=False) as w:
        t0 = time.perf_counter_ns()
        SpoolPolicyExporter(w).export(spans)
        export_us = (time.perf_counter_ns() - t0) / 1000 / len(spans)
    bare, traced = statistics.median(samples_bare), statistics.median(samples_traced)
    return [
        {"what": "policy.decide (anchor)", "us_per_decision": bare, "ratio": 1.0},
        {"what": "decide + span + metrics (engine thread)", "us_per_decision": traced, "ratio": traced / bare},
        {"what": "exporter: span -> PolicyEvent -> spool (export thread)", "us_per_decision": export_us, "ratio": export_us / bare},
        {"what": f"PolicyEvents exported of {5 * n} traced", "us_per_decision": float(exported), "ratio": exported / (5 * n)},
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short run while developing")
    args = ap.parse_args()
    max_tokens = 32 if args.quick else 128
    rounds = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config_mod.load(env={})
        cfg.spool.dir = str(Path(tmp) / "spool")
        rows = http_tokens_per_second(cfg, [1, 16], max_tokens, rounds)
        anchor = rows[0]["tokens_per_s"]
        for r in rows:
            r["ratio_vs_batch1"] = r["tokens_per_s"] / anchor
        print_table(rows, "reference worker through HTTP (non-streaming, ignore_eos, 1 torch thread)")
        reps: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(1 if args.quick else 5):  # alternate, take medians: the machine is shared
            for traced in (False, True):
                reps[traced].append(engine_tokens_per_second(cfg, 16, max_tokens, traced))
        eng = [{"what": f"engine batch 16, tracing {'on' if t else 'off'} (median of {len(v)})",
                "tokens_per_s": statistics.median(v), "min": min(v), "max": max(v)} for t, v in reps.items()]
        for r in eng:
            r["ratio_vs_untraced"] = r["tokens_per_s"] / eng[0]["tokens_per_s"]
        print_table(eng, "engine alone (no HTTP): decision tracing cost")
        dec = decision_overhead(cfg, 2000 if args.quick else 20000)
        print_table(dec, "per-decision cost (us)")
    write_result("worker", {"inputs": {"max_tokens": max_tokens, "rounds": rounds, "quick": args.quick,
                                       "model": "2 layers, d=128, byte vocab", "torch_threads": 1},
                            "http": rows, "engine": eng, "decisions": dec})
    return 0


if __name__ == "__main__":
    sys.exit(main())
