"""The A/B report's statistics, on per-minute arm aggregates: no I/O, numpy only.

Requests are not independent (a user sends many, minutes apart, and every arm shares the fleet's
load), so every test here treats *time* as the unit of replication; per-request tests, as Kayenta
runs them, false-alarm far above their level. The choices (block length, jackknife over a
bootstrap, long-run variance for the SRM) were made on A/A runs: do not change one without
re-running the calibration. Special functions are here so the base install needs no scipy.
See docs/ab.md#3-read-the-verdicts and docs/ab-calibration.md#false-positives-aa.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

_N = NormalDist()
_EPS = 1e-300
_MAX_ITER = 500


# -- special functions ---------------------------------------------------------------------------
def _gamma_series(a: float, x: float) -> float:
    """Regularised lower incomplete gamma P(a, x) by its series (x < a + 1)."""
    term = total = 1.0 / a
    ap = a
    for _ in range(_MAX_ITER):
        ap += 1.0
        term *= x / ap
        total += term
        if abs(term) < abs(total) * 1e-16:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_cf(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x) by its continued fraction (x >= a + 1, Lentz)."""
    b = x + 1.0 - a
    c = 1.0 / _EPS
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_ITER):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _EPS if abs(d) < _EPS else d
        c = b + an / c
        c = _EPS if abs(c) < _EPS else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def chi2_sf(x: float, df: float) -> float:
    """P(X > x) for X ~ chi-square(df)."""
    if x <= 0:
        return 1.0
    a, h = df / 2.0, x / 2.0
    return 1.0 - _gamma_series(a, h) if h < a + 1.0 else _gamma_cf(a, h)


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (_EPS if abs(d) < _EPS else d)
    h = d
    for m in range(1, _MAX_ITER):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (_EPS if abs(d) < _EPS else d)
        c = 1.0 + aa / c
        c = _EPS if abs(c) < _EPS else c
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (_EPS if abs(d) < _EPS else d)
        c = 1.0 + aa / c
        c = _EPS if abs(c) < _EPS else c
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _beta_cf(b, a, 1.0 - x) / b


def f_sf(x: float, d1: float, d2: float) -> float:
    """P(X > x) for X ~ F(d1, d2)."""
    if x <= 0:
        return 1.0
    return betainc(d2 / 2.0, d1 / 2.0, d2 / (d2 + d1 * x))


def t_sf(x: float, df: float) -> float:
    """P(T > x) for T ~ Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + x * x))
    return tail if x >= 0 else 1.0 - tail


def t_ppf(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on :func:`t_sf`; 0 < p < 1)."""
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - p:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if t_sf(mid, df) > 1.0 - p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def norm_sf(z: float) -> float:
    return 1.0 - _N.cdf(z) if z < 0 else _N.cdf(-z)


def norm_ppf(p: float) -> float:
    return _N.inv_cdf(p)


def binomial_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion (the calibration reports false-positive rates)."""
    if n == 0:
        return 0.0, 1.0
    z = norm_ppf(0.5 + level / 2)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


# -- sample-ratio mismatch -----------------------------------------------------------------------
@dataclass(frozen=True)
class SrmResult:
    chi2: float  # Pearson's statistic on the totals
    dispersion: float  # chi-square / the Wald statistic with the long-run variance (>= 1)
    df: int  # arms - 1
    df_dispersion: int  # denominator degrees of freedom of the F reference (0: none, chi-square used)
    p_value: float
    observed: tuple[float, ...]  # each arm's observed share
    expected: tuple[float, ...]  # each arm's expected share


def ewc_terms(t: int) -> int:
    """Cosine terms of the long-run variance estimate for ``t`` time points: 0.4 t^(2/3)
    (Lazarus, Lewis, Stock & Watson, "HAR inference: recommendations for practice", 2018)."""
    return max(2, round(0.4 * t ** (2.0 / 3.0)))


def srm_test(counts: np.ndarray, shares: np.ndarray, *, terms: int | None = None) -> SrmResult:
    """Sample-ratio test of ``counts`` (minutes x arms, requests, in time order) against
    ``shares`` (minutes x arms, the expected split in each minute, rows summing to 1; a minute
    where an arm was rolled back has share 0 there).

    Pearson's chi-square on the totals (expected totals ``sum_t N_t * share_tk``) is the statistic
    of independent requests. Requests are not independent (a unit sends many, minutes apart), so
    the test uses the residuals' long-run variance instead: the equal-weighted cosine estimate
    over ``terms`` low frequencies (default :func:`ewc_terms`), a Wald statistic referred to
    F(K-1, terms-K+2) (Hotelling; fixed-b asymptotics). It sees correlation across minutes that
    a per-block dispersion misses (the A/A calibration measured 18 % rejections at 5 % with
    5-minute blocks). ``dispersion`` is chi-square / Wald: how many times the variance of
    independent requests the traffic shows (floored at 1, so the test is never sharper than the
    plain chi-square)."""
    counts = np.asarray(counts, dtype=float)
    shares = np.asarray(shares, dtype=float)
    n_t = counts.sum(axis=1)
    k = counts.shape[1]
    exp_t = n_t[:, None] * shares
    expected = exp_t.sum(axis=0)
    observed = counts.sum(axis=0)
    total = observed.sum()
    live = expected > 0
    if total == 0 or live.sum() < 2:
        return SrmResult(0.0, 1.0, max(0, k - 1), 0, 1.0, tuple([0.0] * k), tuple([0.0] * k))
    chi2 = float((((observed - expected) ** 2)[live] / expected[live]).sum())
    df = int(live.sum()) - 1
    t = counts.shape[0]
    nu = min(terms or ewc_terms(t), t - 1)
    shares_out = (tuple(observed / total), tuple(expected / expected.sum()))
    if nu < df + 1 or t < 3:
        return SrmResult(chi2, 1.0, df, 0, chi2_sf(chi2, df), *shares_out)
    resid = (counts - exp_t)[:, live][:, :df]  # one live arm left out: the rest determine it
    x = (np.arange(t) + 0.5) / t
    basis = math.sqrt(2.0 / t) * np.cos(np.pi * np.outer(np.arange(1, nu + 1), x))  # nu x t
    lam = basis @ resid  # nu x df
    omega = lam.T @ lam / nu  # long-run variance per minute
    sums = resid.sum(axis=0)
    try:
        wald = float(sums @ np.linalg.solve(t * omega, sums))
    except np.linalg.LinAlgError:
        wald = math.inf
    if not math.isfinite(wald) or wald <= 0:
        phi = 1.0 if wald <= 0 else 0.0
        wald = chi2 if wald <= 0 else wald
    else:
        phi = chi2 / wald
    stat = min(wald, chi2)
    d2 = nu - df + 1
    p = f_sf(stat * d2 / (nu * df), df, d2) if math.isfinite(stat) else 0.0
    return SrmResult(chi2, max(1.0, phi), df, d2, p, *shares_out)


# -- grouped jackknife over time blocks ---------------------------------------------------------
def time_groups(minutes: int, block: int) -> list[slice]:
    """Consecutive minute ranges of ``block`` minutes (the remainder joins the last one); at
    least one range."""
    nb = max(1, minutes // max(1, block))
    cuts = [i * block for i in range(nb)] + [minutes]
    return [slice(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]


@dataclass(frozen=True)
class Jackknife:
    estimate: float  # the statistic on all the data
    se: float  # jackknife standard error (NaN with fewer than 2 usable blocks)
    df: int  # usable blocks - 1
    low: float
    high: float
    p_value: float  # two-sided, Student's t with df


def jackknife(stat: Callable[..., Any], totals: tuple[float | np.ndarray, ...], blocks: tuple[np.ndarray, ...],
              alpha: float) -> Jackknife:
    """Delete-one-block jackknife of ``stat(*totals)``: ``blocks[i][b]`` is block ``b``'s part of
    ``totals[i]``; replicate ``b`` is ``stat(*(t - x[b]))``. A replicate that is not finite (a
    block holding all of an arm's data) is left out. The interval is the estimate +- t(df) SE."""
    est = float(stat(*totals))
    nb = blocks[0].shape[0]
    reps = np.array([float(stat(*(t - x[b] for t, x in zip(totals, blocks, strict=True)))) for b in range(nb)])
    reps = reps[np.isfinite(reps)]
    g = reps.size
    if g < 2 or not math.isfinite(est):
        return Jackknife(est, math.nan, max(0, g - 1), math.nan, math.nan, math.nan)
    se = math.sqrt((g - 1) / g * float(((reps - reps.mean()) ** 2).sum()))
    df = g - 1
    h = t_ppf(1.0 - alpha / 2.0, df) * se
    p = min(1.0, 2.0 * t_sf(abs(est) / se, df)) if se > 0 else 1.0 if est == 0 else 0.0
    return Jackknife(est, se, df, est - h, est + h, p)


# -- always-valid confidence sequences -----------------------------------------------------------
def cs_rho2(alpha: float, t_star: float) -> float:
    """Mixing variance (of the standardised effect) making the boundary tightest near ``t_star``
    observations."""
    la = -2.0 * math.log(alpha)
    return (la + math.log(la + 1.0)) / max(1.0, t_star)


def t_mixture_log_e(sum_x: float, sum_sq: float, t: int, c: float) -> float:
    """log of the scale-invariant normal-mixture e-value for "mean 0" after ``t`` observations
    (Lai 1976; Wang & Ramdas, "Anytime-valid t-tests and confidence sequences for Gaussian means
    with unknown variance"): the Bayes factor with N(0, 1/c) on mean/sd and the right-Haar prior
    on sd, ``sqrt(c/(t+c)) * (V / (V - S^2/(t+c)))^(t/2)``. A nonnegative supermartingale under
    the null whatever the variance, so valid from the first blocks on, not only asymptotically."""
    rest = sum_sq - sum_x * sum_x / (t + c)
    if sum_sq <= 0:
        return 0.0
    if rest <= 0:
        return math.inf
    return 0.5 * math.log(c / (t + c)) + 0.5 * t * (math.log(sum_sq) - math.log(rest))


def t_mixture_half_width(mean: float, ss: float, t: int, c: float, alpha: float) -> float:
    """Half-width around ``mean`` of the means whose e-value stays below ``1/alpha`` after ``t``
    observations with centred sum of squares ``ss`` (inf while the data cannot exclude any)."""
    k = math.exp(2.0 / t * (math.log(1.0 / alpha) + 0.5 * math.log((t + c) / c)))
    a = k * t * t / (t + c) - (k - 1.0) * t
    if a <= 0:
        return math.inf
    return math.sqrt((k - 1.0) * max(ss, 0.0) / a)


@dataclass(frozen=True)
class Sequence:
    """A confidence sequence after ``t`` blocks: running intersection and running-min p-value."""

    t: int
    mean: float
    low: float
    high: float
    p_value: float


def confidence_sequence(x: np.ndarray, alpha: float, t_star: float, *, min_t: int = 4) -> Sequence | None:
    """Always-valid interval for the mean of ``x`` (per-block paired differences, in time order;
    NaN = a block without data for one side): the scale-invariant normal-mixture (t-mixture)
    sequence, intersected over every prefix of at least ``min_t`` blocks, with the anytime p-value
    (1 / the running maximum of the e-value). None before ``min_t`` blocks.

    The calibration replaced a normal-mixture sequence with the running variance plugged in: with
    a dozen blocks that one was only asymptotically valid and rejected true nulls in up to 20 % of
    A/A runs at alpha = 5 %."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < max(2, min_t):
        return None
    c = 1.0 / cs_rho2(alpha, t_star)
    low, high, best = -math.inf, math.inf, 0.0
    csum = np.cumsum(x)
    csq = np.cumsum(x * x)
    for t in range(max(2, min_t), x.size + 1):
        if t < min_t:
            continue
        s1, s2 = float(csum[t - 1]), float(csq[t - 1])
        best = max(best, t_mixture_log_e(s1, s2, t, c))
        mean = s1 / t
        h = t_mixture_half_width(mean, s2 - t * mean * mean, t, c, alpha)
        low, high = max(low, mean - h), min(high, mean + h)
    mean = float(csum[-1] / x.size)
    if low > high:  # an empty intersection can only happen when H0's mean moved: keep the latest
        h = t_mixture_half_width(mean, float(csq[-1]) - x.size * mean * mean, x.size, c, alpha)
        low, high = mean - h, mean + h
    p = 1.0 if best <= 0 else min(1.0, math.exp(-best))
    return Sequence(int(x.size), mean, float(low), float(high), float(p))


# -- verdicts ------------------------------------------------------------------------------------
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


def verdict(low: float, high: float, margin: float, *, lower_is_better: bool) -> str:
    """From the interval of (arm - control): ``pass`` when it rules out a degradation larger than
    the margin (non-inferior), ``fail`` when it rules out no degradation (significantly worse),
    else ``inconclusive``. ``margin`` is in the effect's units, >= 0."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return INCONCLUSIVE
    if lower_is_better:
        if high < margin:
            return PASS
        return FAIL if low > 0 else INCONCLUSIVE
    if low > -margin:
        return PASS
    return FAIL if high < 0 else INCONCLUSIVE
