"""NAB-style folders: the real series load with their windows; a malformed row is an error
naming file, line and field; a repeated timestamp is skipped and recorded (a real NAB file repeats one at a DST change)."""

from __future__ import annotations

import json

import pytest

from llmsla.data import data_dir
from llmsla.forecaster import nab


def test_real_nab_loads_with_labels() -> None:
    ds, files = nab.load(data_dir() / "nab", window=64, horizon=5)
    assert len(files) == 17 and ds.n_series == 17 and ds.step_s == 300.0
    assert ds.breach.sum() > 0 and 0 < ds.y[ds.y >= 0].mean() < 0.3
    # DST jumps stamp several rows alike (e.g. 2014-03-09 03:00:00); an independent count
    want = {}
    for f in files:
        stamps = [ln.split(",")[0] for ln in (data_dir() / "nab" / f).read_text().splitlines()[1:]]
        repeats = [i + 2 for i in range(1, len(stamps)) if stamps[i] <= stamps[i - 1]]
        if repeats:
            want[f] = repeats
    assert ds.info["skipped_rows"] == want and "ec2_disk_write_bytes_1ef3de.csv" in want
    folds = {m["fold"] for m in ds.meta}
    assert folds == {0, 1, 2, 3}
    f0 = nab.fold_splits(ds, 0)
    assert {m["split"] for m in f0.meta} == {"train", "val", "test"}


@pytest.mark.parametrize("row, message", [
    ("2014-01-01 00:10:00,abc", "a.csv:3: value: not a number"),
    ("yesterday,1.0", "a.csv:3: timestamp: not a timestamp"),
    ("2014-01-01 00:10:00,1,2", "a.csv:3: expected 2 columns"),
])
def test_bad_rows_name_file_line_field(tmp_path, row, message) -> None:
    (tmp_path / "a.csv").write_text(f"timestamp,value\n2014-01-01 00:05:00,1.0\n{row}\n")
    (tmp_path / "labels_windows.json").write_text(json.dumps({"g/a.csv": []}))
    with pytest.raises(nab.NabError, match=message):
        nab.load(tmp_path, window=4, horizon=1)


def test_an_alarm_before_a_labelled_window_is_its_early_warning(tmp_path) -> None:
    """A NAB window is the anomaly itself, not a fault that begins before it: an alarm before
    its start is the early warning the evaluation credits (an injected fault's start, by
    contrast, bounds its warnings: test_metrics_and_gaps)."""
    import numpy as np

    from llmsla.forecaster import evaluate
    from llmsla.forecaster import metrics as m

    rows = [f"2014-01-01 {h:02d}:{mi:02d}:00,{1.0 + (h * 60 + mi) % 7}" for h in range(10) for mi in range(0, 60, 5)]
    (tmp_path / "a.csv").write_text("timestamp,value\n" + "\n".join(rows) + "\n")
    (tmp_path / "labels_windows.json").write_text(json.dumps(
        {"g/a.csv": [["2014-01-01 06:00:00.000000", "2014-01-01 06:30:00.000000"]]}))
    ds, _ = nab.load(tmp_path, window=8, horizon=1, folds=1)
    onset = int(np.flatnonzero(ds.breach)[0])

    def scorer(ends: np.ndarray) -> np.ndarray:
        return ((ends >= onset - 4) & (ends < onset)).astype(float)  # on the 4 steps before it

    (s,) = evaluate.series_scores(ds, "test", scorer)
    assert [(e.cause, e.fault_step) for e in s.episodes] == [(m.PRECURSOR, None)]
    r = m.report([s], 0.5, lead_max=24, step_s=ds.step_s, min_onset=ds.window - 1)
    assert r.warned[m.PRECURSOR] == 1 and r.mean_lead_s[m.PRECURSOR] == 4 * ds.step_s
