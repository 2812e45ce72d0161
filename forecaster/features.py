"""The 12 features per target and 5 s step, from the store's windows: one function for the
training sets and the online scorer, so both see the same numbers.

Targets are replicas and pools. A replica target may have several rows per step (one per arm
or model); a pool target has one per replica plus the gateway's ``replica = none`` row
(rejections). Rows of a target are merged exactly where the store keeps counts and sums
(requests, errors, tokens, SLO counts, ITL mean and jitter from ``itl_sum``/``itl_sumsq``); a
percentile cannot be merged from percentiles, so a merged percentile is the **maximum** over the
rows - an upper bound of the pooled percentile (a mixture's quantile lies between its
components'), i.e. the worst replica, which is what an SRE looks at.

GPU features come from the replica's GPU (``gpu_map``: replica -> (node, gpu)); a pool takes the
fullest GPU's memory ratio and the mean utilisation. Temperature jitter comes from the policy
windows of zone = pool; a 60 s window counts from the step after the minute it covers ended
(what the online scorer can have read by then), for the minutes after.

Missing data stays NaN here, with a per-source presence mask (requests, GPU, policy); the
scaler turns NaN into the training median after scaling (0), so a NaN never reaches a model.
A step without a request window has ``qps = output_tps = 0`` (nothing was served) and NaN
latencies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from llmsla import names
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.windowing import Frame

FEATURES: tuple[str, ...] = (
    "qps", "ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "itl_mean_ms", "itl_jitter_ms",
    "queue_p99_ms", "error_ratio", "gpu_mem_used_ratio", "gpu_util", "output_tps", "temperature_jitter",
)
#: Heavy-tailed features get log1p before robust scaling (a 60 s TTFT must not be 1,000 IQRs).
LOG_FEATURES: frozenset[str] = frozenset({"qps", "ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "itl_mean_ms",
                                          "itl_jitter_ms", "queue_p99_ms", "output_tps"})
MASKS: tuple[str, ...] = ("has_requests", "has_gpu", "has_policy")
#: SLI signals the univariate baselines forecast: latency quantile / threshold, error ratio / budget.
SIGNALS: tuple[str, ...] = slo_mod.SLIS
STEP_MS = names.REQUEST_WINDOW_S * 1000

GpuMap = Callable[[str], tuple[str, int] | None]


def sim_gpu_map(replica: str) -> tuple[str, int] | None:
    """The fleet simulator's layout: replica ``rN`` on node ``sim-<N // 8>``, GPU ``N % 8``."""
    if replica.startswith("r") and replica[1:].isdigit():
        i = int(replica[1:])
        return f"sim-{i // 8}", i % 8
    return None


def gpu_map_from(pairs: list[str]) -> GpuMap:
    """``["r0=node-a/0", ...]`` (config ``forecast.gpu_map``); empty = :func:`sim_gpu_map`."""
    if not pairs:
        return sim_gpu_map
    table: dict[str, tuple[str, int]] = {}
    for p in pairs:
        rep, _, where = p.partition("=")
        node, _, gpu = where.rpartition("/")
        if not rep or not node or not gpu.isdigit():
            raise ValueError(f"forecast.gpu_map: {p!r}: expected replica=node/gpu")
        table[rep.strip()] = (node.strip(), int(gpu))
    return table.get


@dataclass(frozen=True, order=True)
class Target:
    pool: str
    replica: str  # "" for the whole pool

    @property
    def kind(self) -> str:
        return names.FORECAST_TARGET_POOL if not self.replica else names.FORECAST_TARGET_REPLICA

    @property
    def id(self) -> str:
        return f"{self.pool}/{self.replica or '*'}"


@dataclass
class TargetSeries:
    """Aligned per-step arrays for ``targets`` over ``n_steps`` steps from ``t0_ms``."""

    targets: list[Target]
    models: list[str]
    t0_ms: int
    x: np.ndarray  # [targets, steps, len(FEATURES)], NaN = missing
    present: np.ndarray  # [targets, steps, len(MASKS)] bool
    counts: np.ndarray  # [targets, steps, len(slo.COUNTS)]
    signals: np.ndarray  # [targets, steps, len(SIGNALS)], 0 where no requests
    extra: dict = field(default_factory=dict)

    @property
    def n_steps(self) -> int:
        return self.x.shape[1]


def targets_of(req: Frame, *, pools: bool = True) -> list[Target]:
    """Every replica (not ``none``) and, with ``pools``, every pool seen in the request rows."""
    seen = set()
    for p, r in zip(req["pool"], req["replica"], strict=True):
        if r != names.NO_REPLICA:
            seen.add(Target(p, r))
        if pools:
            seen.add(Target(p, ""))
    return sorted(seen)


def build(req: Frame, gpu: Frame, pol: Frame, *, targets: list[Target], t0_ms: int, n_steps: int,
          slos: list[slo_mod.SloTarget], gpu_map: GpuMap = sim_gpu_map) -> TargetSeries:
    """Features, presence masks, SLO counts and SLI signals for ``targets`` on the step grid."""
    nt = len(targets)
    tidx = {t: i for i, t in enumerate(targets)}
    x = np.full((nt, n_steps, len(FEATURES)), np.nan)
    present = np.zeros((nt, n_steps, len(MASKS)), dtype=bool)
    counts = np.zeros((nt, n_steps, len(slo_mod.COUNTS)))
    models = [""] * nt

    # -- request windows: rows -> (target, step) cells ---------------------------------------
    step = (req["bucket"] - t0_ms) // STEP_MS
    ok = (step >= 0) & (step < n_steps) & ((req["bucket"] - t0_ms) % STEP_MS == 0)
    row_t: list[int] = []
    row_s: list[int] = []
    row_i: list[int] = []
    for i in np.flatnonzero(ok):
        p, r = req["pool"][i], req["replica"][i]
        for t in (Target(p, r), Target(p, "")):
            j = tidx.get(t)
            if j is not None:
                row_t.append(j)
                row_s.append(int(step[i]))
                row_i.append(int(i))
                models[j] = models[j] or str(req["model"][i])
    ti, si, ri = (np.asarray(a, dtype=np.int64) for a in (row_t, row_s, row_i))
    cell = ti * n_steps + si

    def add(col: str | np.ndarray) -> np.ndarray:
        v = req[col][ri] if isinstance(col, str) else col
        out = np.zeros(nt * n_steps)
        np.add.at(out, cell, v)
        return out.reshape(nt, n_steps)

    def worst(col: str) -> np.ndarray:
        out = np.full(nt * n_steps, np.nan)
        np.fmax.at(out, cell, req[col][ri])
        return out.reshape(nt, n_steps)

    n = add("requests")
    has = n > 0
    present[..., 0] = has
    errors = add(req["errors"][ri] + req["timeouts"][ri] + req["rejected"][ri])
    itl_n, itl_sum, itl_sq = add("itl_n"), add("itl_sum_ms"), add("itl_sumsq_ms2")
    with np.errstate(invalid="ignore", divide="ignore"):
        itl_mean = np.where(itl_n > 0, itl_sum / np.where(itl_n > 0, itl_n, 1), np.nan)
        itl_jit = np.where(itl_n > 0, np.sqrt(np.maximum(itl_sq / np.where(itl_n > 0, itl_n, 1) - itl_mean**2, 0)), np.nan)
        err_ratio = np.where(has, errors / np.where(has, n, 1), np.nan)
    f = {name: i for i, name in enumerate(FEATURES)}
    x[..., f["qps"]] = n / names.REQUEST_WINDOW_S
    x[..., f["output_tps"]] = add("output_tokens") / names.REQUEST_WINDOW_S
    for col in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "queue_p99_ms"):
        x[..., f[col]] = worst(col)
    x[..., f["itl_mean_ms"]] = itl_mean
    x[..., f["itl_jitter_ms"]] = itl_jit
    x[..., f["error_ratio"]] = err_ratio
    ttft_count = add("ttft_count")
    counts[..., 0] = n
    counts[..., 1] = ttft_count
    counts[..., 2] = ttft_count - add("ttft_within_slo")
    counts[..., 3] = n - add("e2e_within_slo")
    counts[..., 4] = errors

    # SLI signals: latency quantile at the objective / threshold; error ratio / error budget
    signals = np.zeros((nt, n_steps, len(SIGNALS)))
    for s in slos:
        k = SIGNALS.index(s.sli)
        if s.sli == slo_mod.SLI_AVAILABILITY:
            v = err_ratio / (1.0 - s.objective)
        else:
            v = worst(f"{s.sli}_{slo_mod.quantile_column(s.objective)}_ms") / s.threshold
        signals[..., k] = np.where(np.isfinite(v), v, 0.0)

    # -- GPU windows ----------------------------------------------------------------------------
    gcell: dict[tuple[str, int], list[int]] = {}
    for j, t in enumerate(targets):
        reps = [t.replica] if t.replica else sorted({r for p, r in zip(req["pool"], req["replica"], strict=True)
                                                    if p == t.pool and r != names.NO_REPLICA})
        for r in reps:
            g = gpu_map(r)
            if g is not None:
                gcell.setdefault(g, []).append(j)
    if len(gpu["bucket"]) and gcell:
        gstep = (gpu["bucket"] - t0_ms) // STEP_MS
        gok = (gstep >= 0) & (gstep < n_steps) & ((gpu["bucket"] - t0_ms) % STEP_MS == 0)
        mem = np.full((nt, n_steps), np.nan)
        util_sum = np.zeros((nt, n_steps))
        util_n = np.zeros((nt, n_steps))
        for i in np.flatnonzero(gok):
            for j in gcell.get((str(gpu["node"][i]), int(gpu["gpu"][i])), ()):
                s_ = int(gstep[i])
                total = gpu["mem_total_bytes"][i]
                ratio = gpu["mem_used_max_bytes"][i] / total if total > 0 else math.nan
                mem[j, s_] = np.fmax(mem[j, s_], ratio)
                util_sum[j, s_] += gpu["util_mean"][i]
                util_n[j, s_] += 1
        present[..., 1] = util_n > 0
        x[..., f["gpu_mem_used_ratio"]] = mem
        with np.errstate(invalid="ignore", divide="ignore"):
            x[..., f["gpu_util"]] = np.where(util_n > 0, util_sum / np.where(util_n > 0, util_n, 1), np.nan)

    # -- policy windows (60 s, zone = pool): the last minute that ended by the step's end -------
    if len(pol["bucket"]):
        pw = names.POLICY_WINDOW_S * 1000
        by_zone: dict[tuple[str, int], float] = {}
        for b, z, v in zip(pol["bucket"], pol["zone"], pol["temperature_jitter"], strict=True):
            key = (str(z), int(b))
            by_zone[key] = max(by_zone.get(key, -math.inf), float(v))
        ends = t0_ms + (np.arange(n_steps) + 1) * STEP_MS
        minute = ends - ends % pw - pw
        for j, t in enumerate(targets):
            vals = np.array([by_zone.get((t.pool, int(m)), math.nan) for m in minute])
            x[j, :, f["temperature_jitter"]] = vals
            present[j, :, 2] = np.isfinite(vals)
    return TargetSeries(targets, models, t0_ms, x, present, counts, signals)


def transform(x: np.ndarray) -> np.ndarray:
    """log1p of the heavy-tailed features (before robust scaling); NaN stays NaN."""
    out = np.array(x, dtype=float, copy=True)
    for i, name in enumerate(FEATURES):
        if name in LOG_FEATURES:
            out[..., i] = np.log1p(np.maximum(out[..., i], 0.0))
    return out
