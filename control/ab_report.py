"""The A/B attribution report: per arm, what it did to the SLA, with statistics that hold up.

It turns per-minute arm aggregates (:class:`~llmsla.control.ab_data.ArmMinutes`) into a
:class:`Report` (JSON, a table, rows for ``ab_results``); the statistics live apart in
:mod:`llmsla.control.ab_stats` so they stay pure and testable against scipy.
See docs/ab.md#3-read-the-verdicts.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from llmsla import histogram as H
from llmsla import names, slo_catalog
from llmsla.control import ab_stats as S
from llmsla.control.ab_data import DEFAULT_GROUP, ArmMinutes

#: (metric name, histogram, quantile) of the latency comparisons.
LATENCY: tuple[tuple[str, str, float], ...] = (
    (names.AB_METRIC_TTFT_P50, "ttft", 0.5), (names.AB_METRIC_TTFT_P95, "ttft", 0.95),
    (names.AB_METRIC_TTFT_P99, "ttft", 0.99), (names.AB_METRIC_E2E_P50, "e2e", 0.5),
    (names.AB_METRIC_E2E_P95, "e2e", 0.95), (names.AB_METRIC_E2E_P99, "e2e", 0.99),
)
#: The mean inter-token latency (sum of gaps / gaps, lower is better). A per-token slowdown moves
#: it by its full size in every request, whatever the mix of output lengths that makes E2E
#: quantiles noisy: the most sensitive test of a decode regression (docs/ab-calibration.md).
MEAN_ITL = names.AB_METRIC_ITL_MEAN
#: Ratio metrics (higher is better): name -> (numerator, kind).
RATIOS: tuple[str, ...] = (names.AB_METRIC_TTFT_ATTAINMENT, names.AB_METRIC_E2E_ATTAINMENT, names.AB_METRIC_AVAILABILITY)
#: A block contributes to a sequential comparison only with this many requests in both arms.
MIN_BLOCK_REQUESTS = 20
#: A breach window counts with at least this many requests per minute on average.
MIN_MINUTE_REQUESTS = 10
#: Attribution: a group accounts for a breach when its excess of bad requests over the rest of
#: the traffic is significant at this level (one-sided, Bonferroni over the groups).
ATTRIBUTION_ALPHA = 0.01


@dataclass(frozen=True)
class Settings:
    """The statistical settings (``[ab]``) and the SLO catalog's objectives."""

    slo_ttft_ms: float
    slo_e2e_ms: float
    ttft_target: float
    e2e_target: float
    availability_target: float
    failed: frozenset[str]  # request statuses the availability SLO counts as failed
    alpha: float = 0.05
    srm_alpha: float = 0.001
    block_minutes: int = 5  # always-valid mode, breach windows
    fixed_block_minutes: int = 10  # fixed-horizon jackknife
    min_requests: int = 5000
    latency_margin_pct: float = 5.0
    ratio_margin_pct: float = 0.5
    sequential_minutes: int = 60
    min_blocks: int = 4

    @classmethod
    def from_config(cls, cfg: Any) -> Settings:
        a, cat = cfg.ab, slo_catalog.load(cfg)
        ttft, e2e = cat.required(slo_catalog.SLI_TTFT), cat.required(slo_catalog.SLI_E2E)
        return cls(alpha=a.alpha, srm_alpha=a.srm_alpha, block_minutes=a.block_minutes,
                   fixed_block_minutes=a.fixed_block_minutes,
                   min_requests=a.min_requests, latency_margin_pct=a.latency_margin_pct,
                   ratio_margin_pct=a.ratio_margin_pct, sequential_minutes=a.sequential_minutes,
                   slo_ttft_ms=ttft.threshold_ms, slo_e2e_ms=e2e.threshold_ms, ttft_target=ttft.target,
                   e2e_target=e2e.target, availability_target=cat.availability.target,
                   failed=cat.availability.failed)


@dataclass
class ArmSummary:
    arm: str
    label: str
    requests: int
    share: float
    expected_share: float
    quantiles_ms: dict[str, float | None]
    itl_mean_ms: float | None
    ttft_attainment: float | None
    e2e_attainment: float | None
    availability: float | None
    minutes_meeting_slo: float | None  # share of minutes with traffic whose attainment met the target
    attainment_per_minute: list[float | None] = field(default_factory=list)


@dataclass
class Comparison:
    arm: str
    metric: str
    n: int
    value: float | None
    baseline: float | None
    effect: float | None  # arm - control (ms for latency)
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    effect_size: float | None  # Cliff's delta for latency (arm slower: > 0), else the effect
    relative: float | None  # effect / baseline (latency)
    verdict: str
    reason: str = ""


@dataclass
class GroupShare:
    group: str
    requests: int
    bad: int
    rate: float
    excess: float
    share_of_excess: float
    p_value: float
    clears: bool  # the interval would meet the SLO had this group done as well as the rest


@dataclass
class Breach:
    start: str
    end: str
    minutes: int
    slis: list[str]
    attainment: dict[str, float]
    groups: dict[str, list[GroupShare]]  # per breached SLI
    attributed: list[str]  # groups that account for it; [] = fleet-wide


@dataclass
class Report:
    experiment: str
    start: str
    end: str
    mode: str
    control: str
    settings: dict[str, Any]
    arms: list[ArmSummary]
    srm: dict[str, Any]
    comparisons: list[Comparison]
    breaches: list[Breach]
    rollbacks: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return _clean(asdict(self))

    def failing_arms(self) -> list[str]:
        return sorted({c.arm for c in self.comparisons if c.verdict == S.FAIL})


def _clean(o: Any) -> Any:
    if isinstance(o, float):
        return None if not math.isfinite(o) else o
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v) for v in o]
    if isinstance(o, frozenset):  # the failed statuses
        return sorted(o)
    if isinstance(o, np.generic):
        return _clean(o.item())
    return o


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def cliffs_delta(a: np.ndarray, b: np.ndarray) -> float | None:
    """P(A > B) - P(A < B) for two count vectors on the same buckets (same bucket: a tie)."""
    na, nb = a.sum(), b.sum()
    if na == 0 or nb == 0:
        return None
    below_b = np.cumsum(b) - b  # B values in lower buckets
    above_b = nb - np.cumsum(b)
    return float((a * below_b).sum() - (a * above_b).sum()) / float(na * nb)


def _ratio_series(d: ArmMinutes, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(numerator, denominator) per group and minute of a ratio metric."""
    if metric == names.AB_METRIC_TTFT_ATTAINMENT:
        return d.ttft_within, d.requests
    if metric == names.AB_METRIC_E2E_ATTAINMENT:
        return d.e2e_within, d.requests
    return d.requests - d.bad, d.requests


def _hist(d: ArmMinutes, which: str) -> np.ndarray:
    return d.ttft_hist if which == "ttft" else d.e2e_hist


# -- per arm ---------------------------------------------------------------------------------------
def summarize(d: ArmMinutes, s: Settings, expected: np.ndarray) -> list[ArmSummary]:
    arm_req = d.requests[: len(d.arms)].sum(axis=1)
    total = arm_req.sum()
    out = []
    for k, arm in enumerate(d.arms):
        req = int(arm_req[k])
        qs = {}
        for metric, which, q in LATENCY:
            v = H.quantiles(_hist(d, which)[k].sum(axis=0)[None, :], q, d.hist_lo)[0]
            qs[metric] = None if not math.isfinite(v) else float(v)
        per_min: list[float | None] = []
        met = seen = 0
        for m in range(d.minutes):
            n = int(d.requests[k, m])
            if n == 0:
                per_min.append(None)
                continue
            att = min(d.ttft_within[k, m], d.e2e_within[k, m]) / n
            per_min.append(att)
            seen += 1
            met += d.ttft_within[k, m] / n >= s.ttft_target and d.e2e_within[k, m] / n >= s.e2e_target
        out.append(ArmSummary(
            arm, d.experiment.label(arm), req, float(req / total) if total else 0.0, float(expected[k]), qs,
            _ratio(float(d.itl_sum_ms[k].sum()), float(d.itl_n[k].sum())),
            _ratio(float(d.ttft_within[k].sum()), req), _ratio(float(d.e2e_within[k].sum()), req),
            _ratio(float(req - d.bad[k].sum()), req), (met / seen) if seen else None, per_min))
    return out


# -- fixed horizon: paired grouped jackknife over time blocks -------------------------------------
def _group_sum(x: np.ndarray, groups: list[slice]) -> np.ndarray:
    """Sum the minutes (first axis) of ``x`` into the time groups."""
    return np.stack([x[g].sum(axis=0) for g in groups])


def _log_q(q: float, lo: int) -> Any:
    def stat(a: np.ndarray, b: np.ndarray) -> float:
        va = H.quantiles(a[None, :], q, lo)[0]
        vb = H.quantiles(b[None, :], q, lo)[0]
        return math.log(va / vb) if va > 0 and vb > 0 else math.nan
    return stat


def _ratio_diff(a: float, b: float, x: float, y: float) -> float:
    return a / b - x / y if b > 0 and y > 0 else math.nan


def _compare_fixed(d: ArmMinutes, s: Settings, k: int, c: int, blocked: str) -> list[Comparison]:
    arm = d.arms[k]
    n_k, n_c = int(d.requests[k].sum()), int(d.requests[c].sum())
    groups = S.time_groups(d.minutes, s.fixed_block_minutes)
    if len(groups) < s.min_blocks and not blocked:  # a t interval on 1-3 blocks is noise
        blocked = (f"fewer than {s.min_blocks} blocks of ab.fixed_block_minutes = {s.fixed_block_minutes}: "
                   f"a fixed-horizon range needs {s.min_blocks * s.fixed_block_minutes} minutes")
    out = []
    for metric, which, q in LATENCY:
        hk, hc = _hist(d, which)[k], _hist(d, which)[c]
        tk, tc = hk.sum(axis=0), hc.sum(axis=0)
        vk = H.quantiles(tk[None, :], q, d.hist_lo)[0]
        vc = H.quantiles(tc[None, :], q, d.hist_lo)[0]
        # the relative difference (log scale), shown in ms at the control's level
        jk = S.jackknife(_log_q(q, d.hist_lo), (tk, tc), (_group_sum(hk, groups), _group_sum(hc, groups)), s.alpha)
        lo = vc * math.expm1(jk.low) if math.isfinite(jk.low) else math.nan
        hi = vc * math.expm1(jk.high) if math.isfinite(jk.high) else math.nan
        effect = vk - vc
        margin = s.latency_margin_pct / 100.0 * vc if math.isfinite(vc) else math.nan
        v, reason = _gate(S.verdict(lo, hi, margin, lower_is_better=True), n_k, n_c, s, blocked)
        out.append(Comparison(arm, metric, n_k, _f(vk), _f(vc), _f(effect), _f(lo), _f(hi), _f(jk.p_value),
                              cliffs_delta(tk, tc), _f(effect / vc) if vc else None, v, reason))
    # the mean ITL's fixed-horizon interval is its always-valid one at the end of the range: the
    # block jackknife rejected a true null in 12-13 % of A/A runs where each arm has its own pool
    # (docs/ab-calibration.md, before this); the sequence holds its level and, a per-token
    # slowdown being so clear in this metric, loses almost no power
    out.append(_compare_itl(d, s, k, c, blocked))
    for metric in RATIOS:
        num, den = _ratio_series(d, metric)
        parts = (num[k], den[k], num[c], den[c])
        jk = S.jackknife(_ratio_diff, tuple(float(x.sum()) for x in parts),
                         tuple(_group_sum(x, groups) for x in parts), s.alpha)
        vk, vc = _ratio(float(num[k].sum()), n_k), _ratio(float(num[c].sum()), n_c)
        effect = None if vk is None or vc is None else vk - vc
        v, reason = _gate(S.verdict(jk.low, jk.high, s.ratio_margin_pct / 100.0, lower_is_better=False), n_k, n_c, s, blocked)
        out.append(Comparison(arm, metric, n_k, vk, vc, effect, _f(jk.low), _f(jk.high), _f(jk.p_value), effect, None, v, reason))
    return out


def _compare_itl(d: ArmMinutes, s: Settings, k: int, c: int, blocked: str) -> Comparison:
    """The mean ITL against control in both modes: an always-valid sequence over blocks of
    ``block_minutes`` of the log ratio of the block means, shown in ms at the control's level (as
    the quantiles); no rank effect size without a histogram."""
    arm = d.arms[k]
    n_k, n_c = int(d.requests[k].sum()), int(d.requests[c].sum())
    size = s.block_minutes
    req, sb, nb = _blocks(d.requests, size), _blocks(d.itl_sum_ms, size), _blocks(d.itl_n, size)
    has = (req[k] >= MIN_BLOCK_REQUESTS) & (req[c] >= MIN_BLOCK_REQUESTS) & (nb[k] > 0) & (nb[c] > 0)
    has &= (sb[k] > 0) & (sb[c] > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(has, np.log(sb[k] / np.maximum(nb[k], 1)) - np.log(sb[c] / np.maximum(nb[c], 1)), np.nan)
    seq = S.confidence_sequence(x, s.alpha, s.sequential_minutes / size, min_t=s.min_blocks)
    vk = _ratio(float(d.itl_sum_ms[k].sum()), float(d.itl_n[k].sum()))
    vc = _ratio(float(d.itl_sum_ms[c].sum()), float(d.itl_n[c].sum()))
    if seq is None or vk is None or vc is None:
        reason = blocked or f"fewer than {s.min_blocks} blocks with inter-token gaps in both arms"
        effect = None if vk is None or vc is None else vk - vc
        return Comparison(arm, MEAN_ITL, n_k, vk, vc, effect, None, None, None, None, None, S.INCONCLUSIVE, reason)
    lo, hi = vc * math.expm1(seq.low), vc * math.expm1(seq.high)
    v, reason = _gate(S.verdict(lo, hi, s.latency_margin_pct / 100.0 * vc, lower_is_better=True), n_k, n_c, s, blocked)
    return Comparison(arm, MEAN_ITL, n_k, vk, vc, vk - vc, lo, hi, _f(seq.p_value), None, _f(math.expm1(seq.mean)),
                      v, reason)


def _f(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _gate(v: str, n_k: int, n_c: int, s: Settings, blocked: str) -> tuple[str, str]:
    if blocked:
        return S.INCONCLUSIVE, blocked
    if min(n_k, n_c) < s.min_requests:
        return S.INCONCLUSIVE, f"fewer than ab.min_requests = {s.min_requests} requests in an arm"
    return v, ""


# -- always valid: confidence sequences over blocks ------------------------------------------------
def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    """Sum consecutive minutes into blocks (last axis after the group axis)."""
    m = x.shape[1]
    nb = m // size  # only whole blocks: a block still filling is not looked at yet
    if nb == 0:
        return x[:, :0]
    return x[:, : nb * size].reshape(x.shape[0], nb, size, *x.shape[2:]).sum(axis=2)


def _compare_sequential(d: ArmMinutes, s: Settings, k: int, c: int, blocked: str) -> list[Comparison]:
    arm = d.arms[k]
    n_k, n_c = int(d.requests[k].sum()), int(d.requests[c].sum())
    size = s.block_minutes
    req = _blocks(d.requests, size)
    ok = (req[k] >= MIN_BLOCK_REQUESTS) & (req[c] >= MIN_BLOCK_REQUESTS)
    t_star = s.sequential_minutes / size
    out = []
    for metric, which, q in LATENCY:
        hb = _blocks(_hist(d, which), size)
        qk = H.quantiles(hb[k], q, d.hist_lo)
        qc = H.quantiles(hb[c], q, d.hist_lo)
        x = np.where(ok, np.log(qk) - np.log(qc), np.nan)
        seq = S.confidence_sequence(x, s.alpha, t_star, min_t=s.min_blocks)
        tk, tc = _hist(d, which)[k].sum(axis=(0,)), _hist(d, which)[c].sum(axis=(0,))
        vk = H.quantiles(tk[None, :], q, d.hist_lo)[0]
        vc = H.quantiles(tc[None, :], q, d.hist_lo)[0]
        if seq is None or not math.isfinite(vc):
            out.append(Comparison(arm, metric, n_k, _f(vk), _f(vc), _f(vk - vc), None, None, None,
                                  cliffs_delta(tk, tc), None, S.INCONCLUSIVE, blocked or f"fewer than {s.min_blocks} blocks"))
            continue
        # the time-averaged relative effect, shown in ms at the control's level over the range
        lo, hi = vc * math.expm1(seq.low), vc * math.expm1(seq.high)
        margin = s.latency_margin_pct / 100.0 * vc
        v, reason = _gate(S.verdict(lo, hi, margin, lower_is_better=True), n_k, n_c, s, blocked)
        out.append(Comparison(arm, metric, n_k, _f(vk), _f(vc), vc * math.expm1(seq.mean), lo, hi, seq.p_value,
                              cliffs_delta(tk, tc), math.expm1(seq.mean), v, reason))
    out.append(_compare_itl(d, s, k, c, blocked))
    for metric in RATIOS:
        num, den = _ratio_series(d, metric)
        nb, db = _blocks(num, size), _blocks(den, size)
        x = np.where(ok, nb[k] / np.maximum(db[k], 1) - nb[c] / np.maximum(db[c], 1), np.nan)
        seq = S.confidence_sequence(x, s.alpha, t_star, min_t=s.min_blocks)
        vk, vc = _ratio(float(num[k].sum()), n_k), _ratio(float(num[c].sum()), n_c)
        if seq is None:
            out.append(Comparison(arm, metric, n_k, vk, vc, None if vk is None or vc is None else vk - vc, None, None,
                                  None, None, None, S.INCONCLUSIVE, blocked or f"fewer than {s.min_blocks} blocks"))
            continue
        v, reason = _gate(S.verdict(seq.low, seq.high, s.ratio_margin_pct / 100.0, lower_is_better=False),
                          n_k, n_c, s, blocked)
        out.append(Comparison(arm, metric, n_k, vk, vc, seq.mean, seq.low, seq.high, seq.p_value, seq.mean, None, v, reason))
    return out


# -- breach attribution ----------------------------------------------------------------------------
_SLIS = ("ttft", "e2e", "availability")


def _sli_counts(d: ArmMinutes, sli: str) -> np.ndarray:
    """Bad requests per group and minute for one SLI."""
    if sli == "ttft":
        return d.requests - d.ttft_within
    if sli == "e2e":
        return d.requests - d.e2e_within
    return d.bad


def attribute_breaches(d: ArmMinutes, s: Settings) -> list[Breach]:
    """SLA-breach intervals of the experiment's traffic as a whole, and who accounts for them.

    A minute is in breach when the trailing ``block_minutes`` window of all the experiment's
    traffic (its arms, forced units and the pool's traffic outside it) misses an SLO: TTFT or
    E2E attainment or availability below its SLO's target (the SLO catalog's specs)
    (a window, as SLO alerting evaluates rates: one minute of a few hundred requests is noise).
    Consecutive breach minutes form an interval (from the first breached window's start). For
    each breached SLI, each group's bad requests are compared with the rate of the rest of the
    traffic in the interval: excess = bad - requests x rest's rate, tested one-sided with a
    two-proportion z whose variance is inflated by the over-dispersion of the per-minute counts
    (a heavy session's misses are not independent). The groups with a significant excess
    (:data:`ATTRIBUTION_ALPHA`, Bonferroni over the groups) account for the interval; none = a
    fleet-wide breach. ``clears``: had the group done as well as the rest, the interval would
    have met the SLO."""
    w = max(1, s.block_minutes)
    n = d.requests.sum(axis=0)
    targets = {"ttft": s.ttft_target, "e2e": s.e2e_target, "availability": s.availability_target}
    bad = {sli: _sli_counts(d, sli) for sli in _SLIS}

    def trailing(x: np.ndarray) -> np.ndarray:
        c = np.concatenate([[0], np.cumsum(x)])
        idx = np.arange(len(x))
        return c[idx + 1] - c[np.maximum(0, idx - w + 1)]

    n_w = trailing(n)
    breach_min = {sli: (n_w >= MIN_MINUTE_REQUESTS * w) & (1 - trailing(bad[sli].sum(axis=0)) / np.maximum(n_w, 1) < targets[sli])
                  for sli in _SLIS}
    any_breach = np.zeros(d.minutes, dtype=bool)
    for v in breach_min.values():
        any_breach |= v
    out: list[Breach] = []
    groups = list(d.groups)
    times = d.minute_times()
    m = 0
    while m < d.minutes:
        if not any_breach[m]:
            m += 1
            continue
        e = m
        while e + 1 < d.minutes and any_breach[e + 1]:
            e += 1
        first = max(0, m - w + 1)
        sl = slice(first, e + 1)
        slis = [x for x in _SLIS if breach_min[x][m:e + 1].any()]
        per_sli: dict[str, list[GroupShare]] = {}
        attributed: set[str] = set()
        attainment = {}
        req_gm = d.requests[:, sl]
        req_g = req_gm.sum(axis=1)
        total = int(req_g.sum())
        for sli in slis:
            bad_gm = bad[sli][:, sl]
            bad_g = bad_gm.sum(axis=1)
            total_bad = int(bad_g.sum())
            attainment[sli] = 1 - total_bad / total if total else 1.0
            phi = _dispersion(req_gm, bad_gm)
            shares, excesses = [], []
            for g, name in enumerate(groups):
                ng, bg = int(req_g[g]), int(bad_g[g])
                rest_n, rest_b = total - ng, total_bad - bg
                if ng == 0 or rest_n == 0:
                    excesses.append(0.0)
                    shares.append(GroupShare(name, ng, bg, bg / ng if ng else 0.0, 0.0, 0.0, 1.0, False))
                    continue
                r_rest = rest_b / rest_n
                excess = bg - ng * r_rest
                pooled = total_bad / total
                se = math.sqrt(phi * pooled * (1 - pooled) * (1 / ng + 1 / rest_n))
                p = S.norm_sf((bg / ng - r_rest) / se) if se > 0 else 1.0
                clears = excess > 0 and 1 - (total_bad - excess) / total >= targets[sli]
                excesses.append(max(0.0, excess))
                shares.append(GroupShare(name, ng, bg, bg / ng, excess, 0.0, p, bool(clears)))
            pos = sum(excesses)
            for gs, ex in zip(shares, excesses, strict=True):
                gs.share_of_excess = ex / pos if pos > 0 else 0.0
                if gs.excess > 0 and gs.p_value < ATTRIBUTION_ALPHA / len(groups):
                    attributed.add(gs.group)
            per_sli[sli] = shares
        out.append(Breach(times[first].isoformat(), (times[e] + dt.timedelta(minutes=1)).isoformat(), e - first + 1,
                          slis, attainment, per_sli, sorted(attributed, key=groups.index)))
        m = e + 1
    return out


def _dispersion(req: np.ndarray, bad: np.ndarray) -> float:
    """Over-dispersion (>= 1) of per-minute bad counts around each group's rate in the interval."""
    n_g = req.sum(axis=1, keepdims=True)
    p_g = bad.sum(axis=1, keepdims=True) / np.maximum(n_g, 1)
    var = req * p_g * (1 - p_g)
    cells = (req > 0) & (var > 0)
    dof = int(cells.sum()) - int((n_g[:, 0] > 0).sum())
    if dof <= 0:
        return 1.0
    resid = np.where(cells, (bad - req * p_g) ** 2 / np.where(cells, var, 1.0), 0.0)
    return max(1.0, float(resid.sum()) / dof)


# -- the report ------------------------------------------------------------------------------------
def analyze(d: ArmMinutes, s: Settings, *, shares: np.ndarray | None = None, srm_minutes: np.ndarray | None = None,
            sequential: bool = False, end: dt.datetime | None = None) -> Report:
    """The report of ``d`` (see the module docstring). ``shares``: each minute's expected split
    among the arms (default: the configured weights); ``srm_minutes``: minutes used by the
    sample-ratio test (default: all)."""
    exp = d.experiment
    arms = d.arms
    k_arms = len(arms)
    if shares is None:
        conf = np.asarray([a.weight for a in exp.arms], dtype=float)
        shares = np.tile(conf / conf.sum(), (d.minutes, 1))
    mask = np.ones(d.minutes, dtype=bool) if srm_minutes is None else np.asarray(srm_minutes, dtype=bool)
    counts = d.requests[:k_arms].T[mask]  # (minutes, arms), in time order
    srm = S.srm_test(counts, shares[mask]) if counts.size else S.srm_test(np.zeros((1, k_arms)), shares[:1])
    srm_flag = srm.p_value < s.srm_alpha
    blocked = "sample-ratio mismatch" if srm_flag else ""
    expected_overall = np.asarray(srm.expected) if srm.expected and sum(srm.expected) > 0 else shares.mean(axis=0)
    c = arms.index(exp.control)
    comparisons: list[Comparison] = []
    if sequential:
        for k in range(k_arms):
            if k != c:
                comparisons += _compare_sequential(d, s, k, c, blocked)
    else:
        for k in range(k_arms):
            if k != c:
                comparisons += _compare_fixed(d, s, k, c, blocked)
    end = end or (d.start + dt.timedelta(minutes=d.minutes))
    return Report(
        experiment=exp.key, start=d.start.isoformat(), end=end.isoformat(),
        mode="sequential" if sequential else "fixed", control=exp.control, settings=asdict(s),
        arms=summarize(d, s, expected_overall),
        srm={"p_value": srm.p_value, "chi2": srm.chi2, "dispersion": srm.dispersion, "df": srm.df,
             "df_dispersion": srm.df_dispersion, "flagged": srm_flag, "alpha": s.srm_alpha,
             "observed": dict(zip(arms, srm.observed, strict=True)), "expected": dict(zip(arms, srm.expected, strict=True))},
        comparisons=comparisons,
        breaches=attribute_breaches(d, s),
    )


def results_rows(report: Report) -> list[tuple]:
    """Rows of ``ab_results`` (ts, experiment, arm, metric, n, value, baseline, effect, ci_low,
    ci_high, p_value): every comparison, and the SRM test once per arm (value = its observed
    share, baseline = its expected share). ``arm`` is the arm's label, as in the windows."""
    ts = dt.datetime.fromisoformat(report.end)
    label = {a.arm: a.label for a in report.arms}
    rows = []
    for cmp in report.comparisons:
        if cmp.value is None:
            continue
        rows.append((ts, report.experiment, label[cmp.arm], cmp.metric, cmp.n, cmp.value, cmp.baseline, cmp.effect,
                     cmp.ci_low, cmp.ci_high, cmp.p_value))
    for a in report.arms:
        rows.append((ts, report.experiment, a.label, names.AB_METRIC_SRM, a.requests, a.share, a.expected_share,
                     a.share - a.expected_share, None, None, report.srm["p_value"]))
    return rows


def write_results(conn: Any, report: Report) -> int:
    """Upsert the report's rows into ``ab_results`` (a re-run for the same end replaces them)."""
    rows = results_rows(report)
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {names.T_AB_RESULTS} (ts, experiment, arm, metric, n, value, baseline, effect, ci_low, ci_high, p_value) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (ts, experiment, arm, metric) DO UPDATE SET "
            "n = EXCLUDED.n, value = EXCLUDED.value, baseline = EXCLUDED.baseline, effect = EXCLUDED.effect, "
            "ci_low = EXCLUDED.ci_low, ci_high = EXCLUDED.ci_high, p_value = EXCLUDED.p_value",
            rows)
    return len(rows)


def default_group_share(d: ArmMinutes) -> float:
    """Share of the traffic outside the experiment (for the table)."""
    total = d.requests.sum()
    return float(d.requests[d.index(DEFAULT_GROUP)].sum() / total) if total else 0.0
