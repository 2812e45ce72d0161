"""The A/B report's statistics against scipy (the special functions, the chi-square, Wilson) and
against brute force / their definitions (the grouped jackknife, confidence sequences, Cliff's delta,
verdicts)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from llmsla.control import ab_stats as S
from llmsla.control.ab_report import cliffs_delta


def test_special_functions_equal_scipy() -> None:
    rng = np.random.default_rng(0)
    for _ in range(3000):
        df = float(rng.uniform(0.5, 300))
        x = float(rng.uniform(0, 4 * df + 20))
        assert S.chi2_sf(x, df) == pytest.approx(stats.chi2.sf(x, df), rel=1e-9, abs=1e-14)
        d1, d2 = int(rng.integers(1, 12)), int(rng.integers(1, 3000))
        f = float(rng.exponential(3))
        assert S.f_sf(f, d1, d2) == pytest.approx(stats.f.sf(f, d1, d2), rel=1e-8, abs=1e-14)
        a, b, u = float(rng.uniform(0.1, 50)), float(rng.uniform(0.1, 50)), float(rng.uniform())
        assert S.betainc(a, b, u) == pytest.approx(stats.beta.cdf(u, a, b), rel=1e-8, abs=1e-14)
    assert S.chi2_sf(0, 3) == 1.0 and S.f_sf(-1, 1, 5) == 1.0
    for z in (-3.0, -0.5, 0.0, 1.7, 6.0):
        assert S.norm_sf(z) == pytest.approx(stats.norm.sf(z), rel=1e-12)
    for df in (1, 2, 3, 5, 11, 30, 200):
        for x in (-4.0, -1.0, 0.0, 0.3, 2.2, 9.0):
            assert S.t_sf(x, df) == pytest.approx(stats.t.sf(x, df), rel=1e-9, abs=1e-14)
        for p in (0.5, 0.9, 0.975, 0.995, 0.025):
            assert S.t_ppf(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-8, abs=1e-12)


def test_wilson_interval_equals_scipy() -> None:
    for k, n in ((0, 200), (1, 200), (10, 200), (200, 200), (37, 91)):
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert S.binomial_interval(k, n) == pytest.approx((ci.low, ci.high), rel=1e-9, abs=1e-12)


def test_srm_without_dispersion_is_pearsons_chi_square() -> None:
    counts = np.array([[5050.0, 4950.0, 10100.0]])
    shares = np.array([[0.25, 0.25, 0.5]])
    got = S.srm_test(counts, shares)
    want = stats.chisquare(counts[0], counts.sum() * shares[0])
    assert got.chi2 == pytest.approx(want.statistic) and got.p_value == pytest.approx(want.pvalue)
    assert got.df_dispersion == 0 and got.dispersion == 1.0


def test_srm_long_run_variance_widens_the_test_and_a_real_mismatch_is_found() -> None:
    rng = np.random.default_rng(3)
    # 60 minutes of clustered traffic: units of 10 requests each, split 50/50 by unit
    units = rng.integers(100, 200, size=60)
    a = np.array([rng.binomial(u, 0.5) * 10 for u in units], dtype=float)
    counts = np.stack([a, units * 10 - a], axis=1)
    shares = np.full((60, 2), 0.5)
    plain = stats.chisquare(counts.sum(0)).pvalue
    got = S.srm_test(counts, shares)
    assert 3 < got.dispersion < 30  # ~10: each unit is 10 requests
    assert got.p_value > plain and got.df_dispersion == S.ewc_terms(60) == 6
    # the equal-weighted cosine estimate by its definition, and the F(1, nu) reference
    r = counts[:, 0] - counts.sum(1) * 0.5
    x = (np.arange(60) + 0.5) / 60
    lam = [math.sqrt(2 / 60) * (r * np.cos(np.pi * j * x)).sum() for j in range(1, 7)]
    wald = r.sum() ** 2 / (60 * np.mean(np.square(lam)))
    assert got.chi2 / got.dispersion == pytest.approx(wald)
    assert got.p_value == pytest.approx(stats.f.sf(wald, 1, 6))
    broken = counts.copy()
    broken[:, 1] *= 0.8  # a fifth of arm b's requests lost
    assert S.srm_test(broken, shares).p_value < 0.001  # flagged at the default ab.srm_alpha
    # an arm rolled back halfway: its expected share is 0 there, no mismatch
    half = counts.copy()
    half[30:, 1] = 0
    sh = shares.copy()
    sh[30:] = [1.0, 0.0]
    assert S.srm_test(half, sh).p_value > 0.001
    # three arms: Hotelling's F(2, nu - 1)
    three = np.stack([a, (units * 10 - a) / 2, (units * 10 - a) / 2], axis=1)
    got3 = S.srm_test(three, np.tile([0.5, 0.25, 0.25], (60, 1)))
    assert got3.df == 2 and got3.df_dispersion == 5 and 0 < got3.p_value <= 1


def test_time_groups_cover_the_range_once() -> None:
    g = S.time_groups(62, 5)
    assert len(g) == 12 and g[0] == slice(0, 5) and g[-1] == slice(55, 62)  # remainder joins the last
    assert S.time_groups(3, 5) == [slice(0, 3)]


def test_jackknife_of_a_mean_is_the_t_interval() -> None:
    """For a mean of equal blocks the delete-one-block jackknife is exactly the one-sample t."""
    rng = np.random.default_rng(4)
    x = rng.normal(0.3, 1.0, size=12)
    jk = S.jackknife(lambda s, n: s / n, (x.sum(), 12.0), (x, np.ones(12)), 0.05)
    t = stats.ttest_1samp(x, 0.0)
    ci = t.confidence_interval(0.95)
    assert jk.df == 11 and jk.estimate == pytest.approx(x.mean())
    assert jk.se == pytest.approx(x.std(ddof=1) / math.sqrt(12))
    assert (jk.low, jk.high) == pytest.approx((ci.low, ci.high)) and jk.p_value == pytest.approx(t.pvalue)
    # a block whose removal leaves the statistic undefined is left out
    nan_stat = S.jackknife(lambda s, n: s / n if n > 11.5 else math.nan, (x.sum(), 12.0), (x, np.ones(12)), 0.05)
    assert math.isnan(nan_stat.se)


def test_confidence_sequence_covers_when_peeked_every_step() -> None:
    """Few blocks (as in an hour of 5-minute blocks), any scale: valid at every peek."""
    rng = np.random.default_rng(5)
    alpha, misses, runs = 0.05, 0, 1000
    for i in range(runs):
        x = rng.normal(1.0, 10.0 ** (i % 5 - 2), size=12)
        seq = S.confidence_sequence(x - 1.0, alpha, t_star=12, min_t=2)
        misses += not (seq.low <= 0 <= seq.high)  # the running intersection: ever excluded
        assert (seq.p_value < alpha) == (not seq.low <= 0 <= seq.high) or seq.low > seq.high
    assert misses <= alpha * runs, misses
    assert S.confidence_sequence(np.array([1.0, np.nan, 2.0]), alpha, 10) is None
    strong = S.confidence_sequence(np.full(12, 1.0) + rng.normal(0, 0.1, 12), alpha, 12)
    assert strong.low > 0.8 and strong.p_value < 1e-3


def test_t_mixture_boundary_is_where_the_e_value_reaches_one_over_alpha() -> None:
    rng = np.random.default_rng(6)
    x = rng.normal(0.2, 1.0, size=9)
    t, c, alpha = x.size, 0.7, 0.05
    mean = x.mean()
    h = S.t_mixture_half_width(mean, float(((x - mean) ** 2).sum()), t, c, alpha)
    for mu in (mean - h, mean + h):
        y = x - mu
        assert S.t_mixture_log_e(float(y.sum()), float((y * y).sum()), t, c) == pytest.approx(math.log(1 / alpha))


def test_cliffs_delta_equals_brute_force() -> None:
    rng = np.random.default_rng(2)
    a = rng.integers(0, 5, size=30)
    b = rng.integers(0, 5, size=30)
    xs = np.repeat(np.arange(30), a)
    ys = np.repeat(np.arange(30), b)
    want = (np.sign(xs[:, None] - ys[None, :])).mean()
    assert cliffs_delta(a, b) == pytest.approx(want)
    assert cliffs_delta(np.zeros(3), b) is None


@pytest.mark.parametrize(("low", "high", "lower_better", "want"), [
    (-2.0, 3.0, True, S.PASS),  # below the margin of 5
    (1.0, 9.0, True, S.FAIL),  # significantly slower, beyond the margin
    (-1.0, 9.0, True, S.INCONCLUSIVE),
    (0.5, 4.0, True, S.PASS),  # significantly slower but within the margin
    (-0.004, 0.01, False, S.PASS),  # attainment: worse by less than the margin (0.005)
    (-0.02, -0.01, False, S.FAIL),
    (-0.02, 0.01, False, S.INCONCLUSIVE),
    (math.nan, 1.0, True, S.INCONCLUSIVE),
])
def test_verdicts(low: float, high: float, lower_better: bool, want: str) -> None:
    assert S.verdict(low, high, 5.0 if lower_better else 0.005, lower_is_better=lower_better) == want
