"""The receiver's rules, pinned on the pure decisions (alerting/decide.py): each test names the
rule it holds. The control API's answers are hand-made Results; time is a number."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

import pytest

from llmsla.alerting import decide
from llmsla.alerting.decide import Facts, TargetState
from llmsla.alerting.policy import Policy, Rule, Schedule, ShareStep, ShedStep
from llmsla.alerting.webhook import Alert
from llmsla.control_client import Result

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
REPLICA = Rule("replica-page", {}, "replica", deweight_to=0.25, drain_after_s=5.0,
               restore_weights=(0.25, 0.5, 1.0), restore_step_s=5.0)
POOL = Rule("pool-ticket", {}, "pool", student_share=ShareStep(step_pct=10.0, max_pct=30.0, step_s=60.0),
            temperature_schedule=Schedule("cosine", {"t_max": 1.0}))
POLICY = Policy((REPLICA, POOL), hold_down_s=10.0, max_hold_down_s=40.0, backoff_reset_s=100.0,
                max_drained_fraction=0.5, rate_actions=10, rate_per_s=600.0)


def alert(status: str = "firing", fp: str = "fp1", start_s: float = 0.0, severity: str = "page") -> Alert:
    labels = {"alertname": "Burn", "severity": severity, "pool": "p", "replica": "r1"}
    return Alert(status, labels, {}, T0 + dt.timedelta(seconds=start_s), T0, fp)


def replica_state(**kw) -> TargetState:
    return replace(TargetState("replica:p/r1", "replica", "p", "r1"), **kw)


def fleet(*reps: dict, share: float = 5.0, schedule: dict | None = None) -> Result:
    body = {"router": {"pools": {"p": list(reps)}},
            "distill": {"pools": {"p": {"student_share_pct": share, "schedule": schedule or {"name": "constant"}}}}}
    return Result(True, 200, body, 1, 1.0, "http://control")


def ok() -> Result:
    return Result(True, 200, {}, 1, 1.0, "http://control")


def r(rid: str, weight: float = 1.0, drained: bool = False) -> dict:
    return {"id": rid, "weight": weight, "drained": drained}


def fired(st: TargetState | None = None, now: float = 0.0, **kw) -> TargetState:
    v = decide.on_alert(st or replica_state(), REPLICA, POLICY, alert(**kw), now)
    assert v.decision == decide.ACT, v
    return v.state


# -- episodes: dedupe, join, stale, resolve ---------------------------------------------------------
def test_a_replayed_firing_of_the_same_episode_is_stale_and_changes_nothing_but_the_rule() -> None:
    st = fired()
    v = decide.on_alert(st, REPLICA, POLICY, alert(), 1.0)
    assert (v.decision, v.advance) == (decide.STALE, False)
    assert v.state == st


def test_a_second_cause_joins_without_a_new_trip() -> None:
    st = fired()
    v = decide.on_alert(st, REPLICA, POLICY, alert(fp="fp2"), 1.0)
    assert v.decision == decide.JOINED and not v.advance
    assert set(v.state.causes) == {"fp1", "fp2"} and v.state.trips == 1


def test_a_firing_older_than_its_resolve_is_stale() -> None:
    """Reordered delivery: the resolve of an episode arrived first; its firing must not act."""
    st = replica_state()
    v = decide.on_alert(st, REPLICA, POLICY, alert("resolved", start_s=5), 0.0)
    assert v.decision == decide.STALE and v.state.ended == {"fp1": alert(start_s=5).starts_iso}
    assert decide.on_alert(v.state, REPLICA, POLICY, alert(start_s=5), 1.0).decision == decide.STALE


def test_resolve_of_one_of_two_causes_is_partial_and_starts_no_hold_down() -> None:
    st = decide.on_alert(fired(), REPLICA, POLICY, alert(fp="fp2"), 1.0).state
    v = decide.on_alert(st, REPLICA, POLICY, alert("resolved"), 2.0)
    assert v.decision == decide.RESOLVED_PARTIAL and v.state.resolved_at is None and not v.advance


def test_last_resolve_starts_the_hold_down_at_now() -> None:
    st = replace(fired(), stage=decide.DRAINED)
    v = decide.on_alert(st, REPLICA, POLICY, alert("resolved"), 7.0)
    assert v.decision == decide.RESOLVED and v.advance
    assert v.state.resolved_at == 7.0 and not v.state.causes
    assert v.reason == "restore after a hold-down of 10 s"


def test_ended_episodes_are_bounded() -> None:
    st = replica_state(ended={f"f{i}": alert(start_s=i).starts_iso for i in range(decide.MAX_ENDED)})
    v = decide.on_alert(st, REPLICA, POLICY, alert("resolved", fp="new", start_s=10_000), 0.0)
    assert len(v.state.ended) == decide.MAX_ENDED and "f0" not in v.state.ended and "new" in v.state.ended


def test_the_input_state_is_never_changed() -> None:
    st = fired()
    before = st.dump()
    decide.on_alert(st, REPLICA, POLICY, alert(fp="fp2"), 1.0)
    decide.on_alert(st, REPLICA, POLICY, alert("resolved"), 1.0)
    decide.replica_step(st, REPLICA, POLICY, 1.0, Facts(fleet(r("r1"), r("r0"))))
    assert st.dump() == before


# -- hysteresis: hold-down and its backoff ----------------------------------------------------------
def test_trips_within_backoff_reset_double_the_hold_down_up_to_the_cap() -> None:
    st = replica_state()
    holds = []
    for i in range(4):
        st = fired(replace(st, stage=decide.DEWEIGHTED), now=20.0 * i, start_s=20.0 * i)
        holds.append(POLICY.hold_down(st.trips))
        st = decide.on_alert(st, REPLICA, POLICY, alert("resolved", start_s=20.0 * i), 20.0 * i + 1).state
    assert holds == [10.0, 20.0, 40.0, 40.0]


def test_a_quiet_period_longer_than_backoff_reset_forgets_the_trips() -> None:
    st = replace(fired(now=0.0), stage=decide.NORMAL, causes={})
    st = fired(st, now=101.0, start_s=101.0)
    assert st.trips == 1


def test_nothing_is_restored_before_the_hold_down_ends() -> None:
    st = replica_state(stage=decide.DRAINED, resolved_at=100.0, trips=1, base_weight=2.0, weight_frac=0.25)
    assert decide.replica_step(st, REPLICA, POLICY, 109.9, Facts()).call is None
    call = decide.replica_step(st, REPLICA, POLICY, 110.0, Facts()).call
    assert call is not None and call.op == "undrain"


# -- the replica ladder --------------------------------------------------------------------------
def test_first_trip_deweights_to_the_rules_fraction_of_the_current_weight() -> None:
    st = fired()
    assert decide.replica_step(st, REPLICA, POLICY, 0.0, Facts()).need == "fleet"
    step = decide.replica_step(st, REPLICA, POLICY, 0.0, Facts(fleet(r("r1", 2.0), r("r0"))))
    assert step.call is not None and (step.call.op, step.call.args[:2]) == ("set_weight", ("r1", 0.5))
    st2, audits, row = decide.after_call(step.state, step.call, ok(), 0.0)
    assert (st2.stage, st2.weight_frac, st2.base_weight) == (decide.DEWEIGHTED, 0.25, 2.0)
    assert row["outcome"] == "applied" and audits[0]["decision"] == "deweight"


def test_drain_waits_for_drain_after_s_and_takes_the_pools_drain_lock() -> None:
    st = replace(fired(), stage=decide.DEWEIGHTED, stage_since=0.0, base_weight=1.0, weight_frac=0.25)
    assert decide.replica_step(st, REPLICA, POLICY, 4.9, Facts()) == decide.Step(st)
    step = decide.replica_step(st, REPLICA, POLICY, 5.0, Facts())
    assert (step.need, step.serialize) == ("fleet", "drain:p")


def test_never_drain_the_last_healthy_replica_and_say_so_once() -> None:
    st = replace(fired(), stage=decide.DEWEIGHTED, base_weight=1.0, weight_frac=0.25)
    facts = Facts(fleet(r("r1"), r("r0", drained=True), r("r2", weight=0.0)))
    step = decide.replica_step(st, REPLICA, POLICY, 10.0, facts)
    assert step.call is None and "last healthy replica" in step.state.blocked
    assert [a["decision"] for a in step.audits] == ["blocked"]
    again = decide.replica_step(step.state, REPLICA, POLICY, 11.0, facts)
    assert again.audits == () and again.call is None  # re-checked, audited once


def test_at_most_max_drained_fraction_of_a_pool_is_drained() -> None:
    st = replace(fired(), stage=decide.DEWEIGHTED, base_weight=1.0, weight_frac=0.25)
    # 4 replicas, 0.5 -> at most 2 drained; one already is
    two = Facts(fleet(r("r1"), r("r0", drained=True), r("r2"), r("r3")))
    assert decide.replica_step(st, REPLICA, POLICY, 10.0, two).call.op == "drain"
    three = Facts(fleet(r("r1"), r("r0", drained=True), r("r2", drained=True), r("r3")))
    step = decide.replica_step(st, REPLICA, POLICY, 10.0, three)
    assert step.call is None and "max_drained_fraction = 0.5" in step.state.blocked


def test_restore_steps_through_the_weights_one_per_restore_step_s_then_rests() -> None:
    st = replica_state(rule=REPLICA.name, stage=decide.DRAINED, resolved_at=0.0, trips=1, base_weight=2.0,
                       weight_frac=0.25)
    seen, now = [], 10.0
    for _ in range(6):
        step = decide.replica_step(st, REPLICA, POLICY, now, Facts())
        if step.call is None:
            st = step.state
            now += 5.0
            continue
        seen.append((step.call.op, step.call.args[1] if step.call.op == "set_weight" else None))
        st, _, _ = decide.after_call(step.state, step.call, ok(), now)
    assert seen == [("undrain", None), ("set_weight", 1.0), ("set_weight", 2.0)]
    assert (st.stage, st.base_weight, st.weight_frac) == (decide.NORMAL, None, 1.0)


def test_an_unknown_replica_is_forgotten_until_a_new_episode() -> None:
    st = fired()
    step = decide.replica_step(st, REPLICA, POLICY, 0.0, Facts(fleet(r("r0"))))
    assert step.state.unknown and step.state.stage == decide.NORMAL and step.call is None
    assert not decide.due(step.state, 1.0)
    st = decide.on_alert(step.state, REPLICA, POLICY, alert("resolved"), 1.0).state
    assert decide.due(fired(st, now=2.0, start_s=2.0), 2.0)


# -- rate limit and retries ----------------------------------------------------------------------
def test_rate_limit_refuses_the_n_plus_first_write_in_the_window_and_audits_once() -> None:
    pol = replace(POLICY, rate_actions=2, rate_per_s=60.0)
    st = replace(fired(), actions=(1.0, 2.0))
    step = decide.replica_step(st, REPLICA, pol, 3.0, Facts(fleet(r("r1"), r("r0"))))
    assert step.call is None and [a["decision"] for a in step.audits] == ["rate_limited"]
    assert decide.replica_step(step.state, REPLICA, pol, 4.0, Facts()).audits == ()
    # the window slides: the writes of t=1, 2 are out of it at t=62
    assert decide.replica_step(step.state, REPLICA, pol, 62.0, Facts()).need == "fleet"


@pytest.mark.parametrize(("res", "outcome", "retry_at"), [
    (Result(False, 503, {}, 3, 1.0, "u", "busy"), "failed", 101.0),
    (Result(False, 409, {}, 1, 1.0, "u", "no", refused=True), "refused", 101.0),
])
def test_a_failed_write_backs_off_exponentially(res: Result, outcome: str, retry_at: float) -> None:
    step = decide.replica_step(fired(), REPLICA, POLICY, 100.0, Facts(fleet(r("r1"), r("r0"))))
    st, _, row = decide.after_call(step.state, step.call, res, 100.0)
    assert row["outcome"] == outcome and st.stage == decide.NORMAL
    assert (st.failures, st.retry_at) == (1, retry_at) and not decide.due(st, retry_at - 0.1)
    st, _, _ = decide.after_call(st, step.call, res, 200.0)
    assert st.retry_at == 202.0  # 1, 2, 4 ... s
    st = replace(st, failures=20)
    assert decide.after_call(st, step.call, res, 0.0)[0].retry_at == decide.MAX_RETRY_S


def test_a_repeated_refusal_is_audited_once() -> None:
    step = decide.replica_step(fired(), REPLICA, POLICY, 0.0, Facts(fleet(r("r1"), r("r0"))))
    no = Result(False, 409, {}, 1, 1.0, "u", "last healthy", refused=True)
    st, first, _ = decide.after_call(step.state, step.call, no, 0.0)
    _, second, _ = decide.after_call(st, step.call, no, 1.0)
    assert len(first) == 1 and second == ()


def test_a_404_is_permanent() -> None:
    step = decide.replica_step(fired(), REPLICA, POLICY, 0.0, Facts(fleet(r("r1"), r("r0"))))
    st, audits, _ = decide.after_call(step.state, step.call, Result(False, 404, {}, 1, 1.0, "u", "unknown",
                                                                     refused=True, permanent=True), 0.0)
    assert st.unknown and "refused for good" in audits[0]["reason"] and st.failures == 0


def test_state_unavailable_backs_off_without_a_write() -> None:
    down = Result(False, 0, None, 3, 1.0, "u", "ConnectionRefused")
    step = decide.replica_step(fired(), REPLICA, POLICY, 50.0, Facts(down))
    assert step.call is None and step.state.retry_at == 51.0 and step.audits[0]["outcome"] == "failed"


# -- the pool ------------------------------------------------------------------------------------
def pool_state(**kw) -> TargetState:
    return replace(TargetState("pool:p", "pool", "p"), **kw)


def pool_fired() -> TargetState:
    return decide.on_alert(pool_state(), POOL, POLICY, alert(), 0.0).state


def test_a_pool_waits_while_one_of_its_replicas_is_under_a_replica_action() -> None:
    st = pool_fired()
    assert decide.pool_step(st, POOL, POLICY, 0.0, Facts()).need == "busy"
    step = decide.pool_step(st, POOL, POLICY, 0.0, Facts(busy="r1"))
    assert step.call is None and decide.deferred(step.state, "firing").startswith("deferred: replica r1")
    assert decide.pool_step(step.state, POOL, POLICY, 1.0, Facts(busy="r1")).audits == ()  # once


def test_a_pool_shift_sets_the_schedule_then_steps_the_share_up_to_max() -> None:
    st, now, calls = pool_fired(), 0.0, []
    facts = Facts(fleet(r("r1"), share=5.0, schedule={"name": "constant", "params": {}}), busy="")
    for _ in range(8):
        step = decide.pool_step(st, POOL, POLICY, now, facts)
        if step.call is not None:
            calls.append((step.call.op, step.call.args[1]))
            st, _, _ = decide.after_call(step.state, step.call, ok(), now)
        else:
            st = step.state
            now += 60.0
    assert calls == [("set_schedule", "cosine"), ("set_student_share", 15.0), ("set_student_share", 25.0),
                     ("set_student_share", 30.0)]
    assert (st.stage, st.baseline_pct, st.share_pct) == (decide.SHIFTED, 5.0, 30.0)


def test_a_pool_restore_puts_the_schedule_back_then_steps_down_to_the_baseline() -> None:
    st = pool_state(rule=POOL.name, stage=decide.SHIFTED, resolved_at=0.0, trips=1, baseline_pct=5.0,
                    share_pct=30.0, prev_schedule={"name": "constant", "params": {}}, schedule_set=True,
                    last_step_at=0.0)
    now, calls = 10.0, []
    for _ in range(10):
        step = decide.pool_step(st, POOL, POLICY, now, Facts())
        if step.call is not None:
            calls.append((step.call.op, step.call.args[1]))
            st, _, _ = decide.after_call(step.state, step.call, ok(), now)
        else:
            st = step.state
            now += 60.0
    assert calls == [("set_schedule", "constant"), ("set_student_share", 20.0), ("set_student_share", 10.0),
                     ("set_student_share", 5.0)]
    assert (st.stage, st.baseline_pct, st.share_pct, st.schedule_set) == (decide.NORMAL, None, None, False)


def test_a_pool_missing_from_the_control_api_is_forgotten() -> None:
    empty = Result(True, 200, {"router": {"pools": {}}, "distill": {}}, 1, 1.0, "u")
    step = decide.pool_step(pool_fired(), POOL, POLICY, 0.0, Facts(empty, busy=""))
    assert step.state.unknown and step.audits[0]["outcome"] == "refused"


def test_state_round_trips_through_the_journal_form() -> None:
    st = replace(fired(), actions=(1.0, 2.0))
    raw = st.dump()
    assert raw["actions"] == [1.0, 2.0]
    assert TargetState.load(raw, st.key, REPLICA, {}) == st


# -- class: shedding the classes below the paging one ------------------------------------------------
CLASS = Rule("class-burn", {}, "class", shed=ShedStep(step=0.25, max_share=0.5, step_s=60.0))


def shed_fleet(order: list[str] | None = None, pools: dict | None = None) -> Result:
    body = {"router": {"pools": {"p": []}}, "distill": {"pools": {}},
            "shed": {"classes": order or ["interactive", "batch", "sheddable"], "protected": "interactive",
                     "pools": {"p": {}} if pools is None else pools}}
    return Result(True, 200, body, 1, 1.0, "http://control")


def class_state(cls: str = "interactive") -> TargetState:
    st = TargetState.load(None, f"class:p/{cls}", CLASS, {})
    v = decide.on_alert(st, CLASS, POLICY, alert(), 0.0)
    assert v.decision == decide.ACT and (v.state.pool, v.state.class_) == ("p", cls)
    return v.state


def test_a_class_page_sheds_every_class_below_it_and_never_the_protected_one() -> None:
    st = class_state()
    assert decide.plan(st, CLASS, POLICY, 0.0, Facts()).need == "fleet"
    step = decide.plan(st, CLASS, POLICY, 0.0, Facts(fleet=shed_fleet()))
    assert step.call.op == "set_shed" and step.call.args[:2] == ("p", {"batch": 0.25, "sheddable": 0.25})
    st, _, _ = decide.after_call(step.state, step.call, ok(), 0.0)
    assert decide.plan(st, CLASS, POLICY, 59.0, Facts()).call is None  # step_s
    step = decide.plan(st, CLASS, POLICY, 60.0, Facts())  # the order is known: no second read
    assert step.call.args[1] == {"batch": 0.5, "sheddable": 0.5}
    st, _, _ = decide.after_call(step.state, step.call, ok(), 60.0)
    assert decide.plan(st, CLASS, POLICY, 500.0, Facts()).call is None  # max_share
    batch = class_state("batch")
    step = decide.plan(batch, CLASS, POLICY, 0.0, Facts(fleet=shed_fleet()))
    assert step.call.args[1] == {"sheddable": 0.25}


def test_shedding_steps_down_after_the_hold_down_then_rests() -> None:
    st = class_state()
    for now in (0.0, 60.0):
        step = decide.plan(st, CLASS, POLICY, now, Facts(fleet=shed_fleet()))
        st, _, _ = decide.after_call(step.state, step.call, ok(), now)
    st = decide.on_alert(st, CLASS, POLICY, alert("resolved"), 100.0).state
    assert decide.plan(st, CLASS, POLICY, 109.0, Facts()).call is None  # hold-down 10 s
    step = decide.plan(st, CLASS, POLICY, 110.0, Facts())
    assert (step.call.decision, step.call.args[1]) == ("unshed", {"batch": 0.25, "sheddable": 0.25})
    st, _, _ = decide.after_call(step.state, step.call, ok(), 110.0)
    assert decide.plan(st, CLASS, POLICY, 169.0, Facts()).call is None
    step = decide.plan(st, CLASS, POLICY, 170.0, Facts())
    assert step.call.args[1] == {"batch": 0.0, "sheddable": 0.0}
    st, _, _ = decide.after_call(step.state, step.call, ok(), 170.0)
    rest = decide.plan(st, CLASS, POLICY, 300.0, Facts())
    assert rest.call is None and rest.state.at_rest and rest.state.shed_share is None


@pytest.mark.parametrize(("cls", "fleet_", "why"), [
    ("sheddable", shed_fleet(), "no class below it"),
    ("gold", shed_fleet(), "not one of the control API's classes"),
    ("interactive", shed_fleet(pools={}), "pool 'p' is not in the control API's shedding state"),
    ("interactive", fleet(), "no load shedding"),
])
def test_a_class_that_cannot_shed_is_refused_once_and_forgotten(cls: str, fleet_: Result, why: str) -> None:
    step = decide.plan(class_state(cls), CLASS, POLICY, 0.0, Facts(fleet=fleet_))
    assert step.call is None and step.state.unknown and why in step.audits[0]["reason"]
    assert step.audits[0]["outcome"] == "refused"
    assert not decide.due(step.state, 1.0)  # no more calls until a new episode


def test_class_state_round_trips_through_the_journal_form() -> None:
    st = class_state()
    step = decide.plan(st, CLASS, POLICY, 0.0, Facts(fleet=shed_fleet()))
    st, _, _ = decide.after_call(step.state, step.call, ok(), 0.0)
    assert TargetState.load(json.loads(json.dumps(st.dump())), st.key, CLASS, {}) == st


def test_a_class_target_takes_pool_and_class_from_the_labels() -> None:
    key = CLASS.target_key({"pool": "p", "class": "a/b"})
    st = TargetState.load(None, key, CLASS, {"pool": "p", "class": "a/b"})
    assert (key, st.pool, st.class_) == ("class:p/a/b", "p", "a/b")
    protect = Rule("fc", {}, "class", shed=ShedStep(0.5, 0.5, 60.0, protect="interactive"))
    key = protect.target_key({"pool": "p"})  # a forecaster warning: no class label
    assert key == "class:p/interactive" and TargetState.load(None, key, protect, {"pool": "p"}).class_ == "interactive"
