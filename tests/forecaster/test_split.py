"""No leakage across the split: runs, seeds and trace time ranges belong to one split, in time
order; the scaler sees training data only. A shuffled split is caught."""

from __future__ import annotations

import copy
import random

import numpy as np

from llmsla.forecaster.dataset import SPLITS, leakage


def test_default_split_is_clean_and_time_ordered(tiny_ds) -> None:
    assert leakage(tiny_ds) == []
    by_split = {s: {m["run"] for m in tiny_ds.meta if m["split"] == s} for s in SPLITS}
    assert all(by_split.values()) and not (by_split["train"] & by_split["test"])
    # every window lies inside one series, so inside one split
    for split in SPLITS:
        ends = tiny_ds.samples(split)
        starts = ends - tiny_ds.window + 1
        assert np.array_equal(tiny_ds.series_index(ends), tiny_ds.series_index(starts))
        assert {tiny_ds.meta[s]["split"] for s in tiny_ds.series_index(ends)} == {split}


def test_a_shuffled_split_is_caught(tiny_ds) -> None:
    shuffled = copy.deepcopy(tiny_ds)
    rng = random.Random(0)
    for m in shuffled.meta:  # what a random per-window (or per-series) split would do
        m["split"] = rng.choice(SPLITS)
    assert any("is in" in p for p in leakage(shuffled))
    swapped = copy.deepcopy(tiny_ds)  # whole runs moved across splits: time order breaks
    scs = swapped.info["scenarios"]
    tr = next(s for s in scs if s["split"] == "train")
    te = next(s for s in scs if s["split"] == "test")
    tr["split"], te["split"] = "test", "train"
    assert any("before a" in p for p in leakage(swapped))


def test_scaler_is_fitted_on_training_data_only(tiny_ds) -> None:
    ref = tiny_ds.fit_scaler()
    poisoned = copy.deepcopy(tiny_ds)
    for s in poisoned.series_of("test") + poisoned.series_of("val"):
        poisoned.feats[poisoned.offsets[s]: poisoned.offsets[s + 1]] *= 1000.0
    again = poisoned.fit_scaler()
    assert np.array_equal(ref.median, again.median) and np.array_equal(ref.iqr, again.iqr)
