"""Gateway TTFT at 1.5x capacity: its TTFT p99 against AIPerf's for the same requests.

``llmsla gateway --workers 1`` in front of one upstream, AIPerf (``bench/_aiperf.py``) as the
client. Two upstreams (``--upstream``):

- ``worker`` (default): one reference worker (``llmsla worker``, one torch thread) pinned to its
  own core; the gateway and AIPerf share the other. The stack saturates in the worker: requests
  queue in its batch and in the gateway, the situation of a fleet driven past its capacity.
- ``fast``: the fast SSE upstream (``bench/_sse_upstream.py``), the gateway pinned to its own
  core, so the gateway itself would be the limit, if the client could drive it there: on a
  2-core machine AIPerf completes 190-330 requests/s against the gateway's ~1,500 per core, so this
  mode measures AIPerf's own backlog, not the gateway's (kept to show exactly that).

First the capacity: ``--cap-requests`` offered open loop at ``--cap-rate``, far past what the
stack serves, so what it completes per second (first start to last end) is its capacity; a
closed loop read less here (AIPerf's own turnaround between a response and the next request
counts against it). In ``fast`` mode the capacity is the rate at which the gateway's core would
be full (1 / its CPU seconds per request), and each round shows what AIPerf served of it. Then
paired rounds at ``--overload`` x that capacity, open loop (``--request-rate``) for ``--round-s``
seconds of arrivals: per round the gateway's TTFT p99 (its RequestEvents, matched to AIPerf's
records by the trace id it returned) over AIPerf's TTFT p99 of the same requests; the geometric
mean of the rounds' ratios with its 95 % interval. Target: within 10 % (ratio >= 0.9: the
gateway's clock starts later than the client's, so it can only read less).

``python bench/gateway_saturation.py [--aiperf PATH] [--upstream worker|fast] [--rounds 3]``
writes bench/results/gateway-saturation[-fast].json. See docs/gateway.md#measured-against-aiperf.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _aiperf  # noqa: E402
from _common import paired_interval, print_table, write_result  # noqa: E402
from _stack import Stack  # noqa: E402

TARGET = 0.9  # gateway TTFT p99 / AIPerf TTFT p99 of the same requests


def cpus() -> tuple[str | None, str | None]:
    """(the saturated process's core, the others' cores); no pinning on one core."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        return None, None
    return str(mine[-1]), ",".join(str(c) for c in mine[:-1])


def p(xs: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 2) if len(xs) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiperf", help="aiperf executable (default: $AIPERF, else aiperf on PATH)")
    ap.add_argument("--upstream", choices=("worker", "fast"), default="worker")
    ap.add_argument("--max-batch", type=int, default=8, help="the worker's batch (worker mode)")
    ap.add_argument("--input-tokens", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16, help="output tokens (chunks) per streamed response")
    ap.add_argument("--gap-s", type=float, default=0.002, help="fast upstream's gap between chunks")
    ap.add_argument("--cap-requests", type=int, default=400)
    ap.add_argument("--cap-rate", type=float, default=200.0,
                    help="requests/s offered to find the capacity: well past it (worker mode)")
    ap.add_argument("--overload", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--round-s", type=float, default=20.0, help="seconds of arrivals per round")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    aiperf = _aiperf.find(args.aiperf)
    hot_cpu, load_cpu = cpus()
    worker = args.upstream == "worker"

    with tempfile.TemporaryDirectory(prefix="llmsla-gwsat-") as t:
        tmp = Path(t)
        tok = _aiperf.tokenizer(aiperf, tmp / "tokenizer")
        env = {"LLMSLA_GATEWAY_CLIENT_SHARE": "1", "LLMSLA_GATEWAY_MAX_CONCURRENCY": "1024"}
        with Stack(tmp, env) as stack:
            if worker:
                stack.worker(max_batch=args.max_batch, cpus=hot_cpu)
                url = stack.gateway(cpus=load_cpu)
            else:
                stack.upstream(tokens=args.tokens, gap_s=args.gap_s, cpus=load_cpu)
                url = stack.gateway({"LLMSLA_GATEWAY_REQUEST_USAGE": "false"}, cpus=hot_cpu)

            def run(name: str, **kw: Any) -> tuple[list[_aiperf.Record], float]:
                c0 = stack.cpu_s()
                recs = _aiperf.profile(aiperf, url, "llmsla-tiny" if worker else "m", tok, tmp / name,
                                       input_tokens=args.input_tokens, output_tokens=args.tokens,
                                       endpoint="chat" if worker else "completions", cpus=load_cpu, **kw)
                return recs, stack.cpu_s() - c0

            run("warmup", requests=50, concurrency=8)
            recs, cpu = run("capacity", requests=args.cap_requests, rate=args.cap_rate)
            ok = sum(r.ok for r in recs)
            served = _aiperf.served_rps(recs) or 0.0
            # fast: the gateway's own capacity is the rate at which its core is full (AIPerf cannot serve it)
            capacity = served if worker or not cpu else ok / cpu
            cap_row = {"upstream": args.upstream, "requests": ok, "capacity_rps": round(capacity, 1), "served_rps": round(served, 1),
                       "aiperf_request_throughput": _aiperf.summary(tmp / "capacity", "request_throughput"),
                       "gateway_cpu_ms_per_request": round(cpu / max(1, ok) * 1000, 3),
                       "gateway_core_full_at_rps": round(ok / cpu, 1) if cpu else None}
            print_table([cap_row], "capacity: requests served per second, offered far more")
            rate = args.overload * capacity
            n = max(50, int(rate * args.round_s))
            rows: list[dict[str, Any]] = []
            for i in range(args.rounds):
                before = set(stack.events(wait_s=0))
                recs, cpu = run(f"round{i}", requests=n, rate=rate, seed=i + 2)
                events = {k: e for k, e in stack.events().items() if k not in before}
                pairs = [(r.ttft_ms, events[r.trace_id].ttft_ms) for r in recs
                         if r.ok and r.trace_id in events and r.ttft_ms is not None
                         and events[r.trace_id].ttft_ms is not None]
                cl = np.array([x[0] for x in pairs])
                gw = np.array([x[1] for x in pairs])
                rows.append({"round": i, "requests": len(recs), "matched": len(pairs),
                             "offered_rps": round(rate, 1), "served_rps": round(_aiperf.served_rps(recs) or 0.0, 1),
                             "gateway_core_busy": round(cpu / (_aiperf.span_s(recs) or 1.0), 2),
                             "aiperf_ttft_p50_ms": p(cl, 50), "gateway_ttft_p50_ms": p(gw, 50),
                             "aiperf_ttft_p99_ms": p(cl, 99), "gateway_ttft_p99_ms": p(gw, 99),
                             "ratio_p99": round(float(np.percentile(gw, 99) / np.percentile(cl, 99)), 4)
                             if len(cl) else None})
                print_table(rows[-1:], f"round {i}")
    ratio = paired_interval([r["ratio_p99"] for r in rows], TARGET)
    print_table(rows, f"gateway TTFT p99 / AIPerf TTFT p99 at {args.overload}x capacity ({args.upstream})")
    print(f"ratio {ratio.get('geomean', float('nan')):.3f} [{ratio.get('low', float('nan')):.3f}, "
          f"{ratio.get('high', float('nan')):.3f}] over {ratio['rounds']} rounds; target >= {TARGET}: "
          f"{ratio['verdict']}")
    name = args.out or ("gateway-saturation" if worker else "gateway-saturation-fast")
    write_result(name, {"inputs": vars(args) | {"hot_cpu": hot_cpu, "load_cpu": load_cpu},
                        "capacity": cap_row, "rounds": rows, "ratio_p99": ratio})


if __name__ == "__main__":
    main()
