"""The alarm policy: when a stream of risk scores is an alert, online and in evaluation alike.

An SRE sees alerts, not scores, so methods are thresholded and judged by the alarm they raise;
judging raw per-step crossings counts every flap of a noisy score as a false alarm and picks
thresholds for an alarm nobody deploys. The online step (:func:`next_alarm`) and the vectorised
form (:func:`alarm_series`) must stay equal; both are pure functions of the score sequence.
See docs/forecaster.md#design (Alarms).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmsla.config import ForecastConfig, check_forecast_alarm


@dataclass(frozen=True)
class AlarmPolicy:
    fire_steps: int = 2
    resolve_steps: int = 6
    resolve_ratio: float = 0.8
    repeat_s: float = 300.0
    #: fire on ``fire_steps`` of the last ``fire_window`` scores at or above the threshold
    #: (k-of-n persistence, firing on a score at or above it); ``0`` (or ``fire_steps``) = that
    #: many in a row
    fire_window: int = 0

    def __post_init__(self) -> None:
        if self.fire_steps < 1 or self.resolve_steps < 1:
            raise ValueError("fire_steps and resolve_steps must be >= 1")
        if self.fire_window and not self.fire_steps <= self.fire_window <= 60:
            raise ValueError(f"fire_window must be 0 or between fire_steps ({self.fire_steps}) and 60, "
                             f"got {self.fire_window}")
        if not 0 <= self.resolve_ratio <= 1:
            raise ValueError(f"resolve_ratio must be in [0, 1], got {self.resolve_ratio}")
        if not self.repeat_s > 0:
            raise ValueError(f"repeat_s must be > 0, got {self.repeat_s}")

    @classmethod
    def from_config(cls, fc: ForecastConfig) -> AlarmPolicy:
        """From ``[forecast]`` (``fire_steps``, ``fire_window``, ``resolve_steps``, ``resolve_ratio``,
        ``repeat_s``); a window shorter than ``fire_steps`` is the config's one-line error."""
        check_forecast_alarm(fc)
        return cls(int(fc.fire_steps), int(fc.resolve_steps), float(fc.resolve_ratio), float(fc.repeat_s),
                   int(fc.fire_window))

    @property
    def window(self) -> int:
        """The scores the fire rule looks at: ``fire_window``, or ``fire_steps`` in a row."""
        return max(self.fire_window, self.fire_steps)

    def repeat_steps(self, step_s: float) -> int:
        """The repeat interval in steps of ``step_s`` (at least one: a step is the finest clock)."""
        return max(1, round(self.repeat_s / step_s)) if np.isfinite(self.repeat_s) else 2**62

    def to_dict(self) -> dict:
        """The policy as an artifact records it; ``fire_window`` only where it is k-of-n, so an
        artifact written before it existed reads as the same (consecutive) policy."""
        out: dict = {"fire_steps": self.fire_steps, "resolve_steps": self.resolve_steps,
                     "resolve_ratio": self.resolve_ratio, "repeat_s": self.repeat_s}
        if self.window > self.fire_steps:
            out["fire_window"] = self.fire_window
        return out


#: Every score crossing the threshold is an alarm step, notified once (raw scores).
RAW = AlarmPolicy(1, 1, 1.0, float("inf"))


@dataclass(frozen=True)
class Alarm:
    """One target's alarm: on or off, the runs of scores above and below the band, and which of
    the last scores were at or above the threshold (bit ``i``: ``i`` scores ago; k-of-n)."""

    firing: bool = False
    above: int = 0
    below: int = 0
    recent: int = 0


def next_alarm(st: Alarm, risk: float, threshold: float, policy: AlarmPolicy) -> tuple[str | None, Alarm]:
    """Feed one score: ``("firing" | "resolved" | None, the new alarm)``; the transition only on
    a change (``fire_steps`` of the last ``policy.window`` scores at or above the threshold,
    ``resolve_steps`` in a row below the band)."""
    hit = risk >= threshold
    recent = ((st.recent << 1) | int(hit)) & ((1 << policy.window) - 1)
    if hit:
        above, below = st.above + 1, 0
    elif risk < threshold * policy.resolve_ratio:
        above, below = 0, st.below + 1
    else:  # inside the hysteresis band: neither counts
        above, below = 0, 0
    if policy.window > policy.fire_steps:  # k-of-n: on a hit, with fire_steps of the last window
        fire = hit and bin(recent).count("1") >= policy.fire_steps
    else:  # fire_steps in a row
        fire = above >= policy.fire_steps
    if not st.firing and fire:
        return "firing", Alarm(True, above, below, recent)
    if st.firing and below >= policy.resolve_steps:
        return "resolved", Alarm(False, above, below, recent)
    return None, Alarm(st.firing, above, below, recent)


@dataclass
class AlarmState:
    """:func:`next_alarm` as a mutable object, stepped in place (the evaluation's reference loop)."""

    firing: bool = False
    above: int = 0
    below: int = 0
    recent: int = 0

    def step(self, risk: float, threshold: float, policy: AlarmPolicy) -> str | None:
        """Feed one score; ``"firing"`` or ``"resolved"`` on a transition, else ``None``."""
        change, nxt = next_alarm(Alarm(self.firing, self.above, self.below, self.recent), risk, threshold, policy)
        self.firing, self.above, self.below, self.recent = nxt.firing, nxt.above, nxt.below, nxt.recent
        return change


def _runs_at_least(flag: np.ndarray, k: int) -> np.ndarray:
    """``out[t]``: the last ``k`` steps up to ``t`` are all set."""
    if k <= 1:
        return flag.copy()
    c = np.concatenate([[0], np.cumsum(flag, dtype=np.int64)])
    out = np.zeros(len(flag), bool)
    out[k - 1:] = (c[k:] - c[:-k]) == k
    return out


def _at_least_of_last(flag: np.ndarray, k: int, n: int, start: np.ndarray) -> np.ndarray:
    """``out[t]``: at least ``k`` of the last ``n`` steps up to ``t`` are set, counting no step
    before ``start[t]`` (where the counts restarted)."""
    c = np.concatenate([[0], np.cumsum(flag, dtype=np.int64)])
    idx = np.arange(len(flag))
    lo = np.maximum(idx + 1 - n, start)
    return (c[idx + 1] - c[lo]) >= k


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
    n = len(score)
    idx = np.arange(n)
    if policy.window > policy.fire_steps:  # k-of-n: the counts restart after an unscored step
        start = np.maximum.accumulate(np.where(~scored, idx + 1, 0)) if n else idx
        fire = above & _at_least_of_last(above, policy.fire_steps, policy.window, start)
    else:
        fire = _runs_at_least(above, policy.fire_steps)
    # an unscored step ends any alarm (the series restarts after it)
    resolve = _runs_at_least(below, policy.resolve_steps) | ~scored
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
