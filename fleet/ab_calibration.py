"""Calibration of the A/B report's statistics on the fleet simulator.

A valid test rejects a true null (an A/A run) at most at its level under time-correlated
traffic, and a useful one detects a real slowdown. Each run is one experiment as a user would run
it, through the production rollout, router and report on the aggregates the store would hold,
so the calibration measures the code that ships, not a model of it. An A/A run must never hand
one arm a real fault. See docs/ab-calibration.md#false-positives-aa (by ``bench/ab_calibration.py``).
"""

from __future__ import annotations

import datetime as dt
import math
import random
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llmsla import experiments as E
from llmsla import names
from llmsla.control import ab_data, ab_report
from llmsla.control import ab_stats as S
from llmsla.control.rollout import Rollout
from llmsla.fleet import engine, faults, traces, workload

#: Calibration SLO: TTFT as the default, E2E at 15 s (a bucket bound), tight enough that the
#: fleet breaches it now and then and attribution is exercised.
SLO_TTFT_MS, SLO_E2E_MS = 800.0, 15000.0
LATENCY = [m for m, _, _ in ab_report.LATENCY] + [ab_report.MEAN_ITL]
METRICS = LATENCY + list(ab_report.RATIOS)
CANARY = "canary"


@dataclass(frozen=True)
class Scenario:
    """One kind of experiment. ``pool_b``: arm b's own pool (else both arms share the fleet);
    ``slow``: arm b's pool is this many times slower for the whole run (1 = an A/A run)."""

    fleet: str = "6b:8"
    split: tuple[int, int] = (1, 1)
    pool_b: str | None = None
    slow: float = 1.0
    minutes: int = 60
    rate: float = 2.0
    mean_turns: float = 6.0
    think_s: float = 30.0
    incident: bool = True  # a replica (one per pool) 3x slower for 5 random minutes


SCENARIOS: dict[str, Scenario] = {
    # a routing / temperature experiment: both arms on one 8-replica pool
    "aa_shared": Scenario(),
    # as aa_shared without the incident: stationary session traffic
    "aa_quiet": Scenario(incident=False),
    # a canary-sized arm on one pool
    "aa_skewed": Scenario(split=(4, 1)),
    # a new serving stack: each arm on its own 4-replica pool
    "aa_pools": Scenario(fleet=f"6b:4,{CANARY}=6b:4", pool_b=CANARY),
    # the same with the treatment's pool 10 % slower: power and attribution
    "slow_pools": Scenario(fleet=f"6b:4,{CANARY}=6b:4", pool_b=CANARY, slow=1.10),
    # the default sample size: ab.min_requests (5,000) per arm over the default horizon
    # (ab.sequential_minutes = 60), i.e. the trace at 0.55x its rate
    "aa_min": Scenario(fleet=f"6b:4,{CANARY}=6b:4", pool_b=CANARY, rate=0.55),
    "slow_min": Scenario(fleet=f"6b:4,{CANARY}=6b:4", pool_b=CANARY, rate=0.55, slow=1.10),
}

_TRACE: list | None = None


def _trace() -> list:
    global _TRACE
    if _TRACE is None:
        _TRACE, _ = traces.load("azure_conv")
    return _TRACE


@dataclass
class Run:
    """One simulated experiment: its per-minute aggregates and per-request facts for contrast."""

    name: str
    seed: int
    experiment: E.Experiment
    data: ab_data.ArmMinutes
    mann_whitney_p: dict[str, float]
    sim_s: float


def settings(base: ab_report.Settings | None = None) -> ab_report.Settings:
    """The report's settings (the configured defaults) with the calibration SLO."""
    if base is None:
        from llmsla import config

        base = ab_report.Settings.from_config(config.load(env={}))
    return replace(base, slo_ttft_ms=SLO_TTFT_MS, slo_e2e_ms=SLO_E2E_MS)


def simulate(name: str, sc: Scenario, seed: int) -> Run:
    """Run one experiment of scenario ``sc`` on the simulator (deterministic in name and seed)."""
    import time

    rng = random.Random(f"{name}/{seed}")
    span = sc.minutes * 60
    arrivals = workload.scale(_trace(), rate=sc.rate, rng=rng)
    arrivals = workload.window(arrivals, start_s=0, duration_s=span)
    arrivals = workload.sessions(arrivals, rng, mean_turns=sc.mean_turns, think_s=sc.think_s)
    arm_b: dict[str, Any] = {"weight": sc.split[1]}
    if sc.pool_b:
        arm_b["pool"] = sc.pool_b
    exp = E.parse({"exp": {"seed": rng.getrandbits(48), "arms": {"a": {"weight": sc.split[0]}, "b": arm_b}}})["exp"]
    replicas = engine.fleet(sc.fleet)
    fault_list = []
    if sc.slow != 1.0:
        fault_list += [faults.Fault(0, span + 900, "slowdown", r.id, sc.slow) for r in replicas if r.pool == sc.pool_b]
    t0 = rng.uniform(min(300, span / 4), max(span / 4, span - 600))
    pools = sorted({r.pool for r in replicas})
    for pool in pools:  # one victim per pool, at the same time: both arms hit alike
        victim = rng.choice([r.id for r in replicas if r.pool == pool])
        if sc.incident:
            fault_list.append(faults.Fault(t0, t0 + 300, "slowdown", victim, 3.0))
    cfg = engine.SimConfig(replicas=replicas, policy="ladr", rollout=Rollout({"exp": exp}), seed=rng.getrandbits(32),
                           gpu_interval_s=0, entry_pools=[names.DEFAULT_POOL])
    t_sim = time.perf_counter()
    rows = engine.Simulator(cfg).run(arrivals, faults=fault_list, start_ms=0).rows
    t_sim = time.perf_counter() - t_sim
    start = dt.datetime.fromtimestamp(0, dt.UTC)
    n = len(rows)
    ttft = np.fromiter((math.nan if r.ttft_ms is None else r.ttft_ms for r in rows), dtype=float, count=n)
    e2e = np.fromiter((r.e2e_ms for r in rows), dtype=float, count=n)
    labels = [r.arm for r in rows]
    d = ab_data.from_arrays(
        exp, start, start + dt.timedelta(minutes=sc.minutes),
        ts_ms=np.fromiter((round(r.end_s * 1000) for r in rows), dtype=np.int64, count=n), labels=labels,
        bad=np.fromiter((r.status in (names.STATUS_ERROR, names.STATUS_TIMEOUT) for r in rows), dtype=bool, count=n),
        ttft_ms=ttft, e2e_ms=e2e, slo_ttft_ms=SLO_TTFT_MS, slo_e2e_ms=SLO_E2E_MS,
        itl_n=np.fromiter((r.itl_n for r in rows), dtype=np.int64, count=n),
        itl_mean_ms=np.fromiter((r.itl_sum_ms / r.itl_n if r.itl_n else 0.0 for r in rows), dtype=float, count=n))
    arm = np.asarray(labels)
    in_a, in_b = arm == exp.label("a"), arm == exp.label("b")
    mw = {"ttft": mann_whitney_p(ttft[in_a], ttft[in_b]), "e2e": mann_whitney_p(e2e[in_a], e2e[in_b])}
    return Run(name, seed, exp, d, mw, t_sim)


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided Mann-Whitney p-value (normal approximation, mid-ranks) treating every request as
    independent: what a per-request judge (Kayenta) does. For contrast only."""
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    n1, n2 = a.size, b.size
    if n1 == 0 or n2 == 0:
        return 1.0
    x = np.concatenate([a, b])
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(x.size)
    # mid-ranks over runs of ties
    edges = np.flatnonzero(np.diff(xs)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [x.size]])
    mid = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(mid, ends - starts)
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    ties = ends - starts
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - float((ties**3 - ties).sum()) / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2.0) - 0.5) / math.sqrt(var)
    return min(1.0, 2.0 * S.norm_sf(max(0.0, z)))


def outcomes(run: Run, s: ab_report.Settings) -> dict[str, Any]:
    """Every test's outcome on one run: the SRM test (and a plain chi-square on the request
    counts for contrast), each comparison in the fixed-horizon and the always-valid mode
    (interval excludes 0; its raw verdict without the sample-size and SRM gates; the gated
    verdict), and the breach intervals with the groups they were attributed to."""
    d, exp = run.data, run.experiment
    fixed = ab_report.analyze(d, s)
    seq = ab_report.analyze(d, s, sequential=True)
    n = d.requests[:2].sum(axis=1).astype(float)
    shares = np.asarray([a.weight for a in exp.arms], dtype=float)
    e = n.sum() * shares / shares.sum()
    out: dict[str, Any] = {
        "scenario": run.name, "seed": run.seed, "requests": [int(x) for x in n], "sim_s": round(run.sim_s, 2),
        "srm_p": fixed.srm["p_value"], "srm_dispersion": fixed.srm["dispersion"],
        "naive_srm_p": S.chi2_sf(float(((n - e) ** 2 / e).sum()), 1), "mannwhitney": run.mann_whitney_p,
        "fixed": {}, "sequential": {}, "breaches": len(fixed.breaches), "attributed": [b.attributed for b in fixed.breaches],
    }
    for mode, rep in (("fixed", fixed), ("sequential", seq)):
        for c in rep.comparisons:
            lo = c.ci_low if c.ci_low is not None else math.nan
            hi = c.ci_high if c.ci_high is not None else math.nan
            lat = c.metric in LATENCY
            margin = (s.latency_margin_pct / 100 * c.baseline if lat and c.baseline else s.ratio_margin_pct / 100)
            out[mode][c.metric] = {"excludes_0": bool(lo > 0 or hi < 0), "p": c.p_value,
                                   "fail": S.verdict(lo, hi, margin, lower_is_better=lat) == S.FAIL,
                                   "verdict": c.verdict, "relative": c.relative}
    return out


# -- summary ---------------------------------------------------------------------------------------
def exact_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson interval of a binomial rate ``k / n`` (beta quantiles by bisection)."""
    if n == 0:
        return 0.0, 1.0
    a = (1.0 - level) / 2.0

    def beta_ppf(p: float, x: float, y: float) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if S.betainc(x, y, mid) < p:
                lo = mid
            else:
                hi = mid
        return 0.5 * (lo + hi)

    low = 0.0 if k == 0 else beta_ppf(a, k, n - k + 1)
    high = 1.0 if k == n else beta_ppf(1.0 - a, k + 1, n - k)
    return low, high


def rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = exact_interval(k, n)
    return {"k": int(k), "n": int(n), "rate": k / n if n else math.nan, "ci95": [lo, hi]}


def within(r: dict[str, Any], nominal: float) -> bool:
    """Not significantly above the nominal rate: its exact 95 % interval reaches down to it."""
    return r["ci95"][0] <= nominal


def summarize(runs: list[dict[str, Any]], alpha: float, srm_alpha: float) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["scenario"], []).append(r)
    out: dict[str, Any] = {}
    for name, rs in by.items():
        n = len(rs)
        sc: dict[str, Any] = {
            "runs": n, "requests_per_arm_mean": [float(np.mean([r["requests"][i] for r in rs])) for i in (0, 1)],
            "sim_s_mean": float(np.mean([r["sim_s"] for r in rs])),
            "srm": {f"p<{a:g}": rate(sum(r["srm_p"] < a for r in rs), n) for a in (srm_alpha, 0.01, 0.05)},
            "srm_naive": {f"p<{a:g}": rate(sum(r["naive_srm_p"] < a for r in rs), n) for a in (srm_alpha, 0.01, 0.05)},
            "srm_dispersion_median": float(np.median([r["srm_dispersion"] for r in rs])),
            "mannwhitney": {k: rate(sum(r["mannwhitney"][k] < alpha for r in rs), n) for k in ("ttft", "e2e")},
        }
        for mode in ("fixed", "sequential"):
            sc[mode] = {m: {"excludes_0": rate(sum(r[mode][m]["excludes_0"] for r in rs), n),
                            "fail": rate(sum(r[mode][m]["fail"] for r in rs), n),
                            "fail_gated": rate(sum(r[mode][m]["verdict"] == S.FAIL for r in rs), n),
                            "relative_median": _median([r[mode][m]["relative"] for r in rs])}
                        for m in METRICS}
            sc[mode]["any_latency_fail"] = rate(sum(any(r[mode][m]["fail"] for m in LATENCY) for r in rs), n)
        intervals = [g for r in rs for g in r["attributed"]]
        sc["breaches"] = {"runs_with_breach": sum(r["breaches"] > 0 for r in rs), "intervals": len(intervals),
                          "attributed_to_a": rate(sum("a" in g for g in intervals), len(intervals)),
                          "attributed_to_b": rate(sum("b" in g for g in intervals), len(intervals)),
                          "runs_attributing_a": rate(sum(any("a" in g for g in r["attributed"]) for r in rs), n),
                          "runs_attributing_b": rate(sum(any("b" in g for g in r["attributed"]) for r in rs), n)}
        out[name] = sc
    return out


def _median(xs: list[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return float(np.median(v)) if v else None
