"""The forecaster's alert decisions as pure functions: (target alarm, score, now) -> (notification,
new alarm).

Why: what reaches the receiver (onset, repeat every ``repeat_s``, resolve, resolve when a target
stops serving) is the forecaster's contract with the closed loop, so it is tested on its own in
``tests/unit`` with no model, store or receiver. Time is an input (``now_ms``: the end of the
window scored); rendering and posting the webhook are :mod:`alerts`' job. See docs/forecaster.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from llmsla import names
from llmsla.forecaster.hysteresis import Alarm, AlarmPolicy, next_alarm

FIRING, RESOLVED = "firing", "resolved"


@dataclass(frozen=True)
class TargetAlarm:
    """One target's alarm and the alert it raised: its start, last send and label set."""

    alarm: Alarm = Alarm()
    starts_ms: int = 0
    last_sent_ms: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def firing(self) -> bool:
        return self.alarm.firing


def on_score(st: TargetAlarm, risk: float, now_ms: int, labels: dict[str, str], *, threshold: float,
             policy: AlarmPolicy, repeat_ms: int) -> tuple[str | None, TargetAlarm]:
    """The notification one score sends (``"firing"``: an onset or a repeat after ``repeat_ms``;
    ``"resolved"``; ``None``) and the new alarm. An onset takes the labels of its score."""
    change, alarm = next_alarm(st.alarm, risk, threshold, policy)
    st = replace(st, alarm=alarm)
    if change == FIRING:
        return FIRING, replace(st, starts_ms=now_ms, last_sent_ms=now_ms, labels=dict(labels))
    if change == RESOLVED:
        return RESOLVED, st
    if st.firing and now_ms - st.last_sent_ms >= repeat_ms:
        return FIRING, replace(st, last_sent_ms=now_ms)
    return None, st


def breach_in_s(risks: Sequence[float], thresholds: Sequence[float], horizons_s: Sequence[float]) -> float | None:
    """Seconds until the breach a target's scores predict: the shortest horizon whose risk is at
    or above its threshold (horizons ascending), or ``None`` when none is - an alert then says
    "within its own horizon". The ``predicted_breach_at`` of every horizon's alert."""
    return next((h for r, t, h in zip(risks, thresholds, horizons_s, strict=True) if r >= t), None)


def on_idle(st: TargetAlarm | None) -> str | None:
    """A target with nothing left to forecast is forgotten; a firing alert of it resolves."""
    return RESOLVED if st is not None and st.firing else None


def idle_steps(idle_s: float, window: int) -> int:
    """``forecast.idle_s`` in scoring steps: at least one, at most the model's window."""
    return min(window, max(1, round(idle_s / names.REQUEST_WINDOW_S)))


def vanished(firing: Iterable[str], served: Iterable[str]) -> list[str]:
    """Targets with a firing alert that served nothing lately or left the windows: resolved,
    so that an alert does not hold the receiver's restore of a replica the receiver drained."""
    return sorted(set(firing) - set(served))
