"""Goodput: the gateway's live goodput counter against AIPerf's ``--goodput`` on the same requests.

Two reference workers (``llmsla worker``, the tiny CPU transformer) behind ``llmsla gateway``;
AIPerf (``bench/_aiperf.py``) sends a fixed count of streamed chat requests with ``--goodput``
set to the SLO catalog's objectives as the gateway reads them (TTFT -> ``time_to_first_token``,
TPOT -> ``inter_token_latency``, which AIPerf defines as the gateway does: (E2E - TTFT) / (output
tokens - 1), E2E -> ``request_latency``, all ms). The bench writes its own SLO directory (the
shipped specs plus a TPOT spec) and thresholds (``--ttft-ms`` ...: bounds of the histograms)
chosen so that load puts a share of requests on each side; the gateway and AIPerf both get them
from that catalog.

It prints: the counter's delta over the run against AIPerf's good request count (target: within
1 % of the requests); every AIPerf request matched to one RequestEvent by the trace id the gateway
returned (``X-Request-Id``), unmatched counts both ways; per matched request whether each side
called it good, and the client time before the gateway's clock (client TTFT - gateway TTFT,
p50/p99: the expected offset between a client's figures and the gateway's).

``python bench/goodput.py [--aiperf PATH] [--requests 600] [--concurrency 12]`` writes
bench/results/goodput.json. See docs/alerting.md#goodput-measured-against-aiperf.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _aiperf  # noqa: E402
from _common import print_table, write_result  # noqa: E402
from _stack import Stack  # noqa: E402

from llmsla import config, names, slo_catalog  # noqa: E402
from llmsla.exporters.metrics import GoodputBounds, tpot_seconds  # noqa: E402
from llmsla.resources import deploy  # noqa: E402

TARGET_SHARE = 0.01  # |gateway - AIPerf| good requests, as a share of the requests


def slo_dir(tmp: Path) -> Path:
    """The shipped specs plus a fleet-wide TPOT objective on ``slo.itl_ms``."""
    d = tmp / "slo"
    shutil.copytree(deploy("slo"), d)
    ttft = (d / "ttft.yaml").read_text()
    (d / "tpot.yaml").write_text(ttft.replace("name: ttft\n", "name: tpot\n")
                                 .replace(names.REQUEST_TTFT_SECONDS, names.REQUEST_TPOT_SECONDS)
                                 .replace("value: slo.ttft_ms", "value: slo.itl_ms"))
    return d


def goodput_arg(bounds: GoodputBounds) -> str:
    """AIPerf's ``--goodput`` from the catalog's bounds (AIPerf's display unit is ms)."""
    parts = []
    for tag, s in (("time_to_first_token", bounds.ttft_s), ("inter_token_latency", bounds.tpot_s),
                   ("request_latency", bounds.e2e_s)):
        if s is not None:
            parts.append(f"{tag}:{s * 1000.0:g}")
    return " ".join(parts)


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 3) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aiperf", help="aiperf executable (default: $AIPERF, else aiperf on PATH)")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--input-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=24)
    ap.add_argument("--ttft-ms", type=float, default=200.0, help="slo.ttft_ms (a bound of metrics.ttft_buckets)")
    ap.add_argument("--tpot-ms", type=float, default=20.0, help="slo.itl_ms (a bound of metrics.itl_buckets)")
    ap.add_argument("--e2e-ms", type=float, default=1000.0, help="slo.e2e_ms")
    ap.add_argument("--out", default="goodput", help="result name under bench/results/")
    args = ap.parse_args()
    aiperf = _aiperf.find(args.aiperf)

    with tempfile.TemporaryDirectory(prefix="llmsla-goodput-") as t:
        tmp = Path(t)
        env = {"LLMSLA_SLO_DIR": str(slo_dir(tmp)), "LLMSLA_SLO_TTFT_MS": f"{args.ttft_ms:g}",
               "LLMSLA_SLO_ITL_MS": f"{args.tpot_ms:g}", "LLMSLA_SLO_E2E_MS": f"{args.e2e_ms:g}",
               "LLMSLA_GATEWAY_CLIENT_SHARE": "1"}
        bounds = GoodputBounds.from_catalog(slo_catalog.load(config.load(env={**env})))
        goodput = goodput_arg(bounds)
        tok = _aiperf.tokenizer(aiperf, tmp / "tokenizer")
        with Stack(tmp, env) as stack:
            for _ in range(args.workers):
                stack.worker(max_batch=args.max_batch)
            url = stack.gateway()
            before_ids = set(stack.events(wait_s=0))
            good0 = stack.sample_sum(names.REQUEST_GOODPUT + "_total")
            t0 = time.monotonic()
            recs = _aiperf.profile(aiperf, url, "llmsla-tiny", tok, tmp / "aiperf", requests=args.requests,
                                   input_tokens=args.input_tokens, output_tokens=args.output_tokens,
                                   concurrency=args.concurrency, goodput=goodput)
            wall = time.monotonic() - t0
            good1 = stack.sample_sum(names.REQUEST_GOODPUT + "_total")
            events = {k: e for k, e in stack.events().items() if k not in before_ids}
            aiperf_good_summary = _aiperf.good_count(tmp / "aiperf")

    gw_good = good1 - good0
    ap_good = sum(r.good for r in recs)
    by_id = {r.trace_id: r for r in recs if r.trace_id}
    matched = [(r, events[k]) for k, r in by_id.items() if k in events]
    no_event = len(recs) - len(matched)
    no_record = len(set(events) - set(by_id))
    # per request: what each side called good (the gateway's rule on its own figures)
    both = gw_only = ap_only = 0
    ttft_off: list[float] = []
    wire_off: list[float] = []  # the same, less AIPerf's wait for and opening of a connection
    # where it is: before the gateway's clock starts (its arrival = ts_ms - e2e_ms, 1 ms steps),
    # of which AIPerf's own send (start to last byte written), and after its first-token stamp
    pre: list[float] = []
    send: list[float] = []
    post: list[float] = []
    e2e_off: list[float] = []
    for r, e in matched:
        tpot = tpot_seconds(e.status, None if e.ttft_ms is None else e.ttft_ms / 1000, e.e2e_ms / 1000, e.output_tokens)
        g = e.status == names.STATUS_OK and bounds.met(None if e.ttft_ms is None else e.ttft_ms / 1000, tpot,
                                                        e.e2e_ms / 1000)
        both += g and r.good
        gw_only += g and not r.good
        ap_only += r.good and not g
        if r.ttft_ms is not None and e.ttft_ms is not None:
            ttft_off.append(r.ttft_ms - e.ttft_ms)
            wire_off.append(r.ttft_ms - r.connect_ms - e.ttft_ms)
            if r.start_ns is not None:
                before = (e.ts_ms - e.e2e_ms) - r.start_ns / 1e6
                pre.append(before)
                post.append(r.ttft_ms - e.ttft_ms - before)
                if r.sent_ns is not None:
                    send.append((r.sent_ns - r.start_ns) / 1e6)
        if r.latency_ms is not None:
            e2e_off.append(r.latency_ms - e.e2e_ms)
    diff = abs(gw_good - ap_good)
    row: dict[str, Any] = {
        "requests": len(recs), "aiperf_good": ap_good, "gateway_goodput_delta": gw_good,
        "diff": diff, "diff_share": round(diff / max(1, len(recs)), 4),
        "target": f"<= {TARGET_SHARE:.0%}", "met": diff <= TARGET_SHARE * len(recs),
    }
    match = {"matched": len(matched), "aiperf_without_event": no_event, "events_without_aiperf_record": no_record,
             "good_both": both, "good_gateway_only": gw_only, "good_aiperf_only": ap_only}
    offset = {"ttft_offset_p50_ms": pct(ttft_off, 50), "ttft_offset_p99_ms": pct(ttft_off, 99),
              "less_connect_p50_ms": pct(wire_off, 50), "less_connect_p99_ms": pct(wire_off, 99),
              "e2e_offset_p50_ms": pct(e2e_off, 50), "e2e_offset_p99_ms": pct(e2e_off, 99),
              "client_ttft_p50_ms": pct([r.ttft_ms for r, _ in matched if r.ttft_ms is not None], 50),
              "gateway_ttft_p50_ms": pct([e.ttft_ms for _, e in matched if e.ttft_ms is not None], 50)}
    split = {"before_gateway_clock_p50_ms": pct(pre, 50), "before_gateway_clock_p99_ms": pct(pre, 99),
             "aiperf_send_p50_ms": pct(send, 50), "aiperf_send_p99_ms": pct(send, 99),
             "after_first_token_p50_ms": pct(post, 50), "after_first_token_p99_ms": pct(post, 99)}
    print(f"--goodput {goodput!r}; {args.requests} requests at concurrency {args.concurrency}, {wall:.1f} s")
    print_table([row], "goodput: gateway counter delta vs AIPerf good requests")
    print_table([match], "per request, matched by trace id (X-Request-Id = RequestEvent.trace_id)")
    print_table([offset], "expected offset: client time the gateway's clock does not see (client - gateway)")
    print_table([split], "where the TTFT offset is (arrival from ts_ms - e2e_ms: 1 ms steps)")
    write_result(args.out, {"inputs": vars(args) | {"goodput": goodput}, "result": row, "match": match,
                            "offset": offset, "offset_split": split, "aiperf_good_request_count_summary": aiperf_good_summary,
                            "wall_s": round(wall, 1)})


if __name__ == "__main__":
    main()
