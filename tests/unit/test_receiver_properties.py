"""The receiver's bounds hold for any order of alerts and ticks: a pool of four replicas, one
target per replica, driven by random fire/resolve/tick sequences through the pure decisions
against an in-memory fleet that applies every call (as the control API would)."""

from __future__ import annotations

import datetime as dt
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from llmsla.alerting import decide
from llmsla.alerting.decide import Facts, TargetState
from llmsla.alerting.policy import Policy, Rule
from llmsla.alerting.webhook import Alert
from llmsla.control_client import Result

REPLICAS = ("r0", "r1", "r2", "r3")
RULE = Rule("replica-page", {}, "replica", deweight_to=0.25, drain_after_s=5.0,
            restore_weights=(0.25, 0.5, 1.0), restore_step_s=5.0)
POLICY = Policy((RULE,), hold_down_s=10.0, max_hold_down_s=40.0, backoff_reset_s=100.0,
                max_drained_fraction=0.5, rate_actions=10, rate_per_s=60.0)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class Fleet:
    """The control API's replica table for pool ``p``; applies what the receiver calls."""

    def __init__(self) -> None:
        self.reps = {r: {"id": r, "weight": 1.0, "drained": False} for r in REPLICAS}

    def state(self) -> Result:
        body = {"router": {"pools": {"p": [dict(v) for v in self.reps.values()]}}, "distill": {"pools": {}}}
        return Result(True, 200, body, 1, 0.0, "mem")

    def apply(self, call: decide.Call) -> Result:
        rep = self.reps[call.args[0]]
        if call.op == "set_weight":
            rep["weight"] = call.args[1]
        else:
            rep["drained"] = call.op == "drain"
        return Result(True, 200, {}, 1, 0.0, "mem")


def advance(fleet: Fleet, stt: TargetState, now: float) -> TargetState:
    """What Engine._advance does, with the fleet in memory."""
    if not decide.due(stt, now):
        return stt
    for _ in range(decide.MAX_STEPS):
        step = decide.plan(stt, RULE, POLICY, now, Facts())
        if step.need:
            step = decide.plan(stt, RULE, POLICY, now, Facts(fleet.state()))
        stt = step.state
        if step.call is None:
            break
        stt, _, row = decide.after_call(stt, step.call, fleet.apply(step.call), now)
        if row["outcome"] != "applied":
            break
    return stt


def alert(rep: str, status: str, episode: int) -> Alert:
    labels = {"alertname": "Burn", "severity": "page", "pool": "p", "replica": rep}
    return Alert(status, labels, {}, T0 + dt.timedelta(seconds=episode), T0, f"fp-{rep}")


events = st.lists(st.tuples(st.sampled_from(("fire", "resolve", "tick")), st.sampled_from(REPLICAS),
                            st.floats(0.0, 20.0)), max_size=60)


@given(events)
@settings(max_examples=150, deadline=None)
def test_bounds_hold_and_everything_is_restored_in_the_end(seq: list[tuple[str, str, float]]) -> None:
    fleet = Fleet()
    states = {r: TargetState(f"replica:p/{r}", "replica", "p", r) for r in REPLICAS}
    episode = {r: 0 for r in REPLICAS}
    now = 0.0
    cap = math.floor(POLICY.max_drained_fraction * len(REPLICAS))
    for kind, rep, dt_s in seq:
        now += dt_s
        if kind == "tick":
            for r in REPLICAS:
                if not states[r].at_rest:
                    states[r] = advance(fleet, states[r], now)
        else:
            if kind == "fire":
                episode[rep] += 1
            v = decide.on_alert(states[rep], RULE, POLICY, alert(rep, "firing" if kind == "fire" else "resolved",
                                                                  episode[rep]), now)
            states[rep] = advance(fleet, v.state, now) if v.advance else v.state
        # the bounds, after every event
        drained = [r for r, v in fleet.reps.items() if v["drained"]]
        assert len(drained) <= cap, fleet.reps
        assert any(not v["drained"] and v["weight"] > 0 for v in fleet.reps.values()), fleet.reps
        assert all(0 < v["weight"] <= 1.0 for v in fleet.reps.values()), fleet.reps
    # every cause resolved and time enough for the longest hold-down and every restore step
    for r in REPLICAS:
        v = decide.on_alert(states[r], RULE, POLICY, alert(r, "resolved", episode[r]), now)
        states[r] = advance(fleet, v.state, now) if v.advance else v.state
    for _ in range(20):
        now += 60.0
        for r in REPLICAS:
            states[r] = advance(fleet, states[r], now)
    assert all(s.at_rest for s in states.values()), states
    assert all(v == {"id": r, "weight": 1.0, "drained": False} for r, v in fleet.reps.items()), fleet.reps
