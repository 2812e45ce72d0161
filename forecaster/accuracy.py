"""The forecaster's own accuracy, live: its alarms scored against the breaches that happened.

Pure: the I/O shell (:mod:`llmsla.forecaster.live_accuracy`) reads the stored risks
(``forecasts``) and the breaches (the SLO catalog evaluated on the stored windows by
:func:`llmsla.forecaster.slo.breaches`, the labels' own rule) and hands them here per target.
The definitions are the offline evaluation's (:mod:`llmsla.forecaster.metrics`,
docs/forecaster-eval.md), so a live recall can be compared with the model's validation recall:

- the alarm is recomputed from the stored risks with the online loop's hysteresis
  (:func:`~llmsla.forecaster.hysteresis.alarm_series`), its notifications (onset and repeats)
  with :func:`~llmsla.forecaster.hysteresis.notifications`;
- a breach *event* is an episode of breaching steps (gaps up to the horizon merged); it is
  *warned* when the alarm was on in the ``lead`` steps before its onset, lead = onset - first such
  step; an onset whose look-back was not fully scored is not judged;
- a *false alarm* is a notification outside every event's ``[onset - lead, end]`` and the steps
  its alarm is still resolving after it (:func:`~llmsla.forecaster.metrics.resolving`); it is
  judged only once the ``lead`` steps after it have passed (a breach may still come);
- false alarms per day are per day of healthy (scored, not excused) target time.

``lead`` is the evaluation's ``forecast.lead_max_steps`` (2 min), or the horizon where that is
longer. See docs/forecaster.md#its-own-accuracy-live.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from llmsla.forecaster import metrics as m
from llmsla.forecaster.hysteresis import AlarmPolicy, alarm_series, notifications


@dataclass(frozen=True)
class Track:
    """One target at one horizon on the step grid: risk as a share of the threshold it was
    scored against (1.0 = at the threshold; NaN where not scored) and the breach per step."""

    target: str
    risk: np.ndarray  # [T] float
    breach: np.ndarray  # [T] bool: the SLO window ending at the step breaches

    def __post_init__(self) -> None:
        if self.risk.shape != self.breach.shape or self.risk.ndim != 1:
            raise ValueError(f"{self.target}: risk {self.risk.shape} and breach {self.breach.shape} must be equal 1-d")


@dataclass
class Accuracy:
    """One horizon's counts over a rolling window, and the ratios exported from them."""

    horizon_s: int
    events: int = 0  # breach onsets judged
    warned: int = 0
    leads_s: list[float] = field(default_factory=list)  # one per warned event
    notifications: int = 0  # judged: their lead window has passed
    false_alarms: int = 0
    healthy_days: float = 0.0

    @property
    def recall(self) -> float:
        return self.warned / self.events if self.events else math.nan

    @property
    def precision(self) -> float:
        """Share of judged notifications that were not false alarms (NaN with none)."""
        return (self.notifications - self.false_alarms) / self.notifications if self.notifications else math.nan

    @property
    def false_alarms_per_day(self) -> float:
        return self.false_alarms / self.healthy_days if self.healthy_days > 0 else math.nan


def lead_steps(horizon_steps: int, lead_max_steps: int) -> int:
    """How far before a breach an alarm counts as its warning (and after an alarm a breach
    excuses it): the evaluation's ``lead_max_steps``, or the horizon where that is longer."""
    return max(int(horizon_steps), int(lead_max_steps))


def score(tracks: Iterable[Track], *, horizon_s: int, step_s: float, start: int, lead: int,
          policy: AlarmPolicy) -> Accuracy:
    """Score ``tracks`` (all on the same grid) from step index ``start``: the steps before it are
    context (an alarm already on, a breach already going); the grid ends at the last step whose
    breach is known. Events with an onset at or after ``start`` are judged, notifications from
    ``start`` up to ``lead`` steps before the end."""
    horizon_steps = max(1, round(horizon_s / step_s))
    repeat = policy.repeat_steps(step_s)
    out = Accuracy(horizon_s)
    for tr in tracks:
        n = len(tr.risk)
        scored = np.isfinite(tr.risk)
        on = alarm_series(tr.risk, 1.0, policy)
        eps = m.episodes(tr.breach, horizon_steps)
        excused = m.excused(eps, on, lead, policy.resolve_steps)
        for e in eps:
            lo = e.onset - lead
            if e.onset < start or lo < 0 or not scored[lo: e.onset].all():
                continue  # before the window, or no full look-back scored before this onset
            out.events += 1
            hits = np.flatnonzero(on[lo: e.onset])
            if len(hits):
                out.warned += 1
                out.leads_s.append((lead - int(hits[0])) * step_s)
        judged = np.zeros(n, bool)
        judged[start: max(start, n - lead)] = True  # the lead window after the step has passed
        sent = np.flatnonzero(notifications(on, repeat) & judged)
        out.notifications += len(sent)
        out.false_alarms += int((~excused[sent]).sum())
        out.healthy_days += float((scored & judged & ~excused).sum()) * step_s / 86400.0
    return out


def validation_recall(meta: dict) -> float:
    """The model's recall of every breach on its validation split (all causes: live breaches
    carry none), from an artifact's ``metrics.val`` (NaN when it records none)."""
    val = (meta.get("metrics") or {}).get("val") or {}
    events, warned = val.get("events") or {}, val.get("warned") or {}
    total = sum(int(v) for v in events.values())
    return sum(int(v) for v in warned.values()) / total if total else math.nan
