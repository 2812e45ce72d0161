"""One alarm online and in evaluation: the vectorised alarm series equals the online state
machine stepped score by score, on hand-made and on random sequences."""

from __future__ import annotations

import numpy as np
import pytest

from llmsla.forecaster import alerts
from llmsla.forecaster.hysteresis import RAW, AlarmPolicy, AlarmState, alarm_series, notifications


def _stepped(score: np.ndarray, thr: float, policy: AlarmPolicy) -> np.ndarray:
    """The reference: AlarmState stepped once per score, restarted after an unscored step."""
    st, out = AlarmState(), []
    for v in score:
        if not np.isfinite(v):
            st = AlarmState()
            out.append(False)
            continue
        st.step(float(v), thr, policy)
        out.append(st.firing)
    return np.array(out, bool)


def test_by_hand_fire_after_two_resolve_after_three_below_the_band() -> None:
    p = AlarmPolicy(fire_steps=2, resolve_steps=3, resolve_ratio=0.5)
    score = np.array([np.nan, 0.1, 0.7, 0.2, 0.7, 0.8, 0.9, 0.55, 0.4, 0.29, 0.2, 0.1, 0.1])
    want = [False, False, False, False, False, True, True, True, True, True, True, False, False]
    assert alarm_series(score, 0.6, p).tolist() == want
    # the raw policy: every crossing is an alarm step
    assert alarm_series(score, 0.6, RAW).tolist() == [bool(v >= 0.6) for v in np.nan_to_num(score)]


@pytest.mark.parametrize("policy", [RAW, AlarmPolicy(), AlarmPolicy(3, 2, 0.5), AlarmPolicy(1, 4, 1.0)])
def test_vectorised_equals_stepped_on_random_scores(policy: AlarmPolicy) -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        score = rng.uniform(0, 1, n)
        score[rng.uniform(0, 1, n) < 0.05] = np.nan  # gaps restart the alarm
        thr = float(rng.uniform(0.2, 0.8))
        assert alarm_series(score, thr, policy).tolist() == _stepped(score, thr, policy).tolist()


def test_online_hysteresis_is_the_same_state_machine() -> None:
    """alerts.Hysteresis fires and resolves exactly where the evaluation's alarm turns on/off."""
    rng = np.random.default_rng(3)
    score = np.clip(0.5 + 0.4 * np.sin(np.arange(300) / 12) + rng.normal(0, 0.15, 300), 0, 1)
    p = AlarmPolicy(2, 4, 0.7, repeat_s=40.0)
    h = alerts.Hysteresis(0.5, fire_steps=p.fire_steps, resolve_steps=p.resolve_steps,
                          resolve_ratio=p.resolve_ratio, repeat_s=p.repeat_s, horizon_s=25)
    labels = alerts.alert_labels("default", "r1", "6b", "ttft-p99", 25)
    sent = [(i, s) for i, v in enumerate(score) for s, _ in h.update("k", float(v), i * 5000, labels)]
    on = alarm_series(score, 0.5, p)
    edges = [(i, "firing" if on[i] else "resolved") for i in range(len(on)) if on[i] != (on[i - 1] if i else False)]
    assert [e for e in sent if e[1] == "resolved"] == [e for e in edges if e[1] == "resolved"]
    # every firing notification, the repeats every 40 s (8 steps) included, is where the
    # evaluation counts one
    firing = [i for i, s in sent if s == "firing"]
    assert firing == np.flatnonzero(notifications(on, p.repeat_steps(5.0))).tolist()
    assert len(edges) >= 4 and len(firing) > len(edges) / 2
