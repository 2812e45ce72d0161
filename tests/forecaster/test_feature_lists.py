"""Each model reads its own feature list: the shipped model keeps its twelve features after the
default list grows, a model trained on another list round-trips and scores with the scorer built
for its list, and a scorer built for one list refuses a model of another with a clear message."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from llmsla import config as config_mod
from llmsla.forecaster import artifact, features, registry, windowing
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.dataset import DatasetError, fleet_inputs
from llmsla.forecaster.feature_window import FeatureWindow
from llmsla.forecaster.online import BatchScorer

from .conftest import tiny_train

T0 = 1_700_000_000_000


def _frames(n: int) -> tuple[windowing.Frame, windowing.Frame, windowing.Frame]:
    """Two replicas ``r0``, ``r1`` (sim GPUs sim-0/0 and sim-0/1) over ``n`` steps; r1's GPU
    heats up by 1 C a step, r0's stays at 50 C."""
    req = windowing.empty(windowing.REQUEST_KEYS, windowing.REQUEST_VALUES)
    rows = [{"bucket": T0 + i * 5000, "model": "m", "pool": "p", "arm": "a", "replica": r, "requests": 4.0,
             "ttft_count": 4.0, "ttft_within_slo": 4.0, "e2e_within_slo": 4.0, "ttft_p50_ms": 100.0 + i,
             "ttft_p99_ms": 200.0 + i, "e2e_p99_ms": 900.0, "queue_p99_ms": 1.0, "output_tokens": 40.0}
            for i in range(n) for r in ("r0", "r1")]
    for k in req:
        req[k] = np.asarray([r.get(k, 0.0) for r in rows], dtype=np.int64 if k == "bucket" else req[k].dtype)
    gpu = windowing.empty(windowing.GPU_KEYS, windowing.GPU_VALUES)
    grows = [{"bucket": T0 + i * 5000, "node": "sim-0", "gpu": g, "samples": 5.0, "mem_used_max_bytes": 40e9 + i * 1e8,
              "mem_used_mean_bytes": 40e9, "mem_total_bytes": 80e9, "util_mean": 0.5,
              "temp_max_c": 50.0 + (i if g == 1 else 0), "power_mean_w": 300.0} for i in range(n) for g in (0, 1)]
    for k in gpu:
        gpu[k] = np.asarray([r[k] for r in grows], dtype=gpu[k].dtype if k not in ("bucket",) else np.int64)
    return req, gpu, windowing.empty(windowing.POLICY_KEYS, windowing.POLICY_VALUES)


def _slos() -> list[slo_mod.SloTarget]:
    return slo_mod.from_config(config_mod.load(env={}))


def test_build_makes_the_list_it_is_asked_for_in_its_order() -> None:
    req, gpu, pol = _frames(6)
    targets = features.targets_of(req)
    kw = {"targets": targets, "t0_ms": T0, "n_steps": 6, "slos": _slos()}
    default = features.build(req, gpu, pol, **kw)
    known = features.build(req, gpu, pol, feature_names=features.KNOWN, **kw)
    assert default.x.shape[-1] == len(features.FEATURES) == 12
    np.testing.assert_array_equal(known.x[..., :12], default.x)  # the twelve are the same numbers
    temp = known.x[..., features.KNOWN.index("gpu_temp_c")]
    r0, r1, pool = (targets.index(features.Target("p", r)) for r in ("r0", "r1", ""))
    assert temp[r0].tolist() == [50.0] * 6 and temp[r1].tolist() == [50.0 + i for i in range(6)]
    assert temp[pool].tolist() == temp[r1].tolist()  # a pool's: its hottest GPU
    back = features.build(req, gpu, pol, feature_names=("gpu_temp_c", "qps"), **kw)
    np.testing.assert_array_equal(back.x[..., 0], temp)
    with pytest.raises(ValueError, match=r"\['gpu_fan_rpm'\] cannot be built"):
        features.build(req, gpu, pol, feature_names=("qps", "gpu_fan_rpm"), **kw)


def test_the_shipped_model_keeps_its_list_and_scores() -> None:
    art = artifact.load(artifact.PRETRAINED)
    assert art.meta["features"] == list(features.FEATURES)
    scorer = BatchScorer(art)
    assert scorer.feature_names == features.FEATURES
    req, gpu, pol = _frames(art.window)
    fw = FeatureWindow(art.window, _slos(), prepare=scorer.prepare, feature_names=scorer.feature_names)
    ts = fw.update(req, gpu, pol, t0_ms=T0, changed_from_ms=T0)
    x = scorer.inputs(ts)
    assert x.shape == (len(ts.targets), art.window, len(features.FEATURES) + len(features.MASKS))
    np.testing.assert_array_equal(x, fleet_inputs(features.transform(ts.x), ts.present, art.scaler))
    risk = scorer.risks(x)
    assert risk.shape[0] == len(ts.targets) and np.all((risk >= 0) & (risk <= 1))


def test_a_model_of_another_list_round_trips_and_scores_with_its_own(tiny_cfg, tiny_ds, tmp_path) -> None:
    from llmsla.app.forecast_cli import train_and_save

    names = [*features.FEATURES[:6], "gpu_temp_c"]
    ds = tiny_ds.select(names)
    assert ds.features == names and ds.feats.shape[1] == 7
    out = tmp_path / "model"
    res, _ = train_and_save(tiny_cfg, ds, out, tiny_train(epochs=1))
    art = artifact.load(out)
    assert art.meta["features"] == names and len(art.scaler.median) == 7
    ends = ds.samples("test")[:50]
    np.testing.assert_array_equal(BatchScorer(art).score(ds.inputs(ends, art.scaler)),
                                  BatchScorer(artifact.load(out)).score(ds.inputs(ends, res.scaler)))
    # the online path builds that same list from the store's windows
    req, gpu, pol = _frames(tiny_ds.window)
    scorer = BatchScorer(art)
    fw = FeatureWindow(art.window, _slos(), prepare=scorer.prepare, feature_names=scorer.feature_names)
    ts = fw.update(req, gpu, pol, t0_ms=T0, changed_from_ms=T0)
    assert ts.x.shape[-1] == 7 and not math.isnan(ts.x[0, -1, 6])
    assert scorer.inputs(ts).shape[-1] == 7 + len(features.MASKS)
    # a data set built without one of the model's features says which
    with pytest.raises(DatasetError, match=r"no features \['gpu_fan_rpm'\]"):
        tiny_ds.select(["qps", "gpu_fan_rpm"])


def test_a_scorer_refuses_a_model_of_a_list_it_cannot_build(tiny_ds, tiny_trained, tmp_path) -> None:
    _, _, src = tiny_trained
    model = tmp_path / "model"
    shutil.copytree(src, model)
    meta = json.loads((model / artifact.META).read_text())
    meta["features"] = [*meta["features"][:-1], "gpu_fan_rpm"]
    (model / artifact.META).write_text(json.dumps(meta))
    art = artifact.load(model)  # the artifact itself is consistent: same number of columns
    with pytest.raises(ValueError, match=r"reads features \['gpu_fan_rpm'\] this llmsla cannot build"):
        BatchScorer(art)
    with pytest.raises(registry.RegistryError, match=r"m1: reads features .*unknown: \['gpu_fan_rpm'\]"):
        registry.check_features(art, "m1")
    # the evaluation's data set is built for one list: a model of another is refused by name
    from llmsla.app.forecast_cli import _features_of
    from llmsla.errors import CliError

    with pytest.raises(CliError, match=r"model x: the data set has no features \['gpu_fan_rpm'\]"):
        _features_of(tiny_ds, meta["features"], "model x")
