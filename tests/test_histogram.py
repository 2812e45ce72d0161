"""The mergeable histogram layout and its Python functions (llmsla.histogram), against numpy's
exact quantiles over the raw values."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from llmsla import histogram as H
from llmsla import names


def test_layout_is_log_spaced_within_one_percent_over_the_range() -> None:
    b = np.asarray(names.HIST_BOUNDS_MS)
    assert np.all(np.diff(b) > 0)
    assert b[0] == names.HIST_MIN_MS and b[-1] >= names.HIST_MAX_MS
    assert len(names.HIST_VALUES_MS) == len(b) + 1 == H.SIZE
    # every bucket's value is within 1 % of each value the bucket holds (float rounding aside)
    assert H.max_relative_error() <= names.HIST_REL_ERROR + 1e-12
    for i in range(1, len(b)):
        lo, hi, v = b[i - 1], b[i], names.HIST_VALUES_MS[i]
        assert lo < v < hi
        assert (v - lo) / lo <= names.HIST_REL_ERROR + 1e-12 and (hi - v) / hi <= names.HIST_REL_ERROR + 1e-12


def test_bucket_index_ties_and_ends() -> None:
    assert H.bucket_index(0.0) == 0 and H.bucket_index(names.HIST_MIN_MS) == 0
    assert H.bucket_index(names.HIST_BOUNDS_MS[5]) == 5  # a bound is in the bucket it closes
    assert H.bucket_index(math.nextafter(names.HIST_BOUNDS_MS[5], math.inf)) == 6
    assert H.bucket_index(1e12) == H.SIZE - 1
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.lognormal(5, 3, 10_000), np.asarray(names.HIST_BOUNDS_MS), [0.0]])
    assert [H.bucket_index(v) for v in values] == H.bucket_indices(values).tolist()


def _exact(values: np.ndarray, q: float) -> float:
    return float(np.quantile(values, q, method="inverted_cdf"))


@pytest.mark.parametrize("seed", range(5))
def test_quantiles_within_one_percent_of_numpy_exact(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    values = rng.lognormal(mean=rng.uniform(2, 9), sigma=rng.uniform(0.1, 2), size=n)
    values = np.clip(values, names.HIST_MIN_MS * 1.0001, names.HIST_MAX_MS)
    h = H.Hist.of(values)
    assert h.n == n
    for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0):
        got, want = h.quantile(q), _exact(values, q)
        assert abs(got - want) <= names.HIST_REL_ERROR * want * (1 + 1e-9), (q, got, want)
        # the rank is numpy's inverted_cdf: the bucket is the one holding that order statistic
        assert got == names.HIST_VALUES_MS[H.bucket_index(want)]


def test_merged_counts_equal_counts_of_the_union() -> None:
    rng = np.random.default_rng(7)
    parts = [rng.lognormal(6, 1, int(rng.integers(0, 300))) for _ in range(40)]
    merged = H.merge(H.Hist.of(p) for p in parts)
    assert merged == H.Hist.of(np.concatenate(parts))
    assert H.Hist.of(parts[0]) + H.Hist.of(parts[1]) == H.Hist.of(np.concatenate(parts[:2]))
    matrix = np.stack([H.Hist.of(p).dense() for p in parts if len(p)])
    for q in (0.5, 0.95, 0.99):
        want = [H.quantile(row, q) for row in matrix]
        assert H.quantiles(matrix, q).tolist() == want
    assert np.isnan(H.quantiles(np.zeros((1, H.SIZE), dtype=np.int64), 0.5)[0])
    assert H.quantile(np.zeros(H.SIZE, dtype=np.int64), 0.5) is None


def test_literal_round_trip_and_bad_literals() -> None:
    rng = random.Random(3)
    for _ in range(50):
        h = H.Hist.of([rng.lognormvariate(5, 2) for _ in range(rng.randint(1, 50))])
        assert H.Hist.parse(h.literal()) == h
    assert H.Hist.parse("{1,2}") == H.Hist(1, (1, 2))
    assert H.Hist.parse(None) == H.EMPTY and H.EMPTY.literal() is None
    for bad in ("[3:4]={1}", "[a:b]={1}", "{1,x}", "[0:0]={-1}", f"[{H.SIZE}:{H.SIZE}]={{1}}", "1,2"):
        with pytest.raises(H.HistError):
            H.Hist.parse(bad)
    with pytest.raises(ValueError, match="quantile"):
        H.rank(1.5, 10)
