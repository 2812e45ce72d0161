"""Training labels and weights that read a simulated data set's injected faults.

A replay knows when each fault began. Two uses of that, both for training only (the evaluation
reads the same episodes through :func:`episodes`):

- **Labels from the fault's start** (:func:`from_fault_start`): a window before a precursor
  fault began is healthy, so it is a negative even when the fault's breach falls within the
  horizon (an alarm there is a false alarm, ``metrics.warn_from``). A breach with no precursor
  fault (a crash, or none injected) keeps the label :meth:`Dataset.labels` gives it.
- **Steps inside a precursor fault** (:func:`in_fault`): about half of the injected faults never
  break the SLO, and an alarm over them is false; training weighs their negatives more, so the
  model learns that a fault is not yet a breach.

A history from the store has no faults: both leave its labels and weights as they are.
See docs/forecaster.md#labels-from-the-faults-start.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llmsla.forecaster import metrics as m
from llmsla.forecaster.dataset import Dataset


def _spans(ds: Dataset) -> tuple[tuple[str, ...], tuple[str, ...], int, int]:
    """(precursor kinds, causal kinds, episode merge gap, fault tail steps) of ``ds``."""
    info = ds.info
    precursor = tuple(info.get("precursor_kinds", ()))
    # injected faults begin before the breaches they cause (a data set that says otherwise,
    # NAB's labelled windows, names none)
    causal = tuple(info.get("causal_kinds", precursor))
    gap = int(info.get("event_gap_steps", ds.horizon))  # the events of every horizon are the same
    return precursor, causal, gap, int(info.get("slo_window_steps", 1)) + gap


def _fault_spans(ds: Dataset, s: int, tail: int) -> list[tuple[int, float]]:
    """The spans of series ``s``'s faults (:func:`metrics.fault_span`), in its own steps."""
    meta = ds.meta[s]
    return [m.fault_span(f, ds.step_s, int(meta.get("t0_ms", 0)), tail) for f in meta.get("faults", [])]


def episodes(ds: Dataset, s: int) -> tuple[list[m.Episode], list[tuple[int, float]]]:
    """Series ``s``'s breach episodes, each attributed to the fault whose span holds its onset,
    and the spans of its faults, in the series' own steps."""
    precursor, causal, gap, tail = _spans(ds)
    lo, hi = int(ds.offsets[s]), int(ds.offsets[s + 1])
    eps = m.episodes(ds.breach[lo:hi], gap)
    meta = ds.meta[s]
    m.attribute(eps, meta.get("faults", []), ds.step_s, int(meta.get("t0_ms", 0)), tail, precursor, causal)
    return eps, _fault_spans(ds, s, tail)


def from_fault_start(ds: Dataset, horizons: Sequence[int]) -> np.ndarray:
    """``[N, len(horizons)]`` int8 like :meth:`Dataset.labels` (1: a breach within the horizon,
    -1: that future not known), except that a precursor fault's breach makes only the windows
    from its fault's first step positive."""
    out = np.full((len(ds.breach), len(horizons)), -1, np.int8)
    for s in range(ds.n_series):
        lo, hi = int(ds.offsets[s]), int(ds.offsets[s + 1])
        n, b = hi - lo, ds.breach[lo:hi]
        eps, _ = episodes(ds, s)
        for k, h in enumerate(horizons):
            y = np.zeros(n, np.int8)
            for e in eps:
                start = e.fault_step if e.cause == m.PRECURSOR and e.fault_step is not None else None
                for i in np.flatnonzero(b[e.onset: e.end + 1]) + e.onset:
                    first = i - h if start is None else max(i - h, start)
                    y[max(first, 0): i] = 1  # y[t] = a breach in (t, t + h]
            y[max(n - int(h), 0):] = -1  # the future past the series' end is not known
            out[lo:hi, k] = y
    return out


def in_fault(ds: Dataset) -> np.ndarray:
    """``[N]`` bool: the steps inside a precursor fault's span (its first step to its tail)."""
    kinds, _, _, tail = _spans(ds)
    precursor = set(kinds)
    out = np.zeros(len(ds.breach), bool)
    for s in range(ds.n_series):
        lo, hi = int(ds.offsets[s]), int(ds.offsets[s + 1])
        for f, (first, last) in zip(ds.meta[s].get("faults", []), _fault_spans(ds, s, tail), strict=True):
            if f["kind"] in precursor:
                out[lo + max(first, 0): lo + min(int(last) + 1, hi - lo)] = True
    return out
