"""Routing policies on a simulated 3-GPU fleet: the reference study's four scenarios.

For each scenario and each policy (round_robin = the anchor, least_outstanding, p2c, ladr, and
two LADR ablations: i.i.d. instead of systematic sampling, and alpha = 0 i.e. queue only) the
fleet simulator (real ``Router`` code, simulated clock) reports P99 E2E latency and P99 TTFT at
a fixed load - the median over ``--seeds`` seeds, and the ratio to round robin as the median
(min, max) of the per-seed ratios, since one seed of an overloaded scenario swings P99 by +-25 % -
the maximum Poisson rate whose P99 E2E stays under the SLO (seed 0, bisection over the rate, same
seed at every rate so the search sees common random numbers), and KV-cache use (seed 0).

Scenarios (3 GPUs each):

* ``chat``      - short chat, ~128 prompt / ~128 output tokens (log-normal), 3 x 6B;
* ``long``      - long context, 2,048 in / 256 out, 3 x 6B;
* ``burst``     - 800 concurrent chat requests on top of background chat traffic, 3 x 6B;
* ``mixed``     - chat on a heterogeneous pool: 1 x 70B + 2 x 6B serving the same requests;
* ``straggler`` - (extra) chat on 3 x 6B with one replica slowed 3x for the whole run, the
  homogeneous-hardware case where a latency-aware router still has something to see.

Held out (never used to choose LADR's defaults, which were picked on the five scenarios above):
the Azure conversation trace at 2x on 8 x 6B with one replica throttled to half speed, and on a
mixed 2 x 13B + 2 x 6B fleet (seeds as above, 3 by default).

Variance sweep (why the reference's homogeneous-fleet gains need per-replica variance): chat on
3 x 6B at 10 req/s where every replica independently spends a third of the time slowed by a
factor f, in windows of exponential length (mean 20 s or 120 s), round robin vs least-outstanding
vs LADR.

Then the Azure conversation trace (first ``--trace-minutes``) replayed at 1x, 2x and 4x its rate
on 8 x 6B, and the speed check: one hour of that trace on 8 replicas, engine alone and with the
gateway's recorders writing the spool (target: <= 30 s wall).

Every scenario, held-out run and variance level also has LADR with its expected-completion-time
term (``ladr+ect``: each replica's decode and prefill speed per token learnt from the first tokens
and completions it returned, times its live queue and the prompt tokens waiting there, and each
request's own prompt size; control/estimator.py), that plus engine signals (the replicas'
waiting / running / KV usage every engine.scrape_interval_s) and the simulator's oracle
(fleet/oracle.py): each policy's P99 TTFT and E2E as a ratio to the oracle's, and whether
``ladr+ect`` is within 10 % of it; ``ladr+engine(defaults)`` is ``ladr+ect`` with the engine
signals at the scorers' default weights (0), where they enter only through the ECT: as the
decode load of the tokens streaming back, and as a slot's turn charged to each request waiting
at a full batch. On the identical-replica scenarios, each engine variant against
LADR without engine signals (``ladr+ect`` and plain ``ladr``), per seed on the same arrivals,
with a 95 % interval over ``--homogeneous-seeds`` (30): the "never worse" half of the target.
``--sweep-engine`` sweeps the engine-scorer weights on top of ``ladr+ect`` on the five training
scenarios (how their defaults were chosen); ``--only-oracle`` skips the max-QPS search, the
replay and the speed check (JSON: routing-oracle.json).

    python bench/routing.py [--quick] [--seed 0] [--only-oracle] [--sweep-engine]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import paired_interval, print_table, write_result  # noqa: E402

from llmsla import config as config_mod  # noqa: E402
from llmsla.fleet import engine, faults, stats, traces, workload  # noqa: E402
from llmsla.fleet.sink import RecorderSink  # noqa: E402

POLICIES = ("round_robin", "least_outstanding", "p2c", "ladr")
#: LADR scoring the expected completion time it learns (control/estimator.py) instead of relative
#: latency and queue: ect = 3, alpha = beta = 0, chosen on the five training scenarios (ect 1 / 3 /
#: 8, ect_n0 4 / 8 / 16 / 32, with and without the queue term; docs/control.md); that plus the
#: replicas' engine signals (waiting, running, KV usage every engine.scrape_interval_s, held until
#: the next scrape) with both scorers at llm-d's weight 1 (the defaults are 0: see
#: --sweep-engine); and the simulator's oracle (the bound).
ECT, ENGINE, ORACLE = "ladr+ect", "ladr+engine", "oracle"
#: ``ladr+ect`` with the same engine signals at the scorers' default weights (0, chosen on the
#: training scenarios by --sweep-engine): the engine data then enters only through the ECT, as
#: the decode load of the tokens streaming back (the engine's running batch, control/router.py
#: ``tokens``) and as a slot's turn per request waiting at a full batch (control/ladr.py
#: ``slot_turn``).
ENGINE_DEFAULTS = "ladr+engine(defaults)"
#: The variants that get engine signals in the simulator.
WITH_ENGINE = (ENGINE, ENGINE_DEFAULTS)
#: ``ladr+ect`` learning each replica's decode speed from its completions alone, not also from
#: the tokens its streams return (``ect_cadence`` = 0): what reading the tokens buys.
ECT_COMPLETIONS = "ladr+ect(completions)"
#: floor 0.001 (LADR's default 0.01 keeps ~0.5 % of picks on a replica it judges 8x slower: the
#: mixed fleet's 70B, whose TTFT then is the P99) was chosen on the training scenarios too.
ECT_PARAMS: dict[str, float] = {"ect": 3.0, "alpha": 0.0, "beta": 0.0, "floor": 0.001}

#: Scenario rows: the four policies with default parameters, LADR with engine signals, two LADR
#: ablations (i.i.d. sampling: systematic = 0; no latency term: alpha = 0, what queue awareness
#: alone gives) and the oracle.
VARIANTS: dict[str, tuple[str, dict[str, float]]] = {
    **{p: (p, {}) for p in POLICIES},
    ECT: ("ladr", dict(ECT_PARAMS)),
    ENGINE: ("ladr", {**ECT_PARAMS, "engine_queue": 1.0, "engine_kv": 1.0}),  # llm-d's equal scorer weights
    ENGINE_DEFAULTS: ("ladr", dict(ECT_PARAMS)),
    ECT_COMPLETIONS: ("ladr", {**ECT_PARAMS, "ect_cadence": 0.0}),
    "ladr(iid)": ("ladr", {"systematic": 0}),
    "ladr(alpha=0)": ("ladr", {"alpha": 0.0}),
    ORACLE: (ORACLE, {}),
}
#: Rows of the held-out scenarios and the variance sweep.
MAIN = (*POLICIES, ECT, ENGINE, ENGINE_DEFAULTS, ECT_COMPLETIONS, ORACLE)
ANCHOR = "round_robin"
#: The engine adapters' default cadence (engine.scrape_interval_s): how old LADR's engine data is.
SCRAPE_S = config_mod.load(env={}).engine.scrape_interval_s
#: Candidate engine-scorer weights (engine_queue, engine_kv) on top of ``ladr+ect``, judged on the
#: five training scenarios only (``--sweep-engine``); the held-out ones play no part in the default.
ENGINE_WEIGHTS = ((0.0, 0.0), (0.25, 0.0), (0.5, 0.0), (1.0, 0.0), (0.0, 0.25), (0.0, 1.0), (1.0, 1.0))
#: The reference study's P99 latencies (seconds), static round robin -> LADR.
REFERENCE = {"chat": (5.1, 1.2), "burst": (9.0, 1.8)}
SPEED_TARGET_S = 30.0

CHAT = (workload.TokenDist(128, 0.5, hi=1024), workload.TokenDist(128, 0.3, hi=512))
LONG = (workload.TokenDist(2048), workload.TokenDist(256))

SCENARIOS: dict[str, dict[str, Any]] = {
    "chat": {"fleet": "6b:3", "tokens": CHAT, "rate": 20.0},
    "long": {"fleet": "6b:3", "tokens": LONG, "rate": 9.0},
    "burst": {"fleet": "6b:3", "tokens": CHAT, "rate": 10.0, "burst": 800},
    "mixed": {"fleet": "70b:1,6b:2", "tokens": CHAT, "rate": 12.0},
    "straggler": {"fleet": "6b:3", "tokens": CHAT, "rate": 14.0, "slow": 3.0},
}


def _load(sc: dict[str, Any], rate: float, duration: float, seed: int) -> list[workload.Arrival]:
    rng = random.Random(seed)
    prompt, output = sc["tokens"]
    arr = workload.poisson(rate, duration, prompt, output, rng)
    if sc.get("burst"):
        arr = sorted(arr + workload.burst(sc["burst"], prompt, output, rng, at_s=duration / 3, spread_s=0.1))
    return arr


#: Held-out scenarios: Azure conv trace (first --trace-minutes) at 2x, fleets with unequal speed.
HELD_OUT: dict[str, dict[str, Any]] = {
    "azure2x_throttled": {"fleet": "6b:8", "rate_mult": 2.0, "slow": 2.0},
    "azure2x_13b+6b": {"fleet": "13b:2,6b:2", "rate_mult": 2.0},
    # Mooncake's conversation trace: ~14k-token prompts (up to 123k), 1x its rate on the fleet
    # the forecaster replays it on (fleet/scenarios.py)
    "mooncake_long": {"fleet": "1.3b:5", "rate_mult": 1.0, "trace": "mooncake"},
}


def sim_config(fleet: str, variant: str, seed: int, **kw: Any) -> engine.SimConfig:
    """The simulator set up for one row: its policy, router parameters, engine signals."""
    policy, params = VARIANTS[variant]
    return engine.SimConfig(engine.fleet(fleet), policy=policy, seed=seed, gpu_interval_s=0,
                            router_params=dict(params), engine_scrape_s=SCRAPE_S if variant in WITH_ENGINE else 0.0,
                            **kw)


#: Variance sweep levels: (slowdown factor, mean window seconds); duty cycle 1/3, chat at 10 req/s.
NOISE_LEVELS = ((1.0, 20.0), (1.5, 20.0), (2.0, 20.0), (3.0, 20.0), (3.0, 120.0))
NOISE_DUTY, NOISE_RATE = 1.0 / 3.0, 10.0


def noise_faults(seed: int, factor: float, mean_s: float, duration: float, n: int) -> list[faults.Fault]:
    """Independent on/off slowdowns per replica: on for Exp(mean_s), off for Exp(mean_s * 2)."""
    if factor <= 1.0:
        return []
    rng = random.Random(seed * 7919 + 1)
    out = []
    for i in range(n):
        t = rng.uniform(0.0, mean_s / NOISE_DUTY)
        while t < duration:
            d = rng.expovariate(1.0 / mean_s)
            out.append(faults.Fault(t, t + d, "slowdown", f"r{i}", factor))
            t += d + rng.expovariate(NOISE_DUTY / ((1.0 - NOISE_DUTY) * mean_s))
    return out


def variance_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    sc = {**SCENARIOS["chat"], "rate": NOISE_RATE}
    rows = []
    for factor, mean_s in NOISE_LEVELS:
        per: dict[str, list[dict[str, Any]]] = {p: [] for p in ("round_robin", "least_outstanding", "ladr", ECT_COMPLETIONS,
                                                               ECT, ENGINE, ENGINE_DEFAULTS, ORACLE)}
        for seed in range(args.seed, args.seed + args.held_out_seeds):
            arr = _load(sc, sc["rate"], args.duration, seed)
            fl = noise_faults(seed, factor, mean_s, args.duration, 3)
            for policy in per:
                cfg = sim_config(sc["fleet"], policy, seed, timeout_s=args.timeout_s)
                per[policy].append(stats.summarize(engine.Simulator(cfg).run(arr, faults=fl, start_ms=0)))
        for policy, ss in per.items():
            p99 = [s["e2e_p99_ms"] for s in ss]
            med, lo, hi = _med_ratio(p99, [s["e2e_p99_ms"] for s in per[ANCHOR]])
            rows.append({"scenario": f"noise x{factor:g} / {mean_s:g} s", "slowdown": factor, "mean_window_s": mean_s,
                         "duty": NOISE_DUTY, "policy": policy,
                         "p99_s": statistics.median(p99) / 1000, "p99_vs_rr": med,
                         "rr_over_policy": 1.0 / med, "p99_vs_rr_min": lo, "p99_vs_rr_max": hi,
                         **_vs_oracle(ss, per[ORACLE])})
    return rows


def _med_ratio(vals: list[float], base: list[float]) -> tuple[float, float, float]:
    ratios = [a / b for a, b in zip(vals, base, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def _vs_oracle(ss: list[dict[str, Any]], oracle: list[dict[str, Any]]) -> dict[str, float]:
    """P99 TTFT and E2E as a ratio to the oracle's on the same seeds: median [min, max]."""
    out: dict[str, float] = {}
    for key, name in (("ttft_p99_ms", "ttft"), ("e2e_p99_ms", "e2e")):
        med, lo, hi = _med_ratio([s[key] or 0.0 for s in ss], [max(1e-9, o[key] or 0.0) for o in oracle])
        out[f"{name}_vs_oracle"], out[f"{name}_vs_oracle_min"], out[f"{name}_vs_oracle_max"] = med, lo, hi
    return out


def _run(sc: dict[str, Any], variant: str, arrivals: list[workload.Arrival], seed: int,
         timeout_s: float, params: dict[str, float] | None = None) -> engine.SimResult:
    cfg = sim_config(sc["fleet"], variant, seed, timeout_s=timeout_s)
    cfg.router_params.update(params or {})
    fl = []
    if sc.get("slow"):
        fl = [faults.Fault(0.0, 1e9, "slowdown", "r0", sc["slow"])]
    return engine.Simulator(cfg).run(arrivals, faults=fl, start_ms=0)


def _p99_s(res: engine.SimResult) -> float:
    return (stats.summarize(res)["e2e_p99_ms"] or 0.0) / 1000.0


def max_qps(sc: dict[str, Any], policy: str, slo_s: float, duration: float, seed: int,
            timeout_s: float, iters: int) -> float:
    """Largest Poisson rate (req/s) with P99 E2E <= slo_s (bisection; 0 if even the floor fails)."""
    lo, hi = 0.5, 4.0 * sc["rate"]
    sc = {**sc, "burst": 0}  # max QPS is a steady-state property; the burst scenario is judged at fixed load
    if _p99_s(_run(sc, policy, _load(sc, lo, duration, seed), seed, timeout_s)) > slo_s:
        return 0.0
    for _ in range(iters):
        mid = (lo + hi) / 2
        if _p99_s(_run(sc, policy, _load(sc, mid, duration, seed), seed, timeout_s)) <= slo_s:
            lo = mid
        else:
            hi = mid
    return lo


def scenarios(args: argparse.Namespace, slo_s: float) -> list[dict[str, Any]]:
    rows = []
    for name, sc in SCENARIOS.items():
        per: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        res0: dict[str, dict[str, Any]] = {}
        t0 = {v: 0.0 for v in VARIANTS}
        for seed in range(args.seed, args.seed + args.seeds):
            arrivals = _load(sc, sc["rate"], args.duration, seed)
            for policy in VARIANTS:
                t = time.perf_counter()
                s = stats.summarize(_run(sc, policy, arrivals, seed, args.timeout_s))
                t0[policy] += time.perf_counter() - t
                per[policy].append(s)
                res0.setdefault(policy, s)
        base = [s["e2e_p99_ms"] for s in per[ANCHOR]]
        base_qps = None
        for policy in VARIANTS:
            t = time.perf_counter()
            qps = max_qps(sc, policy, slo_s, args.search_duration, args.seed, args.timeout_s, args.iters)
            ss, s0 = per[policy], res0[policy]
            p99 = [s["e2e_p99_ms"] for s in ss]
            med, lo, hi = _med_ratio(p99, base)
            row = {
                "scenario": name, "fleet": sc["fleet"], "policy": policy, "rate": sc["rate"],
                "seeds": args.seeds, "requests": s0["requests"],
                "p99_s": statistics.median(p99) / 1000,
                "p99_ttft_s": statistics.median(s["ttft_p99_ms"] for s in ss) / 1000,
                "p50_s": statistics.median(s["e2e_p50_ms"] for s in ss) / 1000,
                "p99_s_per_seed": [x / 1000 for x in p99],
                "p99_vs_rr": med, "p99_vs_rr_min": lo, "p99_vs_rr_max": hi,
                "timeouts": sum(s["status"].get("timeout", 0) for s in ss),
                "max_qps": qps, "kv_peak_gib": s0["kv_peak_gib"], "kv_peak_ratio": s0["kv_peak_ratio"],
                "preemptions": statistics.median(s["preemptions"] for s in ss),
                "wall_s": t0[policy] + time.perf_counter() - t,
                **_vs_oracle(ss, per[ORACLE]),
            }
            if policy == ANCHOR:
                base_qps = qps
            row["qps_vs_rr"] = qps / base_qps if base_qps else None
            rows.append(row)
            print(f"  {name:>9} {policy:>17}: P99 {row['p99_s']:.2f} s ({med:.3f}x RR [{lo:.3f}, {hi:.3f}])"
                  f"  TTFT P99 {row['p99_ttft_s']:.2f} s  max QPS {qps:.1f}  ({row['wall_s']:.1f} s)",
                  file=sys.stderr)
    return rows


def held_out(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Scenarios not used to choose LADR's defaults (see the module docstring)."""
    rows = []
    for name, sc in HELD_OUT.items():
        conv, _ = traces.load(sc.get("trace", "azure_conv"))
        conv = workload.window(conv, duration_s=args.trace_minutes * 60)
        per: dict[str, list[dict[str, Any]]] = {p: [] for p in MAIN}
        for seed in range(args.seed, args.seed + args.held_out_seeds):
            arr = workload.scale(conv, rate=sc["rate_mult"], rng=random.Random(seed))
            fl = [faults.Fault(0.0, 1e9, "slowdown", "r0", sc["slow"])] if sc.get("slow") else []
            for policy in MAIN:
                cfg = sim_config(sc["fleet"], policy, seed)
                per[policy].append(stats.summarize(engine.Simulator(cfg).run(arr, faults=fl, start_ms=0)))
        base = [s["e2e_p99_ms"] for s in per[ANCHOR]]
        for policy in MAIN:
            ss = per[policy]
            p99 = [s["e2e_p99_ms"] for s in ss]
            med, lo, hi = _med_ratio(p99, base)
            rows.append({
                "scenario": name, "fleet": sc["fleet"], "throttled_r0": sc.get("slow", 1.0),
                "rate_mult": sc["rate_mult"], "policy": policy, "seeds": args.held_out_seeds,
                "req_s": len(conv) * sc["rate_mult"] / (args.trace_minutes * 60),
                "p99_s": statistics.median(p99) / 1000,
                "p99_ttft_s": statistics.median(s["ttft_p99_ms"] for s in ss) / 1000,
                "p99_vs_rr": med, "p99_vs_rr_min": lo, "p99_vs_rr_max": hi,
                "timeouts": sum(s["status"].get("timeout", 0) for s in ss),
                "preemptions": statistics.median(s["preemptions"] for s in ss),
                **_vs_oracle(ss, per[ORACLE]),
            })
    return rows


#: Training scenarios of identical replicas: where engine signals must never make LADR worse.
HOMOGENEOUS = ("chat", "long", "burst")


def homogeneous(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each engine-signal variant (``ladr+engine``, ``ladr+engine(defaults)``) against LADR
    without engine signals on identical replicas: per seed, the P99 TTFT and E2E ratios on the
    same arrivals, against ``ladr+ect`` (the same learnt completion time: what engine signals
    alone change) and against plain ``ladr`` (the defaults); geometric mean and 95 % interval over
    ``--homogeneous-seeds`` seeds. "worse" only when the interval lies wholly above 1, "better"
    wholly below, else "no measurable difference"."""
    rows = []
    for name in HOMOGENEOUS:
        sc = SCENARIOS[name]
        per: dict[str, list[dict[str, Any]]] = {v: [] for v in (*WITH_ENGINE, ECT, "ladr")}
        for seed in range(args.seed, args.seed + args.homogeneous_seeds):
            arr = _load(sc, sc["rate"], args.duration, seed)
            for variant in per:
                per[variant].append(stats.summarize(_run(sc, variant, arr, seed, args.timeout_s)))
        for variant in WITH_ENGINE:
            for base in (ECT, "ladr"):
                for metric in ("ttft_p99_ms", "e2e_p99_ms"):
                    got = paired_interval([e[metric] / b[metric] if e[metric] and b[metric] else None
                                           for e, b in zip(per[variant], per[base], strict=True)])
                    low, high = got.get("low"), got.get("high")
                    rows.append({"scenario": name, "variant": variant, "versus": base, "p99": metric.split("_")[0],
                                 "seeds": got["rounds"], "geomean": got.get("geomean"), "low": low, "high": high,
                                 "verdict": "unresolved" if low is None or high is None else "worse" if low > 1.0
                                 else "better" if high < 1.0 else "no measurable difference"})
    return rows


def sweep_engine(args: argparse.Namespace) -> list[dict[str, Any]]:
    """LADR+engine's P99 E2E and TTFT per candidate scorer weights on the training scenarios
    (ratio to ``ladr+ect`` without engine signals, same seeds): how the defaults were chosen."""
    rows = []
    for name, sc in SCENARIOS.items():
        for seed in range(args.seed, args.seed + args.seeds):
            arr = _load(sc, sc["rate"], args.duration, seed)
            base = stats.summarize(_run(sc, ECT, arr, seed, args.timeout_s))
            for q, kv in ENGINE_WEIGHTS:
                s = stats.summarize(_run(sc, ENGINE, arr, seed, args.timeout_s,
                                         {"engine_queue": q, "engine_kv": kv}))
                rows.append({"scenario": name, "seed": seed, "engine_queue": q, "engine_kv": kv,
                             "p99_s": s["e2e_p99_ms"] / 1000, "vs_ladr": s["e2e_p99_ms"] / base["e2e_p99_ms"],
                             "ttft_vs_ladr": (s["ttft_p99_ms"] or 0.0) / max(1e-9, base["ttft_p99_ms"] or 0.0)})
    return rows


def sweep_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per weight pair: the geometric mean and the worst of its ratios to plain LADR."""
    out = []
    for q, kv in ENGINE_WEIGHTS:
        rs = [r["vs_ladr"] for r in rows if r["engine_queue"] == q and r["engine_kv"] == kv]
        ts = [r["ttft_vs_ladr"] for r in rows if r["engine_queue"] == q and r["engine_kv"] == kv]
        out.append({"engine_queue": q, "engine_kv": kv, "geomean_vs_ladr": statistics.geometric_mean(rs),
                    "worst_vs_ladr": max(rs), "ttft_geomean_vs_ladr": statistics.geometric_mean(ts)})
    return out


def oracle_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (scenario, policy): P99 TTFT and E2E over the oracle's."""
    return [{"scenario": r["scenario"], "policy": r["policy"], "ttft_vs_oracle": r["ttft_vs_oracle"],
             "e2e_vs_oracle": r["e2e_vs_oracle"], "e2e_vs_oracle_min": r["e2e_vs_oracle_min"],
             "e2e_vs_oracle_max": r["e2e_vs_oracle_max"]} for r in rows if r["policy"] != ORACLE]


def verdict(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario: is ``ladr+ect`` within 10 % of the oracle (P99 TTFT and E2E), how it
    compares with LADR's defaults, and where ``ladr+engine`` and ``ladr+engine(defaults)`` (the
    same plus engine signals, with llm-d's scorer weights and with the defaults) land."""
    out = []
    for name in dict.fromkeys(r["scenario"] for r in rows):
        by = {r["policy"]: r for r in rows if r["scenario"] == name}
        if ECT not in by or "ladr" not in by:
            continue
        e, lad = by[ECT], by["ladr"]
        row = {"scenario": name, "ttft_vs_oracle": e["ttft_vs_oracle"], "e2e_vs_oracle": e["e2e_vs_oracle"],
               "within_10pct": e["ttft_vs_oracle"] <= 1.10 and e["e2e_vs_oracle"] <= 1.10,
               "e2e_vs_ladr": e["e2e_vs_oracle"] / lad["e2e_vs_oracle"],
               "ttft_vs_ladr": e["ttft_vs_oracle"] / lad["ttft_vs_oracle"]}
        for variant, key in ((ENGINE, "engine"), (ENGINE_DEFAULTS, "engine_defaults")):
            if variant in by:
                g = by[variant]
                row[f"{key}_ttft_vs_oracle"] = g["ttft_vs_oracle"]
                row[f"{key}_e2e_vs_oracle"] = g["e2e_vs_oracle"]
                row[f"{key}_within_10pct"] = g["ttft_vs_oracle"] <= 1.10 and g["e2e_vs_oracle"] <= 1.10
        out.append(row)
    return out


def versus_reference(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name, (rr, ladr) in REFERENCE.items():
        ours = {r["policy"]: r for r in rows if r["scenario"] == name}
        out.append({
            "scenario": name, "ref_rr_p99_s": rr, "ref_ladr_p99_s": ladr, "ref_ratio": rr / ladr,
            "our_rr_p99_s": ours[ANCHOR]["p99_s"], "our_ladr_p99_s": ours["ladr"]["p99_s"],
            "our_ratio": 1.0 / ours["ladr"]["p99_vs_rr"],
            "our_ratio_lo": 1.0 / ours["least_outstanding"]["p99_vs_rr"],
        })
    for name in ("mixed", "straggler"):  # where latency-aware routing should matter
        ours = {r["policy"]: r for r in rows if r["scenario"] == name}
        out.append({
            "scenario": name, "ref_rr_p99_s": None, "ref_ladr_p99_s": None, "ref_ratio": None,
            "our_rr_p99_s": ours[ANCHOR]["p99_s"], "our_ladr_p99_s": ours["ladr"]["p99_s"],
            "our_ratio": 1.0 / ours["ladr"]["p99_vs_rr"],
            "our_ratio_lo": 1.0 / ours["least_outstanding"]["p99_vs_rr"],
        })
    return out


def azure_replay(args: argparse.Namespace) -> list[dict[str, Any]]:
    conv, rep = traces.load("azure_conv")
    conv = workload.window(conv, duration_s=args.trace_minutes * 60)
    rows = []
    for mult in (1.0, 2.0, 4.0):
        arr = workload.scale(conv, rate=mult, rng=random.Random(args.seed))
        base = None
        for policy in POLICIES:
            cfg = engine.SimConfig(engine.fleet("6b:8"), policy=policy, seed=args.seed, gpu_interval_s=0)
            res = engine.Simulator(cfg).run(arr, start_ms=0)
            s = stats.summarize(res)
            row = {"rate_mult": mult, "policy": policy, "requests": s["requests"],
                   "req_s": len(arr) / (args.trace_minutes * 60),
                   "p99_s": s["e2e_p99_ms"] / 1000, "p99_ttft_s": s["ttft_p99_ms"] / 1000,
                   "timeouts": s["status"].get("timeout", 0), "preemptions": s["preemptions"],
                   "kv_peak_ratio": s["kv_peak_ratio"], "wall_s": res.wall_s}
            base = base or row
            row["p99_vs_rr"] = row["p99_s"] / base["p99_s"]
            rows.append(row)
    return rows


def speed(args: argparse.Namespace) -> list[dict[str, Any]]:
    conv, _ = traces.load("azure_conv")
    rows = []
    cfg = engine.SimConfig(engine.fleet("6b:8"), policy="ladr", seed=args.seed)
    res = engine.Simulator(cfg).run(conv, start_ms=0)
    rows.append({"run": "1 h azure_conv, 8 x 6B, engine only", "requests": len(res.rows),
                 "sim_s": res.end_s, "wall_s": res.wall_s, "vs_target": res.wall_s / SPEED_TARGET_S,
                 "sim_per_wall": res.end_s / res.wall_s})
    with tempfile.TemporaryDirectory() as tmp:
        c = config_mod.load(env={})
        t0 = time.perf_counter()
        with RecorderSink(c, spool_dir=tmp) as sink:
            res = engine.Simulator(cfg).run(conv, sink=sink, start_ms=0)
        wall = time.perf_counter() - t0
        rows.append({"run": "1 h azure_conv, 8 x 6B, + recorders + spool", "requests": sink.n_requests,
                     "sim_s": res.end_s, "wall_s": wall, "vs_target": wall / SPEED_TARGET_S,
                     "sim_per_wall": res.end_s / wall})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per fixed-load scenario (median reported)")
    ap.add_argument("--held-out-seeds", type=int, default=5,
                    help="seeds per held-out scenario and variance level (as many as a training scenario's: "
                         "their per-seed ratios to the oracle spread over 0.8-1.1x)")
    ap.add_argument("--homogeneous-seeds", type=int, default=30,
                    help="paired seeds for the engine variants against LADR without engine signals on identical replicas")
    ap.add_argument("--duration", type=float, default=300.0, help="simulated seconds per fixed-load run")
    ap.add_argument("--search-duration", type=float, default=120.0, help="simulated seconds per max-QPS probe")
    ap.add_argument("--iters", type=int, default=7, help="bisection steps of the max-QPS search")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="request timeout in the scenarios")
    ap.add_argument("--trace-minutes", type=float, default=15.0, help="minutes of the Azure conv trace to replay")
    ap.add_argument("--quick", action="store_true", help="short runs while developing")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--only-oracle", action="store_true",
                    help="the scenarios, held-out runs and variance sweep with their ratios to the oracle only")
    ap.add_argument("--sweep-engine", action="store_true",
                    help="also sweep LADR's engine-scorer weights on the training scenarios")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.search_duration, args.iters, args.trace_minutes = 120.0, 60.0, 4, 3.0
        args.seeds, args.held_out_seeds, args.homogeneous_seeds = 2, 1, 3
    slo_s = config_mod.load(env={}).slo.e2e_ms / 1000.0
    t0 = time.perf_counter()
    if args.only_oracle:
        args.iters = 0  # max QPS is not what this run is for
    rows = scenarios(args, slo_s)
    ref = versus_reference(rows)
    held = held_out(args)
    sweep = variance_sweep(args)
    replay = [] if args.only_oracle else azure_replay(args)
    spd = [] if args.skip_speed or args.only_oracle else speed(args)
    eng = sweep_engine(args) if args.sweep_engine else []
    same = homogeneous(args)
    cols = ("scenario", "policy", "rate", "p99_s", "p99_ttft_s", "p99_vs_rr", "p99_vs_rr_min", "p99_vs_rr_max",
            "max_qps", "qps_vs_rr", "kv_peak_gib", "preemptions", "timeouts")
    print_table([{k: r[k] for k in cols} for r in rows],
                f"Routing on a simulated 3-GPU fleet (SLO: P99 E2E <= {slo_s:g} s; P99 = median of {args.seeds} seeds,"
                " vs RR = median [min, max] of per-seed ratios; max QPS, KV: seed 0)")
    print_table(ref, "P99 latency, round robin -> LADR: reference study vs ours (ratio = RR / LADR)")
    print_table([{k: r[k] for k in ("scenario", "fleet", "policy", "req_s", "p99_s", "p99_ttft_s", "p99_vs_rr",
                                    "p99_vs_rr_min", "p99_vs_rr_max", "timeouts", "preemptions")} for r in held],
                f"Held out (not used to choose LADR's defaults): Azure conv 2x, {args.held_out_seeds} seeds")
    print_table(sweep, f"Variance sweep: chat, 3 x 6B, {NOISE_RATE:g} req/s, each replica slowed a third of the"
                       f" time ({args.held_out_seeds} seeds)")
    print_table([{k: r[k] for k in ("rate_mult", "policy", "req_s", "p99_s", "p99_ttft_s", "p99_vs_rr", "timeouts",
                                    "preemptions", "kv_peak_ratio")} for r in replay],
                f"Azure conv trace (first {args.trace_minutes:g} min) on 8 x 6B at 1x/2x/4x rate")
    if spd:
        print_table(spd, f"Speed (target <= {SPEED_TARGET_S:g} s wall)")
    every = rows + held + sweep
    print_table(oracle_table(every), "P99 TTFT and E2E as a ratio to the oracle (median of per-seed ratios; E2E [min, max])")
    judged = verdict(every)
    print_table(judged, "LADR with its learnt completion time (ladr+ect) vs the oracle (target: within 10 % on every"
                        " scenario), vs LADR's defaults, and with engine signals")
    print_table(same, f"LADR with engine signals / without them on identical replicas (target: never worse):"
                      f" P99 ratio per seed on the same arrivals, geometric mean [95 % interval], {args.homogeneous_seeds} seeds")
    if eng:
        print_table(sweep_summary(eng), "Engine-scorer weights on the training scenarios (P99 E2E and TTFT / ladr+ect without them)")
    write_result("routing-oracle" if args.only_oracle else "routing", {
        "inputs": {**vars(args), "slo_e2e_s": slo_s, "scenarios": {k: {**v, "tokens": [t._asdict() for t in v["tokens"]]}
                                                                     for k, v in SCENARIOS.items()}},
        "anchor": ANCHOR, "variants": {k: {"policy": p, "params": v} for k, (p, v) in VARIANTS.items()},
        "held_out_scenarios": HELD_OUT,
        "scenarios": rows, "versus_reference": ref, "held_out": held, "variance_sweep": sweep,
        "azure_conv_replay": replay, "vs_oracle": oracle_table(every), "engine_verdict": judged,
        "engine_sweep": eng, "engine_sweep_summary": sweep_summary(eng) if eng else [],
        "homogeneous_vs_without_engine": same,
        "scrape_interval_s": SCRAPE_S,
        "speed": spd, "bench_wall_s": time.perf_counter() - t0,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
