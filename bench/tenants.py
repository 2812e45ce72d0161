"""Tenant cardinality: 10,000 made-up tenants cannot grow ``/metrics`` or take a declared
tenant's series, and ``/metrics`` renders about as fast as without tenants.

Two ``llmsla gateway --workers 1`` processes over one fast SSE upstream (``bench/_sse_upstream.py``):
one with ``[tenants]`` on (a trusted tenant header, ``--declared`` tenants), one without. Both
get the same traffic from an aiohttp client: per declared tenant ``--per-tenant`` requests, and
``--made-up`` requests each naming a distinct invented tenant, interleaved. It checks the
declared tenants' ``llmsla_requests_total`` are exact and the invented ones are all ``other``
(and counted in ``llmsla_label_overflow_total{label="tenant"}``), prints ``/metrics`` bytes
before/after the flood, and times ``/metrics`` on both gateways in paired rounds (order
alternating): the geometric mean of the rounds' with/without ratios and its 95 % interval.
Target: within 2x (the interval's top <= 2).

``python bench/tenants.py [--made-up 10000] [--rounds 7]`` writes bench/results/tenants.json.
See docs/gateway.md#measured-against-aiperf.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import paired_interval, print_table, write_result  # noqa: E402
from _stack import Stack  # noqa: E402

from llmsla import names  # noqa: E402

HEADER = "X-Tenant"
TARGET = 2.0  # /metrics render time with tenants over without, at most
BODY = json.dumps({"model": "m", "stream": True, "max_tokens": 4, "prompt": "hi"}).encode()


async def send(urls: list[str], tenants: list[str | None], concurrency: int) -> dict[str, int]:
    """Each tenant's request to every URL; returns the status counts."""
    counts: dict[str, int] = {}
    todo: asyncio.Queue[tuple[str, str | None]] = asyncio.Queue()
    for t in tenants:
        for u in urls:
            todo.put_nowait((u, t))

    async def one(session: aiohttp.ClientSession) -> None:
        while not todo.empty():
            u, t = todo.get_nowait()
            hdrs = {"Content-Type": "application/json", **({HEADER: t} if t is not None else {})}
            try:
                async with session.post(u + "/v1/completions", data=BODY, headers=hdrs) as r:
                    await r.read()
                    key = str(r.status)
            except aiohttp.ClientError as exc:
                key = type(exc).__name__
            counts[key] = counts.get(key, 0) + 1

    conn = aiohttp.TCPConnector(limit=concurrency * len(urls))
    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(one(session) for _ in range(concurrency * len(urls))))
    return counts


def by_label(text: str, sample: str, label: str) -> dict[str, int]:
    """One sample name summed per value of one label (``llmsla_requests_total`` per tenant)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, int] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == sample:
                t = s.labels.get(label, "")
                out[t] = out.get(t, 0) + int(s.value)
    return out


def by_tenant(text: str) -> dict[str, int]:
    return by_label(text, names.REQUESTS + "_total", names.L_TENANT)


def render_s(url: str, n: int) -> float:
    """Median wall time of ``n`` GET /metrics (connection, render and transfer, loopback)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
            r.read()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--declared", default="acme:interactive,globex:batch,initech:sheddable")
    ap.add_argument("--per-tenant", type=int, default=300)
    ap.add_argument("--made-up", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--gets", type=int, default=20, help="GET /metrics per gateway per round")
    ap.add_argument("--out", default="tenants")
    args = ap.parse_args()
    declared = dict(p.split(":", 1) for p in args.declared.split(","))

    with tempfile.TemporaryDirectory(prefix="llmsla-tenants-") as t:
        tmp = Path(t)
        with Stack(tmp, {"LLMSLA_GATEWAY_CLIENT_SHARE": "1"}) as stack:
            stack.upstream(tokens=4, gap_s=0.0)
            plain = stack.gateway()
            ten = stack.gateway({"LLMSLA_GATEWAY_TRUSTED_PROXIES": "127.0.0.1", "LLMSLA_TENANTS_HEADER": HEADER,
                                 "LLMSLA_TENANTS_DECLARED": json.dumps(declared)})
            urls = [plain, ten]
            # every series of the warm path exists, the declared tenants' too: what the flood adds is its own
            asyncio.run(send(urls, [None, *declared] * 5, 4))
            before = {u: urllib.request.urlopen(u + "/metrics").read().decode() for u in urls}
            flood = [f"made-up-{i:05d}" for i in range(args.made_up)]
            decl = [d for d in declared for _ in range(args.per_tenant)]
            tenants: list[str | None] = [*flood, *decl]
            random.Random(1).shuffle(tenants)  # the declared tenants' requests amid the flood
            t0 = time.monotonic()
            status = asyncio.run(send(urls, tenants, args.concurrency))
            send_s = time.monotonic() - t0
            after = {u: urllib.request.urlopen(u + "/metrics").read().decode() for u in urls}
            rows = []
            for i in range(args.rounds):
                order = urls if i % 2 == 0 else urls[::-1]
                got = {u: render_s(u, args.gets) for u in order}
                rows.append({"round": i, "with_tenants_ms": round(got[ten] * 1000, 3),
                             "without_ms": round(got[plain] * 1000, 3), "ratio": round(got[ten] / got[plain], 4)})

    sent = {d: sum(1 for x in tenants if x == d) for d in declared}
    counted = by_tenant(after[ten])
    counted0 = by_tenant(before[ten])
    check: list[dict[str, Any]] = [{"tenant": d, "sent": sent[d], "counted": counted.get(d, 0) - counted0.get(d, 0),
                                    "exact": counted.get(d, 0) - counted0.get(d, 0) == sent[d]} for d in declared]
    other = counted.get(names.LABEL_OVERFLOW_VALUE, 0) - counted0.get(names.LABEL_OVERFLOW_VALUE, 0)
    check.append({"tenant": names.LABEL_OVERFLOW_VALUE, "sent": args.made_up, "counted": other,
                  "exact": other == args.made_up})
    overflow = (by_label(after[ten], names.LABEL_OVERFLOW + "_total", "label").get(names.L_TENANT, 0)
                - by_label(before[ten], names.LABEL_OVERFLOW + "_total", "label").get(names.L_TENANT, 0))
    check.append({"tenant": f"{names.LABEL_OVERFLOW}_total{{label=tenant}}", "sent": args.made_up,
                  "counted": overflow, "exact": overflow == args.made_up})
    invented_labels = [k for k in counted if k.startswith("made-up-")]
    size = [{"gateway": name, "metrics_bytes_before": len(before[u]), "metrics_bytes_after": len(after[u]),
             "growth": len(after[u]) - len(before[u])} for name, u in (("with tenants", ten), ("without", plain))]
    ratio = paired_interval([r["ratio"] for r in rows])
    verdict = ("met" if ratio.get("high", float("inf")) <= TARGET else
               "not met" if ratio.get("low", 0.0) > TARGET else "unresolved")
    print(f"{len(tenants)} requests to each gateway in {send_s:.1f} s; statuses {status}")
    print_table(check, "declared tenants' series and the invented ones' fold (gateway with tenants)")
    print(f"series labelled with an invented tenant: {len(invented_labels)}")
    print_table(size, "/metrics size")
    print_table(rows, "/metrics render time, paired rounds (median of each round's GETs)")
    print(f"with/without ratio {ratio.get('geomean', float('nan')):.3f} [{ratio.get('low', float('nan')):.3f}, "
          f"{ratio.get('high', float('nan')):.3f}]; target <= {TARGET}: {verdict}")
    result: dict[str, Any] = {"inputs": vars(args), "statuses": status, "send_s": round(send_s, 1),
                              "declared": check, "invented_series": len(invented_labels), "size": size,
                              "rounds": rows, "ratio": ratio | {"verdict": verdict, "target": f"<= {TARGET}"}}
    write_result(args.out, result)


if __name__ == "__main__":
    main()
