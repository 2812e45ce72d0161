"""SLO targets and the degradation label derived from them.

Labelling depends on one small input, a list of :class:`SloTarget` - ``(name, sli, threshold,
objective)`` per SLI - so it can read ``deploy/slo/`` (OpenSLO) once those specs exist without
any change here: only :func:`from_config` is replaced. Until then the thresholds come from the
``[slo]`` config section and the objectives are the defaults below.

A window *breaches* an SLO when its share of good events is below the objective. Counts are
merged exactly over ``slo_window_steps`` consecutive 5 s windows (the SLO evaluation window):
with a few requests per replica per 5 s, a 99 % objective evaluated on 5 s alone would flag a
single slow request. Degradation at step ``t`` = a breach at any step in ``(t, t + H]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmsla import names
from llmsla.config import Config

SLI_TTFT = "ttft"  # good: a first token within threshold ms; total: requests with a first token
SLI_E2E = "e2e"  # good: end to end within threshold ms; total: all requests
SLI_AVAILABILITY = "availability"  # good: not error, timeout or rejected; total: all requests
SLIS: tuple[str, ...] = (SLI_TTFT, SLI_E2E, SLI_AVAILABILITY)

#: Default objectives until deploy/slo/ carries them (the alerting issue's SLO specs).
DEFAULT_OBJECTIVES: dict[str, tuple[str, float]] = {
    SLI_TTFT: (names.SLO_TTFT, 0.99),
    SLI_E2E: (names.SLO_E2E, 0.95),
    SLI_AVAILABILITY: (names.SLO_AVAILABILITY, 0.9995),
}


@dataclass(frozen=True)
class SloTarget:
    name: str  # the alert's ``slo`` label
    sli: str  # one of SLIS
    threshold: float  # ms for latency SLIs, unused for availability
    objective: float  # share of good events required, 0..1

    def __post_init__(self) -> None:
        if self.sli not in SLIS:
            raise ValueError(f"SLO {self.name}: unknown SLI {self.sli!r} (known: {', '.join(SLIS)})")
        if not 0 < self.objective < 1:
            raise ValueError(f"SLO {self.name}: objective must be in (0, 1), got {self.objective}")


def from_config(cfg: Config) -> list[SloTarget]:
    """Thresholds from ``[slo]``; objectives: 99 % TTFT, 95 % E2E, 99.95 % availability."""
    thresholds = {SLI_TTFT: cfg.slo.ttft_ms, SLI_E2E: cfg.slo.e2e_ms, SLI_AVAILABILITY: 0.0}
    return [SloTarget(name, sli, thresholds[sli], obj) for sli, (name, obj) in DEFAULT_OBJECTIVES.items()]


#: Per-step count columns the labels need, in this order (see features.TargetSeries.counts).
COUNTS: tuple[str, ...] = ("requests", "ttft_count", "ttft_bad", "e2e_bad", "errors")


def rolling_sum(a: np.ndarray, k: int) -> np.ndarray:
    """Sum over the last ``k`` steps (fewer at the start) along the last axis."""
    c = np.cumsum(a, axis=-1)
    out = c.copy()
    out[..., k:] = c[..., k:] - c[..., :-k]
    return out


def breaches(counts: np.ndarray, targets: list[SloTarget], slo_window_steps: int) -> np.ndarray:
    """Boolean ``[..., steps]``: the SLO window ending at each step breaches any target.

    ``counts`` is ``[..., steps, len(COUNTS)]``. A window with no events of an SLI cannot breach
    it (no user was served badly)."""
    c = {name: rolling_sum(counts[..., i], slo_window_steps) for i, name in enumerate(COUNTS)}
    out = np.zeros(counts.shape[:-1], dtype=bool)
    for t in targets:
        if t.sli == SLI_TTFT:
            total, bad = c["ttft_count"], c["ttft_bad"]
        elif t.sli == SLI_E2E:
            total, bad = c["requests"], c["e2e_bad"]
        else:
            total, bad = c["requests"], c["errors"]
        out |= (total > 0) & (bad > (1.0 - t.objective) * total + 1e-9)
    return out


def future_label(breach: np.ndarray, horizon: int) -> np.ndarray:
    """``y[t]`` = any breach in ``(t, t + horizon]``; -1 where that future is not all known."""
    n = breach.shape[-1]
    y = np.full(breach.shape, -1, dtype=np.int8)
    b = breach.astype(np.int32)
    c = np.concatenate([np.zeros(b.shape[:-1] + (1,), np.int32), np.cumsum(b, axis=-1)], axis=-1)
    if n > horizon:
        y[..., : n - horizon] = (c[..., horizon + 1:] - c[..., 1: n - horizon + 1]) > 0
    return y


def quantile_column(objective: float) -> str:
    """The store's percentile column closest above the objective (p95 for 95 %, else p99)."""
    return "p95" if objective <= 0.95 else "p99"
