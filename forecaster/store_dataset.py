"""Data sets from the store's own history: ``llmsla forecast dataset --from-store``.

The fleet's stored windows are read in one-hour chunks and turned into features by
:func:`llmsla.forecaster.features.build` - the function the online scorer calls - with the
same targets and GPU cells for every chunk, so a window of the data set is the window the
online scorer would have scored at that step (a test proves it on the embedded PostgreSQL).
Labels are the SLO catalog's breaches on those windows (:func:`llmsla.forecaster.slo.breaches`,
as the labels and the live accuracy); no fault labels are needed. Splits are by time: train,
then validation, then test, never shuffled. See docs/forecaster.md#train-on-your-own-fleet.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llmsla import names
from llmsla.forecaster import features, store_io
from llmsla.forecaster import metrics as m
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.dataset import SPLITS, Dataset
from llmsla.seams import StoreReader

STEP_MS = features.STEP_MS
CHUNK_STEPS = 720  # one hour of 5 s steps per read: bounded memory for any history length
DEFAULT_SPLIT: tuple[float, float, float] = (0.6, 0.2, 0.2)


class HistoryError(ValueError):
    """A stored history no data set can be built from; the message is one line saying why."""


@dataclass
class History:
    """The store's windows from ``t0_ms`` as the features of every target, and its breaches."""

    ts: features.TargetSeries  # the whole range, built chunk by chunk
    breach: np.ndarray  # [targets, steps] the SLO window ending at each step breaches
    served: np.ndarray  # [steps] any request window of any target (False: a gap)
    feature_names: tuple[str, ...] = features.FEATURES  # the columns of ``ts.x``

    @property
    def t0_ms(self) -> int:
        return self.ts.t0_ms


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def span(steps: int) -> str:
    """``steps`` of 5 s as a short duration (``2 h 5 min``)."""
    s = steps * names.REQUEST_WINDOW_S
    h, rest = divmod(s, 3600)
    return f"{h} h {rest // 60} min" if h else f"{rest // 60} min {rest % 60} s"


def read_targets(conn: StoreReader, from_ms: int, to_ms: int) -> list[features.Target]:
    """Every replica and pool with a request window in ``[from_ms, to_ms)``: the targets of
    every chunk, so a target keeps one row across the whole history."""
    rows = conn.execute(f"SELECT DISTINCT pool, replica FROM {names.T_REQUEST_WINDOWS} "
                        "WHERE bucket >= %s AND bucket < %s", (store_io._ts(from_ms), store_io._ts(to_ms))).fetchall()
    frame = {"pool": np.array([r[0] for r in rows], dtype=object),
             "replica": np.array([r[1] for r in rows], dtype=object)}
    return features.targets_of(frame) if rows else []


def read_history(conn: StoreReader, from_ms: int, to_ms: int, *, slos: list[slo_mod.SloTarget],
                 slo_window_steps: int, gpu_map: features.GpuMap = features.sim_gpu_map,
                 chunk_steps: int = CHUNK_STEPS, feature_names: Sequence[str] = features.FEATURES) -> History:
    """Features (``feature_names``, those a model reads) and breaches of every step in
    ``[from_ms, to_ms)`` (on the 5 s grid). The SLO window of the first steps reaches back
    before ``from_ms``; those steps are read too."""
    from_ms -= from_ms % STEP_MS
    to_ms -= to_ms % STEP_MS
    pre = slo_window_steps - 1
    start = from_ms - pre * STEP_MS
    n = (to_ms - start) // STEP_MS
    if to_ms <= from_ms:
        raise HistoryError(f"--to ({iso(to_ms)}) is not after --from ({iso(from_ms)})")
    targets = read_targets(conn, start, to_ms)
    if not targets:
        raise HistoryError(f"no request windows in the store from {iso(from_ms)} to {iso(to_ms)} "
                           "(is `llmsla stream` writing to this store?)")
    cells = features.gpu_cells_of(targets, gpu_map)
    parts = []
    for cs in range(start, to_ms, chunk_steps * STEP_MS):
        k = min(chunk_steps, (to_ms - cs) // STEP_MS)
        req, gpu, pol, eng = store_io.read_windows(conn, cs, cs + k * STEP_MS)
        parts.append(features.build(req, gpu, pol, targets=targets, t0_ms=cs, n_steps=k, slos=slos,
                                    gpu_map=gpu_map, gpu_cells=cells, feature_names=feature_names, eng=eng))

    def cat(get) -> np.ndarray:  # noqa: ANN001 - a field accessor
        return np.concatenate([get(p) for p in parts], axis=1)

    rows_at = cat(lambda p: p.extra["rows_at"])
    model_at = cat(lambda p: p.extra["model_at"])
    counts = cat(lambda p: p.counts)
    breach = slo_mod.breaches(counts, slos, slo_window_steps)[:, pre:]
    cut = slice(pre, n)
    ts = features.TargetSeries(targets, features.first_models(model_at[:, cut]), from_ms, cat(lambda p: p.x)[:, cut],
                               cat(lambda p: p.present)[:, cut], counts[:, cut], cat(lambda p: p.signals)[:, cut],
                               extra={"rows_at": rows_at[:, cut], "model_at": model_at[:, cut]})
    return History(ts, breach, rows_at[:, cut].any(axis=0), tuple(feature_names))


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[a, b)`` of every run of True in ``mask``."""
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist(), strict=True))


def split_bounds(n: int, split: tuple[float, float, float]) -> dict[str, tuple[int, int]]:
    """Steps ``[a, b)`` of each split, in time order: train, then validation, then test."""
    edges = np.round(np.cumsum([0.0, *split]) / sum(split) * n).astype(int)
    return {s: (int(edges[i]), int(edges[i + 1])) for i, s in enumerate(SPLITS)}


@dataclass
class StoreSpec:
    """How a data set is cut from the history (``forecast dataset --from-store``'s options)."""

    window: int
    horizon: int
    slo_window_steps: int
    split: tuple[float, float, float] = DEFAULT_SPLIT
    min_breaches: int = 5  # breach episodes needed in train and in validation
    allow_gaps: bool = False


def to_dataset(h: History, spec: StoreSpec, slos: list[slo_mod.SloTarget], info: dict | None = None) -> Dataset:
    """The history as a data set: a series per target and gap-free stretch of each split (a
    validation or test series led by the W - 1 steps before the split as input context).

    Raises :class:`HistoryError` (one line, with what was found and what is needed) for a gap
    (unless ``allow_gaps``), a history too short for a full window and horizon in every split,
    and too few breach episodes in train or validation to learn from or set a threshold on."""
    served = h.served
    first, last = (int(i) for i in np.flatnonzero(served)[[0, -1]])  # read_history found a target
    n = last + 1 - first
    need_steps = spec.window + spec.horizon
    need = math.ceil(need_steps * sum(spec.split) / min(spec.split))
    if n < need:
        raise HistoryError(
            f"history too short: {n} steps ({span(n)}) of request windows from {iso(h.t0_ms + first * STEP_MS)}; "
            f"a data set needs >= {need} steps ({span(need)}: a {spec.window}-step window + {spec.horizon}-step "
            f"horizon in the smallest split, {min(spec.split) / sum(spec.split):.0%}); use an earlier --from")
    holes = [(a, b) for a, b in runs(~served[first:last + 1])]
    if holes and not spec.allow_gaps:
        a, b = holes[0]
        raise HistoryError(
            f"the store's request windows have {len(holes)} gap(s), the first from "
            f"{iso(h.t0_ms + (first + a) * STEP_MS)} to {iso(h.t0_ms + (first + b) * STEP_MS)} ({span(b - a)}: the "
            "streaming job was down or the fleet idle); pick --from/--to around it, or --allow-gaps to cut the "
            "series there")
    bounds = {s: (first + a, first + b) for s, (a, b) in split_bounds(n, spec.split).items()}
    ds = Dataset.empty("fleet", spec.window, spec.horizon, float(names.REQUEST_WINDOW_S), {
        "source": "store", "slos": [s.__dict__ for s in slos], "slo_window_steps": spec.slo_window_steps,
        "precursor_kinds": [], "scenarios": [], "features": list(h.feature_names),
        "store": {"from": iso(h.t0_ms + first * STEP_MS), "to": iso(h.t0_ms + (last + 1) * STEP_MS),
                  "split": list(spec.split), "gaps": len(holes),
                  "bounds": {s: [iso(h.t0_ms + a * STEP_MS), iso(h.t0_ms + b * STEP_MS)] for s, (a, b) in bounds.items()}},
        **(info or {})})
    ts = h.ts
    episodes = dict.fromkeys(SPLITS, 0)
    parts, contexts = [], []
    stretches = [(first + a, first + b) for a, b in runs(served[first:last + 1])]
    for split, (a, b) in bounds.items():
        # a validation or test series starts W - 1 steps early (only where the data runs on):
        # its first input window is the one the online scorer held at the split's first step;
        # those context steps carry no label of this split and no event
        ctx = 0 if split == SPLITS[0] else spec.window - 1
        for ra, rb in stretches:
            lo, hi = max(ra, a - ctx), min(rb, b)
            if hi - max(lo, a) < spec.horizon + 1 or hi - lo < need_steps:
                continue  # no full window with a known label in this split
            for j, t in enumerate(ts.targets):
                if not ts.extra["rows_at"][j, max(lo, a):hi].any():
                    continue  # not serving in this stretch: the online scorer has nothing to score
                episodes[split] += sum(lo + e.onset >= a for e in m.episodes(h.breach[j, lo:hi], spec.horizon))
                contexts.append(max(0, a - lo))
                parts.append((features.transform(ts.x[j, lo:hi], h.feature_names), ts.present[j, lo:hi], ts.signals[j, lo:hi],
                              h.breach[j, lo:hi], {
                                  "split": split, "run": f"store/{split}/{iso(h.t0_ms + lo * STEP_MS)}",
                                  "trace": "store", "seed": 0, "pool": t.pool, "replica": t.replica,
                                  "model": ts.models[j], "t0_ms": h.t0_ms + lo * STEP_MS,
                                  "context_steps": max(0, a - lo), "faults": []}))
    ds.info["store"]["breach_episodes"] = episodes
    for split in ("train", "val"):
        if episodes[split] < spec.min_breaches:
            a, b = bounds[split]
            raise HistoryError(
                f"too few SLO breaches to {'learn from' if split == 'train' else 'set a threshold on'}: the "
                f"{'training' if split == 'train' else 'validation'} part ({iso(h.t0_ms + a * STEP_MS)} to "
                f"{iso(h.t0_ms + b * STEP_MS)}) holds {episodes[split]} breach episode(s) over all targets, "
                f"needs >= {spec.min_breaches} (--min-breaches); use a longer history")
    ds.extend(parts)
    for s, ctx in enumerate(contexts):
        ds.y[ds.offsets[s]: ds.offsets[s] + ctx] = -1  # the previous split's steps: not this one's labels
    return ds


def time_order(ds: Dataset) -> list[str]:
    """Why the splits are not in time order, or ``[]``: every validation step must come after
    every training step, every test step after every validation step (input context aside)."""
    ends: dict[str, tuple[int, int]] = {}
    for s in range(ds.n_series):
        meta = ds.meta[s]
        step_ms = int(ds.step_s * 1000)
        a = int(meta["t0_ms"]) + int(meta.get("context_steps", 0)) * step_ms  # its own first step
        b = int(meta["t0_ms"]) + ds.series_len(s) * step_ms
        lo, hi = ends.get(meta["split"], (a, b))
        ends[meta["split"]] = (min(lo, a), max(hi, b))
    out = []
    for early, late in zip(SPLITS, SPLITS[1:], strict=False):
        if early in ends and late in ends and ends[late][0] < ends[early][1]:
            out.append(f"{late} starts at {iso(ends[late][0])}, before {early} ends ({iso(ends[early][1])})")
    return out
