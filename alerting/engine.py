"""The receiver's engine: alerts in, control actions out, one state machine per target.

This module is the I/O shell: it claims alerts in the journal, reads the control API's state,
performs the control calls and audits; every decision is a pure function of :mod:`decide`
(tested in ``tests/unit`` without services).

A target (``replica:<pool>/<id>`` or ``pool:<pool>``) keeps its firing causes, the last resolved
episode of each fingerprint (so a reordered or replayed firing is stale, never a re-trip) and what
it needs to undo its changes. Decisions, control calls and state commit together, and a failed
call leaves the stage where it was for the reconciler to retry: the receiver, not the sender's
retry, owns recovery. See docs/alerting.md#the-policy-file.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmsla.alerting import decide
from llmsla.alerting.decide import (
    DEFERRED,
    DUPLICATE,
    INVALID,
    NO_RULE,
    NORMAL,
    UNROUTABLE,
    TargetState,
)
from llmsla.alerting.journal import Journal, Tx
from llmsla.alerting.policy import Policy, Rule
from llmsla.alerting.webhook import Alert, Notification
from llmsla.seams import ControlApi

#: audit target of the alerts a notification carried but the receiver could not use, and of the
#: notification-level rows (``truncated``: Alertmanager's ``max_alerts`` left alerts out)
INVALID_TARGET = "alert:invalid"


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
                out, state = await self._event(tx, state, rule, alert)
                tx.save(state.dump())
            row = self._alert_row(tx, note, alert, out, key, rule, received, t0)
            # the alert row goes first: move it before the action rows this event produced
            tx.rows.insert(0, tx.rows.pop())
            row["latency_ms"] = (time.perf_counter() - t0) * 1000.0
        if self.metrics is not None:
            self.metrics.alert(alert.status, out.decision)
        return out

    async def _event(self, tx: Tx, st: TargetState, rule: Rule, alert: Alert) -> tuple[Outcome, TargetState]:
        now = self.clock()
        v = decide.on_alert(st, rule, self.policy, alert, now)
        out = Outcome(alert.fingerprint, alert.name, alert.status, v.decision, v.reason, st.key)
        st = v.state
        if v.advance:
            st, out.actions = await self._advance(tx, st, rule, now)
            why = decide.deferred(st, alert.status)
            if why:
                out.decision, out.reason = DEFERRED, why
        return out, st

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
                if st.at_rest:
                    continue
                before = st.dump()
                st, done = await self._advance(tx, st, rule, self.clock())
                if st.dump() != before:  # a refusal or a backoff changes the state without an action
                    tx.save(st.dump())
                n += len(done)
        return n

    # -- the I/O of a decision ---------------------------------------------------------------------
    async def _advance(self, tx: Tx, st: TargetState, rule: Rule, now: float
                       ) -> tuple[TargetState, list[dict[str, Any]]]:
        """Plan, perform, fold the answer in; again while a write applied (up to MAX_STEPS)."""
        if not decide.due(st, now):
            return st, []
        done: list[dict[str, Any]] = []
        for _ in range(decide.MAX_STEPS):
            step = await self._plan(tx, st, rule, now)
            st = step.state
            for row in step.audits:
                tx.audit(**row)
            if step.call is None:
                break
            res = await getattr(self.control, step.call.op)(*step.call.args)
            st, audits, row = decide.after_call(st, step.call, res, now)
            for a in audits:
                tx.audit(**a)
            if self.metrics is not None:
                self.metrics.action(step.call.action, row["outcome"], res.latency_ms / 1000.0)
            done.append(row)
            if row["outcome"] != "applied":
                break
        return st, done

    async def _plan(self, tx: Tx, st: TargetState, rule: Rule, now: float) -> decide.Step:
        """:func:`decide.plan`, reading the facts it asks for (the pool's replica actions, the
        control API's state) one at a time, in the order it asks."""
        facts = decide.Facts()
        while True:
            step = decide.plan(st, rule, self.policy, now, facts)
            if step.need == "busy":
                facts = decide.Facts(facts.fleet, await self._replica_busy(st.pool))
            elif step.need == "fleet":
                if step.serialize:
                    await tx.serialize(step.serialize)
                facts = decide.Facts(await self.control.state(), facts.busy)
            else:
                return step

    async def _replica_busy(self, pool: str) -> str:
        """A replica of ``pool`` under a receiver action, if any (it explains a pool burn)."""
        for key, raw in (await self.journal.states(f"replica:{pool}/")).items():
            if raw.get("stage", NORMAL) != NORMAL or raw.get("causes"):
                return key.split("/", 1)[1]
        return ""
