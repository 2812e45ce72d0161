"""Several horizons: which steps a model forecasts, how each head is scored and thresholded.

One model may forecast a breach within several horizons at once (``forecast.horizons_s``, one
output head each). Each horizon is its own alarm: its own threshold from the false-alarm budget
on validation, its own hysteresis online, its own ``horizon`` label on the alert, because the
receiver answers a warning minutes ahead differently from one seconds ahead. Breach events are
the same at every horizon (those of the data set's own horizon); only the label and the lead
window (at least the horizon) change. See docs/forecaster.md#several-horizons.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from llmsla.forecaster import accuracy, evaluate
from llmsla.forecaster.dataset import Dataset
from llmsla.forecaster.model import LstmForecaster
from llmsla.forecaster.scaler import RobustScaler


def steps_of(horizons_s: Sequence[float], step_s: float) -> tuple[int, ...]:
    """``forecast.horizons_s`` in steps of ``step_s``, ascending; ValueError says which one is
    not a whole number of steps (a 32 s horizon on 5 s windows cannot be labelled)."""
    out = []
    for h in horizons_s:
        steps = h / step_s
        if not np.isfinite(steps) or steps < 1 or abs(steps - round(steps)) > 1e-9:
            raise ValueError(f"horizon {h:g} s is not a whole number (>= 1) of {step_s:g} s steps")
        out.append(int(round(steps)))
    if len(set(out)) != len(out):
        raise ValueError(f"horizons repeat: {list(horizons_s)}")
    return tuple(sorted(out))


def label(seconds: float) -> str:
    """The alert's ``horizon`` label: ``30s``, ``2m``, ``5m``, ``1h`` (what a policy matches)."""
    s = int(round(seconds))
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


def head_scorer(model: LstmForecaster, ds: Dataset, scaler: RobustScaler | None, head: int,
                *, batch: int = 4096) -> evaluate.Scorer:
    """Window end indices -> the risk of output ``head`` (the only one of a one-horizon model)."""
    from llmsla.forecaster.train import predict

    def score(ends: np.ndarray) -> np.ndarray:
        r = predict(model, ds.inputs(ends, scaler), batch=batch)
        return r if r.ndim == 1 else r[:, head]
    return score


def eval_config_for(ec: evaluate.EvalConfig, horizon: int) -> evaluate.EvalConfig:
    """The evaluation at ``horizon``: its lead window as the live accuracy's (:func:`accuracy.lead_steps`)."""
    return dataclasses.replace(ec, lead_max_steps=accuracy.lead_steps(horizon, ec.lead_max_steps))


def evaluate_heads(ds: Dataset, model: LstmForecaster, scaler: RobustScaler | None, horizons: Sequence[int],
                   ec: evaluate.EvalConfig) -> list[evaluate.MethodResult]:
    """Per horizon: the head's threshold on validation (its own lead window) and its test report."""
    out = []
    for k, h in enumerate(horizons):
        dsh = ds.with_horizon(h)
        out.append(evaluate.run_model(dsh, evaluate.LSTM, head_scorer(model, dsh, scaler, k), eval_config_for(ec, h),
                                      {"horizon": int(h), "head": k}, time.perf_counter()))
    return out
