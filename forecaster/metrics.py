"""Scores of a forecaster over whole series: threshold-free, event-based and false alarms.

* **AUC-PR** (average precision) over every scored step: threshold-free, honest under heavy
  class imbalance (unlike ROC AUC).
* **Events** are breach episodes: runs of breaching steps, runs closer than H steps merged; the
  onset is the first breaching step. An event is *warned* when an alarm (score >= threshold)
  fires at some step in ``[onset - lead_max, onset - 1]`` - at least one step of lead; its lead
  time is ``onset - first such alarm`` steps. Events are reported by cause: a precursor fault, a
  crash, or none injected (the load itself).
* **False alarms per day**: alarm onsets (an alarm step after a non-alarm step) outside every
  event's ``[onset - lead_max, end]``, per day of healthy time (scored steps outside those spans).
* **Point-adjusted F1** (secondary; it flatters detectors): every step of a positive-label run
  counts as caught when any of its steps alarms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PRECURSOR = "precursor"
CRASH = "crash"
NONE = "none"
CAUSES: tuple[str, ...] = (PRECURSOR, CRASH, NONE)


def auc_pr(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import average_precision_score

    if y.sum() == 0:
        return float("nan")
    return float(average_precision_score(y, score))


@dataclass
class Episode:
    onset: int  # step index within the series
    end: int  # last breaching step
    cause: str = NONE
    kind: str = ""


def episodes(breach: np.ndarray, merge_gap: int) -> list[Episode]:
    idx = np.flatnonzero(breach)
    out: list[Episode] = []
    for i in idx:
        if out and i - out[-1].end <= merge_gap:
            out[-1].end = int(i)
        else:
            out.append(Episode(int(i), int(i)))
    return out


def attribute(eps: list[Episode], faults: list[dict], step_s: float, t0_ms: int, tail_steps: int,
              precursor_kinds: tuple[str, ...]) -> None:
    """Cause of each episode: the fault whose window (plus ``tail_steps``) holds its onset."""
    for e in eps:
        for f in faults:
            lo = (f["start_ms"] - t0_ms) / 1000 / step_s
            hi = (f["end_ms"] - t0_ms) / 1000 / step_s + tail_steps
            if lo <= e.onset <= hi:
                e.kind = f["kind"]
                e.cause = PRECURSOR if f["kind"] in precursor_kinds else CRASH if f["kind"] == "crash" else NONE
                break


@dataclass
class SeriesScores:
    """One series' scores and what the metrics need about it."""

    score: np.ndarray  # [T], NaN where not scored (before a full window)
    y: np.ndarray  # [T] int8, -1 unknown
    breach: np.ndarray  # [T] bool
    episodes: list[Episode] = field(default_factory=list)
    threshold: float | None = None  # this series' own threshold (cross-validation folds)


@dataclass
class Report:
    auc_pr: float
    events: dict[str, int]
    warned: dict[str, int]
    recall: dict[str, float]
    mean_lead_s: dict[str, float]
    false_alarms_per_day: float
    healthy_days: float
    pa_f1: float
    threshold: float

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def _thr(s: SeriesScores, default: float) -> float:
    return default if s.threshold is None else s.threshold


def _alarm_onsets(alarm: np.ndarray) -> np.ndarray:
    prev = np.concatenate([[False], alarm[:-1]])
    return np.flatnonzero(alarm & ~prev)


def false_alarms(series: list[SeriesScores], threshold: float, lead_max: int, step_s: float) -> tuple[int, float]:
    """(false alarm onsets, healthy days)."""
    n_false, healthy = 0, 0
    for s in series:
        scored = np.isfinite(s.score)
        alarm = scored & (np.nan_to_num(s.score, nan=-np.inf) >= _thr(s, threshold))
        excused = np.zeros(len(alarm), bool)
        for e in s.episodes:
            excused[max(0, e.onset - lead_max): e.end + 1] = True
        onsets = _alarm_onsets(alarm)
        n_false += int((~excused[onsets]).sum())
        healthy += int((scored & ~excused).sum())
    return n_false, healthy * step_s / 86400.0


def threshold_for(series: list[SeriesScores], target_per_day: float, lead_max: int, step_s: float) -> float:
    """The lowest threshold whose false alarms per healthy day are <= the target (validation)."""
    allv = np.concatenate([s.score[np.isfinite(s.score)] for s in series])
    cands = np.unique(np.quantile(allv, np.linspace(0.5, 1.0, 201)))
    best = float(np.nextafter(allv.max(), np.inf))
    for thr in cands[::-1]:  # from the top: false alarms grow as the threshold falls
        n, days = false_alarms(series, float(thr), lead_max, step_s)
        if days > 0 and n / days > target_per_day:
            break
        best = float(thr)
    return best


def report(series: list[SeriesScores], threshold: float, lead_max: int, step_s: float, min_onset: int) -> Report:
    ys = np.concatenate([s.y[np.isfinite(s.score) & (s.y >= 0)] for s in series])
    sc = np.concatenate([s.score[np.isfinite(s.score) & (s.y >= 0)] for s in series])
    events = dict.fromkeys(CAUSES, 0)
    warned = dict.fromkeys(CAUSES, 0)
    leads: dict[str, list[int]] = {c: [] for c in CAUSES}
    tp = fp = fn = 0
    for s in series:
        scored = np.isfinite(s.score)
        alarm = scored & (np.nan_to_num(s.score, nan=-np.inf) >= _thr(s, threshold))
        for e in s.episodes:
            lo = e.onset - lead_max
            if lo < min_onset or not scored[max(0, lo): e.onset].all():
                continue  # no full look-back scored before this onset
            events[e.cause] += 1
            hits = np.flatnonzero(alarm[lo: e.onset])
            if len(hits):
                warned[e.cause] += 1
                leads[e.cause].append(lead_max - int(hits[0]))
        # point adjustment over runs of the label
        lab = (s.y == 1) & scored
        pred = alarm & (s.y >= 0)
        adj = pred.copy()
        for run in episodes(lab, 0):
            if pred[run.onset: run.end + 1].any():
                adj[run.onset: run.end + 1] = True
        tp += int((adj & lab).sum())
        fp += int((adj & ~lab & (s.y >= 0)).sum())
        fn += int((~adj & lab).sum())
    n_false, days = false_alarms(series, threshold, lead_max, step_s)
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan")
    return Report(
        auc_pr=auc_pr(ys, sc), events=events, warned=warned,
        recall={c: warned[c] / events[c] if events[c] else float("nan") for c in CAUSES},
        mean_lead_s={c: float(np.mean(leads[c]) * step_s) if leads[c] else float("nan") for c in CAUSES},
        false_alarms_per_day=n_false / days if days else float("nan"), healthy_days=days,
        pa_f1=f1, threshold=threshold,
    )
