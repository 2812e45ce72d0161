"""``forecast.threshold_confidence`` reaches training: the artifact's threshold is picked with the
configured rule (the Poisson upper bound of validation false alarms, or the count alone) and the
artifact records which. ``train --from-store`` and the backtest build their settings with the
same ``_eval_config``; see docs/forecaster.md#thresholds-that-hold."""

from __future__ import annotations

import dataclasses

from llmsla import config as config_mod
from llmsla.forecaster import artifact, evaluate, train
from llmsla.forecaster import metrics as m

from .conftest import tiny_train


def test_the_configured_confidence_picks_the_artifacts_threshold(tiny_cfg, tiny_ds, tiny_trained, tmp_path) -> None:
    from llmsla.app.forecast_cli import _eval_config, train_and_save

    cfg = config_mod.load(env={"LLMSLA_FORECAST_THRESHOLD_CONFIDENCE": "0.8"})
    assert cfg.forecast.threshold_confidence == 0.8
    cfg.forecast = dataclasses.replace(tiny_cfg.forecast, threshold_confidence=0.8)
    res, mr = train_and_save(cfg, tiny_ds, tmp_path / "m", tiny_train())
    art = artifact.load(tmp_path / "m")
    assert art.meta["threshold_confidence"] == 0.8
    assert "Poisson bound" in art.meta["threshold_rule"]
    # the threshold is the rule's on this model's validation scores, not the count rule's
    ec = _eval_config(cfg)
    val = evaluate.series_scores(tiny_ds, "val", lambda ends: train.predict(res.model, tiny_ds.inputs(ends, res.scaler)))
    bound = m.threshold_for(val, ec.false_alarms_per_day, ec.lead_max_steps, tiny_ds.step_s, ec.policy, 0.8)
    count = m.threshold_for(val, ec.false_alarms_per_day, ec.lead_max_steps, tiny_ds.step_s, ec.policy, 0.0)
    assert art.meta["threshold"] == mr.threshold == bound
    assert bound > count  # the bound is stricter on these few healthy days: the key changed the pick
    # the default (0) is the count rule, recorded as such
    _, _, out = tiny_trained
    shipped_rule = artifact.load(out).meta
    assert shipped_rule["threshold_confidence"] == 0.0 and "Poisson" not in shipped_rule["threshold_rule"]
