"""Injected faults and their ground-truth labels.

A fault is ``(start, end, kind, replica)`` plus a strength; the same list is written next to the
events as the label file (epoch ms, aligned with the events' ``ts_ms``), which is what the
forecaster's early-warning evaluation scores against. Gradual kinds (``ramp``, ``leak``,
``thermal``, ``surge``) have precursors on purpose; ``crash`` has none.
See docs/fleet.md#the-model (Faults).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS: tuple[str, ...] = ("slowdown", "memory", "crash", "jitter", "ramp", "leak", "thermal", "surge")
DEFAULT_FACTOR: dict[str, float] = {"slowdown": 3.0, "memory": 0.08, "crash": 0.0, "jitter": 0.25,
                                    "ramp": 4.0, "leak": 0.05, "thermal": 3.0, "surge": 3.0}
ALL_REPLICAS = "*"
#: Kinds whose strength grows over the window (the engine re-applies them every tick).
GRADUAL: tuple[str, ...] = ("ramp", "leak", "thermal")
#: Kinds that change the load, not a replica (applied to the arrivals before the run).
LOAD_KINDS: tuple[str, ...] = ("surge",)
#: Kinds with a precursor a forecaster can see; the rest (crash, and the step changes
#: slowdown/memory/jitter) start at full strength.
PRECURSOR_KINDS: tuple[str, ...] = GRADUAL + LOAD_KINDS
#: Largest GPU temperature rise of a ``thermal`` fault, C.
THERMAL_RISE_C = 30.0


@dataclass(frozen=True)
class Fault:
    start_s: float
    end_s: float
    kind: str
    replica: str
    factor: float

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not 0 <= self.start_s < self.end_s:
            raise ValueError(f"fault {self.kind}: need 0 <= start < end, got {self.start_s}..{self.end_s}")
        if self.kind == "slowdown" and self.factor < 1:
            raise ValueError(f"slowdown factor must be >= 1, got {self.factor}")
        if self.kind == "memory" and not 0 < self.factor <= 1:
            raise ValueError(f"memory factor (share of KV capacity left) must be in (0, 1], got {self.factor}")
        if self.kind == "jitter" and self.factor < 0:
            raise ValueError(f"jitter mean must be >= 0 s, got {self.factor}")
        if self.kind in ("ramp", "thermal", "surge") and self.factor < 1:
            raise ValueError(f"{self.kind} factor must be >= 1, got {self.factor}")
        if self.kind == "leak" and not 0 < self.factor <= 1:
            raise ValueError(f"leak factor (share of KV capacity left at the end) must be in (0, 1], got {self.factor}")
        if self.replica == ALL_REPLICAS and self.kind not in ("jitter", "surge"):
            raise ValueError(f"fault {self.kind}: replica '*' is only allowed for jitter and surge")
        if self.kind == "surge" and self.replica != ALL_REPLICAS:
            raise ValueError("fault surge: applies to the whole load, replica must be '*'")

    def active(self, t: float) -> bool:
        return self.start_s <= t < self.end_s

    def progress(self, t: float) -> float:
        """Share of the window elapsed at ``t``, 0..1 (the strength of a gradual fault)."""
        return min(1.0, max(0.0, (t - self.start_s) / (self.end_s - self.start_s)))

    def slow_at(self, t: float) -> float:
        """Iteration-time multiplier at ``t`` (1 for kinds that do not slow the replica)."""
        if self.kind == "slowdown":
            return self.factor
        if self.kind == "ramp":
            return 1.0 + (self.factor - 1.0) * self.progress(t)
        if self.kind == "thermal":
            hot = max(0.0, (self.progress(t) - 1 / 3) * 1.5)
            return 1.0 + (self.factor - 1.0) * hot * hot
        return 1.0

    def kv_share_at(self, t: float) -> float:
        """Share of the KV capacity left at ``t`` (1 for kinds that take no memory)."""
        if self.kind == "memory":
            return self.factor
        if self.kind == "leak":
            return 1.0 - (1.0 - self.factor) * self.progress(t)
        return 1.0


def parse(spec: str) -> Fault:
    """``kind:replica:start_s:end_s[:factor]``, e.g. ``slowdown:r1:600:900:4``."""
    parts = spec.split(":")
    if len(parts) not in (4, 5):
        raise ValueError(f"fault {spec!r}: expected kind:replica:start_s:end_s[:factor]")
    kind, replica = parts[0].strip(), parts[1].strip()
    try:
        start, end = float(parts[2]), float(parts[3])
        factor = float(parts[4]) if len(parts) == 5 else DEFAULT_FACTOR.get(kind, 0.0)
    except ValueError:
        raise ValueError(f"fault {spec!r}: start, end and factor must be numbers") from None
    return Fault(start, end, kind, replica, factor)


def labels(faults: list[Fault], start_ms: int) -> list[dict]:
    """Ground-truth label rows in epoch ms (aligned with the events' ``ts_ms``)."""
    return [
        {
            "start_ms": start_ms + round(f.start_s * 1000),
            "end_ms": start_ms + round(f.end_s * 1000),
            "kind": f.kind,
            "replica": f.replica,
            "factor": f.factor,
            "start_s": f.start_s,
            "end_s": f.end_s,
        }
        for f in sorted(faults, key=lambda f: (f.start_s, f.replica, f.kind))
    ]


def write_labels(path: Path, faults: list[Fault], start_ms: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"faults": labels(faults, start_ms)}, indent=1) + "\n")
    return path


def read_labels(path: Path) -> list[dict]:
    return json.loads(path.read_text())["faults"]


def to_dict(f: Fault) -> dict:
    return asdict(f)
