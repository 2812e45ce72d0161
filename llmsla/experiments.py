"""A/B experiments as configured: the contract between the config file, the rollout (control),
the gateway, the simulator and the report.

Core, not control: ``llmsla.config`` validates ``[ab.experiments.<key>]`` at load time with
:func:`parse` (a typo fails at startup with the key named), and the report and the simulator
read the same specs. How arms map to units is :mod:`llmsla.control.rollout`'s.
See docs/ab.md#1-configure-an-experiment.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from llmsla import names
from llmsla.events import MAX_STRING_CHARS, shown_name, string_problem
from llmsla.temperature import Schedule, validate_schedule

#: Experiment keys and arm names: short, no separator, safe as label values and in URLs.
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_EXPERIMENT_KEYS = ("seed", "pool", "coverage", "control", "enabled", "arms", "forced", "description")
_ARM_KEYS = ("weight", "version", "route_policy", "pool", "student_share_pct", "schedule")


class ExperimentError(ValueError):
    """A bad experiment spec; the message starts with the full key (``ab.experiments.x.arms.y.weight``)."""


@dataclass(frozen=True)
class Strategy:
    """What an arm changes for its units; None = the pool's own setting."""

    route_policy: str | None = None
    pool: str | None = None
    student_share_pct: float | None = None
    schedule: Schedule | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in ("route_policy", "pool", "student_share_pct"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.schedule is not None:
            out["schedule"] = self.schedule.to_dict()
        return out


@dataclass(frozen=True)
class Arm:
    name: str
    weight: float
    version: str = ""
    strategy: Strategy = field(default_factory=Strategy)


@dataclass(frozen=True)
class Experiment:
    key: str
    seed: int
    pool: str
    coverage: float
    arms: tuple[Arm, ...]
    control: str
    enabled: bool = True
    forced: dict[str, str] = field(default_factory=dict)
    description: str = ""

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(f"experiment {self.key!r} has no arm {name!r} (arms: {', '.join(a.name for a in self.arms)})")

    def label(self, arm: str, *, forced: bool = False) -> str:
        """The ``arm`` label value of a unit in ``arm`` (RequestEvent, metrics, the store)."""
        return arm_label(self.key, arm, forced=forced)

    def shares(self) -> dict[str, float]:
        """Configured share of each arm among the experiment's units (weights normalised)."""
        total = sum(a.weight for a in self.arms)
        return {a.name: a.weight / total for a in self.arms}


def arm_label(experiment: str, arm: str, *, forced: bool = False) -> str:
    sep = names.ARM_LABEL_SEP
    return f"{experiment}{sep}{arm}" + (f"{sep}{names.ARM_FORCED_SUFFIX}" if forced else "")


def parse_label(label: str) -> tuple[str, str, bool] | None:
    """``(experiment, arm, forced)`` of an arm label, None for ``default`` or a foreign value."""
    parts = label.split(names.ARM_LABEL_SEP)
    if len(parts) == 2 and all(parts):
        return parts[0], parts[1], False
    if len(parts) == 3 and all(parts) and parts[2] == names.ARM_FORCED_SUFFIX:
        return parts[0], parts[1], True
    return None


def _number(v: Any, key: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ExperimentError(f"{key}: expected a number, got {v!r}")
    if v < lo or v > hi or (lo_open and v == lo):
        raise ExperimentError(f"{key}: must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def _name(v: Any, key: str, what: str) -> str:
    if not isinstance(v, str) or not NAME.match(v):
        raise ExperimentError(f"{key}: {what} must be 1-64 characters of A-Z a-z 0-9 _ . -, got {v!r}")
    return v


def _table(v: Any, key: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ExperimentError(f"{key}: expected a table, got {type(v).__name__}")
    return v


def _unknown(body: dict[str, Any], known: tuple[str, ...], key: str) -> None:
    extra = sorted(set(body) - set(known))
    if extra:
        raise ExperimentError(f"{key}.{extra[0]}: unknown key (known: {', '.join(known)})")


def parse_arm(name: str, body: Any, key: str) -> Arm:
    _name(name, key, "an arm name")
    body = _table(body, key)
    _unknown(body, _ARM_KEYS, key)
    weight = _number(body.get("weight", 1), f"{key}.weight", 0, 1e9, lo_open=True)
    version = body.get("version", "")
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    if not isinstance(version, str) or len(version) > 64:
        raise ExperimentError(f"{key}.version: expected a string of at most 64 characters, got {version!r}")
    policy = body.get("route_policy")
    if policy is not None and policy not in names.ROUTE_POLICIES:
        raise ExperimentError(f"{key}.route_policy: must be one of {', '.join(names.ROUTE_POLICIES)}, got {policy!r}")
    pool = body.get("pool")
    if pool is not None:
        _pool_name(pool, f"{key}.pool")
    share = body.get("student_share_pct")
    if share is not None:
        share = _number(share, f"{key}.student_share_pct", 0, 100)
    schedule = None
    if "schedule" in body:
        sch = _table(body["schedule"], f"{key}.schedule")
        _unknown(sch, ("name", "params"), f"{key}.schedule")
        try:
            schedule = validate_schedule(sch.get("name"), sch.get("params"))
        except ValueError as exc:  # "schedule.params.t_min: ..." -> the full key
            raise ExperimentError(f"{key}.{exc}") from None
    return Arm(name, weight, version, Strategy(policy, pool, share, schedule))


def _pool_name(pool: Any, where: str) -> str:
    """A pool name is a label of every event the pool's requests make: the event contract's rule
    for strings (non-empty, at most MAX_STRING_CHARS, storable text), as for ``gateway.pool``."""
    if not isinstance(pool, str) or not pool or len(pool) > MAX_STRING_CHARS:
        shown = repr(shown_name(pool)) if isinstance(pool, str) else type(pool).__name__
        raise ExperimentError(f"{where}: expected a non-empty pool name of at most {MAX_STRING_CHARS} "
                              f"characters, got {shown}")
    if (problem := string_problem(pool)) is not None:
        raise ExperimentError(f"{where}: pool name {problem}")
    return pool


def parse_experiment(key: str, body: Any, prefix: str = "ab.experiments") -> Experiment:
    where = f"{prefix}.{key}"
    _name(key, where, "an experiment key")
    body = _table(body, where)
    _unknown(body, _EXPERIMENT_KEYS, where)
    seed = body.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ExperimentError(f"{where}.seed: expected a non-negative integer, got {seed!r}")
    pool = _pool_name(body.get("pool", names.DEFAULT_POOL), f"{where}.pool")
    coverage = _number(body.get("coverage", 1.0), f"{where}.coverage", 0, 1)
    enabled = body.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ExperimentError(f"{where}.enabled: expected true/false, got {enabled!r}")
    description = body.get("description", "")
    if not isinstance(description, str):
        raise ExperimentError(f"{where}.description: expected a string, got {description!r}")
    arms_body = _table(body.get("arms", {}), f"{where}.arms")
    if len(arms_body) < 2:
        raise ExperimentError(f"{where}.arms: an experiment needs at least two arms, got {len(arms_body)}")
    arms = tuple(parse_arm(n, b, f"{where}.arms.{n}") for n, b in arms_body.items())
    control = body.get("control", arms[0].name)
    if control not in {a.name for a in arms}:
        raise ExperimentError(f"{where}.control: {control!r} is not one of its arms ({', '.join(a.name for a in arms)})")
    forced: dict[str, str] = {}
    for unit, arm in _table(body.get("forced", {}), f"{where}.forced").items():
        if arm not in {a.name for a in arms}:
            raise ExperimentError(f"{where}.forced.{unit}: {arm!r} is not one of its arms")
        forced[str(unit)] = arm
    return Experiment(key, seed, pool, coverage, arms, control, enabled, forced, description)


def parse(value: Any, prefix: str = "ab.experiments") -> dict[str, Experiment]:
    """Every experiment of ``[ab.experiments]``; at most one enabled experiment per pool, so a
    request carries one arm label (ExperimentError naming both keys otherwise)."""
    out = {k: parse_experiment(k, b, prefix) for k, b in _table(value, prefix).items()}
    by_pool: dict[str, str] = {}
    for e in out.values():
        if not e.enabled:
            continue
        if e.pool in by_pool:
            raise ExperimentError(
                f"{prefix}.{e.key}.enabled: pool {e.pool!r} already runs {prefix}.{by_pool[e.pool]}; one enabled "
                "experiment per pool (a request carries one arm label): disable one, or give it another pool")
        by_pool[e.pool] = e.key
    return out


def normalised(value: Any, prefix: str = "ab.experiments") -> dict[str, Any]:
    """``value`` checked by :func:`parse`, returned as given (what the config keeps and shows)."""
    parse(value, prefix)
    return value
