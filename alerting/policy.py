"""The receiver's policy file: which alerts act on what, how hard, and how they are undone.

Rules are tried in order and the first whose ``match`` fits decides, as Alertmanager routes do;
an alert that fits none is audited as ``no_rule``. It is YAML validated like the SLO specs
(``file:line: field: reason``), so an operator's mistake names its line instead of acting wrongly.
See docs/alerting.md#the-policy-file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from llmsla import names
from llmsla.yamlsrc import Doc, Reader, SourceError, load_docs, load_file

API_VERSION = "llmsla/v1"
KIND = "ReceiverPolicy"
TARGET_REPLICA = "replica"
TARGET_POOL = "pool"
#: a request class of a pool (``class:<pool>/<class>``): shed the classes below it
TARGET_CLASS = "class"
TARGETS = (TARGET_REPLICA, TARGET_POOL, TARGET_CLASS)
#: a ``match`` value that fits any non-empty value of the label (the label must be present)
ANY = "*"
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class ShareStep:
    step_pct: float
    max_pct: float
    step_s: float


@dataclass(frozen=True)
class ShedStep:
    """Shed the classes below the alert's class: ``step`` more of their share every ``step_s``
    while it fires, up to ``max_share``; the same steps down after the hold-down."""

    step: float
    max_share: float
    step_s: float
    #: the class to protect when the alert carries no ``class`` label (a forecaster warning for a
    #: pool); empty: such an alert is not acted on (audited as unroutable)
    protect: str = ""


@dataclass(frozen=True)
class Schedule:
    name: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    name: str
    match: dict[str, tuple[str, ...]]
    target: str
    # replica
    deweight_to: float | None = None
    drain_after_s: float | None = None
    restore_weights: tuple[float, ...] = (0.25, 0.5, 1.0)
    restore_step_s: float = 60.0
    # pool
    student_share: ShareStep | None = None
    temperature_schedule: Schedule | None = None
    skip_if_replica_action: bool = True
    # class
    shed: ShedStep | None = None

    def matches(self, labels: dict[str, str]) -> bool:
        for k, vals in self.match.items():
            v = labels.get(k, "")
            if v not in vals and not (v and ANY in vals):
                return False
        return True

    def target_key(self, labels: dict[str, str]) -> str:
        """``replica:<pool>/<id>``, ``pool:<pool>`` or ``class:<pool>/<class>``; KeyError names
        the missing label."""
        pool = labels.get(names.L_POOL)
        if not pool:
            raise KeyError(names.L_POOL)
        if self.target == TARGET_POOL:
            return f"pool:{pool}"
        if self.target == TARGET_CLASS:
            cls = labels.get(names.L_CLASS) or (self.shed.protect if self.shed is not None else "")
            if not cls:
                raise KeyError(names.L_CLASS)
            return f"class:{pool}/{cls}"
        rep = labels.get(names.L_REPLICA)
        if not rep:
            raise KeyError(names.L_REPLICA)
        return f"replica:{pool}/{rep}"


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...]
    hold_down_s: float = 300.0
    max_hold_down_s: float = 3600.0
    backoff_reset_s: float = 3600.0
    max_drained_fraction: float = 0.5
    rate_actions: int = 10
    rate_per_s: float = 600.0
    source: str = ""

    def match(self, labels: dict[str, str]) -> Rule | None:
        return next((r for r in self.rules if r.matches(labels)), None)

    def rule(self, name: str) -> Rule | None:
        return next((r for r in self.rules if r.name == name), None)

    def hold_down(self, trips: int) -> float:
        """Hold-down after the ``trips``-th trip in a row: doubles per trip, capped."""
        return min(self.max_hold_down_s, self.hold_down_s * 2 ** max(0, trips - 1))


def _num(r: Reader, key: str, default: float | None = None, *, lo: float = 0.0, hi: float = math.inf,
         lo_open: bool = False) -> float:
    v = float(r.get(key, (int, float), default))
    if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise r.error(key, f"must be a number in {rng}, got {v!r}")
    return v


def _rule(doc: Doc, path: tuple, value: Any) -> Rule:
    r = Reader(doc, path, value)
    r.keys({"name", "match", "target", "deweight_to", "drain_after_s", "restore_weights", "restore_step_s",
            "student_share", "temperature_schedule", "skip_if_replica_action", "shed"}, {"name", "match", "target"})
    name = r.get("name", str)
    if not _NAME.match(name):
        raise r.error("name", f"lowercase letters, digits and '-', got {name!r}")
    m = r.sub("match")
    match: dict[str, tuple[str, ...]] = {}
    if not m.value:
        raise m.error(None, "empty: a rule must match at least one label")
    for k, v in m.value.items():
        if not _LABEL.match(k):
            raise m.error(k, "not a valid label name")
        vals = v if isinstance(v, list) else [v]
        if not vals or not all(isinstance(x, str) and x for x in vals):
            raise m.error(k, f"expected a string or a list of strings, got {v!r}")
        match[k] = tuple(vals)
    target = r.get("target", str)
    if target not in TARGETS:
        raise r.error("target", f"expected 'replica', 'pool' or 'class', got {target!r}")
    own = {TARGET_REPLICA: {"deweight_to", "drain_after_s", "restore_weights", "restore_step_s"},
           TARGET_POOL: {"student_share", "temperature_schedule", "skip_if_replica_action"},
           TARGET_CLASS: {"shed"}}
    wrong = (set().union(*own.values()) - own[target]) & set(r.value)
    if wrong:
        k = sorted(wrong)[0]
        raise r.error(k, f"not a field of a {target} rule")
    if target == TARGET_CLASS:
        if not r.has("shed"):
            raise r.error(None, "a class rule needs shed: {step, max_share[, step_s, protect]}")
        sh = r.sub("shed")
        sh.keys({"step", "max_share", "step_s", "protect"}, {"step", "max_share"})
        protect = sh.get("protect", str, "")
        if protect and not _LABEL_VALUE.match(protect):
            raise sh.error("protect", f"a class name, got {protect!r}")
        step = ShedStep(_num(sh, "step", lo=0, hi=1, lo_open=True), _num(sh, "max_share", lo=0, hi=1, lo_open=True),
                        _num(sh, "step_s", 60.0), protect)
        return Rule(name, match, target, shed=step)
    if target == TARGET_REPLICA:
        dw = _num(r, "deweight_to", lo=0, hi=1, lo_open=True) if r.has("deweight_to") else None
        if dw is not None and dw >= 1:
            raise r.error("deweight_to", "must be below 1 (a fraction of the replica's weight)")
        drain = _num(r, "drain_after_s") if r.has("drain_after_s") else None
        if dw is None and drain is None:
            raise r.error(None, "a replica rule needs deweight_to, drain_after_s, or both")
        weights: tuple[float, ...] = (0.25, 0.5, 1.0)
        if r.has("restore_weights"):
            items = r.items("restore_weights")
            weights = tuple(float(x) if isinstance(x, int | float) and not isinstance(x, bool) else math.nan
                            for _, x in items)
            if (not weights or any(not (0 < w <= 1) for w in weights) or list(weights) != sorted(set(weights))
                    or weights[-1] != 1):
                raise r.error("restore_weights", "strictly increasing fractions in (0, 1] ending at 1, "
                                                 f"got {r.value['restore_weights']!r}")
        return Rule(name, match, target, deweight_to=dw, drain_after_s=drain, restore_weights=weights,
                    restore_step_s=_num(r, "restore_step_s", 60.0))
    share = None
    if r.has("student_share"):
        s = r.sub("student_share")
        s.keys({"step_pct", "max_pct", "step_s"}, {"step_pct", "max_pct"})
        share = ShareStep(_num(s, "step_pct", lo=0, hi=100, lo_open=True), _num(s, "max_pct", lo=0, hi=100, lo_open=True),
                          _num(s, "step_s", 60.0))
    sched = None
    if r.has("temperature_schedule"):
        t = r.sub("temperature_schedule")
        t.keys({"name", "params"}, {"name"})
        params = t.get("params", dict, {})
        sched = Schedule(t.get("name", str), dict(params))
    if share is None and sched is None:
        raise r.error(None, "a pool rule needs student_share, temperature_schedule, or both")
    return Rule(name, match, target, student_share=share, temperature_schedule=sched,
                skip_if_replica_action=r.get("skip_if_replica_action", bool, True))


def parse(doc: Doc) -> Policy:
    r = Reader(doc)
    r.keys({"apiVersion", "kind", "timing", "safety", "rules"}, {"apiVersion", "kind", "rules"})
    if r.get("apiVersion", str) != API_VERSION:
        raise r.error("apiVersion", f"expected {API_VERSION!r}, got {r.value['apiVersion']!r}")
    if r.get("kind", str) != KIND:
        raise r.error("kind", f"expected {KIND!r}, got {r.value['kind']!r}")
    kw: dict[str, Any] = {}
    if r.has("timing"):
        t = r.sub("timing")
        t.keys({"hold_down_s", "max_hold_down_s", "backoff_reset_s"})
        kw.update(hold_down_s=_num(t, "hold_down_s", 300.0), max_hold_down_s=_num(t, "max_hold_down_s", 3600.0),
                  backoff_reset_s=_num(t, "backoff_reset_s", 3600.0))
        if kw["max_hold_down_s"] < kw["hold_down_s"]:
            raise t.error("max_hold_down_s", "must be >= hold_down_s")
    if r.has("safety"):
        s = r.sub("safety")
        s.keys({"max_drained_fraction", "rate_limit"})
        kw["max_drained_fraction"] = _num(s, "max_drained_fraction", 0.5, hi=1)
        if s.has("rate_limit"):
            rl = s.sub("rate_limit")
            rl.keys({"actions", "per_s"}, {"actions", "per_s"})
            actions = rl.get("actions", int)
            if actions < 1:
                raise rl.error("actions", f"must be >= 1, got {actions}")
            kw.update(rate_actions=actions, rate_per_s=_num(rl, "per_s", lo=0, lo_open=True))
    rules = [_rule(doc, path, v) for path, v in r.items("rules")]
    if not rules:
        raise r.error("rules", "empty: nothing would ever be done")
    seen: set[str] = set()
    for (path, _), rule in zip(r.items("rules"), rules, strict=True):
        if rule.name in seen:
            raise doc.error((*path, "name"), f"duplicate rule name {rule.name!r}")
        seen.add(rule.name)
    return Policy(tuple(rules), source=doc.file, **kw)


def load(path: str | Path | None = None) -> Policy:
    """The policy file at ``path``, else the built-in default."""
    if path:
        docs = load_file(path)
    else:
        text = (resources.files("llmsla.alerting") / "policy.default.yaml").read_text()
        docs = list(load_docs(text, "llmsla/alerting/policy.default.yaml"))
    if len(docs) != 1:
        raise SourceError(f"{path}: expected one YAML document, got {len(docs)}")
    return parse(docs[0])
