"""Dynamic-temperature policies: what temperature to sample the next token at, and why.

A policy is a small stateful object per request: ``decide(step, entropy)`` returns a
:class:`Decision`. Pure Python on floats so one decision costs about a microsecond; the engine
computes entropies for a batch in one tensor op. Core, not a component: the worker applies the
policies, the control plane validates schedules against them and the gateway names them.
See docs/temperature-policy.md#schedules.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from llmsla import names
from llmsla.events import POLICY_ACTIONS

#: The temperature schedules a pool can run; the first is the default everywhere (the worker's
#: ``worker.temperature_policy``, a pool's schedule, ``RequestEvent.policy`` when nothing else is named).
TEMPERATURE_POLICIES: tuple[str, ...] = names.TEMPERATURE_POLICIES
#: Relative change below which two temperatures count as the same (action ``hold``).
_EPS = 1e-9

TRIGGER_SCHEDULE = "schedule"
TRIGGER_ENTROPY_LOW = "entropy_low"
TRIGGER_ENTROPY_HIGH = "entropy_high"
TRIGGER_ENTROPY_OK = "entropy_ok"


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision: the temperature for this step, what changed, and why."""

    temperature: float
    action: str
    trigger: str


@dataclass(frozen=True)
class PolicyParams:
    """Parameters shared by every schedule; unused ones are ignored by a given schedule."""

    t_min: float = 0.1
    t_max: float = 1.0
    horizon: int = 256  # steps over which linear/cosine go from t_max to t_min
    decay: float = 0.98  # exponential: T(s) = max(t_min, t_max * decay**s)
    entropy_target: float = 2.5  # nats
    entropy_band: float = 0.25  # |H - target| within this -> hold
    entropy_gain: float = 0.5  # T <- T * exp(gain * (target - H))
    t_init: float | None = None  # entropy: starting temperature; None = midpoint of the bounds

    def __post_init__(self) -> None:
        for name in ("t_min", "t_max", "entropy_band", "entropy_gain"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.t_min > self.t_max:
            raise ValueError(f"t_min ({self.t_min}) must be <= t_max ({self.t_max})")
        if not (0 < self.decay <= 1):
            raise ValueError(f"decay must be in (0, 1], got {self.decay!r}")
        if self.horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {self.horizon!r}")


def _action(prev: float | None, new: float) -> str:
    if prev is None:
        return "set"
    if abs(new - prev) <= _EPS * max(1.0, abs(prev)):
        return "hold"
    return "raise" if new > prev else "lower"


def _clamp(t: float, p: PolicyParams) -> float:
    return min(p.t_max, max(p.t_min, t))


class Policy:
    """Base: tracks the previous temperature so actions are relative to it."""

    name = "base"
    needs_entropy = False

    def __init__(self, params: PolicyParams = PolicyParams(), policy_id: str | None = None) -> None:
        self.params = params
        self.policy_id = policy_id or self.name
        self.prev: float | None = None

    def value(self, step: int, entropy: float | None) -> tuple[float, str]:
        raise NotImplementedError

    def decide(self, step: int, entropy: float | None = None) -> Decision:
        """Temperature for decode ``step`` (0 = first generated token)."""
        t, trigger = self.value(step, entropy)
        action = _action(self.prev, t)
        self.prev = t
        return Decision(t, action, trigger)


class Constant(Policy):
    """T = t_max at every step (the request's ``temperature``)."""

    name = "constant"

    def value(self, step: int, entropy: float | None) -> tuple[float, str]:
        return self.params.t_max, TRIGGER_SCHEDULE


class LinearDecay(Policy):
    """T(s) = t_max - (t_max - t_min) * min(s / horizon, 1)."""

    name = "linear"

    def value(self, step: int, entropy: float | None) -> tuple[float, str]:
        p = self.params
        f = min(step / p.horizon, 1.0)
        return _clamp(p.t_max - (p.t_max - p.t_min) * f, p), TRIGGER_SCHEDULE


class CosineAnnealing(Policy):
    """T(s) = t_min + (t_max - t_min) * (1 + cos(pi * min(s / horizon, 1))) / 2."""

    name = "cosine"

    def value(self, step: int, entropy: float | None) -> tuple[float, str]:
        p = self.params
        f = min(step / p.horizon, 1.0)
        return _clamp(p.t_min + (p.t_max - p.t_min) * (1.0 + math.cos(math.pi * f)) / 2.0, p), TRIGGER_SCHEDULE


class ExponentialDecay(Policy):
    """T(s) = max(t_min, t_max * decay**s)."""

    name = "exponential"

    def value(self, step: int, entropy: float | None) -> tuple[float, str]:
        p = self.params
        return _clamp(p.t_max * p.decay**step, p), TRIGGER_SCHEDULE


class EntropyAdaptive(Policy):
    """Keeps the next-token entropy near a target: a too peaked distribution (entropy below the
    band) raises T, a too flat one lowers it, multiplicatively and within [t_min, t_max].

    ``entropy`` is of the model's untempered distribution (softmax of the raw logits), so the
    controller's input does not depend on its own output and a decision is a closed form of
    (previous T, entropy): T' = clamp(T * exp(gain * (target - H))) outside the band.
    """

    name = "entropy"
    needs_entropy = True

    def value(self, step: int, entropy: float | None) -> tuple[float, str]:
        p = self.params
        if entropy is None:
            raise ValueError("the entropy-adaptive policy needs the next-token entropy")
        prev = self.prev
        if prev is None:
            prev = _clamp(p.t_init if p.t_init is not None else (p.t_min + p.t_max) / 2.0, p)
        err = p.entropy_target - entropy
        if abs(err) <= p.entropy_band:
            return prev, TRIGGER_ENTROPY_OK
        t = _clamp(prev * math.exp(p.entropy_gain * err), p)
        if t == 0.0 and err > 0 and p.t_max > 0:  # multiplicative control cannot leave 0
            t = _clamp(max(p.t_min, 1e-3), p)
        return t, (TRIGGER_ENTROPY_LOW if err > 0 else TRIGGER_ENTROPY_HIGH)


_CLASSES: dict[str, type[Policy]] = {
    c.name: c for c in (Constant, LinearDecay, CosineAnnealing, ExponentialDecay, EntropyAdaptive)
}
assert tuple(_CLASSES) == TEMPERATURE_POLICIES
assert {"set", "raise", "lower", "hold"} <= set(POLICY_ACTIONS)


def make_policy(name: str, params: PolicyParams, policy_id: str | None = None) -> Policy:
    """A fresh policy instance (one per request) by schedule name; ValueError names the choices."""
    try:
        cls = _CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown temperature policy {name!r}; expected one of {', '.join(TEMPERATURE_POLICIES)}") from None
    return cls(params, policy_id)


@dataclass
class Schedule:
    """A temperature schedule as the control plane sets it for a pool: a name of
    :data:`TEMPERATURE_POLICIES` and every :class:`PolicyParams` value (normalised by
    :func:`validate_schedule`)."""

    name: str = names.DEFAULT_POLICY
    params: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params)}


def validate_schedule(name: Any, params: Any) -> Schedule:
    """A normalised schedule (all params filled in), or ValueError naming the bad field."""
    if not isinstance(name, str) or name not in TEMPERATURE_POLICIES:
        raise ValueError(f"schedule.name: must be one of {', '.join(TEMPERATURE_POLICIES)}, got {name!r}")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError(f"schedule.params: expected an object, got {type(params).__name__}")
    known = set(PolicyParams.__dataclass_fields__)
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"schedule.params: unknown key(s) {unknown} (known: {sorted(known)})")
    for k, v in params.items():
        if v is None and k == "t_init":
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"schedule.params.{k}: expected a finite number, got {v!r}")
    if "horizon" in params and params["horizon"] != int(params["horizon"]):
        raise ValueError(f"schedule.params.horizon: expected an integer, got {params['horizon']!r}")
    clean = {k: (int(v) if k == "horizon" else v) for k, v in params.items()}
    try:
        pp = PolicyParams(**clean)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"schedule.params: {exc}") from None
    return Schedule(name, asdict(pp))


#: What a pool runs until the control plane says otherwise.
DEFAULT_SCHEDULE = validate_schedule(names.DEFAULT_POLICY, {})


def policy_params(schedule: Schedule) -> PolicyParams:
    """The :class:`PolicyParams` of a validated schedule."""
    return PolicyParams(**schedule.params)
