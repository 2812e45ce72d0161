"""The live accuracy's pure scoring (forecaster/accuracy.py) on hand-built sequences: an early
alarm, a late one, an alarm with no breach, a breach with no alarm, a horizon not yet passed,
and the offline evaluation (forecaster/metrics.py) agreeing on the same series."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmsla.forecaster import accuracy as A
from llmsla.forecaster import metrics as m
from llmsla.forecaster.hysteresis import AlarmPolicy

STEP_S = 5.0
LEAD = 6  # steps an alarm may precede a breach
POLICY = AlarmPolicy(fire_steps=2, resolve_steps=2, resolve_ratio=0.8, repeat_s=1e9)  # no repeats
N = 60


def track(high: tuple[int, int] | None = None, breach: tuple[int, int] | None = None, n: int = N,
          scored_from: int = 0) -> A.Track:
    """Risk 0.1 x threshold, 2.0 x on ``high`` [a, b); breaching on ``breach`` [a, b)."""
    risk = np.full(n, 0.1)
    risk[:scored_from] = np.nan
    if high:
        risk[high[0]: high[1]] = 2.0
    b = np.zeros(n, bool)
    if breach:
        b[breach[0]: breach[1]] = True
    return A.Track("p/r0", risk, b)


def run(*tracks: A.Track, start: int = 0) -> A.Accuracy:
    return A.score(tracks, horizon_s=25, step_s=STEP_S, start=start, lead=LEAD, policy=POLICY)


def test_an_alarm_before_the_breach_is_a_warning_with_its_lead() -> None:
    # scores high at 20, 21 -> fires at 21; the breach begins at 25: warned 4 steps (20 s) ahead
    acc = run(track(high=(20, 30), breach=(25, 32)))
    assert (acc.events, acc.warned, acc.leads_s) == (1, 1, [20.0])
    assert (acc.notifications, acc.false_alarms) == (1, 0)
    assert acc.recall == 1.0 and acc.precision == 1.0


def test_an_alarm_earlier_than_the_lead_window_does_not_warn_and_is_false() -> None:
    # fires at 11, resolves by 15; the breach at 30 is more than LEAD steps later
    acc = run(track(high=(10, 13), breach=(30, 33)))
    assert (acc.events, acc.warned) == (1, 0)
    assert (acc.notifications, acc.false_alarms) == (1, 1)
    assert acc.recall == 0.0 and acc.precision == 0.0


def test_an_alarm_after_the_onset_is_late_not_a_warning_nor_a_false_alarm() -> None:
    acc = run(track(high=(26, 30), breach=(25, 32)))
    assert (acc.events, acc.warned, acc.leads_s) == (1, 0, [])
    assert (acc.notifications, acc.false_alarms) == (1, 0)  # it fired inside the breach
    assert acc.recall == 0.0


def test_an_alarm_with_no_breach_is_a_false_alarm_per_healthy_day() -> None:
    acc = run(track(high=(20, 24)))
    assert (acc.events, acc.notifications, acc.false_alarms) == (0, 1, 1)
    assert math.isnan(acc.recall) and acc.precision == 0.0
    judged_steps = N - LEAD  # every judged step is healthy
    assert acc.healthy_days == pytest.approx(judged_steps * STEP_S / 86400)
    assert acc.false_alarms_per_day == pytest.approx(86400 / (judged_steps * STEP_S))


def test_a_breach_with_no_alarm_is_missed() -> None:
    acc = run(track(breach=(30, 40)))
    assert (acc.events, acc.warned, acc.notifications) == (1, 0, 0)
    assert acc.recall == 0.0 and math.isnan(acc.precision)


def test_an_alarm_whose_horizon_has_not_passed_is_not_judged_yet() -> None:
    # fires at 56: the LEAD steps after it are not all known (the grid ends at 59)
    acc = run(track(high=(55, 60)))
    assert (acc.notifications, acc.false_alarms) == (0, 0)
    # once the breach data covers its lead window, it is judged (here: false)
    acc = run(track(high=(55, 60), n=N + LEAD))
    assert (acc.notifications, acc.false_alarms) == (1, 1)


def test_a_repeat_sent_while_the_warning_resolves_is_not_false() -> None:
    """Repeats every 6 steps, resolved after 3 below: high on [20, 32) fires at 21 and stays on
    through 33; the breach ends at 31, so the repeat at 33 belongs to the warning. Left high to
    45, the alarm is still on past those 3 steps: its repeats at 39 and 45 are false."""
    policy = AlarmPolicy(fire_steps=2, resolve_steps=3, resolve_ratio=0.8, repeat_s=6 * STEP_S)

    def score(high_to: int) -> A.Accuracy:
        return A.score([track(high=(20, high_to), breach=(25, 32))], horizon_s=25, step_s=STEP_S, start=0,
                       lead=LEAD, policy=policy)

    acc = score(32)
    assert (acc.warned, acc.notifications, acc.false_alarms) == (1, 3, 0)  # 21, 27, 33
    acc = score(45)
    assert (acc.warned, acc.notifications, acc.false_alarms) == (1, 5, 2)  # 21, 27, 33, 39, 45


def test_a_breach_without_a_scored_look_back_or_before_the_window_is_not_judged() -> None:
    assert run(track(breach=(8, 12), scored_from=5)).events == 0  # forecaster not running before it
    assert run(track(breach=(3, 6))).events == 0  # no full look-back on the grid
    acc = run(track(high=(20, 30), breach=(25, 32)), start=26)  # onset before the window: context
    assert acc.events == 0 and acc.notifications == 0


def test_gaps_up_to_the_horizon_merge_into_one_event() -> None:
    b = np.zeros(N, bool)
    b[[20, 24, 40]] = True  # 20 and 24 are 4 steps apart (<= 5-step horizon): one episode
    acc = run(A.Track("p/r0", np.full(N, 0.1), b))
    assert acc.events == 2


def test_counts_add_over_targets() -> None:
    acc = run(track(high=(20, 30), breach=(25, 32)), track(breach=(30, 40)), track(high=(20, 24)))
    assert (acc.events, acc.warned, acc.notifications, acc.false_alarms) == (2, 1, 2, 1)
    assert acc.recall == 0.5 and acc.precision == 0.5


def test_risk_is_a_share_of_the_threshold_it_was_scored_against() -> None:
    """The hysteresis band is relative: 0.9 x threshold neither fires nor resolves."""
    risk = np.full(N, 0.1)
    risk[20:22] = 1.0  # at the threshold: fires at 21
    risk[22:40] = 0.9  # inside the band: stays on
    acc = run(A.Track("p/r0", risk, np.r_[np.zeros(35, bool), np.ones(5, bool), np.zeros(N - 40, bool)]))
    # on since 21: its onset notification is 14 steps before the breach (false), yet the alarm is
    # still on through the lead window, so the breach was warned, the full LEAD ahead (as offline)
    assert (acc.events, acc.warned, acc.leads_s, acc.false_alarms) == (1, 1, [LEAD * STEP_S], 1)


def test_matches_the_offline_evaluation_on_the_same_series() -> None:
    rng = np.random.default_rng(7)
    n = 4000
    risk = np.clip(rng.normal(0.3, 0.35, n), 0, 1)
    breach = np.zeros(n, bool)
    for onset in rng.choice(np.arange(50, n - 50), 25, replace=False):
        breach[onset: onset + rng.integers(1, 20)] = True
        risk[max(0, onset - rng.integers(0, 10)): onset] = 0.99  # some warned, some not
    horizon = 5
    policy = AlarmPolicy(fire_steps=2, resolve_steps=6, resolve_ratio=0.8, repeat_s=300.0)
    thr = 0.9
    series = m.SeriesScores(risk, np.zeros(n, np.int8), breach, m.episodes(breach, horizon))
    rep = m.report([series], thr, LEAD, STEP_S, 0, policy)
    acc = A.score([A.Track("x", risk / thr, breach)], horizon_s=horizon * 5, step_s=STEP_S, start=0, lead=LEAD,
                  policy=policy)
    assert acc.events == sum(rep.events.values()) and acc.warned == sum(rep.warned.values())
    assert acc.events > 10 and 0 < acc.warned < acc.events
    assert np.mean(acc.leads_s) == pytest.approx(rep.mean_lead_s["none"])
    # the offline count judges every notification; live ones in the last LEAD steps wait
    assert acc.false_alarms <= rep.false_alarms
    full = A.score([A.Track("x", np.r_[risk / thr, np.full(LEAD, np.nan)], np.r_[breach, np.zeros(LEAD, bool)])],
                   horizon_s=horizon * 5, step_s=STEP_S, start=0, lead=LEAD, policy=policy)
    assert full.false_alarms == rep.false_alarms > 0
    assert full.healthy_days == pytest.approx(rep.healthy_days)


def test_validation_recall_counts_every_cause() -> None:
    meta = {"metrics": {"val": {"events": {"precursor": 41, "crash": 6, "none": 41},
                                "warned": {"precursor": 18, "crash": 0, "none": 2}}}}
    assert A.validation_recall(meta) == pytest.approx(20 / 88)
    assert math.isnan(A.validation_recall({}))


def test_lead_is_the_evaluation_window_or_the_horizon_if_longer() -> None:
    assert A.lead_steps(5, 24) == 24
    assert A.lead_steps(120, 24) == 120


def test_mismatched_arrays_are_refused() -> None:
    with pytest.raises(ValueError, match="p/r0"):
        A.Track("p/r0", np.zeros(3), np.zeros(4, bool))
