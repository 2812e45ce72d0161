"""SLO targets and the degradation label derived from them.

Labelling depends on one small input, a list of :class:`SloTarget` - ``(name, sli, threshold,
objective, failed)`` per SLI - taken from the SLO catalog (``llmsla.slo_catalog``: the specs in
``slo.dir``), so the forecaster calls a breach what the burn-rate rules call one.

A window *breaches* an SLO when its share of good events is below the objective. Counts are
merged exactly over ``slo_window_steps`` consecutive 5 s windows (the SLO evaluation window):
with a few requests per replica per 5 s, a 99 % objective evaluated on 5 s alone would flag a
single slow request. Degradation at step ``t`` = a breach at any step in ``(t, t + H]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmsla import names, slo_catalog
from llmsla.config import Config

SLI_TTFT = slo_catalog.SLI_TTFT  # good: a first token within threshold ms; total: requests with a first token
SLI_E2E = slo_catalog.SLI_E2E  # good: end to end within threshold ms; total: all requests
SLI_AVAILABILITY = slo_catalog.SLI_AVAILABILITY  # failed and total: the statuses its spec selects
SLIS: tuple[str, ...] = (SLI_TTFT, SLI_E2E, SLI_AVAILABILITY)


@dataclass(frozen=True)
class SloTarget:
    name: str  # the alert's ``slo`` label
    sli: str  # one of SLIS
    threshold: float  # ms for latency SLIs, unused for availability
    objective: float  # share of good events required, 0..1
    #: availability: the request statuses that fail it, and those its total counts
    failed: frozenset[str] = frozenset()
    counted: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.sli not in SLIS:
            raise ValueError(f"SLO {self.name}: unknown SLI {self.sli!r} (known: {', '.join(SLIS)})")
        if self.sli == SLI_AVAILABILITY and not (self.failed and self.counted <= set(names.STATUSES)
                                                 and self.failed <= self.counted):
            raise ValueError(f"SLO {self.name}: availability needs failed statuses within its counted ones")
        if not 0 < self.objective < 1:
            raise ValueError(f"SLO {self.name}: objective must be in (0, 1), got {self.objective}")


def from_catalog(catalog: slo_catalog.Catalog) -> list[SloTarget]:
    """The catalog's TTFT, E2E and availability objectives, as the labels read them."""
    out = []
    for sli in SLIS:
        o = catalog.required(sli)
        out.append(SloTarget(o.name, sli, o.threshold_ms, o.target, o.failed, o.counted) if sli == SLI_AVAILABILITY
                   else SloTarget(o.name, sli, o.threshold_ms, o.target))
    return out


def from_config(cfg: Config) -> list[SloTarget]:
    """:func:`from_catalog` of the specs ``cfg`` points at (``slo.dir``)."""
    return from_catalog(slo_catalog.load(cfg))


def availability(slos: list[SloTarget]) -> SloTarget:
    """The availability target of ``slos``: its statuses define the error features and counts."""
    found = next((s for s in slos if s.sli == SLI_AVAILABILITY), None)
    if found is None:
        raise ValueError("the SLO targets name no availability objective (its statuses define a failed request)")
    return found


#: Per-step count columns the labels need, in this order (see features.TargetSeries.counts).
#: ``errors``: requests of the availability SLO's failed statuses; ``served``: of its counted ones.
COUNTS: tuple[str, ...] = ("requests", "ttft_count", "ttft_bad", "e2e_bad", "errors", "served")


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
            total, bad = c["served"], c["errors"]
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
