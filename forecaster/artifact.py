"""The versioned model artifact: a directory with the weights and everything needed to score.

``artifact.json`` holds the format version, the model version (sha256 of the weights and the
settings), the model and training configuration, the feature names, input window, horizon, SLO
targets, the scaler (median/IQR per feature), the alarm threshold and how it was chosen, the
evaluation metrics and the data set's sha256; a model with several horizons adds ``horizons``
(steps, ascending, one per output of the model) and ``thresholds`` (one per horizon), and keeps
``horizon``/``threshold`` as its shortest horizon's, so a reader that knows one horizon still
reads it (docs/forecaster.md#several-horizons); ``model.pt`` holds the state dict (tensors only,
loaded with ``weights_only=True``), its sha256 recorded in the JSON. Any mismatch - a missing
key, a truncated weights file, a shape that does not fit - is an :class:`ArtifactError` naming
the file and the field, never a half-loaded model.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmsla.forecaster.model import LstmForecaster, ModelConfig
from llmsla.forecaster.scaler import RobustScaler

FORMAT = 1
#: The model that ships with llmsla (trained by scripts/forecast-fixture.sh on simulated Azure
#: replays; docs/forecaster-eval.md): `llmsla forecast serve` uses it until one is trained here.
PRETRAINED = Path(__file__).parent / "pretrained"
META = "artifact.json"
WEIGHTS = "model.pt"


class ArtifactError(ValueError):
    """An artifact that cannot be used; the message names the file and the field."""


@dataclass
class Artifact:
    model: LstmForecaster
    scaler: RobustScaler | None
    meta: dict[str, Any]

    @property
    def version(self) -> str:
        return self.meta["version"]

    @property
    def threshold(self) -> float:
        return float(self.meta["threshold"])

    @property
    def window(self) -> int:
        return int(self.meta["window"])

    @property
    def horizon(self) -> int:
        return int(self.meta["horizon"])

    @property
    def horizons(self) -> list[int]:
        """Label horizons in steps, ascending, one per model output (``[horizon]`` for an
        artifact with one, as every artifact before several horizons)."""
        return [int(h) for h in self.meta.get("horizons", [self.meta["horizon"]])]

    @property
    def thresholds(self) -> list[float]:
        """The alarm threshold of each of :attr:`horizons`."""
        return [float(t) for t in self.meta.get("thresholds", [self.meta["threshold"]])]


def save(path: Path, model: LstmForecaster, scaler: RobustScaler | None, meta: dict[str, Any]) -> Path:
    """Write atomically: a temp directory renamed into place (readers never see half a model)."""
    path = Path(path)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    weights = buf.getvalue()
    digest = hashlib.sha256(weights).hexdigest()
    meta = {**meta, "format": FORMAT, "model": model.cfg.to_dict(), "weights_sha256": digest,
            "scaler": scaler.to_dict() if scaler is not None else None,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    meta["version"] = hashlib.sha256((digest + json.dumps(meta.get("train", {}), sort_keys=True)).encode()).hexdigest()[:12]
    tmp = path.with_name(path.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / WEIGHTS).write_bytes(weights)
    (tmp / META).write_text(json.dumps(meta, indent=1, default=_json) + "\n")
    if path.exists():
        old = path.with_name(path.name + ".old")
        if old.exists():
            import shutil

            shutil.rmtree(old)
        path.rename(old)
        tmp.rename(path)
        import shutil

        shutil.rmtree(old)
    else:
        tmp.rename(path)
    return path


def _json(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, frozenset):  # an SLO target's statuses
        return sorted(v)
    raise TypeError(f"not JSON: {type(v).__name__}")


def load(path: Path) -> Artifact:
    path = Path(path)
    meta_path, w_path = path / META, path / WEIGHTS
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{meta_path}: missing (train one with `llmsla forecast train`)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{meta_path}: not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"{meta_path}: expected a JSON object")
    for key in ("format", "version", "model", "weights_sha256", "threshold", "window", "horizon", "mode"):
        if key not in meta:
            raise ArtifactError(f"{meta_path}: missing field {key!r}")
    if meta["format"] != FORMAT:
        raise ArtifactError(f"{meta_path}: format: {meta['format']!r}, this llmsla reads {FORMAT}")
    try:
        weights = w_path.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"{w_path}: missing") from None
    if hashlib.sha256(weights).hexdigest() != meta["weights_sha256"]:
        raise ArtifactError(f"{w_path}: sha256 differs from {META} weights_sha256 (corrupt or replaced)")
    try:
        mcfg = ModelConfig(**meta["model"])
        model = LstmForecaster(mcfg)
        state = torch.load(io.BytesIO(weights), map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except (TypeError, RuntimeError, ValueError) as exc:
        raise ArtifactError(f"{path}: model: {str(exc).splitlines()[0]}") from None
    model.eval()
    scaler = None
    if meta["mode"] == "fleet":
        try:
            scaler = RobustScaler.from_dict(meta["scaler"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{meta_path}: scaler: {exc}") from None
        features = meta.get("features", [])
        if len(scaler.median) != len(features) or mcfg.inputs != len(features) + len(meta.get("masks", [])):
            raise ArtifactError(f"{meta_path}: scaler/features/model inputs disagree "
                                f"({len(scaler.median)} scaled, {len(features)} features, {mcfg.inputs} inputs)")
    thr = meta["threshold"]
    if not isinstance(thr, int | float) or not np.isfinite(thr):
        raise ArtifactError(f"{meta_path}: threshold: expected a finite number, got {thr!r}")
    _check_horizons(meta_path, meta, mcfg.outputs)
    return Artifact(model, scaler, meta)


def _check_horizons(meta_path: Path, meta: dict[str, Any], outputs: int) -> None:
    """``horizons`` and ``thresholds`` (absent in a one-horizon artifact) fit the model's outputs."""
    if "horizons" not in meta and "thresholds" not in meta:
        if outputs != 1:
            raise ArtifactError(f"{meta_path}: model has {outputs} outputs but no horizons field")
        return
    hs, ts = meta.get("horizons"), meta.get("thresholds")
    if (not isinstance(hs, list) or not hs or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hs)
            or hs != sorted(set(hs))):
        raise ArtifactError(f"{meta_path}: horizons: expected ascending whole steps >= 1, got {hs!r}")
    if not isinstance(ts, list) or len(ts) != len(hs) or not all(
            isinstance(t, int | float) and not isinstance(t, bool) and np.isfinite(t) for t in ts):
        raise ArtifactError(f"{meta_path}: thresholds: expected {len(hs)} finite numbers (one per horizon), got {ts!r}")
    if len(hs) != outputs:
        raise ArtifactError(f"{meta_path}: {len(hs)} horizons but the model has {outputs} outputs")
