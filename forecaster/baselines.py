"""Baselines scored in the same harness, on the same windows, as the LSTM.

Forecasting rules score the SLI signals as an alert rule on that SLI would (persistence, EWMA,
Prometheus's ``predict_linear`` and double exponential smoothing); learned baselines see the
LSTM's exact flattened input. A forecaster earns its keep only by beating these under the same
alarm policy and false-alarm budget. See docs/forecaster.md#evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

RULES: tuple[str, ...] = ("persistence", "ewma", "predict_linear", "holt_winters")
LEARNED: tuple[str, ...] = ("logistic_regression", "gradient_boosting")
METHODS: tuple[str, ...] = RULES + LEARNED

#: Parameter grids searched on validation (by AUC-PR) for the rules.
GRIDS: dict[str, list[dict]] = {
    "persistence": [{}],
    "ewma": [{"alpha": a} for a in (0.1, 0.2, 0.3, 0.5, 0.7)],
    "predict_linear": [{"span": s} for s in (6, 12, 24, 48)],
    "holt_winters": [{"sf": sf, "tf": tf} for sf in (0.2, 0.5, 0.8) for tf in (0.1, 0.3, 0.6)],
}


def grid(method: str, window: int) -> list[dict]:
    """The grid points of ``method`` that fit a ``window``-step input (a span cannot be longer)."""
    return [p for p in GRIDS[method] if int(p.get("span", 0)) <= window]


def _ewma(v: np.ndarray, alpha: float) -> np.ndarray:
    """EWMA along axis 1 of ``[n, W, k]``; the last value."""
    e = v[:, 0].copy()
    for t in range(1, v.shape[1]):
        e = alpha * v[:, t] + (1 - alpha) * e
    return e


def _linear(v: np.ndarray, span: int, ahead: int) -> np.ndarray:
    w = v[:, -span:]
    t = np.arange(span, dtype=float)
    tc = t - t.mean()
    slope = np.tensordot(tc, w - w.mean(axis=1, keepdims=True), axes=(0, 1)) / (tc @ tc)
    return w.mean(axis=1) + slope * (span - 1 - t.mean() + ahead)


def _holt(v: np.ndarray, sf: float, tf: float, ahead: int) -> np.ndarray:
    level = v[:, 0].copy()
    trend = v[:, 1] - v[:, 0]
    for t in range(1, v.shape[1]):
        prev = level
        level = sf * v[:, t] + (1 - sf) * (level + trend)
        trend = tf * (level - prev) + (1 - tf) * trend
    return level + ahead * trend


def forecast(method: str, v: np.ndarray, horizon: int, **p: float) -> np.ndarray:
    """Signal forecast ``[n, k]`` of a rule for windows ``v`` ``[n, W, k]``."""
    if method == "persistence":
        return v[:, -1]
    if method == "ewma":
        return _ewma(v, p["alpha"])
    if method == "predict_linear":
        return _linear(v, int(p["span"]), horizon)
    if method == "holt_winters":
        return _holt(v, p["sf"], p["tf"], horizon)
    raise ValueError(f"unknown rule {method!r}")


def fleet_score(method: str, signals: np.ndarray, horizon: int, **p: float) -> np.ndarray:
    """Fleet mode: the largest forecast SLI ratio (1 = at the SLO threshold)."""
    return forecast(method, signals, horizon, **p).max(axis=1)


def univariate_score(method: str, values: np.ndarray, horizon: int, **p: float) -> np.ndarray:
    """Univariate mode: |forecast - window median| / window IQR (a robust deviation)."""
    v = values[..., :1].astype(float)
    med = np.median(v[:, :, 0], axis=1)
    q1, q3 = np.percentile(v[:, :, 0], [25, 75], axis=1)
    scale = np.where(q3 - q1 > 1e-12, q3 - q1, np.maximum(np.std(v[:, :, 0], axis=1), 1e-12))
    return np.abs(forecast(method, v, horizon, **p)[:, 0] - med) / scale


@dataclass
class Learned:
    """A fitted scikit-learn classifier over flattened windows."""

    name: str
    model: Any = field(repr=False)  # scikit-learn ships no type information

    def score(self, x: np.ndarray) -> np.ndarray:
        return self.model.predict_proba(x.reshape(len(x), -1))[:, 1]


def fit_learned(name: str, x: np.ndarray, y: np.ndarray, *, seed: int = 0) -> Learned:
    """Fit on ``x`` ``[n, W, C]``; class imbalance by balanced weights (same as the LSTM's)."""
    flat = x.reshape(len(x), -1)
    if name == "logistic_regression":
        from sklearn.linear_model import LogisticRegression

        # lbfgs did not converge in 300 iterations on 12k windows x 960 inputs: a baseline stopped
        # early is a weaker one than it should be
        m = LogisticRegression(C=0.05, class_weight="balanced", max_iter=2000, random_state=seed)
    elif name == "gradient_boosting":
        from sklearn.ensemble import HistGradientBoostingClassifier

        # no internal early stopping: its random hold-out would mix overlapping windows
        m = HistGradientBoostingClassifier(max_iter=100, learning_rate=0.1, max_leaf_nodes=31,
                                           class_weight="balanced", early_stopping=False, random_state=seed)
    else:
        raise ValueError(f"unknown learned baseline {name!r}")
    m.fit(flat, y)
    return Learned(name, m)


ScoreFn = Callable[[np.ndarray], np.ndarray]
