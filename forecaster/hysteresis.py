"""The alarm policy: when a stream of risk scores is an alert, online and in evaluation alike.

An SRE sees alerts, not scores, so a forecaster is judged by the alarm it raises: it fires after
``fire_steps`` consecutive scores at or above the threshold and resolves after
``resolve_steps`` consecutive scores below ``resolve_ratio`` x threshold (a score inside the
band resets both counts); while it fires, the notification is repeated every ``repeat_s``
(Alertmanager's repeat interval), so an alarm left on for hours is not one notification but
many (:func:`notifications`). The online loop steps :class:`AlarmState` once per scored window;
the evaluation computes the same states for a whole series at once with :func:`alarm_series`
(tested equal). Judging methods on raw per-step crossings instead would count every flap of a
noisy score as a new false alarm and pick thresholds for an alarm nobody deploys.

Both are pure functions of the score sequence: the consecutive-above and consecutive-below
counts do not depend on the state, so the state at a step is "firing" exactly when the last
fire condition at or before it came after the last resolve condition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmsla.config import ForecastConfig


@dataclass(frozen=True)
class AlarmPolicy:
    fire_steps: int = 2
    resolve_steps: int = 6
    resolve_ratio: float = 0.8
    repeat_s: float = 300.0

    def __post_init__(self) -> None:
        if self.fire_steps < 1 or self.resolve_steps < 1:
            raise ValueError("fire_steps and resolve_steps must be >= 1")
        if not 0 <= self.resolve_ratio <= 1:
            raise ValueError(f"resolve_ratio must be in [0, 1], got {self.resolve_ratio}")
        if not self.repeat_s > 0:
            raise ValueError(f"repeat_s must be > 0, got {self.repeat_s}")

    @classmethod
    def from_config(cls, fc: ForecastConfig) -> AlarmPolicy:
        """From ``[forecast]`` (``fire_steps``, ``resolve_steps``, ``resolve_ratio``, ``repeat_s``)."""
        return cls(int(fc.fire_steps), int(fc.resolve_steps), float(fc.resolve_ratio), float(fc.repeat_s))

    def repeat_steps(self, step_s: float) -> int:
        """The repeat interval in steps of ``step_s`` (at least one: a step is the finest clock)."""
        return max(1, round(self.repeat_s / step_s)) if np.isfinite(self.repeat_s) else 2**62

    def to_dict(self) -> dict:
        return {"fire_steps": self.fire_steps, "resolve_steps": self.resolve_steps,
                "resolve_ratio": self.resolve_ratio, "repeat_s": self.repeat_s}


#: Every score crossing the threshold is an alarm step, notified once (raw scores).
RAW = AlarmPolicy(1, 1, 1.0, float("inf"))


@dataclass
class AlarmState:
    """One target's alarm, stepped once per score (the online loop)."""

    firing: bool = False
    above: int = 0
    below: int = 0

    def step(self, risk: float, threshold: float, policy: AlarmPolicy) -> str | None:
        """Feed one score; ``"firing"`` or ``"resolved"`` on a transition, else ``None``."""
        if risk >= threshold:
            self.above += 1
            self.below = 0
        elif risk < threshold * policy.resolve_ratio:
            self.below += 1
            self.above = 0
        else:  # inside the hysteresis band: neither counts
            self.above = 0
            self.below = 0
        if not self.firing and self.above >= policy.fire_steps:
            self.firing = True
            return "firing"
        if self.firing and self.below >= policy.resolve_steps:
            self.firing = False
            return "resolved"
        return None


def _runs_at_least(flag: np.ndarray, k: int) -> np.ndarray:
    """``out[t]``: the last ``k`` steps up to ``t`` are all set."""
    if k <= 1:
        return flag.copy()
    c = np.concatenate([[0], np.cumsum(flag, dtype=np.int64)])
    out = np.zeros(len(flag), bool)
    out[k - 1:] = (c[k:] - c[:-k]) == k
    return out


def alarm_series(score: np.ndarray, threshold: float, policy: AlarmPolicy) -> np.ndarray:
    """Alarm state per step of one series, as :class:`AlarmState` would have it after each
    score. A NaN score (not scored: before the first full window) is no alarm and starts the
    counts afresh."""
    score = np.asarray(score, dtype=float)
    scored = np.isfinite(score)
    s = np.where(scored, score, np.nan)
    with np.errstate(invalid="ignore"):
        above = scored & (s >= threshold)
        below = scored & (s < threshold * policy.resolve_ratio)
    fire = _runs_at_least(above, policy.fire_steps)
    # an unscored step ends any alarm (the series restarts after it)
    resolve = _runs_at_least(below, policy.resolve_steps) | ~scored
    n = len(score)
    idx = np.arange(n)
    last_fire = np.maximum.accumulate(np.where(fire, idx, -1)) if n else idx
    last_resolve = np.maximum.accumulate(np.where(resolve, idx, -1)) if n else idx
    return (last_fire > last_resolve) & scored


def notifications(on: np.ndarray, repeat_steps: int) -> np.ndarray:
    """Steps at which a firing notification goes out for the alarm states ``on``: each onset, then
    every ``repeat_steps`` while it stays on (what ``alerts.Hysteresis`` sends)."""
    n = len(on)
    if not n:
        return np.zeros(0, bool)
    idx = np.arange(n)
    onset = on & ~np.concatenate([[False], on[:-1]])
    since = idx - np.maximum.accumulate(np.where(onset, idx, -1))
    return on & (since % repeat_steps == 0)
