"""``llmsla forecast eval`` end to end on the tiny data set and a small NAB-style folder cut from
the real series: every method gets a row in (a) and (b) of the generated page, the JSON holds
the same numbers, and the thresholds were set on validation under the online alarm policy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmsla.app.cli import main
from llmsla.data import data_dir

from .conftest import tiny_train

NAB = data_dir() / "nab"
METHODS = ("lstm", "persistence", "ewma", "predict_linear", "holt_winters", "logistic_regression",
           "gradient_boosting")


def _small_nab(dst: Path, n_files: int = 6, before: int = 400, after: int = 200) -> Path:
    """``n_files`` real series cut to the rows around their first labelled window (``before``
    rows before its start, ``after`` rows after it), with their labels: the layout ``--nab``
    takes, small enough for seconds."""
    dst.mkdir()
    labels = {Path(k).name: v for k, v in json.loads((NAB / "labels_windows.json").read_text()).items()}
    files = [f for f in sorted(NAB.glob("*.csv")) if labels.get(f.name)][:n_files]
    for f in files:
        lines = f.read_text().splitlines(keepends=True)
        start = labels[f.name][0][0][:19]
        i = next(k for k, ln in enumerate(lines) if ln.startswith(start))
        dst.joinpath(f.name).write_text("".join([lines[0], *lines[max(1, i - before): i + after]]))
    (dst / "labels_windows.json").write_text(json.dumps({n: labels[n] for n in (f.name for f in files)}))
    return dst


def test_a_fold_without_labels_is_a_clear_error(tiny_ds, tiny_trained, tmp_path, capsys) -> None:
    nab = _small_nab(tmp_path / "nab", n_files=3, before=80, after=0)  # windows start after the cut
    data = tiny_ds.save(tmp_path / "dataset.npz")
    rc = main(["forecast", "eval", "--data", str(data), "--model", str(tiny_trained[2]), "--nab", str(nab),
               "--folds", "3", "--methods", "persistence", "--doc", ""])
    err = capsys.readouterr().err
    assert rc == 2 and "no labelled window" in err and str(nab) in err, err


@pytest.mark.slow  # an LSTM per NAB fold: tens of seconds on two busy cores
def test_eval_writes_every_method_for_both_parts(tiny_ds, tiny_trained, tmp_path, capsys) -> None:
    _res, mr, model = tiny_trained
    data = tiny_ds.save(tmp_path / "dataset.npz")
    nab = _small_nab(tmp_path / "nab")
    doc, out = tmp_path / "eval.md", tmp_path / "eval.json"
    shutil.copytree(model, tmp_path / "model")
    rc = main(["forecast", "eval", "--data", str(data), "--model", str(tmp_path / "model"), "--nab", str(nab),
               "--folds", "3", "--nab-epochs", "1", "--doc", str(doc), "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    page = doc.read_text()
    fleet_part, nab_part = page.split("## (b)")
    for meth in METHODS:
        assert f"| {meth} |" in fleet_part and f"| {meth} |" in nab_part, meth
    assert "not comparable" in nab_part
    got = json.loads(out.read_text())
    lstm = next(r for r in got["fleet"] if r["method"] == "lstm")
    # the LSTM row is the trained model's: the same threshold and test AUC-PR as at training time
    assert lstm["threshold"] == mr.threshold and lstm["test"]["auc_pr"] == mr.test.auc_pr
    assert lstm["test"]["policy"] == {"fire_steps": 2, "resolve_steps": 6, "resolve_ratio": 0.8, "repeat_s": 300.0}
    # operating points: a larger false-alarm budget never raises the threshold
    assert "### Operating points" in fleet_part
    for r in got["fleet"]:
        points = r["operating_points"]
        assert [p["budget"] for p in points] == [1.0, 2.0, 4.0, 8.0, 16.0]
        assert all(a["threshold"] >= b["threshold"] for a, b in zip(points, points[1:], strict=False)), r["method"]
        assert next(p for p in points if p["budget"] == 4.0)["threshold"] == r["threshold"]
    assert len(got["nab"]) == len(METHODS) and all(r["test"]["events"]["precursor"] >= 0 for r in got["nab"])
    assert tiny_train().threads == 1
