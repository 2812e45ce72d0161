"""Event metrics on hand-built series (independent counts), labels from SLO counts, and gaps:
missing windows are masked and a NaN never reaches a score."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmsla import names
from llmsla.forecaster import features, metrics, windowing
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.dataset import fleet_inputs
from llmsla.forecaster.hysteresis import AlarmPolicy
from llmsla.forecaster.scaler import RobustScaler


def test_event_metrics_by_hand() -> None:
    breach = np.zeros(100, bool)
    breach[40:50] = True  # event A (onset 40): warned at 35 -> lead 5 steps
    breach[80:85] = True  # event B (onset 80): alarm only at 81 (after onset) -> missed
    score = np.zeros(100)
    score[:9] = np.nan  # first full window at step 9
    score[35:45] = 0.9
    score[81] = 0.9
    score[20] = 0.9  # a false alarm, healthy time
    s = metrics.SeriesScores(score, slo_mod.future_label(breach, 3), breach, metrics.episodes(breach, 3))
    s.episodes[0].cause, s.episodes[1].cause = metrics.PRECURSOR, metrics.CRASH
    r = metrics.report([s], 0.5, lead_max=10, step_s=5.0, min_onset=9)
    assert r.events == {"precursor": 1, "crash": 1, "none": 0}
    assert r.warned == {"precursor": 1, "crash": 0, "none": 0}
    assert r.mean_lead_s["precursor"] == 25.0
    # healthy steps: scored (9..99) minus [30, 49] and [70, 84]
    healthy = (100 - 9) - 20 - 15
    assert r.false_alarms_per_day == pytest.approx(1 / (healthy * 5 / 86400))
    # the threshold search keeps false alarms at or under the target
    thr = metrics.threshold_for([s], 0.0, 10, 5.0)
    assert thr > 0.9 and metrics.false_alarms([s], thr, 10, 5.0)[0] == 0


def test_a_precursor_breach_is_warned_only_by_an_alarm_after_its_fault_began() -> None:
    """An alarm inside the lead window but before the precursor fault's first step is no
    warning of it (the target was healthy: chance) and counts as a false alarm; one after the
    fault began is, with its lead from there. A crash keeps its whole window: an alarm before it
    is how a leak of the label would show."""
    breach = np.zeros(100, bool)
    breach[40:50] = True  # onset 40, window [30, 39]
    breach[80:85] = True  # onset 80, window [70, 79]
    score = np.zeros(100)
    score[:9] = np.nan
    score[31] = 0.9  # before the fault (its first step 34): healthy, a false alarm
    score[36] = 0.9  # after it: a warning, 4 steps ahead
    score[72] = 0.9  # before the crash (its first step 78): still a "warning" (chance)
    s = metrics.SeriesScores(score, slo_mod.future_label(breach, 3), breach, metrics.episodes(breach, 3))
    (a, b) = s.episodes
    a.cause, a.fault_step, b.cause, b.fault_step = metrics.PRECURSOR, 34, metrics.CRASH, 78
    r = metrics.report([s], 0.5, lead_max=10, step_s=5.0, min_onset=9)
    assert r.warned == {"precursor": 1, "crash": 1, "none": 0}
    assert (r.mean_lead_s["precursor"], r.mean_lead_s["crash"]) == (20.0, 40.0)
    assert r.false_alarms == 1  # the alarm at 31
    healthy = (100 - 9) - (50 - 34) - (85 - 70)
    assert r.healthy_days == pytest.approx(healthy * 5 / 86400)
    # the alarm after the fault began gone: the precursor breach is missed, not warned at 31
    score[36] = 0.0
    r = metrics.report([s], 0.5, lead_max=10, step_s=5.0, min_onset=9)
    assert r.warned["precursor"] == 0 and r.false_alarms == 1


def test_alarm_policy_alarms_false_alarms_in_faults_and_chance_by_hand() -> None:
    """The same series under the online alarm (fire after 2 steps, resolve after 3 below 0.5):
    the one-step blip is no alarm, a fault that never breaches holds the only false alarm, and
    chance recall is the share of healthy steps with an alarm in the lead window before them."""
    breach = np.zeros(100, bool)
    breach[40:50] = True  # onset 40, warned from 35 (alarm on 36..)
    score = np.zeros(100)
    score[:9] = np.nan
    score[35:45] = 0.9  # alarm on from 36 (2nd step), off at 47 (3rd step below 0.45)
    score[20] = 0.9  # a one-step blip: no alarm
    score[60:64] = 0.9  # alarm 61..65, inside an injected fault that never breaches
    s = metrics.SeriesScores(score, slo_mod.future_label(breach, 3), breach, metrics.episodes(breach, 3),
                             fault_spans=[(58, 70.0)])
    s.episodes[0].cause = metrics.PRECURSOR
    p = AlarmPolicy(fire_steps=2, resolve_steps=3, resolve_ratio=0.5)
    r = metrics.report([s], 0.5, lead_max=10, step_s=5.0, min_onset=9, policy=p)
    assert r.warned["precursor"] == 1 and r.mean_lead_s["precursor"] == 20.0  # 40 - 36 steps
    assert (r.false_alarms, r.false_alarms_in_fault) == (1, 1)
    healthy = [t for t in range(9, 100) if not 30 <= t <= 49]  # scored minus [onset - 10, end]
    on = set(range(36, 47)) | set(range(61, 66))  # every alarm step, the warning's too
    covered = [t for t in healthy if on & set(range(t - 10, t))]
    assert r.chance_recall == pytest.approx(len(covered) / len(healthy))
    assert r.alarm_share == pytest.approx(len(on & set(healthy)) / len(healthy))
    assert r.false_alarms_per_day == pytest.approx(1 / (len(healthy) * 5 / 86400))


def test_an_alarm_left_on_is_charged_every_repeat_and_never_chosen() -> None:
    """Counting onsets alone, an alarm that never resolves has one false alarm however long it
    fires, and a threshold search would happily pick it; its repeats count too."""
    rng = np.random.default_rng(0)
    n = 5000
    score = 0.5 + 0.01 * rng.standard_normal(n)  # no foresight, hovering around 0.5
    score[:9] = np.nan
    breach = np.zeros(n, bool)
    breach[4000:4010] = True
    s = metrics.SeriesScores(score, slo_mod.future_label(breach, 3), breach, metrics.episodes(breach, 3))
    p = AlarmPolicy(fire_steps=2, resolve_steps=3, resolve_ratio=0.5, repeat_s=300.0)  # 60 steps of 5 s
    on = metrics.alarm(s, 0.4, p)
    assert on[11:].all()  # always on below the noise
    n_false, days = metrics.false_alarms([s], 0.4, 10, 5.0, p)
    healthy = (n - 9) - 20 - 3  # minus [3990, 4009] and the 3 steps the alarm resolves in after it
    assert n_false >= healthy // 60 and days == pytest.approx(healthy * 5 / 86400)
    # 4 false alarms per day allows ~1 notification here: the search stays above the noise
    thr = metrics.threshold_for([s], 4.0, 10, 5.0, p)
    assert thr > 0.5 and not metrics.alarm(s, thr, p)[11:].all()


def test_an_ideal_alarm_scores_no_false_alarm_while_it_resolves() -> None:
    """An alarm on exactly over the credited window [onset - lead, end] stays on while it
    resolves (the policy needs 3 scores below): a repeat sent then is the warning's own. One
    left on past those steps is charged as before."""
    breach = np.zeros(100, bool)
    breach[40:50] = True  # onset 40, end 49, credited from 30
    score = np.zeros(100)
    score[:9] = np.nan
    score[30:50] = 0.9  # fires at 31, below from 50: on 50 and 51, off at 52
    s = metrics.SeriesScores(score, slo_mod.future_label(breach, 3), breach, metrics.episodes(breach, 3))
    p = AlarmPolicy(fire_steps=2, resolve_steps=3, resolve_ratio=0.5, repeat_s=95.0)  # 19 steps: 31, 50
    on = metrics.alarm(s, 0.5, p)
    assert np.flatnonzero(on).tolist() == list(range(31, 52))
    assert metrics.resolving(on, 49, 3) == 2
    r = metrics.report([s], 0.5, lead_max=10, step_s=5.0, min_onset=9, policy=p)
    assert r.warned["none"] == 1 and r.false_alarms == 0
    assert r.healthy_days == pytest.approx(((100 - 9) - 20 - 2) * 5 / 86400)
    score[50:60] = 0.9  # on until 62: the repeat at 50 is still excused (3 steps), the one at 69 is not
    score[60:75] = 0.9
    on = metrics.alarm(s, 0.5, p)
    assert metrics.resolving(on, 49, 3) == 3
    r = metrics.report([s], 0.5, lead_max=10, step_s=5.0, min_onset=9, policy=p)
    assert r.false_alarms == 1  # the repeat at 69


def test_a_crash_breaching_in_the_window_it_starts_in_is_a_crash() -> None:
    """Steps are windows [t0 + 5k, t0 + 5k + 5) s: a crash at 491.2 s breaches in window 98
    (490-495 s), which starts before the crash - it is still the crash's episode."""
    t0 = 1_700_000_000_000
    breach = np.zeros(200, bool)
    breach[98:110] = True
    eps = metrics.episodes(breach, 3)
    crash = {"kind": "crash", "start_ms": t0 + 491_200, "end_ms": t0 + 536_700}
    metrics.attribute(eps, [crash], 5.0, t0, 15, ("ramp",))
    assert (eps[0].cause, eps[0].kind, eps[0].fault_step) == (metrics.CRASH, "crash", None)
    metrics.attribute(eps, [crash], 5.0, t0, 15, ("ramp",), ("crash",))
    assert eps[0].fault_step == 98  # a causal kind's first step
    assert metrics.fault_span(crash, 5.0, t0, 15) == (98, 536.7 / 5 + 15)
    # an episode that began before the fault's window is not the fault's
    early = metrics.episodes(np.r_[np.zeros(97, bool), np.ones(5, bool)], 3)
    metrics.attribute(early, [crash], 5.0, t0, 15, ("ramp",), ("crash",))
    assert (early[0].cause, early[0].fault_step) == (metrics.NONE, None)


def test_labels_from_slo_counts() -> None:
    slos = [slo_mod.SloTarget("ttft-p99", "ttft", 800, 0.99),
            slo_mod.SloTarget("avail", "availability", 0, 0.9995, frozenset({"error"}), frozenset({"ok", "error"}))]
    counts = np.zeros((10, len(slo_mod.COUNTS)))
    counts[:, 0] = counts[:, 1] = counts[:, 5] = 50  # requests, with a first token, served
    counts[4, 2] = 1  # one slow TTFT of 50 in step 4: 2 % > 1 % allowed
    b1 = slo_mod.breaches(counts, slos, 1)
    assert b1.tolist() == [i == 4 for i in range(10)]
    b3 = slo_mod.breaches(counts, slos, 3)  # merged over 3 steps: 1 of 150 < 1 %? no: 0.67 % -> ok
    assert not b3.any()
    counts[7, 4] = 1  # one error in 50: availability breach
    assert slo_mod.breaches(counts, slos, 3)[7:10].tolist() == [True, True, True]
    y = slo_mod.future_label(b1, 2)
    assert y.tolist() == [0, 0, 1, 1, 0, 0, 0, 0, -1, -1]


def _frame(rows: list[dict]) -> windowing.Frame:
    out = windowing.empty(windowing.REQUEST_KEYS, windowing.REQUEST_VALUES)
    for k in out:
        vals = [r.get(k, 0.0) for r in rows]
        out[k] = np.asarray(vals, dtype=out[k].dtype if k != "bucket" else np.int64)
    return out


def test_gaps_and_nans_are_masked_and_never_scored() -> None:
    t0 = 1_700_000_000_000
    base = {"model": "6b", "pool": "p", "arm": "a", "requests": 4.0, "ttft_count": 4.0, "itl_n": 10.0,
            "itl_sum_ms": 200.0, "itl_sumsq_ms2": 4400.0, "ttft_p50_ms": 100.0, "ttft_p95_ms": 150.0,
            "ttft_p99_ms": 200.0, "e2e_p95_ms": 900.0, "e2e_p99_ms": 1000.0, "queue_p99_ms": 1.0,
            "ttft_within_slo": 4.0, "e2e_within_slo": 4.0, "output_tokens": 40.0}
    rows = [{**base, "bucket": t0 + i * 5000, "replica": "r0"} for i in range(8) if i != 3]  # step 3 missing
    rows.append({**base, "bucket": t0 + 5 * 5000, "replica": "r1", "ttft_p99_ms": math.nan, "ttft_p50_ms": math.nan,
                 "ttft_count": 0.0, "ttft_within_slo": 0.0, "errors": 4.0})  # all failed: null TTFT
    req = _frame(rows)
    gpu = windowing.empty(windowing.GPU_KEYS, windowing.GPU_VALUES)
    pol = windowing.empty(windowing.POLICY_KEYS, windowing.POLICY_VALUES)
    targets = features.targets_of(req)
    assert [t.id for t in targets] == ["p/*", "p/r0", "p/r1"]
    slos = slo_mod.from_config(__import__("llmsla.config", fromlist=["load"]).load(env={}))
    ts = features.build(req, gpu, pol, targets=targets, t0_ms=t0, n_steps=8, slos=slos)
    r0 = targets.index(features.Target("p", "r0"))
    pool = targets.index(features.Target("p", ""))
    f = features.FEATURES.index
    assert not ts.present[r0, 3, 0] and ts.x[r0, 3, f("qps")] == 0 and math.isnan(ts.x[r0, 3, f("ttft_p99_ms")])
    assert not ts.present[r0, :, 1].any() and not ts.present[r0, :, 2].any()  # no GPU, no policy windows
    # pool: counts add, percentiles are the worst replica's, ITL pooled exactly from sums
    assert ts.x[pool, 5, f("qps")] == 8 / names.REQUEST_WINDOW_S
    assert ts.x[pool, 5, f("ttft_p99_ms")] == 200.0 and ts.x[pool, 5, f("error_ratio")] == 0.5
    assert ts.x[pool, 5, f("itl_mean_ms")] == pytest.approx(20.0)
    assert ts.x[pool, 5, f("itl_jitter_ms")] == pytest.approx(math.sqrt(440 - 400))
    x = np.where(np.isfinite(ts.x), ts.x, np.nan)
    assert np.isnan(x).any()
    scaler = RobustScaler.fit(features.transform(ts.x).reshape(-1, len(features.FEATURES)))
    inputs = fleet_inputs(features.transform(ts.x), ts.present, scaler)
    assert np.all(np.isfinite(inputs)) and inputs.shape == (3, 8, len(features.FEATURES) + len(features.MASKS))
    assert ts.signals[targets.index(features.Target("p", "r1")), 5, 2] == pytest.approx(1 / (1 - 0.9995))


def test_threshold_with_confidence_keeps_a_margin_that_shrinks_with_healthy_days() -> None:
    """With a confidence the budget must hold for the Poisson upper bound of the validation count:
    on one healthy day a single false alarm passes a 1/day budget by count but not by the
    bound (upper 80 % bound of 1 event: 2.99), and no threshold at all passes on too few days."""
    assert metrics.poisson_upper(0, 0.8) == pytest.approx(-math.log(0.2), rel=1e-6)
    assert metrics.poisson_upper(1, 0.8) == pytest.approx(2.994, abs=1e-3)  # chi2(0.8, 4) / 2
    assert metrics.poisson_upper(3, 0.0) == 3.0
    day = int(86400 / 5)

    def series(n_days: int, blips: int) -> metrics.SeriesScores:
        score = np.full(n_days * day, 0.1)
        score[np.linspace(100, len(score) - 100, blips).astype(int)] = 0.9  # false alarms
        none = np.zeros(len(score), bool)
        return metrics.SeriesScores(score, slo_mod.future_label(none, 3), none, [])

    one = [series(1, 1)]
    assert metrics.threshold_for(one, 1.0, 10, 5.0) <= 0.9  # by count: 1 per day is within 1/day
    assert metrics.threshold_for(one, 1.0, 10, 5.0, confidence=0.8) > 0.9  # by the bound: not
    # 1.15 healthy days cannot support 1/day at 80 %: even no alarm at all has a bound of 1.61
    assert metrics.threshold_for([series(1, 0)], 1.0, 10, 5.0, confidence=0.8) > 0.1
    # ten healthy days with 4 false alarms: bound 6.72 over 10 days = 0.67/day, within 1/day
    assert metrics.threshold_for([series(10, 4)], 1.0, 10, 5.0, confidence=0.8) <= 0.9
