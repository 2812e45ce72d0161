"""Robust scaling fitted on training data only and saved with the model.

Median and inter-quartile range per feature (after :func:`features.transform`), so a fault's
extreme values do not set the scale; values are clipped to +-``CLIP`` IQRs and a missing value
(NaN) becomes 0, the training median. The presence masks travel beside the features as 0/1
channels, so the model can tell an imputed median from a real one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CLIP = 10.0


@dataclass
class RobustScaler:
    median: np.ndarray
    iqr: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> RobustScaler:
        """``x``: ``[..., features]`` of training data (NaN ignored)."""
        flat = x.reshape(-1, x.shape[-1])
        med = np.zeros(flat.shape[1])
        iqr = np.ones(flat.shape[1])
        for i in range(flat.shape[1]):
            v = flat[:, i]
            v = v[np.isfinite(v)]
            if len(v):
                q1, q2, q3 = np.percentile(v, [25, 50, 75])
                med[i] = q2
                spread = q3 - q1
                if spread <= 1e-12:  # constant on most rows: fall back to the std, then 1
                    spread = float(np.std(v)) or 1.0
                iqr[i] = spread
        return cls(med, iqr)

    def transform(self, x: np.ndarray) -> np.ndarray:
        z = (x - self.median) / self.iqr
        z = np.clip(z, -CLIP, CLIP)
        return np.where(np.isfinite(z), z, 0.0).astype(np.float32)

    def to_dict(self) -> dict:
        return {"median": [float(v) for v in self.median], "iqr": [float(v) for v in self.iqr], "clip": CLIP}

    @classmethod
    def from_dict(cls, d: dict) -> RobustScaler:
        med = np.asarray(d["median"], dtype=float)
        iqr = np.asarray(d["iqr"], dtype=float)
        if med.shape != iqr.shape or med.ndim != 1 or not (np.all(np.isfinite(med)) and np.all(iqr > 0)):
            raise ValueError("scaler: median and iqr must be equal-length finite lists with iqr > 0")
        return cls(med, iqr)
