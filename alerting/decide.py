"""The receiver's decisions as pure functions: (target state, input, now) -> (actions, new state).

Why: the rules (dedupe per episode, hysteresis, backoff, bounds, rate limit, retry) are what an
operator must trust, so they are tested on their own in ``tests/unit`` without a store or a
control API. Nothing here reads a clock, a journal or the network: time and the control API's
answers are inputs; audit rows and control calls are outputs that :mod:`engine` performs.
The state machine itself is described in :mod:`llmsla.alerting.engine` and docs/alerting.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from llmsla import names
from llmsla.alerting.policy import TARGET_CLASS, TARGET_POOL, Policy, Rule
from llmsla.alerting.webhook import FIRING, Alert
from llmsla.seams import ControlAnswer

NORMAL, DEWEIGHTED, DRAINED, RESTORING, SHIFTED, SHEDDING = (
    "normal", "deweighted", "drained", "restoring", "shifted", "shedding")
#: Decisions (the ``decision`` column of the alert's audit row).
ACT, JOINED, DUPLICATE, STALE, RESOLVED, RESOLVED_PARTIAL, NO_RULE, UNROUTABLE, DEFERRED, INVALID = (
    "act", "joined", "duplicate", "stale", "resolved", "resolved_partial", "no_rule", "unroutable", "deferred",
    "invalid")
MAX_ENDED = 200
MAX_RETRY_S = 60.0
#: the most control writes one advance makes (a step may make the next one due at once)
MAX_STEPS = 4


@dataclass(frozen=True)
class TargetState:
    """One target's state, as the journal stores it (:meth:`dump`). Never changed in place:
    every decision returns a new one (the dicts inside are copied on write too)."""

    key: str
    kind: str
    pool: str
    replica: str = ""
    rule: str = ""
    causes: dict[str, dict[str, str]] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)
    stage: str = NORMAL
    stage_since: float = 0.0
    resolved_at: float | None = None
    trips: int = 0
    last_trip: float = 0.0
    actions: tuple[float, ...] = ()
    failures: int = 0
    retry_at: float = 0.0
    blocked: str = ""
    #: why the control API does not know this target (a 404 or absent from its state): no more
    #: calls for it until a new episode fires (the fleet may have changed by then)
    unknown: str = ""
    # replica
    base_weight: float | None = None
    weight_frac: float = 1.0
    # pool
    baseline_pct: float | None = None
    share_pct: float | None = None
    last_step_at: float | None = None
    prev_schedule: dict[str, Any] | None = None
    schedule_set: bool = False
    # class: the classes below it that this target sheds, and the share it set
    class_: str = ""
    shed_classes: tuple[str, ...] | None = None
    shed_share: float | None = None

    @classmethod
    def load(cls, raw: dict[str, Any] | None, key: str, rule: Rule | None, labels: dict[str, str]) -> TargetState:
        if raw:
            known = set(cls.__dataclass_fields__)
            kw = {k: v for k, v in raw.items() if k in known}
            if "actions" in kw:
                kw["actions"] = tuple(kw["actions"])
            if kw.get("shed_classes") is not None:
                kw["shed_classes"] = tuple(kw["shed_classes"])
            return cls(**kw)
        kind = rule.target if rule else key.split(":", 1)[0]
        if kind == TARGET_CLASS:  # class:<pool>/<class>: the labels the rule built it from
            pool, _, klass = key.split(":", 1)[1].partition("/")
            protect = rule.shed.protect if rule is not None and rule.shed is not None else ""
            return cls(key=key, kind=kind, pool=labels.get(names.L_POOL) or pool,
                       class_=labels.get(names.L_CLASS) or protect or klass)
        return cls(key=key, kind=kind, pool=labels.get(names.L_POOL, ""),
                   replica=labels.get(names.L_REPLICA, "") if kind != TARGET_POOL else "")

    def dump(self) -> dict[str, Any]:
        out = asdict(self)
        out["actions"] = list(self.actions)
        return out

    @property
    def at_rest(self) -> bool:
        """Nothing firing and nothing to undo: the reconciler skips it."""
        return self.stage == NORMAL and not self.causes


# -- one alert ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """What one alert does to its target: the audited decision and whether to act now."""

    decision: str
    reason: str
    state: TargetState
    advance: bool = False  # a new episode or the last resolve: the shell advances the target


def on_alert(st: TargetState, rule: Rule, policy: Policy, alert: Alert, now: float) -> Verdict:
    """Dedupe by episode (``startsAt``), join concurrent causes, count trips for the hold-down's
    backoff and start the hold-down on the last resolve."""
    fp, starts = alert.fingerprint, alert.starts_iso
    st = replace(st, rule=rule.name)
    if alert.status == FIRING:
        if st.ended.get(fp, "") >= starts:
            return Verdict(STALE, "a resolve of this or a later episode was already received", st)
        if fp in st.causes and st.causes[fp]["startsAt"] >= starts:
            return Verdict(STALE, "this or a later episode is already firing", st)
        first = not st.causes
        cause = {"startsAt": starts, "alertname": alert.name,
                 "severity": alert.labels.get(names.L_SEVERITY, ""), "slo": alert.labels.get(names.L_SLO, "")}
        st = replace(st, causes={**st.causes, fp: cause})
        if not first:
            return Verdict(JOINED, f"{len(st.causes)} alerts now point at {st.key}; acting already", st)
        trips = 0 if st.stage == NORMAL and now - st.last_trip > policy.backoff_reset_s else st.trips
        # a new episode: look the target up again (``unknown`` cleared)
        st = replace(st, trips=trips + 1, last_trip=now, resolved_at=None, retry_at=0.0, unknown="")
        return Verdict(ACT, f"trip {st.trips} of {st.key} ({rule.name})", st, advance=True)
    if st.ended.get(fp, "") < starts:
        ended = {**st.ended, fp: starts}
        if len(ended) > MAX_ENDED:
            for k in sorted(ended, key=ended.__getitem__)[: len(ended) - MAX_ENDED]:
                del ended[k]
        st = replace(st, ended=ended)
    known = st.causes.get(fp)
    if known is None or known["startsAt"] > starts:
        return Verdict(STALE, "no firing episode of this alert is known", st)
    st = replace(st, causes={k: v for k, v in st.causes.items() if k != fp})
    if st.causes:
        return Verdict(RESOLVED_PARTIAL, f"{len(st.causes)} other alerts still point at {st.key}", st)
    st = replace(st, resolved_at=now, retry_at=0.0)
    hold = policy.hold_down(st.trips)
    return Verdict(RESOLVED, f"restore after a hold-down of {hold:g} s" if st.stage != NORMAL else "nothing to restore",
                   st, advance=True)


def deferred(st: TargetState, status: str) -> str:
    """The reason a firing pool alert was deferred to a replica action, else ``""``."""
    if status == FIRING and st.kind == TARGET_POOL and st.blocked.startswith("deferred"):
        return st.blocked
    return ""


# -- the next control action ------------------------------------------------------------------------
@dataclass(frozen=True)
class Facts:
    """What the shell read for this step (``None``: not read yet; the step asks via ``need``)."""

    fleet: ControlAnswer | None = None  # the control API's ``GET /v1/state``
    busy: str | None = None  # a replica of the pool under a replica action ("" = none)


@dataclass(frozen=True)
class Call:
    """One control API write: ``ControlClient.<op>(*args)``, then ``on_ok`` if it applied."""

    op: str
    args: tuple[Any, ...]
    decision: str
    action: str
    request: dict[str, Any]
    on_ok: dict[str, Any] = field(default_factory=dict)
    settle: bool = False  # after ``on_ok``: back to normal when fully restored


@dataclass(frozen=True)
class Step:
    """The outcome of one planning step. With ``need`` set nothing else counts: the shell reads
    that fact (taking the ``serialize`` lock first, if named) and plans again from the same state."""

    state: TargetState
    audits: tuple[dict[str, Any], ...] = ()
    call: Call | None = None
    need: str = ""  # "fleet" or "busy"
    serialize: str = ""


def due(st: TargetState, now: float) -> bool:
    """Not backing off after a failed call and not a target the control API does not know."""
    return not (now < st.retry_at or st.unknown)


def reason(st: TargetState, what: str) -> str:
    causes = ", ".join(sorted({f"{c['alertname']}/{c['severity']}" for c in st.causes.values()})) or "resolved"
    return f"{what} ({causes}; {st.rule})"


def forget(st: TargetState, why: str) -> TargetState:
    """The target does not exist: nothing to act on and nothing to restore; no more calls
    until a new episode (``unknown``), the causes stay so their resolves still match."""
    return replace(st, unknown=why, stage=NORMAL, failures=0, retry_at=0.0, blocked="", base_weight=None,
                   weight_frac=1.0, baseline_pct=None, share_pct=None, prev_schedule=None, last_step_at=None,
                   schedule_set=False, shed_classes=None, shed_share=None)


def settle(st: TargetState, now: float) -> TargetState:
    """Fully restored: back to rest (trips stay, for the backoff of the next hold-down)."""
    if st.weight_frac >= 1 - 1e-9:
        return replace(st, stage=NORMAL, stage_since=now, base_weight=None, weight_frac=1.0, blocked="")
    return st


def backoff(st: TargetState, now: float) -> TargetState:
    """One more failure: retry after 1, 2, 4 ... s, at most :data:`MAX_RETRY_S`."""
    failures = st.failures + 1
    return replace(st, failures=failures, retry_at=now + min(MAX_RETRY_S, 2.0 ** (failures - 1)))


def rate_limit(st: TargetState, policy: Policy, now: float, action: str) -> tuple[TargetState, tuple[dict, ...], bool]:
    """At most ``rate_actions`` writes per target per ``rate_per_s``; a refusal is audited once
    while its reason stays the same."""
    st = replace(st, actions=tuple(t for t in st.actions if now - t < policy.rate_per_s))
    if len(st.actions) < policy.rate_actions:
        return st, (), True
    why = f"rate limited: {len(st.actions)} actions on {st.key} in the last {policy.rate_per_s:g} s"
    if st.blocked == why:
        return st, (), False
    return (replace(st, blocked=why),
            ({"action": action, "target": st.key, "decision": "rate_limited", "outcome": "refused", "reason": why},),
            False)


def refuse(st: TargetState, action: str, decision: str, why: str) -> Step:
    """A bound said no: audited once while the reason stays (re-checked every tick)."""
    if st.blocked == why:
        return Step(st)
    st = replace(st, blocked=why)
    return Step(st, ({"action": action, "target": st.key, "decision": decision, "outcome": "refused",
                      "reason": reason(st, why)},))


def fleet_pool(st: TargetState, fleet: ControlAnswer, action: str, decision: str, now: float
               ) -> tuple[TargetState, tuple[dict, ...], tuple[list[dict], dict] | None]:
    """The target's pool in the control API's state: (replicas, distillation settings), or
    ``None`` with the state and audit of why not (unavailable: retried; absent: forgotten)."""
    if not fleet.ok or not isinstance(fleet.body, dict):
        st = backoff(st, now)
        return st, ({"action": action, "target": st.key, "decision": decision, "outcome": "failed",
                     "latency_ms": fleet.latency_ms, "reason": f"control API state unavailable: {fleet.error or fleet.status}",
                     "params": {"response": fleet.summary()}},), None
    router = fleet.body.get("router", {})
    distill = fleet.body.get("distill", {})
    pools = router.get("pools", {})
    if not isinstance(pools, dict) or st.pool not in pools:
        why = f"{decision} refused for good: pool {st.pool!r} is not in the control API's state; not retried"
        st = forget(st, why)
        return st, ({"action": action, "target": st.key, "decision": decision, "outcome": "refused",
                     "latency_ms": fleet.latency_ms, "reason": reason(st, why),
                     "params": {"response": fleet.summary()}},), None
    return st, (), (list(pools.get(st.pool) or []), distill.get("pools", {}).get(st.pool, {}))


def plan(st: TargetState, rule: Rule, policy: Policy, now: float, facts: Facts) -> Step:
    """The target's next step: a control call, a refusal, a state change, or nothing."""
    if st.kind == TARGET_CLASS:
        return class_step(st, rule, policy, now, facts)
    return (pool_step if st.kind == TARGET_POOL else replica_step)(st, rule, policy, now, facts)


def replica_step(st: TargetState, rule: Rule, policy: Policy, now: float, facts: Facts) -> Step:
    """Deweight at once, drain after ``drain_after_s`` (never the last healthy replica, at most
    ``max_drained_fraction`` of the pool); after the hold-down, restore step by step."""
    if st.causes:
        want_deweight = st.stage in (NORMAL, RESTORING) and rule.deweight_to is not None
        want_drain = (st.stage in (NORMAL, RESTORING) and rule.deweight_to is None) or (
            st.stage == DEWEIGHTED and rule.drain_after_s is not None and now - st.stage_since >= rule.drain_after_s)
        if not (want_deweight or want_drain):
            return Step(st)
        action = "set_weight" if want_deweight else "drain"
        st, audits, ok = rate_limit(st, policy, now, action)
        if not ok:
            return Step(st, audits)
        if facts.fleet is None:
            # one drain decision per pool at a time (receivers and targets alike): the count of
            # drained replicas read from the fleet must not change before this drain is applied
            return Step(st, need="fleet", serialize=f"drain:{st.pool}" if want_drain else "")
        st, audits, fleet = fleet_pool(st, facts.fleet, action, "deweight" if want_deweight else "drain", now)
        if fleet is None:
            return Step(st, audits)
        reps, _ = fleet
        me = next((r for r in reps if r.get("id") == st.replica), None)
        if me is None:
            why = (f"{action} refused for good: replica {st.replica!r} is not in pool {st.pool!r} of the "
                   "control API; not retried")
            st = forget(st, why)
            return Step(st, ({"action": action, "target": st.key, "decision": "unknown", "outcome": "refused",
                              "reason": reason(st, why)},))
        if st.stage == NORMAL or st.base_weight is None:
            st = replace(st, base_weight=float(me.get("weight", 1.0)) or 1.0)
        if want_deweight:
            frac = min(rule.deweight_to or 1.0, st.weight_frac if st.stage == RESTORING else 1.0)
            w = round((st.base_weight if st.base_weight is not None else 1.0) * frac, 6)
            return Step(st, call=Call("set_weight", (st.replica, w, reason(st, "deweight")), "deweight", "set_weight",
                                      {"replica": st.replica, "weight": w},
                                      {"stage": DEWEIGHTED, "stage_since": now, "weight_frac": frac}))
        others = [r for r in reps if r.get("id") != st.replica]
        healthy = [r for r in others if not r.get("drained") and float(r.get("weight", 1.0)) > 0]
        if not healthy:
            return refuse(st, "drain", "blocked", f"not draining {st.replica}: it is the last healthy replica of pool {st.pool}")
        cap = math.floor(policy.max_drained_fraction * len(reps) + 1e-9)
        drained = sum(1 for r in others if r.get("drained"))
        if drained + 1 > cap:
            return refuse(st, "drain", "blocked",
                          f"not draining {st.replica}: {drained} of {len(reps)} replicas of pool {st.pool} are "
                          f"drained and max_drained_fraction = {policy.max_drained_fraction:g}")
        return Step(st, call=Call("drain", (st.replica, reason(st, "drain")), "drain", "drain", {"replica": st.replica},
                                  {"stage": DRAINED, "stage_since": now}))
    # no cause firing: restore after the hold-down, one step per restore_step_s
    if st.stage == NORMAL or st.resolved_at is None or now - st.resolved_at < policy.hold_down(st.trips):
        return Step(st)
    base = st.base_weight or 1.0
    first = rule.restore_weights[0]
    if st.stage == DRAINED:
        st, audits, ok = rate_limit(st, policy, now, "undrain")
        if not ok:
            return Step(st, audits)
        if abs(st.weight_frac - first) > 1e-9:
            # the weight it comes back at, set while still drained (no traffic yet)
            w = round(base * first, 6)
            return Step(st, call=Call("set_weight", (st.replica, w, reason(st, f"restore at {first:g}")), "restore",
                                      "set_weight", {"replica": st.replica, "weight": w}, {"weight_frac": first}))
        return Step(st, call=Call("undrain", (st.replica, reason(st, "restore: undrain")), "restore", "undrain",
                                  {"replica": st.replica}, {"stage": RESTORING, "stage_since": now}, settle=True))
    if st.stage == RESTORING and now - st.stage_since < rule.restore_step_s:
        return Step(st)
    nxt = next((w for w in rule.restore_weights if w > st.weight_frac + 1e-9), None)
    if nxt is None:
        return Step(settle(replace(st, weight_frac=1.0), now))
    st, audits, ok = rate_limit(st, policy, now, "set_weight")
    if not ok:
        return Step(st, audits)
    w = round(base * nxt, 6)
    return Step(st, call=Call("set_weight", (st.replica, w, reason(st, f"restore {nxt:g}")), "restore", "set_weight",
                              {"replica": st.replica, "weight": w},
                              {"stage": RESTORING, "stage_since": now, "weight_frac": nxt}, settle=True))


def pool_step(st: TargetState, rule: Rule, policy: Policy, now: float, facts: Facts) -> Step:
    """Switch the schedule and raise the student share step by step up to ``max_pct`` (unless a
    replica of the pool is under a replica action); after the hold-down, undo both."""
    share = rule.student_share
    sched = rule.temperature_schedule
    if st.causes:
        if rule.skip_if_replica_action:
            if facts.busy is None:
                return Step(st, need="busy")
            if facts.busy:
                why = f"deferred: replica {facts.busy} of pool {st.pool} is under a replica action and explains the burn"
                if st.blocked == why:
                    return Step(st)
                return Step(replace(st, blocked=why), ({"action": "shift", "target": st.key, "decision": "deferred",
                                                         "outcome": "refused", "reason": why},))
            if st.blocked.startswith("deferred"):
                st = replace(st, blocked="")
        if st.stage in (NORMAL, RESTORING) and st.baseline_pct is None:
            if facts.fleet is None:
                return Step(st, need="fleet")
            st, audits, fleet = fleet_pool(st, facts.fleet, "shift", "shift", now)
            if fleet is None:
                return Step(st, audits)
            _, pc = fleet
            baseline = float(pc.get("student_share_pct", 0.0))
            st = replace(st, baseline_pct=baseline, share_pct=baseline, prev_schedule=pc.get("schedule"))
        if st.stage != SHIFTED:
            st = replace(st, stage=SHIFTED, stage_since=now)
        if sched is not None and not st.schedule_set:
            st, audits, ok = rate_limit(st, policy, now, "set_temperature_schedule")
            if not ok:
                return Step(st, audits)
            return Step(st, call=Call("set_schedule", (st.pool, sched.name, sched.params, reason(st, "schedule")),
                                      "schedule", "set_temperature_schedule",
                                      {"pool": st.pool, "name": sched.name, "params": sched.params},
                                      {"schedule_set": True}))
        cur = st.share_pct if st.share_pct is not None else 0.0
        if share is None or cur >= share.max_pct - 1e-9:
            return Step(st)
        if st.last_step_at is not None and now - st.last_step_at < share.step_s:
            return Step(st)
        st, audits, ok = rate_limit(st, policy, now, "set_student_share")
        if not ok:
            return Step(st, audits)
        new = round(min(share.max_pct, cur + share.step_pct), 6)
        return Step(st, call=Call("set_student_share", (st.pool, new, reason(st, f"shift to {new:g} %")), "shift",
                                  "set_student_share", {"pool": st.pool, "pct": new},
                                  {"share_pct": new, "last_step_at": now}))
    if st.stage == NORMAL or st.resolved_at is None or now - st.resolved_at < policy.hold_down(st.trips):
        return Step(st)
    if st.stage != RESTORING:
        st = replace(st, stage=RESTORING, stage_since=now)
    if st.schedule_set and st.prev_schedule is not None:
        prev = st.prev_schedule  # the rate limit only counts calls: the schedule to restore stays
        st, audits, ok = rate_limit(st, policy, now, "set_temperature_schedule")
        if not ok:
            return Step(st, audits)
        return Step(st, call=Call("set_schedule", (st.pool, prev.get("name", "constant"), prev.get("params", {}),
                                                   reason(st, "schedule restore")),
                                  "schedule_restore", "set_temperature_schedule", {"pool": st.pool, **prev},
                                  {"schedule_set": False}))
    base = st.baseline_pct or 0.0
    cur = st.share_pct if st.share_pct is not None else base
    if cur <= base + 1e-9:
        return Step(replace(st, stage=NORMAL, stage_since=now, baseline_pct=None, share_pct=None, prev_schedule=None,
                            schedule_set=False))
    if st.last_step_at is not None and now - st.last_step_at < (share.step_s if share else 0):
        return Step(st)
    st, audits, ok = rate_limit(st, policy, now, "set_student_share")
    if not ok:
        return Step(st, audits)
    new = round(max(base, cur - (share.step_pct if share else cur - base)), 6)
    return Step(st, call=Call("set_student_share", (st.pool, new, reason(st, f"restore to {new:g} %")), "unshift",
                              "set_student_share", {"pool": st.pool, "pct": new},
                              {"share_pct": new, "last_step_at": now}))


def shed_order(st: TargetState, fleet: ControlAnswer, now: float
               ) -> tuple[TargetState, tuple[dict, ...], tuple[str, ...] | None]:
    """The classes below the target's, from the control API's shedding state (its
    ``tenants.classes``, most protected first), or ``None`` with the state and audit of why not
    (unavailable: retried; pool or class unknown, nothing below it: forgotten until a new episode)."""
    if not fleet.ok or not isinstance(fleet.body, dict):
        st = backoff(st, now)
        return st, ({"action": "set_shed", "target": st.key, "decision": "shed", "outcome": "failed",
                     "latency_ms": fleet.latency_ms, "reason": f"control API state unavailable: {fleet.error or fleet.status}",
                     "params": {"response": fleet.summary()}},), None
    shed = fleet.body.get("shed")
    order = shed.get("classes") if isinstance(shed, dict) else None
    pools = shed.get("pools") if isinstance(shed, dict) else None
    why = ""
    if not isinstance(order, list) or not isinstance(pools, dict):
        why = "the control API has no load shedding (no 'shed' in its state)"
    elif st.pool not in pools:
        why = f"pool {st.pool!r} is not in the control API's shedding state"
    elif st.class_ not in order:
        why = f"class {st.class_!r} is not one of the control API's classes ({', '.join(map(str, order))})"
    elif order.index(st.class_) == len(order) - 1:
        why = f"class {st.class_!r} is the least protected: there is no class below it to shed"
    if why:
        why = f"shed refused for good: {why}; not retried"
        st = forget(st, why)
        return st, ({"action": "set_shed", "target": st.key, "decision": "shed", "outcome": "refused",
                     "latency_ms": fleet.latency_ms, "reason": reason(st, why),
                     "params": {"response": fleet.summary()}},), None
    assert isinstance(order, list)
    return st, (), tuple(str(c) for c in order[order.index(st.class_) + 1:])


def class_step(st: TargetState, rule: Rule, policy: Policy, now: float, facts: Facts) -> Step:
    """While the class's alert fires, shed the classes below it (never the most protected: it
    is first, so never below another) ``step`` more every ``step_s`` up to ``max_share``; after
    the hold-down, step their share back down to 0 at the same pace."""
    shed = rule.shed
    assert shed is not None  # a class rule always has one (policy.parse)
    cur = st.shed_share or 0.0
    if st.causes:
        if st.shed_classes is None:
            if facts.fleet is None:
                return Step(st, need="fleet")
            st, audits, below = shed_order(st, facts.fleet, now)
            if below is None:
                return Step(st, audits)
            st = replace(st, shed_classes=below, shed_share=cur)
        if st.stage != SHEDDING:
            st = replace(st, stage=SHEDDING, stage_since=now)
        if cur >= shed.max_share - 1e-9 or (st.last_step_at is not None and now - st.last_step_at < shed.step_s):
            return Step(st)
        new = round(min(shed.max_share, cur + shed.step), 6)
        decision, what = "shed", f"shed {', '.join(st.shed_classes or ())} at {new:g}"
    else:
        if st.stage == NORMAL or st.resolved_at is None or now - st.resolved_at < policy.hold_down(st.trips):
            return Step(st)
        if cur <= 1e-9 or not st.shed_classes:
            return Step(replace(st, stage=NORMAL, stage_since=now, shed_classes=None, shed_share=None,
                                last_step_at=None, blocked=""))
        if st.last_step_at is not None and now - st.last_step_at < shed.step_s and st.stage == RESTORING:
            return Step(st)
        if st.stage != RESTORING:
            st = replace(st, stage=RESTORING, stage_since=now)
        new = round(max(0.0, cur - shed.step), 6)
        decision, what = "unshed", f"shed {', '.join(st.shed_classes or ())} at {new:g}"
    st, audits, ok = rate_limit(st, policy, now, "set_shed")
    if not ok:
        return Step(st, audits)
    classes = {c: new for c in st.shed_classes or ()}
    return Step(st, call=Call("set_shed", (st.pool, classes, reason(st, what)), decision, "set_shed",
                              {"pool": st.pool, "classes": classes}, {"shed_share": new, "last_step_at": now}))


# -- the control API's answer ---------------------------------------------------------------------
def after_call(st: TargetState, call: Call, res: ControlAnswer, now: float
               ) -> tuple[TargetState, tuple[dict, ...], dict[str, Any]]:
    """Fold a write's result into the state: applied (``on_ok``), refused (retried with backoff,
    audited once while the answer stays), failed (retried with backoff) or permanent (a 404:
    forgotten). Returns the state, the audit rows and the webhook response's action entry."""
    st = replace(st, actions=(*st.actions, now))
    outcome = "applied" if res.ok else ("refused" if res.refused else "failed")
    why = f"{call.decision} {outcome}: {res.error}"
    audit = True
    if res.ok:
        st = replace(st, failures=0, retry_at=0.0, blocked="")
    elif res.permanent:
        why = f"{call.decision} refused for good: the control API does not know {st.key} ({res.error}); not retried"
        st = forget(st, why)
    else:
        st = backoff(st, now)
        if res.refused:  # retried (the fleet may change), audited once while the answer stays
            audit = st.blocked != why
            st = replace(st, blocked=why)
    audits: tuple[dict, ...] = ()
    if audit:
        audits = ({"action": call.action, "target": st.key, "decision": call.decision, "outcome": outcome,
                   "latency_ms": res.latency_ms, "reason": reason(st, call.decision if res.ok else why),
                   "params": {"request": call.request, "response": res.summary()}},)
    if res.ok:
        st = replace(st, **call.on_ok)
        if call.settle:
            st = settle(st, now)
    row = {"action": call.action, "decision": call.decision, "outcome": outcome, "latency_ms": round(res.latency_ms, 3),
           **({"error": res.error} if res.error else {})}
    return st, audits, row
