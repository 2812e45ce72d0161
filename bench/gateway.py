"""Gateway bench: a core's worth of the llmsla gateway measured against nginx on the same upstream.

Four processes: the raw-protocol SSE upstream and the raw-protocol keep-alive load client of
``bench/exporters.py`` (``serve_upstream``, ``load_client``), nginx as a streaming reverse proxy
(Debian's package: ``apt-get install nginx-light``; this bench installs nothing) from a config
generated in a temp dir, and ``llmsla gateway --workers 1``. Each proxy is pinned to one core
with ``taskset``; the upstream and the client share the other core (on a 2-core machine: proxies
on CPU 1, upstream and client on CPU 0). One client run drives the direct path and both proxies,
interleaved round by round (order alternating), so a busy moment on a shared machine hits them
alike; "added" TTFT is a proxy's per-round p50/p99 minus the direct path's in the same round,
the median over rounds.

``--general`` adds the same gateway with ``gateway.fast_path = false`` (``llmsla-general``) to
the same interleaved rounds, to show what the fast path changes on the same machine at the same time.
``--relay`` adds a bare TCP relay in Python (``bench/_relay.py``, ``python-relay``: bytes copied both
ways on uvloop, no HTTP parsing, no accounting) to the same rounds: the floor of any Python proxy
on this machine, so what the gateway adds beyond it is its own per-request work.
``--vs-ref REV`` adds the gateway of another git revision (``llmsla-ref``: that revision's code,
this venv's dependencies, started in that revision's own tree) to the same rounds, and prints
this revision's added p50 minus REV's, round by round, with a 95 % interval, and the ratio of
their CPU per request: a change is measured against its parent on the same load. Its results go
to ``gateway-<scenarios>-vs-<REV>.json``.

Scenarios: (a) 50 streams x 8 tokens at 2 ms/token; (b) 200 streams x 256 tokens at 20 ms/token;
(c) closed-loop streams ramped (4, 8, 16, ...) on (a)'s upstream until both proxies' added TTFT
p99 passes 5 ms. Per proxy it prints requests/s and chunks/s per core (the proxy is pinned to one
core, so its throughput is per core), whether that rate held added p99 <= 5 ms, CPU per request
(``/proc`` schedstat of its processes) and added TTFT p50/p99. Targets: llmsla's requests/s per
core at added p99 <= 5 ms >= 0.25x nginx's on (a) and (c); added TTFT p50 <= 0.5 ms on (b).

``python bench/gateway.py [--quick] [--only a|b|c]`` prints the table and writes
bench/results/gateway.json (``--only``: bench/results/gateway-<scenarios>.json).
``--profile OUT.prof`` runs scenario (a) with the gateway under cProfile and prints its top costs.
See docs/gateway.md#capacity-per-core-against-nginx.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import mean_interval, print_table, write_result  # noqa: E402

from exporters import _cpu_ns_threads, _loadavg, check_runs_from, legacy_tree  # noqa: E402
from llmsla.services import free_port, wait_http  # noqa: E402

NGINX = "/usr/sbin/nginx"
EXPORTERS = str(Path(__file__).resolve().parent / "exporters.py")
P99_LIMIT_MS = 5.0
#: ``--general``: the gateway with ``gateway.fast_path = false`` as a third proxy, same rounds
GENERAL = "llmsla-general"
#: ``--vs-ref REV``: the gateway of another revision as a fourth proxy, same rounds
REF = "llmsla-ref"
#: ``--relay``: a bare TCP relay in Python as another proxy, same rounds (the floor of a Python proxy)
RELAY = "python-relay"
RELAY_SCRIPT = str(Path(__file__).resolve().parent / "_relay.py")
PROXIES = ("nginx", "llmsla", GENERAL, REF, RELAY)
#: llmsla's requests/s per core at added p99 <= 5 ms, as a share of nginx's, on (a) and (c).
RATE_TARGET = 0.25
#: added TTFT p50 on (b), ms.
P50_TARGET_B_MS = 0.5

NGINX_CONF = """\
worker_processes 1;
pid {tmp}/nginx.pid;
daemon off;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream llm {{
        server 127.0.0.1:{upstream};
        keepalive 512;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        tcp_nodelay on;
        keepalive_requests 100000;
        keepalive_timeout 600s;
        client_header_timeout 600s;
        location = /healthz {{ return 200 "ok"; }}
        location / {{
            proxy_pass http://llm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


#: The gateway under cProfile on the CPU clock of its thread (the default wall clock would charge
#: the event loop's idle waits to whatever frame was current), stats written when it stops.
PROFILED = """
import cProfile, runpy, sys, time
sys.argv = {argv!r}
prof = cProfile.Profile(time.thread_time)
prof.enable()
try:
    runpy.run_module("llmsla", run_name="__main__")
except SystemExit:
    pass
finally:
    prof.disable()
    prof.dump_stats({out!r})
"""


def cpus() -> tuple[str, str]:
    """(the proxies' core, the upstream's and client's core) from this process's affinity."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        return str(mine[0]), str(mine[0])
    return str(mine[-1]), str(mine[0])


def _pids(root: int) -> list[int]:
    """A process and its children (nginx's master and worker)."""
    out = [root]
    for task in Path(f"/proc/{root}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _cpu_s(pids: list[int]) -> float:
    return sum(_cpu_ns_threads(p) for p in pids) / 1e9


class Stack:
    """The upstream, nginx (when installed) and the llmsla gateway, pinned; stopped on exit."""

    def __init__(self, tmp: Path, tokens: int, gap_s: float, profile: str | None = None,
                 general: bool = False, ref: Path | None = None, relay: bool = False) -> None:
        self.tmp, self.tokens, self.gap_s, self.profile, self.general = tmp, tokens, gap_s, profile, general
        self.relay = relay
        self.ref = ref  # another revision's package tree (``--vs-ref``), run as REF
        self.proxy_cpu, self.load_cpu = cpus()
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        # the load client opens every connection before the first warm-up, and (b)'s warm-up of
        # the targets before a proxy takes longer than the 10 s slowloris bound on a request head
        self.env = {**os.environ, "LLMSLA_SPOOL_DIR": str(tmp / "spool"),
                    "LLMSLA_CONTROL_ROUTE_POLICY": "round_robin", "LLMSLA_HTTP_HEADER_TIMEOUT_S": "600",
                    "LLMSLA_HTTP_KEEPALIVE_TIMEOUT_S": "600"}
        self.env.pop("PROMETHEUS_MULTIPROC_DIR", None)

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        up = self.ports["direct"] = free_port()
        self.procs["direct"] = subprocess.Popen(
            ["taskset", "-c", self.load_cpu, sys.executable, EXPORTERS, "--serve-upstream", str(up),
             "--gap-s", str(self.gap_s), "--tokens", str(self.tokens)], env=self.env)
        wait_http(f"http://127.0.0.1:{up}/healthz", proc=self.procs["direct"])
        if os.access(NGINX, os.X_OK):
            port = self.ports["nginx"] = free_port()
            conf_dir = self.tmp / f"nginx-{port}"
            conf_dir.mkdir(parents=True)
            (conf_dir / "nginx.conf").write_text(NGINX_CONF.format(tmp=conf_dir, upstream=up, port=port))
            self.procs["nginx"] = subprocess.Popen(
                ["taskset", "-c", self.proxy_cpu, NGINX, "-p", str(conf_dir), "-e", str(conf_dir / "error.log"),
                 "-c", str(conf_dir / "nginx.conf")], env=self.env)
            wait_http(f"http://127.0.0.1:{port}/healthz", proc=self.procs["nginx"])
        port = self.ports["llmsla"] = free_port()
        argv = ["gateway", "--port", str(port), "--workers", "1", "--upstream", f"http://127.0.0.1:{up}"]
        run = ["-c", PROFILED.format(out=self.profile, argv=["llmsla", *argv])] if self.profile else ["-m", "llmsla", *argv]
        self.procs["llmsla"] = subprocess.Popen(["taskset", "-c", self.proxy_cpu, sys.executable, *run], env=self.env,
                                                stdout=subprocess.DEVNULL)
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=self.procs["llmsla"])
        if self.general:  # the same gateway with its fast path off: aiohttp's server for everything
            port = self.ports[GENERAL] = free_port()
            argv = ["gateway", "--port", str(port), "--workers", "1", "--upstream", f"http://127.0.0.1:{up}"]
            env = {**self.env, "LLMSLA_SPOOL_DIR": str(self.tmp / "spool-general"), "LLMSLA_GATEWAY_FAST_PATH": "false"}
            self.procs[GENERAL] = subprocess.Popen(["taskset", "-c", self.proxy_cpu, sys.executable, "-m", "llmsla",
                                                    *argv], env=env, stdout=subprocess.DEVNULL)
            wait_http(f"http://127.0.0.1:{port}/healthz", proc=self.procs[GENERAL])
        if self.ref is not None:  # the same command on another revision's code, this venv's dependencies
            port = self.ports[REF] = free_port()
            argv = ["gateway", "--port", str(port), "--workers", "1", "--upstream", f"http://127.0.0.1:{up}"]
            env = {**self.env, "LLMSLA_SPOOL_DIR": str(self.tmp / "spool-ref"), "PYTHONPATH": str(self.ref)}
            check_runs_from(self.ref, env)  # cwd: the tree, or ``-m`` would run the checkout's code
            self.procs[REF] = subprocess.Popen(["taskset", "-c", self.proxy_cpu, sys.executable, "-m", "llmsla",
                                                *argv], env=env, cwd=self.ref, stdout=subprocess.DEVNULL)
            wait_http(f"http://127.0.0.1:{port}/healthz", proc=self.procs[REF])
        if self.relay:  # the floor: bytes copied both ways, nothing else
            port = self.ports[RELAY] = free_port()
            self.procs[RELAY] = subprocess.Popen(["taskset", "-c", self.proxy_cpu, sys.executable, RELAY_SCRIPT,
                                                  str(port), str(up)], env=self.env)
            wait_http(f"http://127.0.0.1:{port}/healthz", proc=self.procs[RELAY])

    def proxies(self) -> list[str]:
        return [n for n in PROXIES if n in self.procs]

    def cpu(self) -> dict[str, float]:
        return {n: _cpu_s(_pids(self.procs[n].pid)) for n in self.proxies()}

    def __exit__(self, *exc: object) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def drive(stack: Stack, concurrency: int, per_stream: int, rounds: int) -> dict[str, Any]:
    """One interleaved client run over the direct path and the proxies: per proxy the medians
    over rounds of requests/s, added p50/p99, and its CPU per request over the run."""
    order = ["direct", *stack.proxies()]
    if REF in order:  # the two gateways at the two ends: rounds alternate the order, so each runs
        # twice in a row (warm from its own last turn) equally often, and neither is favoured
        order = ["llmsla", *[n for n in order if n not in ("llmsla", REF)], REF]
    targets = {n: stack.ports[n] for n in order}
    cpu0 = stack.cpu()
    out = subprocess.run(
        ["taskset", "-c", stack.load_cpu, sys.executable, EXPORTERS, "--load-client", json.dumps(targets),
         "--concurrency", str(concurrency), "--per-stream", str(per_stream), "--rounds", str(rounds),
         "--stagger-s", str(stack.gap_s * stack.tokens)],
        env=stack.env, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"load client failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    cpu1 = stack.cpu()
    res = json.loads(out.stdout)
    direct = res["direct"]
    row: dict[str, Any] = {"streams": concurrency,
                           "direct_p50_ms": round(statistics.median(r["p50"] for r in direct), 3),
                           "direct_p99_ms": round(statistics.median(r["p99"] for r in direct), 3)}
    for n in stack.proxies():
        rs = res[n]
        served = sum(r["n"] for r in rs) + 2 * concurrency  # + the client's warm-up requests
        rate = statistics.median(r["n"] / r["wall_s"] for r in rs)
        p99 = statistics.median(g["p99"] - d["p99"] for d, g in zip(direct, rs, strict=True))
        p50s = [g["p50"] - d["p50"] for d, g in zip(direct, rs, strict=True)]
        row[n] = {"requests_per_s": round(rate, 1), "chunks_per_s": round(rate * stack.tokens, 1),
                  "added_p50_ms": round(statistics.median(p50s), 3),
                  "per_round_added_p50_ms": [round(x, 3) for x in p50s],
                  "added_p99_ms": round(p99, 3), "p99_within_5ms": p99 <= P99_LIMIT_MS,
                  "cpu_ms_per_request": round((cpu1[n] - cpu0[n]) * 1000.0 / served, 4),
                  "per_round_added_p99_ms": [round(g["p99"] - d["p99"], 3) for d, g in zip(direct, rs, strict=True)]}
    if REF in res:  # this revision against the reference, round by round: the difference of their p50s
        diff = [g["p50"] - r["p50"] for r, g in zip(res[REF], res["llmsla"], strict=True)]
        row["llmsla_minus_ref_p50_ms"] = {"per_round": [round(x, 3) for x in diff], **mean_interval(diff)}
    return row


def fixed(name: str, tmp: Path, tokens: int, gap_s: float, concurrency: int, per_stream: int, rounds: int,
          profile: str | None = None, general: bool = False, ref: Path | None = None,
          relay: bool = False) -> dict[str, Any]:
    with Stack(tmp, tokens, gap_s, profile, general, ref, relay) as stack:
        row = drive(stack, concurrency, per_stream, rounds)
    return {"scenario": name, "tokens": tokens, "gap_ms": gap_s * 1000.0, **row}


def ramp(tmp: Path, steps: list[int], per_stream: int, rounds: int, general: bool = False,
         ref: Path | None = None, relay: bool = False) -> dict[str, Any]:
    """(c): more closed-loop streams each step (a higher request rate) until every proxy's added
    p99 passes 5 ms; a proxy's capacity is its highest rate with added p99 <= 5 ms."""
    tokens, gap_s = 8, 0.002
    out: dict[str, Any] = {"scenario": "c", "tokens": tokens, "gap_ms": gap_s * 1000.0, "steps": []}
    with Stack(tmp, tokens, gap_s, general=general, ref=ref, relay=relay) as stack:
        passed: set[str] = set()
        for c in steps:
            row = drive(stack, c, per_stream, rounds)
            out["steps"].append(row)
            print(f"  ramp {c} streams: " + ", ".join(
                f"{n} {row[n]['requests_per_s']:.0f}/s +{row[n]['added_p99_ms']:.2f} ms p99" for n in stack.proxies()),
                flush=True)
            passed |= {n for n in stack.proxies() if not row[n]["p99_within_5ms"]}
            if passed == set(stack.proxies()):
                break
        for n in stack.proxies():
            ok = [s[n] for s in out["steps"] if s[n]["p99_within_5ms"]]
            best = max(ok, key=lambda r: r["requests_per_s"]) if ok else None
            out[n] = {"requests_per_s": best["requests_per_s"] if best else 0.0,
                      "chunks_per_s": best["chunks_per_s"] if best else 0.0,
                      "added_p50_ms": best["added_p50_ms"] if best else None,
                      "added_p99_ms": best["added_p99_ms"] if best else None,
                      "p99_within_5ms": best is not None,
                      "cpu_ms_per_request": best["cpu_ms_per_request"] if best else None}
    return out


def table(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        for n in PROXIES:
            if n not in r:
                continue
            m = r[n]
            rows.append({"scenario": r["scenario"], "proxy": n, "streams": r.get("streams", "ramp"),
                         "req_per_s_core": m["requests_per_s"], "chunks_per_s_core": m["chunks_per_s"],
                         "p99_le_5ms": m["p99_within_5ms"], "cpu_ms_per_req": m["cpu_ms_per_request"],
                         "added_p50_ms": m["added_p50_ms"], "added_p99_ms": m["added_p99_ms"]})
    return rows


def verdicts(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in results:
        s, g = r["scenario"], r["llmsla"]
        if s in ("a", "c"):
            n = r.get("nginx")
            # at a fixed load a proxy whose added p99 is over 5 ms has no rate "at p99 <= 5 ms"
            mine = g["requests_per_s"] if g["p99_within_5ms"] else 0.0
            theirs = n["requests_per_s"] if n and n["p99_within_5ms"] else None
            ratio = mine / theirs if theirs else None
            out[s] = {"llmsla_rate_at_p99_le_5ms": mine, "nginx_rate_at_p99_le_5ms": theirs,
                      "ratio": None if ratio is None else round(ratio, 3), "target": RATE_TARGET,
                      "met": None if ratio is None else ratio >= RATE_TARGET}
        elif s == "b":
            # the median over rounds against the target, and the per-round mean's 95 % interval:
            # a median near the line is only a verdict when the interval is clear of it
            out[s] = {"llmsla_added_p50_ms": g["added_p50_ms"], "target_ms": P50_TARGET_B_MS,
                      "met": g["added_p50_ms"] <= P50_TARGET_B_MS,
                      "per_round_interval": mean_interval(g["per_round_added_p50_ms"], P50_TARGET_B_MS)}
    return out


def print_profile(path: str, top: int = 30) -> None:
    import pstats

    pstats.Stats(path).sort_stats("tottime").print_stats(top)
    pstats.Stats(path).sort_stats("cumulative").print_stats(top)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run while developing")
    ap.add_argument("--only", choices=["a", "b", "c"], action="append", help="one scenario (repeatable)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per run (default 7, quick 3)")
    ap.add_argument("--profile", metavar="OUT", help="scenario (a) with the gateway under cProfile; print top costs")
    ap.add_argument("--general", action="store_true",
                    help=f"also run the gateway with gateway.fast_path = false ({GENERAL}) in the same rounds")
    ap.add_argument("--relay", action="store_true",
                    help=f"also run a bare TCP relay in Python ({RELAY}) in the same rounds: the floor of a Python proxy")
    ap.add_argument("--vs-ref", metavar="REV",
                    help=f"also run the gateway of git revision REV ({REF}) in the same rounds, and print "
                         "this revision's added p50 minus REV's per round, with an interval")
    args = ap.parse_args()
    if not os.access(NGINX, os.X_OK):
        print(f"nginx is not installed ({NGINX}): `apt-get install nginx-light` (Debian/Ubuntu) to compare; "
              "measuring the llmsla gateway alone", file=sys.stderr)
    if shutil.which("taskset") is None:
        print("taskset (util-linux) is needed to pin the processes", file=sys.stderr)
        return 2
    rounds = args.rounds or (3 if args.quick else 7)
    ref = legacy_tree(args.vs_ref) if args.vs_ref else None
    proxy_cpu, load_cpu = cpus()
    with tempfile.TemporaryDirectory(prefix="llmsla-bench-gw-") as t:
        tmp = Path(t)
        if args.profile:
            row = fixed("a", tmp / "a", 8, 0.002, 50, 10, rounds, profile=os.path.abspath(args.profile))
            print_table(table([row]), "scenario (a) with the gateway under cProfile")
            print_profile(args.profile)
            return 0
        todo = args.only or ["a", "b", "c"]
        results = []
        inputs: dict[str, Any] = {"rounds": rounds, "proxy_cpu": proxy_cpu, "upstream_and_client_cpu": load_cpu,
                                  "nginx": subprocess.run([NGINX, "-v"], capture_output=True, text=True).stderr.strip()
                                  if os.access(NGINX, os.X_OK) else None}
        load0 = _loadavg()
        for s in todo:
            (tmp / s).mkdir()
            print(f"scenario ({s}) ...", flush=True)
            if s == "a":
                results.append(fixed("a", tmp / s, 8, 0.002, 50, 4 if args.quick else 10, rounds, general=args.general,
                                     ref=ref, relay=args.relay))
            elif s == "b":
                results.append(fixed("b", tmp / s, 256, 0.020, 200, 1, rounds, general=args.general, ref=ref,
                                     relay=args.relay))
            else:
                steps = [4, 8, 16, 32, 64, 128, 256]
                results.append(ramp(tmp / s, steps, 4 if args.quick else 10, rounds, general=args.general, ref=ref,
                                    relay=args.relay))
        inputs["loadavg_1m_before"], inputs["loadavg_1m_after"] = load0, _loadavg()
        inputs["vs_ref"] = args.vs_ref
        inputs["relay"] = args.relay
    if ref is not None:
        shutil.rmtree(ref.parent, ignore_errors=True)
    rows = table(results)
    print_table(rows, f"per core (proxies pinned to CPU {proxy_cpu}, upstream and client to CPU {load_cpu})")
    v = verdicts(results)
    print("\ntargets:", json.dumps(v, indent=1))
    for r in results:
        vs = r.get("llmsla_minus_ref_p50_ms") or {}
        if "mean" in vs:
            print(f"({r['scenario']}) added p50, this revision minus {args.vs_ref}: mean {vs['mean']:+.3f} ms, "
                  f"95 % interval [{vs['low']:+.3f}, {vs['high']:+.3f}] over {vs['rounds']} rounds")
        if REF in r and r["llmsla"]["cpu_ms_per_request"] and r[REF]["cpu_ms_per_request"]:
            print(f"({r['scenario']}) CPU per request, this revision / {args.vs_ref}: "
                  f"{r['llmsla']['cpu_ms_per_request'] / r[REF]['cpu_ms_per_request']:.3f}")
    name = "gateway" if not args.only else "gateway-" + "".join(todo)
    if args.vs_ref:  # a comparison never replaces the run the docs quote
        name += "-vs-" + "".join(c if c.isalnum() else "_" for c in args.vs_ref)
    write_result(name, {"inputs": inputs, "rows": rows, "targets": v, "scenarios": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
