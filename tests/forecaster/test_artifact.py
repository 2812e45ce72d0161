"""The artifact round-trips exactly (weights, scaler, threshold), training is deterministic for a
seed on the CPU, and a corrupt artifact is a clear error naming the file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from llmsla.forecaster import artifact, train
from llmsla.forecaster.online import BatchScorer

from .conftest import tiny_train

MAIN = "import sys; from llmsla.app.cli import main; sys.exit(main())"


def test_loaded_artifact_scores_identically(tiny_ds, tiny_trained) -> None:
    res, mr, out = tiny_trained
    art = artifact.load(out)
    ends = tiny_ds.samples("test")
    want = train.predict(res.model, tiny_ds.inputs(ends, res.scaler))
    got = train.predict(art.model, tiny_ds.inputs(ends, art.scaler))
    assert np.array_equal(want, got)
    # the scaler is saved and reused: identical statistics, and the online scorer's inputs
    # (built from the artifact alone) equal the training pipeline's
    assert np.array_equal(art.scaler.median, res.scaler.median) and np.array_equal(art.scaler.iqr, res.scaler.iqr)
    idx = ends[:, None] - tiny_ds.window + 1 + np.arange(tiny_ds.window)
    from llmsla.forecaster.dataset import fleet_inputs

    assert np.array_equal(fleet_inputs(tiny_ds.feats[idx], tiny_ds.present[idx], art.scaler),
                          tiny_ds.inputs(ends, res.scaler))
    assert np.array_equal(BatchScorer(art).score(tiny_ds.inputs(ends, art.scaler)), got.astype(float))
    assert art.threshold == mr.threshold and art.meta["data_sha256"] == tiny_ds.digest()
    assert art.meta["features"] and art.meta["metrics"]["test"]["auc_pr"] == mr.test.auc_pr


def test_training_is_deterministic_for_a_seed(tiny_ds) -> None:
    a = train.train_lstm(tiny_ds, tiny_train(epochs=2))
    b = train.train_lstm(tiny_ds, tiny_train(epochs=2))
    for (ka, va), (kb, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb), ka
    c = train.train_lstm(tiny_ds, tiny_train(epochs=2, seed=1))
    assert not torch.equal(a.model.out.weight, c.model.out.weight)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "model.pt").write_bytes((d / "model.pt").read_bytes()[:100]), "sha256 differs"),
    (lambda d: (d / "artifact.json").write_text("{not json"), "not valid JSON"),
    (lambda d: (d / "artifact.json").write_text(json.dumps(
        {k: v for k, v in json.loads((d / "artifact.json").read_text()).items() if k != "threshold"})),
     "missing field 'threshold'"),
    (lambda d: (d / "artifact.json").write_text(json.dumps(
        {**json.loads((d / "artifact.json").read_text()), "scaler": {"median": [0.0], "iqr": [1.0]}})),
     "disagree"),
    (lambda d: (d / "model.pt").unlink(), "model.pt: missing"),
])
def test_corrupt_artifact_is_a_clear_error(tiny_trained, tmp_path, damage, message) -> None:
    d = tmp_path / "model"
    shutil.copytree(tiny_trained[2], d)
    damage(d)
    with pytest.raises(artifact.ArtifactError, match=message):
        artifact.load(d)


def test_cli_names_the_corrupt_file(tiny_trained, tmp_path) -> None:
    d = tmp_path / "model"
    shutil.copytree(tiny_trained[2], d)
    (d / "model.pt").write_bytes(b"garbage")
    out = subprocess.run([sys.executable, "-c", MAIN, "forecast", "serve", "--model", str(d), "--steps", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert f"llmsla: error: {d}/model.pt: sha256 differs" in out.stderr
