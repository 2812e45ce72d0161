"""The receiver's decisions: alerts in, control actions out, one state machine per target.

A target is a replica (``replica:<pool>/<id>``) or a pool (``pool:<pool>``). Its state holds the
firing alerts that point at it (``causes``, by fingerprint), the last resolved episode of each
fingerprint (``ended``: a firing that arrives after its own resolve - reordered or replayed -
is stale and ignored), the stage, and what it needs to undo its changes.

Replica: ``normal -> deweighted -> drained`` while any cause fires (deweight at once, drain after
``drain_after_s``); when the last cause resolves the hold-down starts (``Policy.hold_down``,
doubling per re-trip), then ``restoring`` steps the weight through ``restore_weights`` back to
``normal``. A cause that fires during the hold-down or the restore trips it again.

Pool: ``normal -> shifted``: remember the student share and schedule, switch the schedule, raise
the share by ``step_pct`` every ``step_s`` up to ``max_pct``; after the hold-down, ``restoring``
restores the schedule and steps the share back to the baseline. A pool whose replica is under a
replica action (``skip_if_replica_action``) waits: that replica explains the burn.

Every decision and every control call is audited (the journal commits them with the state). A
failed control call leaves the stage where it was; the reconciler (:meth:`Engine.tick`) retries
it with a growing delay, auditing a refusal (409) once while its reason stays the same. A target
the control API does not know (404, or absent from its state) is permanent: audited once, then
left alone (``unknown``) until a new episode fires on it. Actions pass the safety bounds first: never the last healthy replica of
a pool, at most ``max_drained_fraction`` of a pool drained, at most ``rate_actions`` control
writes per target per ``rate_per_s``.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from llmsla import names
from llmsla.alerting.control_client import Result
from llmsla.alerting.journal import Journal, Tx
from llmsla.alerting.policy import TARGET_POOL, Policy, Rule
from llmsla.alerting.webhook import FIRING, Alert, Notification
from llmsla.seams import ControlApi

NORMAL, DEWEIGHTED, DRAINED, RESTORING, SHIFTED = "normal", "deweighted", "drained", "restoring", "shifted"
#: Decisions (the ``decision`` column of the alert's audit row).
ACT, JOINED, DUPLICATE, STALE, RESOLVED, RESOLVED_PARTIAL, NO_RULE, UNROUTABLE, DEFERRED, INVALID = (
    "act", "joined", "duplicate", "stale", "resolved", "resolved_partial", "no_rule", "unroutable", "deferred",
    "invalid")
#: audit target of the alerts a notification carried but the receiver could not use, and of the
#: notification-level rows (``truncated``: Alertmanager's ``max_alerts`` left alerts out)
INVALID_TARGET = "alert:invalid"
MAX_ENDED = 200
MAX_RETRY_S = 60.0


@dataclass
class TargetState:
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
    actions: list[float] = field(default_factory=list)
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

    @classmethod
    def load(cls, raw: dict[str, Any] | None, key: str, rule: Rule | None, labels: dict[str, str]) -> TargetState:
        if raw:
            known = {f for f in cls.__dataclass_fields__}
            return cls(**{k: v for k, v in raw.items() if k in known})
        kind = rule.target if rule else ("pool" if key.startswith("pool:") else "replica")
        return cls(key=key, kind=kind, pool=labels.get(names.L_POOL, ""),
                   replica=labels.get(names.L_REPLICA, "") if kind != TARGET_POOL else "")

    def dump(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    """What one alert led to (the webhook's response lists these)."""

    fingerprint: str
    alertname: str
    status: str
    decision: str
    reason: str
    target: str = ""
    actions: list[dict[str, Any]] = field(default_factory=list)


class Engine:
    def __init__(self, policy: Policy, control: ControlApi, journal: Journal, *,
                 clock: Callable[[], float] = time.time, metrics: Any = None) -> None:
        self.policy = policy
        self.control = control
        self.journal = journal
        self.clock = clock
        self.metrics = metrics

    # -- alerts ----------------------------------------------------------------------------------
    async def handle(self, note: Notification, t0: float | None = None) -> list[Outcome]:
        """Process every alert of a notification; the outcomes in the notification's order.

        Alerts that point at no target (no rule matches, or the rule's target label is missing)
        are claimed and audited first, all in one transaction (:meth:`Journal.batch`); then each
        alert with a target, in order, under its target's lock. A large group is mostly the
        former (static alerts grouped by labels they do not carry), so its cost stays a few
        round trips instead of two per alert."""
        t0 = time.perf_counter() if t0 is None else t0
        out: list[Outcome | None] = [None] * len(note.alerts)
        untargeted: list[tuple[int, Alert, Rule | None, str]] = []
        targeted: list[tuple[int, Alert, Rule, str]] = []
        for i, a in enumerate(note.alerts):
            rule = self.policy.match(a.labels)
            if rule is None:
                untargeted.append((i, a, None, ""))
                continue
            try:
                targeted.append((i, a, rule, rule.target_key(a.labels)))
            except KeyError as exc:
                untargeted.append((i, a, rule, str(exc.args[0])))
        if untargeted:
            for (i, *_), o in zip(untargeted, await self._untargeted(note, untargeted, t0), strict=True):
                out[i] = o
        for i, a, rule, key in targeted:
            out[i] = await self._one(note, a, rule, key, t0)
        done = [o for o in out if o is not None]
        if note.skipped or note.truncated:
            done += await self._unusable(note, t0)
        return done

    def _alert_row(self, tx: Tx, note: Notification, alert: Alert, out: Outcome, key: str, rule: Rule | None,
                   received: dt.datetime, t0: float) -> dict[str, Any]:
        return tx.audit(ts=received, action="alert", target=out.target or key, alertname=alert.name,
                        fingerprint=alert.fingerprint, alert_status=alert.status, decision=out.decision,
                        reason=out.reason, dedupe_key=alert.dedupe_key, outcome="received",
                        latency_ms=(time.perf_counter() - t0) * 1000.0,
                        params={"labels": alert.labels, "startsAt": alert.starts_iso, "groupKey": note.group_key,
                                "rule": rule.name if rule else None})

    async def _untargeted(self, note: Notification, items: list[tuple[int, Alert, Rule | None, str]],
                          t0: float) -> list[Outcome]:
        """Claim and audit alerts that point at no target, in one transaction."""
        outs: list[Outcome] = []
        async with self.journal.batch() as tx:
            fresh = await tx.claim_many([(a.dedupe_key, a.fingerprint, a.status, a.starts_iso, note.group_key)
                                         for _, a, _, _ in items])
            for (_, a, rule, missing), new in zip(items, fresh, strict=True):
                key = f"alert:{a.fingerprint}"
                if not new:
                    out = Outcome(a.fingerprint, a.name, a.status, DUPLICATE,
                                  "this (fingerprint, status, startsAt) was already received", key)
                elif rule is None:
                    out = Outcome(a.fingerprint, a.name, a.status, NO_RULE, "no policy rule matches its labels")
                else:
                    out = Outcome(a.fingerprint, a.name, a.status, UNROUTABLE,
                                  f"rule {rule.name!r} targets a {rule.target} but the alert has no {missing!r} label")
                self._alert_row(tx, note, a, out, key, rule, dt.datetime.now(dt.UTC), t0)
                outs.append(out)
        if self.metrics is not None:
            for o in outs:
                self.metrics.alert(o.status, o.decision)
        return outs

    async def _unusable(self, note: Notification, t0: float) -> list[Outcome]:
        """Audit what the notification carried but cannot be acted on, in one transaction: each
        skipped alert with its reason, and the count Alertmanager truncated (``max_alerts``)."""
        outs = [Outcome(s.fingerprint, s.alertname, s.status, INVALID, s.reason, INVALID_TARGET) for s in note.skipped]
        async with self.journal.lock(INVALID_TARGET) as tx:
            for s in note.skipped:
                # the dedupe key says which post and position; an invalid alert claims no idempotency key
                tx.audit(action="alert", target=INVALID_TARGET, alertname=s.alertname, fingerprint=s.fingerprint,
                         alert_status=s.status, decision=INVALID, reason=s.reason, outcome="skipped",
                         dedupe_key=f"invalid:{note.group_key[:200]}:{s.index}",
                         latency_ms=(time.perf_counter() - t0) * 1000.0,
                         params={"labels": s.labels, "index": s.index, "groupKey": note.group_key})
            if note.truncated:
                tx.audit(action="truncated", target=INVALID_TARGET, decision="truncated", outcome="lost",
                         reason=(f"Alertmanager left {note.truncated} alerts of this group out (max_alerts of the "
                                 "webhook config); they reach the receiver only once the group is smaller"),
                         params={"truncatedAlerts": note.truncated, "received": len(note.alerts) + len(note.skipped),
                                 "groupKey": note.group_key})
        if self.metrics is not None:
            for s in note.skipped:
                self.metrics.alert(s.status or "unknown", INVALID)
            if note.truncated:
                self.metrics.truncated.inc(note.truncated)
        return outs

    async def _one(self, note: Notification, alert: Alert, rule: Rule, key: str, t0: float) -> Outcome:
        """An alert with a target: claim, state, decision and actions in the target's transaction."""
        received = dt.datetime.now(dt.UTC)  # the alert row sorts before the actions it causes
        claim = (alert.dedupe_key, alert.fingerprint, alert.status, alert.starts_iso, note.group_key)
        async with self.journal.lock(key, claim) as tx:
            claimed = await tx.claim(*claim)
            if not claimed:
                out = Outcome(alert.fingerprint, alert.name, alert.status, DUPLICATE,
                              "this (fingerprint, status, startsAt) was already received", key)
            else:
                state = TargetState.load(await tx.load(), key, rule, alert.labels)
                out = await self._event(tx, state, rule, alert)
                tx.save(state.dump())
            row = self._alert_row(tx, note, alert, out, key, rule, received, t0)
            # the alert row goes first: move it before the action rows this event produced
            tx.rows.insert(0, tx.rows.pop())
            row["latency_ms"] = (time.perf_counter() - t0) * 1000.0
        if self.metrics is not None:
            self.metrics.alert(alert.status, out.decision)
        return out

    async def _event(self, tx: Tx, st: TargetState, rule: Rule, alert: Alert) -> Outcome:
        now = self.clock()
        fp, starts = alert.fingerprint, alert.starts_iso
        out = Outcome(fp, alert.name, alert.status, "", "", st.key)
        st.rule = rule.name
        if alert.status == FIRING:
            if st.ended.get(fp, "") >= starts:
                out.decision, out.reason = STALE, "a resolve of this or a later episode was already received"
                return out
            if fp in st.causes and st.causes[fp]["startsAt"] >= starts:
                out.decision, out.reason = STALE, "this or a later episode is already firing"
                return out
            first = not st.causes
            st.causes[fp] = {"startsAt": starts, "alertname": alert.name,
                             "severity": alert.labels.get(names.L_SEVERITY, ""), "slo": alert.labels.get(names.L_SLO, "")}
            if not first:
                out.decision, out.reason = JOINED, f"{len(st.causes)} alerts now point at {st.key}; acting already"
                return out
            if st.stage == NORMAL and now - st.last_trip > self.policy.backoff_reset_s:
                st.trips = 0
            st.trips += 1
            st.last_trip = now
            st.resolved_at = None
            st.retry_at = 0.0
            st.unknown = ""  # a new episode: look the target up again
            out.decision, out.reason = ACT, f"trip {st.trips} of {st.key} ({rule.name})"
        else:
            if st.ended.get(fp, "") < starts:
                st.ended[fp] = starts
                if len(st.ended) > MAX_ENDED:
                    for k in sorted(st.ended, key=st.ended.__getitem__)[: len(st.ended) - MAX_ENDED]:
                        del st.ended[k]
            cause = st.causes.get(fp)
            if cause is None or cause["startsAt"] > starts:
                out.decision, out.reason = STALE, "no firing episode of this alert is known"
                return out
            del st.causes[fp]
            if st.causes:
                out.decision, out.reason = RESOLVED_PARTIAL, f"{len(st.causes)} other alerts still point at {st.key}"
                return out
            st.resolved_at = now
            st.retry_at = 0.0
            hold = self.policy.hold_down(st.trips)
            out.decision, out.reason = RESOLVED, (f"restore after a hold-down of {hold:g} s" if st.stage != NORMAL
                                                  else "nothing to restore")
        out.actions = await self._advance(tx, st, rule, now)
        if alert.status == FIRING and st.kind == TARGET_POOL and st.blocked.startswith("deferred"):
            out.decision, out.reason = DEFERRED, st.blocked
        return out

    # -- the reconciler ----------------------------------------------------------------------------
    async def tick(self) -> int:
        """Advance every target that is not at rest (escalation, hold-down expiry, restore steps)."""
        n = 0
        for key, raw in (await self.journal.states()).items():
            if raw.get("stage", NORMAL) == NORMAL and not raw.get("causes"):
                continue
            rule = self.policy.rule(raw.get("rule", ""))
            if rule is None:
                continue  # its rule left the policy: leave the target as it is (operator's call)
            async with self.journal.lock(key) as tx:
                st = TargetState.load(await tx.load(), key, rule, {})
                if st.stage == NORMAL and not st.causes:
                    continue
                before = st.dump()
                done = await self._advance(tx, st, rule, self.clock())
                if st.dump() != before:  # a refusal or a backoff changes the state without an action
                    tx.save(st.dump())
                n += len(done)
        return n

    # -- transitions -----------------------------------------------------------------------------
    async def _advance(self, tx: Tx, st: TargetState, rule: Rule, now: float) -> list[dict[str, Any]]:
        if now < st.retry_at or st.unknown:
            return []
        done: list[dict[str, Any]] = []
        for _ in range(4):  # a step may make the next one due at once (drain_after_s = 0)
            step = await (self._pool_step if st.kind == TARGET_POOL else self._replica_step)(tx, st, rule, now)
            if step is None:
                break
            done.append(step)
            if step["outcome"] != "applied":
                break
        return done

    def _reason(self, st: TargetState, what: str) -> str:
        causes = ", ".join(sorted({f"{c['alertname']}/{c['severity']}" for c in st.causes.values()})) or "resolved"
        return f"{what} ({causes}; {st.rule})"

    def _rate_ok(self, tx: Tx, st: TargetState, now: float, action: str) -> bool:
        st.actions = [t for t in st.actions if now - t < self.policy.rate_per_s]
        if len(st.actions) < self.policy.rate_actions:
            return True
        why = f"rate limited: {len(st.actions)} actions on {st.key} in the last {self.policy.rate_per_s:g} s"
        if st.blocked != why:
            st.blocked = why
            tx.audit(action=action, target=st.key, decision="rate_limited", outcome="refused", reason=why)
        return False

    async def _write(self, tx: Tx, st: TargetState, decision: str, action: str, call: Any,
                     request: dict[str, Any], now: float) -> tuple[dict[str, Any], Result]:
        res: Result = await call
        st.actions.append(now)
        outcome = "applied" if res.ok else ("refused" if res.refused else "failed")
        why = f"{decision} {outcome}: {res.error}"
        audit = True
        if res.ok:
            st.failures, st.retry_at, st.blocked = 0, 0.0, ""
        elif res.permanent:
            why = f"{decision} refused for good: the control API does not know {st.key} ({res.error}); not retried"
            self._forget(st, why)
        else:
            st.failures += 1
            st.retry_at = now + min(MAX_RETRY_S, 2.0 ** (st.failures - 1))
            if res.refused:  # retried (the fleet may change), audited once while the answer stays
                audit = st.blocked != why
                st.blocked = why
        if audit:
            tx.audit(action=action, target=st.key, decision=decision, outcome=outcome, latency_ms=res.latency_ms,
                     reason=self._reason(st, decision if res.ok else why),
                     params={"request": request, "response": res.summary()})
        if self.metrics is not None:
            self.metrics.action(action, outcome, res.latency_ms / 1000.0)
        return {"action": action, "decision": decision, "outcome": outcome, "latency_ms": round(res.latency_ms, 3),
                **({"error": res.error} if res.error else {})}, res

    async def _fleet_pool(self, tx: Tx, st: TargetState, action: str, decision: str) -> tuple[list[dict], dict] | None:
        res = await self.control.state()
        if not res.ok or not isinstance(res.body, dict):
            st.failures += 1
            st.retry_at = self.clock() + min(MAX_RETRY_S, 2.0 ** (st.failures - 1))
            tx.audit(action=action, target=st.key, decision=decision, outcome="failed", latency_ms=res.latency_ms,
                     reason=f"control API state unavailable: {res.error or res.status}",
                     params={"response": res.summary()})
            return None
        router = res.body.get("router", {})
        distill = res.body.get("distill", {})
        pools = router.get("pools", {})
        if not isinstance(pools, dict) or st.pool not in pools:
            why = f"{decision} refused for good: pool {st.pool!r} is not in the control API's state; not retried"
            self._forget(st, why)
            tx.audit(action=action, target=st.key, decision=decision, outcome="refused", latency_ms=res.latency_ms,
                     reason=self._reason(st, why), params={"response": res.summary()})
            return None
        return list(pools.get(st.pool) or []), distill.get("pools", {}).get(st.pool, {})

    @staticmethod
    def _forget(st: TargetState, why: str) -> None:
        """The target does not exist: nothing to act on and nothing to restore; no more calls
        until a new episode (``unknown``), the causes stay so their resolves still match."""
        st.unknown = why
        st.stage, st.failures, st.retry_at, st.blocked = NORMAL, 0, 0.0, ""
        st.base_weight, st.weight_frac = None, 1.0
        st.baseline_pct = st.share_pct = st.prev_schedule = st.last_step_at = None
        st.schedule_set = False

    def _refuse(self, tx: Tx, st: TargetState, action: str, decision: str, why: str) -> dict[str, Any] | None:
        if st.blocked == why:
            return None  # already audited; re-checked every tick
        st.blocked = why
        tx.audit(action=action, target=st.key, decision=decision, outcome="refused", reason=self._reason(st, why))
        return None

    async def _replica_step(self, tx: Tx, st: TargetState, rule: Rule, now: float) -> dict[str, Any] | None:
        reason_of = self._reason
        if st.causes:
            want_deweight = st.stage in (NORMAL, RESTORING) and rule.deweight_to is not None
            want_drain = (st.stage in (NORMAL, RESTORING) and rule.deweight_to is None) or (
                st.stage == DEWEIGHTED and rule.drain_after_s is not None and now - st.stage_since >= rule.drain_after_s)
            if not (want_deweight or want_drain):
                return None
            action = "set_weight" if want_deweight else "drain"
            if not self._rate_ok(tx, st, now, action):
                return None
            if want_drain:
                # one drain decision per pool at a time (receivers and targets alike): the count of
                # drained replicas read below must not change before this drain is applied
                await tx.serialize(f"drain:{st.pool}")
            fleet = await self._fleet_pool(tx, st, action, "deweight" if want_deweight else "drain")
            if fleet is None:
                return None
            reps, _ = fleet
            me = next((r for r in reps if r.get("id") == st.replica), None)
            if me is None:
                why = (f"{action} refused for good: replica {st.replica!r} is not in pool {st.pool!r} of the "
                       "control API; not retried")
                self._forget(st, why)
                tx.audit(action=action, target=st.key, decision="unknown", outcome="refused", reason=self._reason(st, why))
                return None
            if st.stage == NORMAL or st.base_weight is None:
                st.base_weight = float(me.get("weight", 1.0)) or 1.0
            if want_deweight:
                frac = min(rule.deweight_to or 1.0, st.weight_frac if st.stage == RESTORING else 1.0)
                w = round(st.base_weight * frac, 6)
                row, res = await self._write(tx, st, "deweight", "set_weight",
                                             self.control.set_weight(st.replica, w, reason_of(st, "deweight")),
                                             {"replica": st.replica, "weight": w}, now)
                if res.ok:
                    st.stage, st.stage_since, st.weight_frac = DEWEIGHTED, now, frac
                return row
            others = [r for r in reps if r.get("id") != st.replica]
            healthy = [r for r in others if not r.get("drained") and float(r.get("weight", 1.0)) > 0]
            if not healthy:
                return self._refuse(tx, st, "drain", "blocked",
                                    f"not draining {st.replica}: it is the last healthy replica of pool {st.pool}")
            cap = math.floor(self.policy.max_drained_fraction * len(reps) + 1e-9)
            drained = sum(1 for r in others if r.get("drained"))
            if drained + 1 > cap:
                return self._refuse(tx, st, "drain", "blocked",
                                    f"not draining {st.replica}: {drained} of {len(reps)} replicas of pool {st.pool} are "
                                    f"drained and max_drained_fraction = {self.policy.max_drained_fraction:g}")
            row, res = await self._write(tx, st, "drain", "drain", self.control.drain(st.replica, reason_of(st, "drain")),
                                         {"replica": st.replica}, now)
            if res.ok:
                st.stage, st.stage_since = DRAINED, now
            return row
        # no cause firing: restore after the hold-down, one step per restore_step_s
        if st.stage == NORMAL or st.resolved_at is None:
            return None
        if now - st.resolved_at < self.policy.hold_down(st.trips):
            return None
        base = st.base_weight or 1.0
        first = rule.restore_weights[0]
        if st.stage == DRAINED:
            if not self._rate_ok(tx, st, now, "undrain"):
                return None
            if abs(st.weight_frac - first) > 1e-9:
                # the weight it comes back at, set while still drained (no traffic yet)
                w = round(base * first, 6)
                row, res = await self._write(tx, st, "restore", "set_weight",
                                             self.control.set_weight(st.replica, w, reason_of(st, f"restore at {first:g}")),
                                             {"replica": st.replica, "weight": w}, now)
                if res.ok:
                    st.weight_frac = first
                return row
            row, res = await self._write(tx, st, "restore", "undrain",
                                         self.control.undrain(st.replica, reason_of(st, "restore: undrain")),
                                         {"replica": st.replica}, now)
            if res.ok:
                st.stage, st.stage_since = RESTORING, now
                self._maybe_normal(st, now)
            return row
        if st.stage == RESTORING and now - st.stage_since < rule.restore_step_s:
            return None
        nxt = next((w for w in rule.restore_weights if w > st.weight_frac + 1e-9), None)
        if nxt is None:
            st.weight_frac = 1.0
            self._maybe_normal(st, now)
            return None
        if not self._rate_ok(tx, st, now, "set_weight"):
            return None
        w = round(base * nxt, 6)
        row, res = await self._write(tx, st, "restore", "set_weight",
                                     self.control.set_weight(st.replica, w, reason_of(st, f"restore {nxt:g}")),
                                     {"replica": st.replica, "weight": w}, now)
        if res.ok:
            st.stage, st.stage_since, st.weight_frac = RESTORING, now, nxt
            self._maybe_normal(st, now)
        return row

    @staticmethod
    def _maybe_normal(st: TargetState, now: float) -> None:
        """Fully restored: back to rest (trips stay, for the backoff of the next hold-down)."""
        if st.weight_frac >= 1 - 1e-9:
            st.stage, st.stage_since = NORMAL, now
            st.base_weight, st.weight_frac, st.blocked = None, 1.0, ""

    async def _replica_busy(self, pool: str) -> str:
        """A replica of ``pool`` under a receiver action, if any (it explains a pool burn)."""
        for key, raw in (await self.journal.states(f"replica:{pool}/")).items():
            if raw.get("stage", NORMAL) != NORMAL or raw.get("causes"):
                return key.split("/", 1)[1]
        return ""

    async def _pool_step(self, tx: Tx, st: TargetState, rule: Rule, now: float) -> dict[str, Any] | None:
        share = rule.student_share
        sched = rule.temperature_schedule
        if st.causes:
            if rule.skip_if_replica_action:
                busy = await self._replica_busy(st.pool)
                if busy:
                    why = f"deferred: replica {busy} of pool {st.pool} is under a replica action and explains the burn"
                    if st.blocked != why:
                        st.blocked = why
                        tx.audit(action="shift", target=st.key, decision="deferred", outcome="refused", reason=why)
                    return None
                if st.blocked.startswith("deferred"):
                    st.blocked = ""
            if st.stage in (NORMAL, RESTORING) and st.baseline_pct is None:
                fleet = await self._fleet_pool(tx, st, "shift", "shift")
                if fleet is None:
                    return None
                _, pc = fleet
                st.baseline_pct = float(pc.get("student_share_pct", 0.0))
                st.share_pct = st.baseline_pct
                st.prev_schedule = pc.get("schedule")
            if st.stage != SHIFTED:
                st.stage, st.stage_since = SHIFTED, now
            if sched is not None and not st.schedule_set:
                if not self._rate_ok(tx, st, now, "set_temperature_schedule"):
                    return None
                row, res = await self._write(tx, st, "schedule", "set_temperature_schedule",
                                             self.control.set_schedule(st.pool, sched.name, sched.params,
                                                                       self._reason(st, "schedule")),
                                             {"pool": st.pool, "name": sched.name, "params": sched.params}, now)
                if res.ok:
                    st.schedule_set = True
                return row
            cur = st.share_pct if st.share_pct is not None else 0.0
            if share is None or cur >= share.max_pct - 1e-9:
                return None
            if st.last_step_at is not None and now - st.last_step_at < share.step_s:
                return None
            if not self._rate_ok(tx, st, now, "set_student_share"):
                return None
            new = round(min(share.max_pct, cur + share.step_pct), 6)
            row, res = await self._write(tx, st, "shift", "set_student_share",
                                         self.control.set_student_share(st.pool, new, self._reason(st, f"shift to {new:g} %")),
                                         {"pool": st.pool, "pct": new}, now)
            if res.ok:
                st.share_pct, st.last_step_at = new, now
            return row
        if st.stage == NORMAL or st.resolved_at is None or now - st.resolved_at < self.policy.hold_down(st.trips):
            return None
        if st.stage != RESTORING:
            st.stage, st.stage_since = RESTORING, now
        if st.schedule_set and st.prev_schedule is not None:
            if not self._rate_ok(tx, st, now, "set_temperature_schedule"):
                return None
            prev = st.prev_schedule
            row, res = await self._write(tx, st, "schedule_restore", "set_temperature_schedule",
                                         self.control.set_schedule(st.pool, prev.get("name", "constant"),
                                                                   prev.get("params", {}),
                                                                   self._reason(st, "schedule restore")),
                                         {"pool": st.pool, **prev}, now)
            if res.ok:
                st.schedule_set = False
            return row
        base = st.baseline_pct or 0.0
        cur = st.share_pct if st.share_pct is not None else base
        if cur <= base + 1e-9:
            st.stage, st.stage_since = NORMAL, now
            st.baseline_pct = st.share_pct = st.prev_schedule = None
            st.schedule_set = False
            return None
        if st.last_step_at is not None and now - st.last_step_at < (share.step_s if share else 0):
            return None
        if not self._rate_ok(tx, st, now, "set_student_share"):
            return None
        new = round(max(base, cur - (share.step_pct if share else cur - base)), 6)
        row, res = await self._write(tx, st, "unshift", "set_student_share",
                                     self.control.set_student_share(st.pool, new, self._reason(st, f"restore to {new:g} %")),
                                     {"pool": st.pool, "pct": new}, now)
        if res.ok:
            st.share_pct, st.last_step_at = new, now
        return row
