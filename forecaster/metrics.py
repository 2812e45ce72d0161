"""Scores of a forecaster over whole series: threshold-free, event-based and false alarms.

AUC-PR (and AUC-PR ahead, where a positive needs foresight), breach events warned ahead by the
alarm the online loop would raise, false alarms per healthy day counted per notification (so an
alarm that never resolves cannot score zero), and chance recall to tell foresight from a leak.
See docs/forecaster.md#evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from llmsla.forecaster.hysteresis import RAW, AlarmPolicy, alarm_series, notifications

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
    #: first step of its fault (fault_span) when that fault's start bounds a warning of it: an
    #: injected fault, before which the target was healthy (attribute's ``causal_kinds``)
    fault_step: int | None = None


def episodes(breach: np.ndarray, merge_gap: int) -> list[Episode]:
    idx = np.flatnonzero(breach)
    out: list[Episode] = []
    for i in idx:
        if out and i - out[-1].end <= merge_gap:
            out[-1].end = int(i)
        else:
            out.append(Episode(int(i), int(i)))
    return out


def fault_span(fault: dict, step_s: float, t0_ms: int, tail_steps: int) -> tuple[int, float]:
    """Steps ``[first, last]`` a fault can cause a breach onset in: from the step that holds its
    start (steps are windows ``[t0 + k step, t0 + (k + 1) step)``) to ``tail_steps`` after its
    end (an SLO window still holds the fault's bad requests after it ended)."""
    first = math.floor((fault["start_ms"] - t0_ms) / 1000 / step_s)
    return first, (fault["end_ms"] - t0_ms) / 1000 / step_s + tail_steps


def attribute(eps: list[Episode], faults: list[dict], step_s: float, t0_ms: int, tail_steps: int,
              precursor_kinds: tuple[str, ...], causal_kinds: tuple[str, ...] = ()) -> None:
    """Cause of each episode: the fault whose span (:func:`fault_span`) holds its onset; for a
    fault of ``causal_kinds`` (injected ones, which begin before the breach they cause) also its
    first step, before which no alarm is a warning of it (:func:`warn_from`). A labelled anomaly
    window (NAB) is the event itself, not a cause before it: not causal."""
    for e in eps:
        for f in faults:
            lo, hi = fault_span(f, step_s, t0_ms, tail_steps)
            if lo <= e.onset <= hi:
                e.kind = f["kind"]
                e.cause = PRECURSOR if f["kind"] in precursor_kinds else CRASH if f["kind"] == "crash" else NONE
                e.fault_step = lo if f["kind"] in causal_kinds else None
                break


@dataclass
class SeriesScores:
    """One series' scores and what the metrics need about it."""

    score: np.ndarray  # [T], NaN where not scored (before a full window)
    y: np.ndarray  # [T] int8, -1 unknown
    breach: np.ndarray  # [T] bool
    episodes: list[Episode] = field(default_factory=list)
    threshold: float | None = None  # this series' own threshold (cross-validation folds)
    fault_spans: list[tuple[int, float]] = field(default_factory=list)  # injected faults, see fault_span


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
    false_alarms: int = 0
    false_alarms_in_fault: int = 0  # of ``false_alarms``: sent while an injected fault was on
    chance_recall: float = float("nan")  # see the module docstring
    alarm_share: float = float("nan")  # share of healthy time with the alarm on
    policy: dict = field(default_factory=dict)
    auc_pr_ahead: float = float("nan")  # AUC-PR over steps not breaching now (module docstring)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def _thr(s: SeriesScores, default: float) -> float:
    return default if s.threshold is None else s.threshold


def alarm(s: SeriesScores, threshold: float, policy: AlarmPolicy = RAW) -> np.ndarray:
    """The alarm state per step of one series (its own threshold if it has one)."""
    return alarm_series(s.score, _thr(s, threshold), policy)


def warn_from(e: Episode, lead_max: int) -> int:
    """The first step whose alarm counts as a warning of ``e``: ``lead_max`` steps before its
    onset, and for a precursor fault's breach not before the fault began (before it the target
    was healthy: an alarm then is chance, and false). A crash's and an unattributed breach's
    window stays whole: an alarm well above chance before a crash is how a leak shows."""
    lo = e.onset - lead_max
    if e.cause == PRECURSOR and e.fault_step is not None:
        return max(lo, e.fault_step)
    return lo


def resolving(on: np.ndarray, end: int, steps: int) -> int:
    """How many steps after a breach's last step ``end`` its alarm is still resolving: on at
    ``end`` and on every step since, at most ``steps`` (the policy's ``resolve_steps``). The
    online loop resolves an alarm only after that many scores below the band, and no forecaster
    can see a breach end before it does: a repeat sent then is the warning's own, not a false
    alarm (an ideal alarm, on exactly over each credited window, scores none)."""
    n = 0
    while n < steps and end + n + 1 < len(on) and on[end] and on[end + n + 1]:
        n += 1
    return n


def excused(episodes_: list[Episode], on: np.ndarray, lead_max: int, resolve_steps: int) -> np.ndarray:
    """Steps where a notification is not a false alarm: each event's ``[warn_from, end]`` and
    the steps its alarm is still resolving after it (:func:`resolving`)."""
    out = np.zeros(len(on), bool)
    for e in episodes_:
        out[max(0, warn_from(e, lead_max)): e.end + 1 + resolving(on, e.end, resolve_steps)] = True
    return out


def _excused(s: SeriesScores, lead_max: int, on: np.ndarray, policy: AlarmPolicy) -> np.ndarray:
    return excused(s.episodes, on, lead_max, policy.resolve_steps)


@dataclass
class _Alarms:
    false: int = 0
    in_fault: int = 0
    healthy_steps: int = 0
    covered: int = 0  # healthy steps with an alarm in the lead_max steps before them
    on: int = 0  # healthy steps with the alarm on


def _count(series: list[SeriesScores], threshold: float, lead_max: int, policy: AlarmPolicy, step_s: float,
           *, detail: bool = False) -> _Alarms:
    out = _Alarms()
    repeat = policy.repeat_steps(step_s)
    for s in series:
        scored = np.isfinite(s.score)
        on = alarm(s, threshold, policy)
        healthy = scored & ~_excused(s, lead_max, on, policy)
        sent = np.flatnonzero(notifications(on, repeat))
        false = sent[healthy[sent]]
        out.false += len(false)
        out.healthy_steps += int(healthy.sum())
        if not detail:
            continue
        out.in_fault += sum(any(lo <= o <= hi for lo, hi in s.fault_spans) for o in false)
        c = np.concatenate([[0], np.cumsum(on, dtype=np.int64)])
        idx = np.flatnonzero(healthy)
        before = c[idx] - c[np.maximum(idx - lead_max, 0)]  # alarm steps in [t - lead_max, t - 1]
        out.covered += int((before > 0).sum())
        out.on += int(on[idx].sum())
    return out


def false_alarms(series: list[SeriesScores], threshold: float, lead_max: int, step_s: float,
                 policy: AlarmPolicy = RAW) -> tuple[int, float]:
    """(false alarm notifications, healthy days)."""
    a = _count(series, threshold, lead_max, policy, step_s)
    return a.false, a.healthy_steps * step_s / 86400.0


def candidates(series: list[SeriesScores]) -> np.ndarray:
    """Thresholds worth trying: quantiles of the scores, dense towards the top, where a
    forecaster that is confident on most healthy steps puts its useful thresholds."""
    allv = np.concatenate([s.score[np.isfinite(s.score)] for s in series])
    qs = np.unique(np.concatenate([np.linspace(0.5, 1.0, 101), 1.0 - np.geomspace(0.5, 1e-6, 300)]))
    return np.unique(np.quantile(allv, qs))


def poisson_upper(k: int, confidence: float) -> float:
    """The upper ``confidence`` bound of a Poisson mean after ``k`` events (the exact one:
    P(at most k events | mean) = 1 - confidence), by bisection; 0 confidence gives ``k``."""
    if confidence <= 0:
        return float(k)
    lo, hi = float(k), float(k) + 10.0 * math.sqrt(k + 1) + 10.0

    def cdf(mu: float) -> float:
        term = total = math.exp(-mu)
        for i in range(1, k + 1):
            term *= mu / i
            total += term
        return total

    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 1.0 - confidence else (lo, mid)
    return hi


def threshold_for(series: list[SeriesScores], target_per_day: float, lead_max: int, step_s: float,
                  policy: AlarmPolicy = RAW, confidence: float = 0.0) -> float:
    """The lowest threshold down to which the alarms' false alarms per healthy day stay at or
    under the target (scanned from the top; validation data). With ``confidence`` > 0 the rate
    that must stay under the target is the upper ``confidence`` bound of the count (Poisson)
    over the healthy days, not the count itself: with few healthy days on validation a rate
    measured there is noisy, and the bound keeps a margin that shrinks as days are added
    (docs/forecaster.md#thresholds-that-hold)."""
    cands = candidates(series)
    best = float(np.nextafter(cands.max(), np.inf))
    for thr in cands[::-1]:  # from the top: false alarms grow as the threshold falls
        n, days = false_alarms(series, float(thr), lead_max, step_s, policy)
        if days <= 0 or poisson_upper(n, confidence) / days > target_per_day:
            break
        best = float(thr)
    return best


def report(series: list[SeriesScores], threshold: float, lead_max: int, step_s: float, min_onset: int,
           policy: AlarmPolicy = RAW) -> Report:
    known = [np.isfinite(s.score) & (s.y >= 0) for s in series]
    ys = np.concatenate([s.y[k] for s, k in zip(series, known, strict=True)])
    sc = np.concatenate([s.score[k] for s, k in zip(series, known, strict=True)])
    calm = np.concatenate([~s.breach[k] for s, k in zip(series, known, strict=True)])
    events = dict.fromkeys(CAUSES, 0)
    warned = dict.fromkeys(CAUSES, 0)
    leads: dict[str, list[int]] = {c: [] for c in CAUSES}
    tp = fp = fn = 0
    for s in series:
        scored = np.isfinite(s.score)
        on = alarm(s, threshold, policy)
        for e in s.episodes:
            lo = e.onset - lead_max
            if lo < min_onset or not scored[max(0, lo): e.onset].all():
                continue  # no full look-back scored before this onset
            events[e.cause] += 1
            start = warn_from(e, lead_max)
            hits = np.flatnonzero(on[start: e.onset])
            if len(hits):
                warned[e.cause] += 1
                leads[e.cause].append(e.onset - start - int(hits[0]))
        # point adjustment over runs of the label
        lab = (s.y == 1) & scored
        pred = on & (s.y >= 0)
        adj = pred.copy()
        for run in episodes(lab, 0):
            if pred[run.onset: run.end + 1].any():
                adj[run.onset: run.end + 1] = True
        tp += int((adj & lab).sum())
        fp += int((adj & ~lab & (s.y >= 0)).sum())
        fn += int((~adj & lab).sum())
    a = _count(series, threshold, lead_max, policy, step_s, detail=True)
    days = a.healthy_steps * step_s / 86400.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else float("nan")
    return Report(
        auc_pr=auc_pr(ys, sc), events=events, warned=warned,
        recall={c: warned[c] / events[c] if events[c] else float("nan") for c in CAUSES},
        mean_lead_s={c: float(np.mean(leads[c]) * step_s) if leads[c] else float("nan") for c in CAUSES},
        false_alarms_per_day=a.false / days if days else float("nan"), healthy_days=days,
        pa_f1=f1, threshold=threshold, false_alarms=a.false, false_alarms_in_fault=a.in_fault,
        chance_recall=a.covered / a.healthy_steps if a.healthy_steps else float("nan"),
        alarm_share=a.on / a.healthy_steps if a.healthy_steps else float("nan"), policy=policy.to_dict(),
        auc_pr_ahead=auc_pr(ys[calm], sc[calm]),
    )
