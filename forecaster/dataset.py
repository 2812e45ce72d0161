"""Forecasting data sets: per-target step series, their labels and the split they belong to.

A data set is a list of *series* (one target of one simulated run, or one NAB file), stored
end to end in flat arrays with offsets, so a 64-step input window is an index range and no
window is materialised until a batch needs it. Every series belongs to exactly one split
(``train``, ``val``, ``test``): the split is decided per run, before any window exists, so a
window can never straddle two splits and no test run's trace slice or seed appears in training.

Two modes: ``fleet`` (the features of ``info["features"]`` - :data:`features.FEATURES` where a
file does not say - + 3 presence masks, robust-scaled by a scaler fitted on the train split) and ``univariate`` (one value per step; each window is normalised by its own
median and IQR, since real series differ in scale by orders of magnitude).
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmsla.forecaster import features as feat
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.scaler import CLIP, RobustScaler

SPLITS: tuple[str, ...] = ("train", "val", "test")
MODES: tuple[str, ...] = ("fleet", "univariate")
FORMAT = 1


class DatasetError(ValueError):
    """A data set file that cannot be used; the message names the file and the problem."""


@dataclass
class Dataset:
    mode: str
    window: int  # W, input steps
    horizon: int  # H, label horizon in steps
    step_s: float
    feats: np.ndarray  # [N, F] transformed, unscaled, NaN = missing
    present: np.ndarray  # [N, len(MASKS)] bool (fleet) or [N, 0]
    signals: np.ndarray  # [N, len(SIGNALS)] (fleet) or [N, 1] (univariate: the value)
    breach: np.ndarray  # [N] bool: an SLO breach (fleet) / inside a labelled window (univariate)
    y: np.ndarray  # [N] int8: breach within the horizon, -1 unknown
    offsets: np.ndarray  # [S + 1]
    meta: list[dict[str, Any]]  # per series: split, run, trace, seed, pool, replica, t0_ms, faults
    info: dict[str, Any] = field(default_factory=dict)  # slos, slo_window_steps, scenarios, ...

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def empty(cls, mode: str, window: int, horizon: int, step_s: float, info: dict | None = None) -> Dataset:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        nf = len((info or {}).get("features", feat.FEATURES)) if mode == "fleet" else 1
        nm = len(feat.MASKS) if mode == "fleet" else 0
        ns = len(feat.SIGNALS) if mode == "fleet" else 1
        return cls(mode, window, horizon, step_s, np.zeros((0, nf), np.float32), np.zeros((0, nm), bool),
                   np.zeros((0, ns), np.float32), np.zeros(0, bool), np.zeros(0, np.int8),
                   np.zeros(1, np.int64), [], dict(info or {}))

    def extend(self, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]]) -> None:
        """Append series: ``(feats, present, signals, breach, meta)`` each; labels from breach."""
        if not parts:
            return
        lens = [len(p[3]) for p in parts]
        self.feats = np.concatenate([self.feats, *[p[0].astype(np.float32) for p in parts]])
        self.present = np.concatenate([self.present, *[p[1].astype(bool) for p in parts]])
        self.signals = np.concatenate([self.signals, *[p[2].astype(np.float32) for p in parts]])
        self.breach = np.concatenate([self.breach, *[p[3].astype(bool) for p in parts]])
        self.y = np.concatenate([self.y, *[slo_mod.future_label(p[3], self.horizon) for p in parts]])
        self.offsets = np.concatenate([self.offsets, self.offsets[-1] + np.cumsum(lens)])
        for p in parts:
            if p[4].get("split") not in SPLITS:
                raise ValueError(f"series meta needs split in {SPLITS}, got {p[4].get('split')!r}")
            self.meta.append(p[4])

    def add_fleet_run(self, ts: feat.TargetSeries, slos: list[slo_mod.SloTarget], slo_window_steps: int,
                      meta: dict, faults: list[dict]) -> None:
        """One simulated run: a series per target, labelled from its SLO counts."""
        b = slo_mod.breaches(ts.counts, slos, slo_window_steps)
        parts = []
        for j, t in enumerate(ts.targets):
            mine = [f for f in faults if f["replica"] in ("*", t.replica) or (not t.replica and f["pool"] == t.pool)]
            parts.append((feat.transform(ts.x[j], self.features), ts.present[j], ts.signals[j], b[j],
                          {**meta, "pool": t.pool, "replica": t.replica, "model": ts.models[j],
                           "t0_ms": ts.t0_ms, "faults": mine}))
        self.extend(parts)

    # -- access --------------------------------------------------------------------------------
    @property
    def features(self) -> list[str]:
        """The columns of :attr:`feats` (fleet mode): what a model trained on this set reads."""
        if self.mode != "fleet":
            return ["value"]
        return list(self.info.get("features", feat.FEATURES))

    def select(self, feature_names: list[str] | tuple[str, ...]) -> Dataset:
        """The same series with only ``feature_names`` as columns, in that order (shares every
        other array): a model's own feature list out of a set built with more."""
        have = self.features
        missing = [n for n in feature_names if n not in have]
        if missing:
            raise DatasetError(f"the data set has no features {missing} (it has {have}): rebuild it")
        cols = [have.index(n) for n in feature_names]
        return Dataset(self.mode, self.window, self.horizon, self.step_s, self.feats[:, cols], self.present,
                       self.signals, self.breach, self.y, self.offsets, self.meta,
                       {**self.info, "features": list(feature_names)})

    def absent_features(self) -> list[str]:
        """Opted-into columns (beyond the default list) with no value at all: a feature whose
        source the history lacks, e.g. the engine's state where nothing scraped the replicas; a
        model would learn a constant from it. The default list's may be absent (a fleet without
        a GPU exporter): their presence masks say so and the shipped model is trained that way."""
        if self.mode != "fleet" or not len(self.feats):
            return []
        empty = np.isnan(self.feats).all(axis=0)
        return [n for n, e in zip(self.features, empty, strict=True) if e and n not in feat.FEATURES]

    @property
    def n_series(self) -> int:
        return len(self.meta)

    def series_len(self, s: int) -> int:
        return int(self.offsets[s + 1] - self.offsets[s])

    def series_of(self, split: str) -> list[int]:
        return [i for i, m in enumerate(self.meta) if m["split"] == split]

    def samples(self, split: str, *, stride: int = 1) -> np.ndarray:
        """Global end indices of every full input window with a known label in ``split``."""
        out = []
        for s in self.series_of(split):
            lo, hi = int(self.offsets[s]), int(self.offsets[s + 1])
            idx = np.arange(lo + self.window - 1, hi, stride)
            out.append(idx[self.y[idx] >= 0])
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def series_index(self, ends: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, ends, side="right") - 1

    def labels(self, horizons: list[int]) -> np.ndarray:
        """``[N, len(horizons)]`` int8: a breach within each horizon (steps), -1 where that future
        is not all known - the label of :attr:`y` for every horizon, series by series."""
        out = np.full((len(self.breach), len(horizons)), -1, np.int8)
        for s in range(self.n_series):
            lo, hi = int(self.offsets[s]), int(self.offsets[s + 1])
            for k, h in enumerate(horizons):
                out[lo:hi, k] = slo_mod.future_label(self.breach[lo:hi], int(h))
        return out

    def with_horizon(self, horizon: int) -> Dataset:
        """The same series labelled for another horizon (shares the arrays). Breach events stay
        those of the data set's own horizon (``info["event_gap_steps"]``: gaps merged, faults
        attributed), so the recall at every horizon counts the same events."""
        info = {**self.info, "event_gap_steps": int(self.info.get("event_gap_steps", self.horizon))}
        y = self.labels([horizon])[:, 0]
        return Dataset(self.mode, self.window, int(horizon), self.step_s, self.feats, self.present, self.signals,
                       self.breach, y, self.offsets, self.meta, info)

    def fit_scaler(self) -> RobustScaler:
        rows = np.concatenate([np.arange(self.offsets[s], self.offsets[s + 1]) for s in self.series_of("train")])
        return RobustScaler.fit(self.feats[rows].astype(float))

    def inputs(self, ends: np.ndarray, scaler: RobustScaler | None) -> np.ndarray:
        """Model inputs ``[n, W, C]`` float32 for windows ending at ``ends``."""
        idx = ends[:, None] - self.window + 1 + np.arange(self.window)[None, :]
        if self.mode == "fleet":
            assert scaler is not None
            return fleet_inputs(self.feats[idx], self.present[idx], scaler)
        return univariate_inputs(self.feats[idx, 0])

    def signal_windows(self, ends: np.ndarray) -> np.ndarray:
        idx = ends[:, None] - self.window + 1 + np.arange(self.window)[None, :]
        return self.signals[idx].astype(float)

    # -- files ---------------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        return {"feats": self.feats, "present": self.present, "signals": self.signals, "breach": self.breach,
                "y": self.y, "offsets": self.offsets}

    def header(self) -> dict[str, Any]:
        return {"format": FORMAT, "mode": self.mode, "window": self.window, "horizon": self.horizon,
                "step_s": self.step_s, "meta": self.meta, "info": self.info}

    def digest(self) -> str:
        """sha256 of the arrays and the header: the artifact records which data made it."""
        h = hashlib.sha256()
        for k, v in sorted(self.arrays().items()):
            h.update(k.encode())
            h.update(np.ascontiguousarray(v).tobytes())
        h.update(json.dumps(self.header(), sort_keys=True, default=str).encode())
        return h.hexdigest()

    def save(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.savez_compressed(buf, header=np.frombuffer(json.dumps(self.header(), default=str).encode(), np.uint8),
                            **self.arrays())
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(buf.getvalue())
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> Dataset:
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                arrs = {k: z[k] for k in z.files}
        except FileNotFoundError:
            raise DatasetError(f"{path}: no such data set (build one with `llmsla forecast dataset`)") from None
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise DatasetError(f"{path}: not a readable data set: {exc}") from None
        missing = [k for k in ("header", "feats", "present", "signals", "breach", "y", "offsets") if k not in arrs]
        if missing:
            raise DatasetError(f"{path}: missing arrays {missing}")
        try:
            h = json.loads(arrs["header"].tobytes().decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DatasetError(f"{path}: header: not JSON: {exc}") from None
        if h.get("format") != FORMAT:
            raise DatasetError(f"{path}: format {h.get('format')!r}, this llmsla reads {FORMAT}")
        ds = cls(h["mode"], int(h["window"]), int(h["horizon"]), float(h["step_s"]), arrs["feats"],
                 arrs["present"], arrs["signals"], arrs["breach"], arrs["y"], arrs["offsets"], h["meta"], h["info"])
        n = len(ds.y)
        if ds.mode == "fleet" and ds.feats.shape[1] != len(ds.features):
            raise DatasetError(f"{path}: {ds.feats.shape[1]} feature columns, the header names {len(ds.features)}")
        if not (len(ds.feats) == len(ds.present) == len(ds.signals) == len(ds.breach) == n
                and ds.offsets[-1] == n and len(ds.offsets) == len(ds.meta) + 1):
            raise DatasetError(f"{path}: array lengths disagree (a truncated or edited file)")
        return ds


def fleet_inputs(x: np.ndarray, present: np.ndarray, scaler: RobustScaler) -> np.ndarray:
    """``[..., F]`` transformed features + ``[..., M]`` masks -> ``[..., F + M]`` float32."""
    return np.concatenate([scaler.transform(x), present.astype(np.float32)], axis=-1)


def univariate_inputs(v: np.ndarray) -> np.ndarray:
    """``[n, W]`` raw values -> ``[n, W, 1]`` normalised by each window's median and IQR."""
    v = v.astype(float)
    med = np.nanmedian(v, axis=1, keepdims=True)
    q1, q3 = np.nanpercentile(v, [25, 75], axis=1, keepdims=True)
    spread = q3 - q1
    std = np.nanstd(v, axis=1, keepdims=True)
    scale = np.where(spread > 1e-12, spread, np.where(std > 1e-12, std, 1.0))
    z = np.clip((v - med) / scale, -CLIP, CLIP)
    return np.where(np.isfinite(z), z, 0.0).astype(np.float32)[..., None]


def leakage(ds: Dataset) -> list[str]:
    """Why the split could leak, or ``[]``: a run (or seed) in two splits, or, per trace, a
    validation/test slice that is not entirely after every training slice (time order)."""
    problems = []
    split_of: dict[str, str] = {}
    for m in ds.meta:
        prev = split_of.setdefault(m["run"], m["split"])
        if prev != m["split"]:
            problems.append(f"run {m['run']} is in {prev} and {m['split']}")
    seeds: dict[tuple[str, int], str] = {}
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for sc in ds.info.get("scenarios", []):
        key = (sc["trace"], sc["seed"])
        if seeds.setdefault(key, sc["split"]) != sc["split"]:
            problems.append(f"{sc['trace']} seed {sc['seed']} is in {seeds[key]} and {sc['split']}")
        spans.setdefault((sc["trace"], sc["split"]), []).append((sc["start_s"], sc["start_s"] + sc["duration_s"]))
    order = list(SPLITS)
    for (trace, split), sl in spans.items():
        for later in order[order.index(split) + 1:]:
            for _a0, a1 in sl:
                for b0, _b1 in spans.get((trace, later), []):
                    if b0 < a1:
                        problems.append(f"{trace}: a {later} slice starts at {b0:.0f} s, before a {split} slice ends ({a1:.0f} s)")
    return problems
