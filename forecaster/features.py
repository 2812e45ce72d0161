"""The features per target and 5 s step, from the store's windows: one function for the
training sets and the online scorer, so both see the same numbers.

Each model reads its own feature list (the artifact records it): :data:`FEATURES` is the list
new models train on, :data:`KNOWN` every feature this function can build; :func:`build` and
:func:`transform` take the list, so a model trained before a feature was added keeps scoring.

Rows are merged exactly where the store keeps counts and sums; a merged percentile is the
**maximum** over the rows (an upper bound of the pooled one, the worst replica), because
percentiles cannot be averaged. Missing data stays NaN with a per-source presence mask, and the
scaler turns it into the training median, so a NaN never reaches a model.
See docs/forecaster.md#design.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from llmsla import names
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.windowing import Frame

FEATURES: tuple[str, ...] = names.FORECAST_FEATURES
#: The engine's own state (``engine_windows``: the serving engine's scrape, ``llmsla engines``):
#: requests waiting for a batch slot, the fullest KV cache, preemptions per second. A pool sums
#: its replicas' queues and preemptions and takes the fullest cache.
ENGINE_FEATURES: tuple[str, ...] = names.FORECAST_ENGINE_FEATURES
#: Every feature :func:`build` can make: the default list and those a model may opt into
#: (``gpu_temp_c``: the hottest of the target's GPUs, the thermal-throttling precursor; the
#: engine's state, :data:`ENGINE_FEATURES`).
KNOWN: tuple[str, ...] = names.FORECAST_KNOWN_FEATURES
#: Heavy-tailed features get log1p before robust scaling (a 60 s TTFT must not be 1,000 IQRs).
LOG_FEATURES: frozenset[str] = frozenset({"qps", "ttft_p50_ms", "ttft_p99_ms", "e2e_p99_ms", "itl_mean_ms",
                                          "itl_jitter_ms", "queue_p99_ms", "output_tps", "engine_waiting",
                                          "engine_preemptions_per_s"})
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
    x: np.ndarray  # [targets, steps, len(feature_names)], NaN = missing
    present: np.ndarray  # [targets, steps, len(MASKS)] bool
    counts: np.ndarray  # [targets, steps, len(slo.COUNTS)]
    signals: np.ndarray  # [targets, steps, len(SIGNALS)], 0 where no requests
    extra: dict = field(default_factory=dict)

    @property
    def n_steps(self) -> int:
        return self.x.shape[1]


def targets_of(req: Frame, *, pools: bool = True) -> list[Target]:
    """Every replica (not ``none``) and, with ``pools``, every pool seen in the request rows."""
    keys = _Keys.of(req)
    seen = set()
    for c in np.unique(keys.pair_of).tolist():  # each (pool, replica) once, not each row
        p, r = keys.pair(c)
        if r != names.NO_REPLICA:
            seen.add(Target(p, r))
        if pools:
            seen.add(Target(p, ""))
    return sorted(seen)


def configured(names_: Sequence[str]) -> tuple[str, ...]:
    """The feature list new models read: ``forecast.features``, or :data:`FEATURES` when it is
    empty (the config check has refused unknown or repeated names)."""
    return tuple(names_) or FEATURES


def unknown_features(feature_names: Sequence[str]) -> list[str]:
    """The names in ``feature_names`` this llmsla cannot build (an artifact from a newer one)."""
    return [n for n in feature_names if n not in KNOWN]


def build(req: Frame, gpu: Frame, pol: Frame, *, targets: list[Target], t0_ms: int, n_steps: int,
          slos: list[slo_mod.SloTarget], gpu_map: GpuMap = sim_gpu_map,
          gpu_cells: GpuCells | None = None, feature_names: Sequence[str] = FEATURES,
          eng: Frame | None = None) -> TargetSeries:
    """Features (``feature_names``, in that order), presence masks, SLO counts and SLI signals
    for ``targets`` on the step grid.

    A pool's GPUs are those of its replicas seen in ``req``, unless ``gpu_cells`` is given (the
    online scorer's :class:`~llmsla.forecaster.feature_window.FeatureWindow` builds a few steps at
    a time, with the GPUs of the whole window's replicas: :func:`gpu_cells_of`). ``extra`` holds
    per (target, step) cell ``rows_at`` (any request row) and ``model_at`` (the first named row's
    model), from which ``models`` is taken: the model of a target's first step with a named row;
    and ``unknown``: whether a row on the grid belongs to a replica or pool not in ``targets``.
    ``eng``: the engine windows (:data:`ENGINE_FEATURES`; NaN where a target has none, or
    without it).
    """
    bad = unknown_features(feature_names)
    if bad:
        raise ValueError(f"features {bad} cannot be built (known: {list(KNOWN)})")
    nt = len(targets)
    tidx = {(t.pool, t.replica): i for i, t in enumerate(targets)}  # tuples hash in C
    x = np.full((nt, n_steps, len(KNOWN)), np.nan)
    present = np.zeros((nt, n_steps, len(MASKS)), dtype=bool)
    counts = np.zeros((nt, n_steps, len(slo_mod.COUNTS)))

    # -- request windows: rows -> (target, step) cells ---------------------------------------
    # Vectorised (the online scorer runs this every step for every target): each row feeds its
    # replica's target and its pool's, in row order, so sums add up in the same order always.
    step = (req["bucket"] - t0_ms) // STEP_MS
    ok = (step >= 0) & (step < n_steps) & ((req["bucket"] - t0_ms) % STEP_MS == 0)
    keys = _Keys.of(req)
    ti, ri, unknown = _request_cells(keys, np.flatnonzero(ok), tidx)
    si = step[ri]
    cell = ti * n_steps + si
    rows_at = np.zeros(nt * n_steps, dtype=bool)
    rows_at[cell] = True
    model_at = np.full(nt * n_steps, "", dtype=object)
    if len(ri):
        named = req["model"][ri] != ""  # object compare: no copy into a unicode array
        first_cell, first = np.unique(cell[named], return_index=True)
        model_at[first_cell] = req["model"][ri[named][first]]
    rows_at, model_at = rows_at.reshape(nt, n_steps), model_at.reshape(nt, n_steps)
    models = first_models(model_at)

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
    avail = slo_mod.availability(slos)  # what "failed" and "total" mean: the spec's statuses
    errors = add(sum(req[names.STATUS_COLUMNS[st]][ri] for st in sorted(avail.failed)))
    served = add(sum(req[names.STATUS_COLUMNS[st]][ri] for st in sorted(avail.counted)))
    itl_n, itl_sum, itl_sq = add("itl_n"), add("itl_sum_ms"), add("itl_sumsq_ms2")
    with np.errstate(invalid="ignore", divide="ignore"):
        itl_mean = np.where(itl_n > 0, itl_sum / np.where(itl_n > 0, itl_n, 1), np.nan)
        itl_jit = np.where(itl_n > 0, np.sqrt(np.maximum(itl_sq / np.where(itl_n > 0, itl_n, 1) - itl_mean**2, 0)), np.nan)
        err_ratio = np.where(has, errors / np.where(has, n, 1), np.nan)
    f = {name: i for i, name in enumerate(KNOWN)}
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
    counts[..., 5] = served

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
    gcell = gpu_cells if gpu_cells is not None else gpu_cells_of(targets, gpu_map, _pool_replicas(keys))
    if len(gpu["bucket"]) and gcell:
        gstep = (gpu["bucket"] - t0_ms) // STEP_MS
        gok = np.flatnonzero((gstep >= 0) & (gstep < n_steps) & ((gpu["bucket"] - t0_ms) % STEP_MS == 0))
        gj, gi = _gpu_cells(gpu, gok, gcell)
        gc = gj * n_steps + gstep[gi]
        total = gpu["mem_total_bytes"][gi]
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(total > 0, gpu["mem_used_max_bytes"][gi] / np.where(total > 0, total, 1), np.nan)
        mem = np.full(nt * n_steps, np.nan)
        np.fmax.at(mem, gc, ratio)
        temp = np.full(nt * n_steps, np.nan)
        np.fmax.at(temp, gc, gpu["temp_max_c"][gi])
        util_sum = np.zeros(nt * n_steps)
        np.add.at(util_sum, gc, gpu["util_mean"][gi])
        util_n = np.zeros(nt * n_steps)
        np.add.at(util_n, gc, 1.0)
        mem, temp, util_sum, util_n = (a.reshape(nt, n_steps) for a in (mem, temp, util_sum, util_n))
        present[..., 1] = util_n > 0
        x[..., f["gpu_mem_used_ratio"]] = mem
        x[..., f["gpu_temp_c"]] = temp
        with np.errstate(invalid="ignore", divide="ignore"):
            x[..., f["gpu_util"]] = np.where(util_n > 0, util_sum / np.where(util_n > 0, util_n, 1), np.nan)

    # -- engine windows: a replica's rows and its pool's ------------------------------------------
    if eng is not None and len(eng["bucket"]):
        _engine_features(eng, tidx, t0_ms, n_steps, x, [f[n] for n in ENGINE_FEATURES])

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
    x = x[..., [f[n] for n in feature_names]]
    return TargetSeries(targets, models, t0_ms, x, present, counts, signals,
                        extra={"rows_at": rows_at, "model_at": model_at, "unknown": unknown})


def _engine_features(eng: Frame, tidx: dict[tuple[str, str], int], t0_ms: int, n_steps: int, x: np.ndarray,
                     cols: list[int]) -> None:
    """Write the engine features into ``x`` (columns ``cols``: waiting, KV usage, preemptions/s):
    each row feeds its replica's target and its pool's, summed (the queue, preemptions) or the
    maximum (the KV cache); a cell without a known value stays NaN."""
    nt = x.shape[0]
    estep = (eng["bucket"] - t0_ms) // STEP_MS
    ok = np.flatnonzero((estep >= 0) & (estep < n_steps) & ((eng["bucket"] - t0_ms) % STEP_MS == 0))
    if not len(ok):
        return
    pools, replicas = eng["pool"][ok].tolist(), eng["replica"][ok].tolist()
    rep_t = np.array([tidx.get((p, r), -1) for p, r in zip(pools, replicas, strict=True)], dtype=np.int64)
    pool_t = np.array([tidx.get((p, ""), -1) for p in pools], dtype=np.int64)
    ti = np.stack([rep_t, pool_t], axis=1).ravel()
    ri = np.repeat(ok, 2)
    keep = ti >= 0
    ti, ri = ti[keep], ri[keep]
    cell = ti * n_steps + estep[ri]

    def total(col: str) -> np.ndarray:
        v = eng[col][ri]
        known = np.isfinite(v)
        out = np.zeros(nt * n_steps)
        np.add.at(out, cell[known], v[known])
        seen = np.zeros(nt * n_steps, dtype=bool)
        seen[cell[known]] = True
        return np.where(seen, out, np.nan).reshape(nt, n_steps)

    kv = np.full(nt * n_steps, np.nan)
    np.fmax.at(kv, cell, eng["kv_usage_max"][ri])
    x[..., cols[0]] = total("waiting_mean")
    x[..., cols[1]] = kv.reshape(nt, n_steps)
    x[..., cols[2]] = total("preemptions") / names.ENGINE_WINDOW_S


def first_models(model_at: np.ndarray) -> list[str]:
    """Per target (row of ``model_at``), the first non-empty model along the steps, or ``""``."""
    named = model_at != ""
    first = named.argmax(axis=1)
    rows = np.arange(len(model_at))
    return [str(m) if ok else "" for m, ok in zip(model_at[rows, first].tolist(), named[rows, first].tolist(),
                                                  strict=True)]


#: (node, gpu) -> the indices of the targets whose GPU features it feeds
GpuCells = dict[tuple[str, int], list[int]]


def gpu_cells_of(targets: list[Target], gpu_map: GpuMap, pool_replicas: dict[str, set[str]] | None = None) -> GpuCells:
    """(node, gpu) -> the targets it serves: its replica's, and its pool's (a pool's replicas:
    ``pool_replicas``, or else the replica targets of the pool in ``targets``), in target order."""
    if pool_replicas is None:
        pool_replicas = {}
        for t in targets:
            if t.replica:
                pool_replicas.setdefault(t.pool, set()).add(t.replica)
    gcell: GpuCells = {}
    for j, t in enumerate(targets):
        for r in [t.replica] if t.replica else sorted(pool_replicas.get(t.pool, ())):
            g = gpu_map(r)
            if g is not None:
                gcell.setdefault(g, []).append(j)
    return gcell


def transform(x: np.ndarray, feature_names: Sequence[str] = FEATURES) -> np.ndarray:
    """log1p of the heavy-tailed features (before robust scaling); NaN stays NaN. ``x``'s last
    axis holds ``feature_names``."""
    out = np.array(x, dtype=float, copy=True)
    idx = [i for i, name in enumerate(feature_names) if name in LOG_FEATURES]
    out[..., idx] = np.log1p(np.maximum(out[..., idx], 0.0))
    return out


def _codes(col: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(distinct values in order of appearance, each row's index into them) of a key column: a
    hash pass in C (``dict.fromkeys``, ``map``), cheaper than sorting strings; the online scorer
    runs it on every row of the last W steps, every step."""
    values = col.tolist()
    seen: dict[str, int] = {}
    code_of = {v: seen.setdefault(str(v), len(seen)) for v in dict.fromkeys(values)}
    return list(seen), np.fromiter(map(code_of.__getitem__, values), np.int64, len(values))


@dataclass
class _Keys:
    """The request rows' (pool, replica) as codes, computed once per build."""

    pools: list[str]
    reps: list[str]
    pool_of: np.ndarray  # [rows] index into pools
    pair_of: np.ndarray  # [rows] pool index * len(reps) + replica index

    @classmethod
    def of(cls, req: Frame) -> _Keys:
        pools, ip = _codes(req["pool"])
        reps, ir = _codes(req["replica"])
        return cls(pools, reps, ip, ip * max(1, len(reps)) + ir)

    def pair(self, code: int) -> tuple[str, str]:
        return self.pools[code // len(self.reps)], self.reps[code % len(self.reps)]


def _request_cells(keys: _Keys, rows: np.ndarray, tidx: dict[tuple[str, str], int]) -> tuple[np.ndarray, np.ndarray, bool]:
    """(target, row) pairs: each of ``rows`` feeds ``Target(pool, replica)`` then
    ``Target(pool, "")`` where those are targets, in row order; and whether a row's replica or
    pool is not a target."""
    if not len(rows):
        return np.empty(0, np.int64), np.empty(0, np.int64), False
    upair, ipair = np.unique(keys.pair_of[rows], return_inverse=True)
    pairs = [keys.pair(c) for c in upair.tolist()]
    rep_of_pair = np.array([tidx.get((p, r), -1) for p, r in pairs], dtype=np.int64)
    pool_of = np.array([tidx.get((p, ""), -1) for p in keys.pools], dtype=np.int64)
    unknown = bool(np.any((rep_of_pair < 0) & np.array([r != names.NO_REPLICA for _, r in pairs]))
                   or np.any(pool_of[np.unique(keys.pool_of[rows])] < 0))
    rep_t, pool_t = rep_of_pair[ipair], pool_of[keys.pool_of[rows]]
    both = np.stack([rep_t, pool_t], axis=1).ravel()
    keep = both >= 0
    return both[keep], np.repeat(rows, 2)[keep], unknown


def _pool_replicas(keys: _Keys) -> dict[str, set[str]]:
    """Pool -> the replicas (not ``none``) seen in the request rows."""
    out: dict[str, set[str]] = {}
    for c in np.unique(keys.pair_of).tolist():
        pool, rep = keys.pair(c)
        if rep != names.NO_REPLICA:
            out.setdefault(pool, set()).add(rep)
    return out


def _gpu_cells(gpu: Frame, rows: np.ndarray, gcell: dict[tuple[str, int], list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(target, row) pairs of the GPU ``rows``: each row feeds every target of its (node, gpu),
    in row order."""
    if not len(rows):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    un, inode = _codes(gpu["node"][rows])
    g = gpu["gpu"][rows].astype(np.int64)
    span = int(g.max()) + 1 if len(g) else 1
    ukey, ikey = np.unique(inode * span + g, return_inverse=True)
    lists = [gcell.get((un[k // span], int(k % span)), []) for k in ukey.tolist()]
    n = np.array([len(v) for v in lists], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(n)[:-1]])
    flat = np.array([j for v in lists for j in v], dtype=np.int64)
    per_row = n[ikey]
    out_rows = np.repeat(rows, per_row)
    offset = np.arange(int(per_row.sum())) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    return flat[np.repeat(start[ikey], per_row) + offset], out_rows
