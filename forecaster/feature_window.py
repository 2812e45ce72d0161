"""The online scorer's features, rolled forward: each step builds only the steps that changed.

Building every cell of the window each step cost most of the scoring budget, so the previous
series is shifted and only the steps from the first changed window are built again. The result
must equal ``features.build`` over the whole window (a test checks it step by step); since a
pool's GPU features depend on every replica seen in the window, any change in the set of targets
rebuilds the whole window. See docs/forecaster.md#online-and-alerts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from llmsla.forecaster import features
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.windowing import Frame

STEP_MS = features.STEP_MS


def rows_between(frame: Frame, lo_ms: int, hi_ms: int) -> Frame:
    """The rows with ``lo_ms <= bucket < hi_ms``: slices (views) when buckets are sorted, as the
    store's reads are, else a mask."""
    b = frame["bucket"]
    if len(b) and np.all(b[1:] >= b[:-1]):
        i, j = np.searchsorted(b, [lo_ms, hi_ms])
        return {k: v[i:j] for k, v in frame.items()}
    keep = (b >= lo_ms) & (b < hi_ms)
    return {k: v[keep] for k, v in frame.items()}


@dataclass
class FeatureWindow:
    """The features of the last ``n_steps`` steps, kept between calls to :meth:`update`; with
    ``prepare`` (features, masks -> model inputs, elementwise per step), the model inputs too, in
    ``extra["inputs"]``."""

    n_steps: int
    slos: list[slo_mod.SloTarget]
    gpu_map: features.GpuMap = features.sim_gpu_map
    prepare: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    feature_names: tuple[str, ...] = features.FEATURES  # the served model's own list
    last: features.TargetSeries | None = None
    full_builds: int = 0  # how often the whole window was built (for tests and the benchmark)
    steps_built: int = 0  # steps built so far, whole windows included
    _gpu_cells: features.GpuCells = field(default_factory=dict)

    def update(self, req: Frame, gpu: Frame, pol: Frame, *, t0_ms: int, changed_from_ms: int,
               eng: Frame | None = None) -> features.TargetSeries:
        """The series of ``[t0_ms, t0_ms + n_steps * STEP)`` from the frames of that range (``eng``:
        the engine windows), given that no row before ``changed_from_ms`` differs from the
        previous call's frames."""
        end_ms = t0_ms + self.n_steps * STEP_MS
        req = rows_between(req, t0_ms, end_ms)  # targets_of counts only rows on the grid
        prev = self.last
        if prev is None or (t0_ms - prev.t0_ms) % STEP_MS or t0_ms < prev.t0_ms:
            return self._full(req, gpu, pol, t0_ms, eng)
        shift = (t0_ms - prev.t0_ms) // STEP_MS
        lo = max(0, -(-(changed_from_ms - t0_ms) // STEP_MS))  # first step that may have changed
        lo = min(lo, self.n_steps - shift)  # steps after prev's end were never built
        if lo <= 0:
            return self._full(req, gpu, pol, t0_ms, eng)
        lo_ms = t0_ms + lo * STEP_MS
        new = features.build(rows_between(req, lo_ms, end_ms), rows_between(gpu, lo_ms, end_ms), pol,
                             targets=prev.targets, t0_ms=lo_ms, n_steps=self.n_steps - lo, slos=self.slos,
                             gpu_map=self.gpu_map, gpu_cells=self._gpu_cells, feature_names=self.feature_names,
                             eng=None if eng is None else rows_between(eng, lo_ms, end_ms))
        still = prev.extra["rows_at"][:, shift:shift + lo].any(axis=1) | new.extra["rows_at"].any(axis=1)
        if new.extra["unknown"] or not still.all():  # the targets changed, so did a pool's GPUs
            return self._full(req, gpu, pol, t0_ms, eng)
        self.steps_built += self.n_steps - lo

        def splice(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.concatenate([a[:, shift:shift + lo], b], axis=1)

        extra = {k: splice(prev.extra[k], new.extra[k]) for k in ("rows_at", "model_at")}
        if self.prepare is not None:
            extra["inputs"] = splice(prev.extra["inputs"], self.prepare(new.x, new.present))
        self.last = features.TargetSeries(
            prev.targets, features.first_models(extra["model_at"]), t0_ms, splice(prev.x, new.x),
            splice(prev.present, new.present), splice(prev.counts, new.counts), splice(prev.signals, new.signals),
            extra=extra)
        return self.last

    def _full(self, req: Frame, gpu: Frame, pol: Frame, t0_ms: int, eng: Frame | None) -> features.TargetSeries:
        self.full_builds += 1
        self.steps_built += self.n_steps
        targets = features.targets_of(req)
        self._gpu_cells = features.gpu_cells_of(targets, self.gpu_map)
        ts = features.build(req, gpu, pol, targets=targets, t0_ms=t0_ms, n_steps=self.n_steps, slos=self.slos,
                            gpu_map=self.gpu_map, gpu_cells=self._gpu_cells, feature_names=self.feature_names,
                            eng=eng)
        if self.prepare is not None:
            ts.extra["inputs"] = self.prepare(ts.x, ts.present)
        self.last = ts
        return ts
