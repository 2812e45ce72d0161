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


def test_k_of_n_by_hand_fires_on_a_hit_with_k_of_the_last_n() -> None:
    """3 of 5: a lone spike never fires; a third hit within five steps does, on that hit."""
    p = AlarmPolicy(fire_steps=3, resolve_steps=2, resolve_ratio=0.5, fire_window=5)
    score = np.array([0.9, 0.1, 0.1, 0.1, 0.9, 0.4, 0.9, 0.4, 0.9, 0.1, 0.1, 0.9, np.nan, 0.9, 0.9])
    want = [False] * 8 + [True, True, False, False, False, False, False]
    assert alarm_series(score, 0.6, p).tolist() == want
    assert _stepped(score, 0.6, p).tolist() == want
    # the same scores under two in a row never fire: no two hits are adjacent before the gap
    assert not alarm_series(score[:12], 0.6, AlarmPolicy(2, 2, 0.5)).any()


@pytest.mark.parametrize("policy", [AlarmPolicy(2, 6, 0.8, fire_window=4), AlarmPolicy(3, 2, 0.5, fire_window=6),
                                    AlarmPolicy(1, 3, 1.0, fire_window=3), AlarmPolicy(4, 1, 0.9, fire_window=10)])
def test_k_of_n_vectorised_equals_stepped_on_random_scores(policy: AlarmPolicy) -> None:
    """The evaluation's alarm under k-of-n is the online state machine's, gaps included."""
    rng = np.random.default_rng(11)
    fired = 0
    for _ in range(300):
        n = int(rng.integers(1, 80))
        score = rng.uniform(0, 1, n)
        score[rng.uniform(0, 1, n) < 0.05] = np.nan
        thr = float(rng.uniform(0.3, 0.8))
        got = alarm_series(score, thr, policy)
        assert got.tolist() == _stepped(score, thr, policy).tolist()
        fired += int(got.any())
    assert fired > 30  # the sequences exercise firing, not only silence


def test_k_of_n_equal_to_k_is_in_a_row_and_records_as_before() -> None:
    """fire_window == fire_steps is the consecutive rule; an artifact's policy reads the same."""
    rng = np.random.default_rng(5)
    score = rng.uniform(0, 1, 500)
    assert (alarm_series(score, 0.5, AlarmPolicy(3, 2, 0.7, fire_window=3)).tolist()
            == alarm_series(score, 0.5, AlarmPolicy(3, 2, 0.7)).tolist())
    assert AlarmPolicy(3, 2, 0.7, fire_window=3).to_dict() == AlarmPolicy(3, 2, 0.7).to_dict()
    assert AlarmPolicy(3, 2, 0.7, fire_window=6).to_dict()["fire_window"] == 6
    with pytest.raises(ValueError, match="fire_window"):
        AlarmPolicy(3, 2, 0.7, fire_window=2)


def test_online_hysteresis_k_of_n_sends_what_the_evaluation_counts() -> None:
    """alerts.Hysteresis with fire_window: its firing notifications are the evaluation's."""
    rng = np.random.default_rng(9)
    score = np.clip(0.5 + 0.3 * np.sin(np.arange(400) / 15) + rng.normal(0, 0.25, 400), 0, 1)
    p = AlarmPolicy(3, 4, 0.7, repeat_s=40.0, fire_window=6)
    h = alerts.Hysteresis(0.6, fire_steps=p.fire_steps, resolve_steps=p.resolve_steps, resolve_ratio=p.resolve_ratio,
                          repeat_s=p.repeat_s, horizon_s=25, fire_window=p.fire_window)
    labels = alerts.alert_labels("default", "r1", "6b", "ttft-p99", 25)
    sent = [i for i, v in enumerate(score) for s, _ in h.update("k", float(v), i * 5000, labels) if s == "firing"]
    on = alarm_series(score, 0.6, p)
    assert sent == np.flatnonzero(notifications(on, p.repeat_steps(5.0))).tolist()
    assert len(sent) >= 4
    # and k-of-n fires where two in a row would not have yet: the policies differ on this series
    assert on.tolist() != alarm_series(score, 0.6, AlarmPolicy(3, 4, 0.7, repeat_s=40.0)).tolist()


def test_a_fire_window_shorter_than_fire_steps_is_one_config_error(tmp_path, capsys) -> None:
    """Every command reading the policy refuses it as ``llmsla config check`` does: one line."""
    from llmsla import config as config_mod
    from llmsla.app.cli import main
    from llmsla.config import ConfigError

    cfg = config_mod.load(env={"LLMSLA_FORECAST_FIRE_STEPS": "3", "LLMSLA_FORECAST_FIRE_WINDOW": "2"})
    with pytest.raises(ConfigError, match=r"forecast\.fire_window: 2 is shorter than forecast\.fire_steps \(3\)"):
        AlarmPolicy.from_config(cfg.forecast)
    cfg = config_mod.load(env={"LLMSLA_FORECAST_FIRE_STEPS": "3", "LLMSLA_FORECAST_FIRE_WINDOW": "5"})
    assert AlarmPolicy.from_config(cfg.forecast) == AlarmPolicy(3, 6, 0.8, 300.0, fire_window=5)
    conf = tmp_path / "llmsla.toml"
    conf.write_text("[forecast]\nfire_steps = 3\nfire_window = 2\n")
    assert main(["--config", str(conf), "config", "check"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "forecast.fire_window" in err[0], err
