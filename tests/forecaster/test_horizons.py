"""Several horizons: one head each, its own threshold in the artifact, its own alarm online.

The multi-head artifact round-trips (weights, horizons, thresholds), the shipped one-horizon
artifact still loads and scores as before, a horizons field that does not fit the model is a
clear error, and the online scorer - against the embedded PostgreSQL - keeps one hysteresis per
horizon: a long horizon fires while a short one stays quiet, each alert carries its horizon and
the predicted breach time, and each resolves on its own.
"""

from __future__ import annotations

import json
import math
import shutil
import time

import numpy as np
import psycopg
import pytest
import torch

from llmsla import config as config_mod
from llmsla import names
from llmsla.forecaster import (
    artifact,
    decide,
    features,
    horizons,
    online,
    store_io,
    train,
    windowing,
)
from llmsla.forecaster.model import LstmForecaster, ModelConfig
from llmsla.forecaster.scaler import RobustScaler
from llmsla.store.migrate import migrate

from .conftest import tiny_train
from .webhook_server import validate

#: recent, so a TimescaleDB store's retention job never drops the test's windows mid-test
T0 = (int(time.time() * 1000) // 3_600_000 - 2) * 3_600_000
STEP_MS = features.STEP_MS


@pytest.fixture(scope="module")
def multi_trained(tiny_cfg, tiny_ds, tmp_path_factory):
    from llmsla.app.forecast_cli import train_and_save

    cfg = config_mod.load(env={})
    cfg.forecast = type(tiny_cfg.forecast)(**{**tiny_cfg.forecast.__dict__, "horizons_s": [15.0, 30.0, 60.0]})
    out = tmp_path_factory.mktemp("forecast") / "multi"
    res, mr = train_and_save(cfg, tiny_ds, out, tiny_train())
    return res, mr, out


def test_multi_horizon_artifact_round_trips(tiny_ds, multi_trained) -> None:
    res, mr, out = multi_trained
    art = artifact.load(out)
    assert art.horizons == [3, 6, 12] and art.model.cfg.outputs == 3
    assert len(art.thresholds) == 3 and all(math.isfinite(t) for t in art.thresholds)
    # a reader that knows one horizon reads the shortest
    assert art.horizon == 3 and art.threshold == art.thresholds[0] == mr.threshold
    assert [m["horizon"] for m in art.meta["horizon_metrics"]] == [3, 6, 12]
    ends = tiny_ds.samples("test")
    want = train.predict(res.model, tiny_ds.inputs(ends, res.scaler))
    got = online.BatchScorer(art).risks(tiny_ds.inputs(ends, art.scaler))
    assert want.shape == got.shape == (len(ends), 3)
    assert np.array_equal(want.astype(float), got)
    # each head is thresholded on its own horizon's labels: the longer horizon has more positives
    y = tiny_ds.labels([3, 6, 12])
    known = (y >= 0).all(axis=1)
    assert (y[known] == 1).sum(axis=0).tolist() == sorted((y[known] == 1).sum(axis=0).tolist())


def test_online_scorer_exports_each_horizons_validation_recall(multi_trained) -> None:
    from prometheus_client import CollectorRegistry

    from llmsla.forecaster import accuracy

    art = artifact.load(multi_trained[2])
    cfg = config_mod.load(env={})
    reg = CollectorRegistry()
    scorer = online.OnlineScorer(art, cfg, "postgresql://unused", registry=reg)  # connects on the first step
    got = {smp.labels["horizon"]: smp.value for fam in reg.collect() for smp in fam.samples
           if smp.name == names.FORECAST_VALIDATION_RECALL}
    want = {str(m["horizon"] * 5): accuracy.validation_recall({"metrics": {"val": m["val"]}})
            for m in art.meta["horizon_metrics"]}
    assert list(got) == ["15", "30", "60"] and got == pytest.approx(want, nan_ok=True)
    scorer.close()


def test_the_shipped_one_horizon_artifact_still_loads_and_scores() -> None:
    art = artifact.load(artifact.PRETRAINED)
    assert "horizons" not in art.meta and art.model.cfg.outputs == 1
    assert art.horizons == [art.horizon] == [5] and art.thresholds == [art.threshold]
    x = np.zeros((4, art.window, art.model.cfg.inputs), np.float32)
    scorer = online.BatchScorer(art)
    assert scorer.score(x).shape == (4,) and scorer.risks(x).shape == (4, 1)
    assert np.array_equal(scorer.risks(x)[:, 0], scorer.score(x))


@pytest.mark.parametrize("edit, message", [
    (lambda m: m | {"horizons": [5, 24], "thresholds": [0.5, 0.5]}, "2 horizons but the model has 1 outputs"),
    (lambda m: m | {"horizons": [24, 5]}, "ascending"),
    (lambda m: m | {"horizons": [5], "thresholds": [float("nan")]}, "thresholds: expected 1 finite"),
    (lambda m: m | {"horizons": [5]}, "thresholds"),
])
def test_horizons_that_do_not_fit_are_a_clear_error(tmp_path, edit, message) -> None:
    d = tmp_path / "model"
    shutil.copytree(artifact.PRETRAINED, d)
    meta = json.loads((d / artifact.META).read_text())
    (d / artifact.META).write_text(json.dumps(edit(meta)))
    with pytest.raises(artifact.ArtifactError, match=message):
        artifact.load(d)


def test_horizon_steps_labels_and_breach_time() -> None:
    assert horizons.steps_of([600, 30, 120], 5.0) == (6, 24, 120)
    with pytest.raises(ValueError, match="32 s is not a whole number"):
        horizons.steps_of([32], 5.0)
    assert [horizons.label(s) for s in (25, 30, 120, 300, 3600)] == ["25s", "30s", "2m", "5m", "1h"]
    ec = horizons.evaluate.EvalConfig(lead_max_steps=24)
    assert horizons.eval_config_for(ec, 6).lead_max_steps == 24 and horizons.eval_config_for(ec, 120).lead_max_steps == 120
    # the earliest horizon over its own threshold, or none
    assert decide.breach_in_s([0.2, 0.7, 0.9], [0.5, 0.6, 0.95], [30, 120, 300]) == 120
    assert decide.breach_in_s([0.2, 0.1, 0.9], [0.5, 0.6, 0.95], [30, 120, 300]) is None


def test_config_refuses_a_horizon_off_the_window_grid() -> None:
    assert config_mod.load(env={"LLMSLA_FORECAST_HORIZONS_S": "30,600"}).forecast.horizons_s == [30.0, 600.0]
    with pytest.raises(config_mod.ConfigError, match="whole multiple of 5 s"):
        config_mod.load(env={"LLMSLA_FORECAST_HORIZONS_S": "30,32"})


# -- online: one alarm per horizon, against the real store ------------------------------------

def _frames(n_steps: int, replicas: int = 2):
    rng = np.random.default_rng(0)
    rows = [(T0 + s * STEP_MS, r) for s in range(n_steps) for r in range(replicas)]
    n = len(rows)
    req = windowing.empty(windowing.REQUEST_KEYS, windowing.REQUEST_VALUES)
    req["bucket"] = np.array([b for b, _ in rows], dtype=np.int64)
    req["model"] = np.array(["6b"] * n, dtype=object)
    req["pool"] = np.array([names.DEFAULT_POOL] * n, dtype=object)
    req["replica"] = np.array([f"r{r}" for _, r in rows], dtype=object)
    req["arm"] = np.array(["default"] * n, dtype=object)
    req[names.L_TENANT] = np.array([names.DEFAULT_TENANT] * n, dtype=object)
    req[names.L_CLASS] = np.array([names.DEFAULT_CLASS] * n, dtype=object)
    for v in windowing.REQUEST_VALUES:
        req[v] = rng.gamma(2.0, 50.0, n)
    req["requests"] = rng.integers(5, 20, n).astype(float)
    req["errors"] = req["timeouts"] = req["rejected"] = req["cancelled"] = np.zeros(n)
    req["ok"] = req["ttft_count"] = req["requests"].copy()
    req["ttft_within_slo"] = req["e2e_within_slo"] = req["requests"].copy()
    return req


def _constant_artifact(tmp_path, horizons_steps: list[int], thresholds: list[float]) -> artifact.Artifact:
    """A two-head model whose risks are its output biases (every weight zero): the test sets them."""
    nf, nm = len(features.FEATURES), len(features.MASKS)
    model = LstmForecaster(ModelConfig(nf + nm, hidden=4, dense=4, outputs=len(horizons_steps)))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    scaler = RobustScaler(np.zeros(nf), np.ones(nf))
    meta = {"mode": "fleet", "window": 8, "horizon": horizons_steps[0], "step_s": 5.0,
            "threshold": thresholds[0], "horizons": horizons_steps, "thresholds": thresholds,
            "features": list(features.FEATURES), "masks": list(features.MASKS)}
    artifact.save(tmp_path / "m", model, scaler, meta)
    return artifact.load(tmp_path / "m")


def _set_risks(art: artifact.Artifact, risks: list[float]) -> None:
    with torch.no_grad():
        art.model.out.bias.copy_(torch.tensor([math.log(r / (1 - r)) for r in risks]))


def _scoring_store(pg_dsn: str) -> config_mod.Config:
    """A migrated store holding 30 steps of two replicas' windows, and a config that scores at
    once (no lag, no accuracy pass) and fires or resolves after two steps."""
    cfg = config_mod.load(env={})
    cfg.store.dsn = pg_dsn
    cfg.forecast.lag_s = 0.0
    cfg.forecast.accuracy_every_steps = 0
    cfg.forecast.fire_steps, cfg.forecast.resolve_steps = 2, 2
    with psycopg.connect(pg_dsn) as conn:
        migrate(conn, cfg)
        store_io.write_frame(conn, names.T_REQUEST_WINDOWS, windowing.REQUEST_KEYS, windowing.REQUEST_VALUES,
                             _frames(30))
    return cfg


def test_online_scorer_keeps_one_alarm_per_horizon(pg_dsn, tmp_path) -> None:
    cfg = _scoring_store(pg_dsn)
    art = _constant_artifact(tmp_path, [6, 60], [0.5, 0.3])  # 30 s and 5 min, each its own threshold
    scorer = online.OnlineScorer(art, cfg, pg_dsn)
    try:
        def step(i: int, risks: list[float]) -> online.StepResult:
            _set_risks(art, risks)
            return scorer.step(T0 + (8 + i) * STEP_MS)

        sent = []
        # the 5 min head is over its threshold (0.4 >= 0.3), the 30 s head is not (0.4 < 0.5)
        for i in range(3):
            sent += step(i, [0.4, 0.4]).notifications
        firing = [a for s, a in sent if s == "firing"]
        assert {a["labels"][names.L_HORIZON] for a in firing} == {"5m"}, [a["labels"] for a in firing]
        assert {a["labels"].get(names.L_REPLICA, "*") for a in firing} == {"r0", "r1", "*"}
        a = firing[0]
        assert a["annotations"][names.ANN_HORIZON_S] == "300"
        fired_at = T0 + (8 + 1) * STEP_MS  # the second step (i = 1): the end of the window it scored
        assert a["annotations"][names.ANN_PREDICTED_BREACH] == online.alerts.rfc3339(fired_at + 300_000)
        for s, alert in sent:
            validate(online.alerts.payload(s, alert, ""))
        # now the 30 s head crosses too: its own alert, and the breach is expected within 30 s
        sent = step(3, [0.9, 0.9]).notifications + step(4, [0.9, 0.9]).notifications
        short = [a for s, a in sent if s == "firing"]
        assert {a["labels"][names.L_HORIZON] for a in short} == {"30s"}
        when = T0 + (8 + 4) * STEP_MS + 30_000  # fired at i = 4
        assert all(a["annotations"][names.ANN_PREDICTED_BREACH] == online.alerts.rfc3339(when) for a in short)
        # the 30 s head falls below its band and resolves; the 5 min alarm stays on
        sent = step(5, [0.1, 0.9]).notifications + step(6, [0.1, 0.9]).notifications
        assert {(s, a["labels"][names.L_HORIZON]) for s, a in sent} == {("resolved", "30s")}
        assert len(scorer.hysts[1].firing_keys()) == 3 and not scorer.hysts[0].firing_keys()
        res = step(7, [0.1, 0.9])
        assert res.scored == 3 and res.horizon_risks["default/r0"] == pytest.approx([0.1, 0.9])
    finally:
        scorer.close()
    # one forecasts row per target and horizon, each with its own threshold
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT horizon_s, threshold, count(*) FROM {names.T_FORECASTS} "
                            "GROUP BY horizon_s, threshold ORDER BY horizon_s").fetchall()
    assert [(h, round(t, 3)) for h, t, _ in rows] == [(30, 0.5), (300, 0.3)]
    assert rows[0][2] == rows[1][2] == 8 * 3


def test_a_swapped_champion_brings_its_horizons_and_keeps_the_shared_alarm(pg_dsn, tmp_path) -> None:
    """A one-horizon model swapped for a two-horizon champion (the registry's hand-over): the
    30 s alarm keeps its state (no second notification for a firing target), the new 5 min
    head gets its own alarm and threshold, and the forecasts rows follow the new model."""
    cfg = _scoring_store(pg_dsn)
    one = _constant_artifact(tmp_path / "one", [6], [0.5])
    two = _constant_artifact(tmp_path / "two", [6, 60], [0.6, 0.3])
    scorer = online.OnlineScorer(one, cfg, pg_dsn)
    try:
        _set_risks(one, [0.9])
        sent = [n for i in range(2) for n in scorer.step(T0 + (8 + i) * STEP_MS).notifications]
        assert {a["labels"][names.L_HORIZON] for s, a in sent if s == "firing"} == {"30s"}
        firing_30s = scorer.hysts[0].firing_keys()
        scorer.swap(two)
        assert scorer.horizons_s == [30, 300] and scorer.thresholds == [0.6, 0.3]
        assert scorer.hysts[0].firing_keys() == firing_30s and scorer.hysts[0].threshold == 0.6
        _set_risks(two, [0.9, 0.4])
        sent = [n for i in range(2, 4) for n in scorer.step(T0 + (8 + i) * STEP_MS).notifications]
        # the 30 s alarm was already firing: nothing new; the 5 min head fires on its own threshold
        assert {a["labels"][names.L_HORIZON] for s, a in sent if s == "firing"} == {"5m"}
    finally:
        scorer.close()
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT forecaster, horizon_s, count(*) FROM {names.T_FORECASTS} "
                            "GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    assert {(f, h) for f, h, _ in rows} == {(f"lstm-{one.version}", 30), (f"lstm-{two.version}", 30),
                                            (f"lstm-{two.version}", 300)}
