"""The A/B calibration machinery (llmsla.fleet.ab_calibration) on a few small runs: an A/A run's
p-values are not all tiny, a large slowdown is detected and its breaches attributed to its arm,
and the helpers equal scipy. docs/ab-calibration.md holds the full calibration (bench/)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from llmsla import names
from llmsla.fleet import ab_calibration as C

SMALL = replace(C.SCENARIOS["aa_pools"], minutes=20, rate=1.0)


@pytest.fixture(scope="module")
def settings():
    return C.settings()


def test_aa_runs_p_values_are_not_all_tiny(settings) -> None:
    ps = []
    for seed in (1, 2):
        o = C.outcomes(C.simulate("aa", SMALL, seed), settings)
        assert o["requests"][0] > 1000 and o["requests"][1] > 1000
        ps += [v["p"] for v in o["fixed"].values() if v["p"] is not None]
        ps += [v["p"] for v in o["sequential"].values() if v["p"] is not None]
        assert o["srm_p"] > settings.srm_alpha
        assert not any(v["fail"] for v in o["fixed"].values())
    ps = np.asarray(ps)
    assert np.median(ps) > 0.1 and (ps < 0.01).mean() <= 0.1, ps


def test_a_large_slowdown_is_detected_and_attributed(settings) -> None:
    # 6 blocks: the always-valid mode pays for peeking with width at few blocks
    o = C.outcomes(C.simulate("slow", replace(SMALL, minutes=30, slow=1.5), 1), settings)
    for mode in ("fixed", "sequential"):
        assert o[mode][names.AB_METRIC_E2E_P95]["fail"], o[mode][names.AB_METRIC_E2E_P95]
        assert o[mode][names.AB_METRIC_E2E_P95]["relative"] > 0.2
    assert o["breaches"] > 0 and all(g == ["b"] for g in o["attributed"]), o["attributed"]
    summary = C.summarize([o], settings.alpha, settings.srm_alpha)["slow"]
    assert summary["fixed"][names.AB_METRIC_E2E_P95]["fail"]["k"] == 1
    assert summary["breaches"]["runs_attributing_b"]["rate"] == 1.0


def test_exact_interval_and_mann_whitney_equal_scipy() -> None:
    for k, n in ((0, 200), (1, 200), (10, 200), (200, 200), (37, 91)):
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert C.exact_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)
    rng = np.random.default_rng(3)
    a = rng.integers(0, 40, size=300).astype(float)  # ties
    b = rng.integers(2, 40, size=250).astype(float)
    assert C.mann_whitney_p(a, b) == pytest.approx(stats.mannwhitneyu(a, b).pvalue, rel=1e-9)
