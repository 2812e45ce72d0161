"""The online scorer's features, rolled forward: each step builds only the steps that changed.

Every step scores the last W steps of every target, but between two steps only the newest
windows change: the window cache re-reads the rows from ``reread_s`` before its frontier and
keeps the older ones as read. Building all W x targets cells again every step cost most of the
scoring budget (the p99 target is 5 ms for 64 targets); this keeps the last series, shifts it
by the steps the window moved, and builds with :func:`features.build` only the steps from the
first one whose rows may have changed (``changed_from_ms``, from the cache), then splices them in.

The result equals ``features.build`` over the whole window (``tests/forecaster/test_window_cache.py``
checks it step by step): a step's cells depend only on that step's rows, except a pool's GPU
features, which depend on the replicas seen anywhere in the window. So whenever the set of
targets changes (a row of a new replica or pool, or a target without rows left in the window),
the whole window is built again, as it is on the first step, after a gap or when the clock goes
back.
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
    last: features.TargetSeries | None = None
    full_builds: int = 0  # how often the whole window was built (for tests and the benchmark)
    steps_built: int = 0  # steps built so far, whole windows included
    _gpu_cells: features.GpuCells = field(default_factory=dict)

    def update(self, req: Frame, gpu: Frame, pol: Frame, *, t0_ms: int, changed_from_ms: int) -> features.TargetSeries:
        """The series of ``[t0_ms, t0_ms + n_steps * STEP)`` from the frames of that range, given
        that no row before ``changed_from_ms`` differs from the previous call's frames."""
        end_ms = t0_ms + self.n_steps * STEP_MS
        req = rows_between(req, t0_ms, end_ms)  # targets_of counts only rows on the grid
        prev = self.last
        if prev is None or (t0_ms - prev.t0_ms) % STEP_MS or t0_ms < prev.t0_ms:
            return self._full(req, gpu, pol, t0_ms)
        shift = (t0_ms - prev.t0_ms) // STEP_MS
        lo = max(0, -(-(changed_from_ms - t0_ms) // STEP_MS))  # first step that may have changed
        lo = min(lo, self.n_steps - shift)  # steps after prev's end were never built
        if lo <= 0:
            return self._full(req, gpu, pol, t0_ms)
        lo_ms = t0_ms + lo * STEP_MS
        new = features.build(rows_between(req, lo_ms, end_ms), rows_between(gpu, lo_ms, end_ms), pol,
                             targets=prev.targets, t0_ms=lo_ms, n_steps=self.n_steps - lo, slos=self.slos,
                             gpu_map=self.gpu_map, gpu_cells=self._gpu_cells)
        still = prev.extra["rows_at"][:, shift:shift + lo].any(axis=1) | new.extra["rows_at"].any(axis=1)
        if new.extra["unknown"] or not still.all():  # the targets changed, so did a pool's GPUs
            return self._full(req, gpu, pol, t0_ms)
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

    def _full(self, req: Frame, gpu: Frame, pol: Frame, t0_ms: int) -> features.TargetSeries:
        self.full_builds += 1
        self.steps_built += self.n_steps
        targets = features.targets_of(req)
        self._gpu_cells = features.gpu_cells_of(targets, self.gpu_map)
        ts = features.build(req, gpu, pol, targets=targets, t0_ms=t0_ms, n_steps=self.n_steps, slos=self.slos,
                            gpu_map=self.gpu_map, gpu_cells=self._gpu_cells)
        if self.prepare is not None:
            ts.extra["inputs"] = self.prepare(ts.x, ts.present)
        self.last = ts
        return ts
