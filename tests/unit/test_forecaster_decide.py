"""The forecaster's alarm and alert rules, pinned on the pure decisions (forecaster/hysteresis.py's
:func:`next_alarm`, forecaster/decide.py): each test names the rule it holds."""

from __future__ import annotations

from llmsla.forecaster import decide
from llmsla.forecaster.decide import TargetAlarm
from llmsla.forecaster.hysteresis import Alarm, AlarmPolicy, next_alarm

P = AlarmPolicy(fire_steps=2, resolve_steps=3, resolve_ratio=0.5)
THR = 0.6
LABELS = {"alertname": "SloBreachForecast", "pool": "p", "replica": "r1", "slo": "ttft"}


def feed(scores: list[float], policy: AlarmPolicy = P) -> list[str | None]:
    st, out = Alarm(), []
    for s in scores:
        change, st = next_alarm(st, s, THR, policy)
        out.append(change)
    return out


def test_fires_after_fire_steps_consecutive_scores_at_or_above_the_threshold() -> None:
    assert feed([0.6, 0.9]) == [None, "firing"]
    assert feed([0.7, 0.1, 0.7]) == [None, None, None]  # not consecutive


def test_the_threshold_itself_counts_as_above() -> None:
    assert feed([THR, THR]) == [None, "firing"]


def test_resolves_only_after_resolve_steps_scores_below_the_band() -> None:
    # band: [0.3, 0.6); 0.29 is below it, 0.3 is inside
    assert feed([0.9, 0.9, 0.29, 0.29, 0.29]) == [None, "firing", None, None, "resolved"]
    assert feed([0.9, 0.9, 0.3, 0.3, 0.3, 0.3]) == [None, "firing", None, None, None, None]


def test_a_score_inside_the_band_resets_both_runs() -> None:
    assert feed([0.9, 0.9, 0.1, 0.1, 0.45, 0.1, 0.1]) == [None, "firing", None, None, None, None, None]
    assert feed([0.9, 0.45, 0.9]) == [None, None, None]


def test_next_alarm_never_changes_its_input() -> None:
    st = Alarm(True, 0, 2)
    change, nxt = next_alarm(st, 0.1, THR, P)
    assert (change, nxt.firing, st) == ("resolved", False, Alarm(True, 0, 2))


def score_all(scores: list[float], repeat_ms: int = 60_000, step_ms: int = 5_000) -> list[tuple[int, str]]:
    st, sent = TargetAlarm(), []
    for i, s in enumerate(scores):
        status, st = decide.on_score(st, s, (i + 1) * step_ms, LABELS, threshold=THR, policy=P, repeat_ms=repeat_ms)
        if status:
            sent.append((i, status))
    return sent


def test_an_onset_is_sent_once_then_repeated_every_repeat_interval() -> None:
    sent = score_all([0.9] * 30)  # 5 s steps, repeat 60 s = every 12 steps after the onset
    assert sent == [(1, "firing"), (13, "firing"), (25, "firing")]


def test_a_resolve_is_sent_once_and_no_repeat_follows() -> None:
    sent = score_all([0.9, 0.9] + [0.0] * 30)
    assert sent == [(1, "firing"), (4, "resolved")]


def test_the_onset_records_its_time_and_labels() -> None:
    status, st = decide.on_score(TargetAlarm(Alarm(False, 1, 0)), 0.9, 10_000, LABELS, threshold=THR, policy=P,
                                 repeat_ms=60_000)
    assert status == "firing" and (st.starts_ms, st.last_sent_ms, st.labels) == (10_000, 10_000, LABELS)
    _, later = decide.on_score(st, 0.9, 20_000, {**LABELS, "slo": "e2e"}, threshold=THR, policy=P, repeat_ms=60_000)
    assert later.labels == LABELS and later.starts_ms == 10_000  # one episode, one label set


def test_an_idle_target_resolves_only_a_firing_alert() -> None:
    assert decide.on_idle(TargetAlarm(Alarm(True))) == "resolved"
    assert decide.on_idle(TargetAlarm(Alarm(False, 1, 0))) is None
    assert decide.on_idle(None) is None


def test_idle_steps_are_at_least_one_and_at_most_the_window() -> None:
    assert decide.idle_steps(0.0, 12) == 1
    assert decide.idle_steps(30.0, 12) == 6  # 5 s windows
    assert decide.idle_steps(3600.0, 12) == 12


def test_vanished_targets_are_firing_ones_that_served_nothing() -> None:
    assert decide.vanished(["a", "b", "c"], ["b", "x"]) == ["a", "c"]
    assert decide.vanished([], ["b"]) == []
