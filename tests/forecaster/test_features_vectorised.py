"""features.build and targets_of are vectorised (the online scorer runs it every step for every target); it must
equal, bit for bit, the straightforward row-by-row implementation it replaced - kept here as
the reference - on frames with several pools, gateway ``none`` rows, missing steps, misaligned
buckets, GPU rows and policy windows, and on a real simulated run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmsla import config as config_mod
from llmsla import names
from llmsla.fleet import faults, scenarios
from llmsla.forecaster import features, windowing
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.features import (
    FEATURES,
    MASKS,
    SIGNALS,
    STEP_MS,
    Target,
    TargetSeries,
    sim_gpu_map,
)
from llmsla.forecaster.windowing import Frame

T0 = 1_700_000_000_000


def build_reference(req: Frame, gpu: Frame, pol: Frame, *, targets: list[Target], t0_ms: int, n_steps: int,
          slos: list[slo_mod.SloTarget], gpu_map=sim_gpu_map) -> TargetSeries:
    """The first implementation, row by row: the reference the vectorised one must equal."""
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
    avail = next(s for s in slos if s.sli == slo_mod.SLI_AVAILABILITY)
    errors = add(sum(req[names.STATUS_COLUMNS[st]][ri] for st in sorted(avail.failed)))
    served = add(sum(req[names.STATUS_COLUMNS[st]][ri] for st in sorted(avail.counted)))
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




def targets_reference(req: Frame, *, pools: bool = True) -> list[Target]:
    """The first targets_of, row by row."""
    seen = set()
    for p, r in zip(req["pool"], req["replica"], strict=True):
        if r != names.NO_REPLICA:
            seen.add(Target(p, r))
        if pools:
            seen.add(Target(p, ""))
    return sorted(seen)


def _random_frames(rng: np.random.Generator, n_steps: int):
    rows = []
    for s in range(-2, n_steps + 2):  # some rows outside the grid
        for pool, reps in (("a", ["r0", "r1", "r2", "none"]), ("b", ["r8", "r9", "none"]), ("c", ["r3"])):
            for r in reps:
                if rng.uniform() < 0.2:
                    continue  # a missing window
                for arm in ("x", "y") if rng.uniform() < 0.3 else ("x",):
                    rows.append((T0 + s * STEP_MS + (1000 if rng.uniform() < 0.02 else 0), pool, r, arm))
    n = len(rows)
    req = windowing.empty(windowing.REQUEST_KEYS, windowing.REQUEST_VALUES)
    req["bucket"] = np.array([b for b, *_ in rows], dtype=np.int64)
    req["model"] = np.array(["6b" if p != "c" else "1.3b" for _, p, *_ in rows], dtype=object)
    req["pool"] = np.array([p for _, p, *_ in rows], dtype=object)
    req["replica"] = np.array([r for _, _, r, _ in rows], dtype=object)
    req["arm"] = np.array([a for *_, a in rows], dtype=object)
    for v in windowing.REQUEST_VALUES:
        req[v] = rng.gamma(2.0, 50.0, n) * rng.uniform(0.5, 1.5, n)
        req[v][rng.uniform(size=n) < 0.05] = np.nan  # null percentiles
    for v in ("requests", "errors", "timeouts", "rejected", "ttft_count", "ttft_within_slo", "e2e_within_slo",
              "itl_n"):
        req[v] = rng.integers(0, 20, n).astype(float)
    g_rows = [(T0 + s * STEP_MS, f"sim-{i // 8}", i % 8) for s in range(n_steps) for i in (0, 1, 2, 3, 8, 9, 12)
              if rng.uniform() < 0.8]
    gpu = windowing.empty(windowing.GPU_KEYS, windowing.GPU_VALUES)
    gpu["bucket"] = np.array([b for b, _, _ in g_rows], dtype=np.int64)
    gpu["node"] = np.array([nd for _, nd, _ in g_rows], dtype=object)
    gpu["gpu"] = np.array([g for *_, g in g_rows], dtype=np.int64)
    for v in windowing.GPU_VALUES:
        gpu[v] = rng.uniform(0, 1, len(g_rows))
    gpu["mem_total_bytes"] = np.where(rng.uniform(size=len(g_rows)) < 0.05, 0.0, 80e9)
    gpu["mem_used_max_bytes"] = rng.uniform(1e9, 79e9, len(g_rows))
    pw = names.POLICY_WINDOW_S * 1000
    minutes = sorted({T0 - T0 % pw + k * pw for k in range(-2, n_steps * STEP_MS // pw + 2)})
    pol = windowing.empty(windowing.POLICY_KEYS, windowing.POLICY_VALUES)
    pol["bucket"] = np.array(minutes * 2, dtype=np.int64)
    pol["zone"] = np.array(["a"] * len(minutes) + ["b"] * len(minutes), dtype=object)
    pol["policy_id"] = np.array(["p"] * 2 * len(minutes), dtype=object)
    for v in windowing.POLICY_VALUES:
        pol[v] = rng.uniform(0, 1, 2 * len(minutes))
    return req, gpu, pol


def _assert_same(a: TargetSeries, b: TargetSeries) -> None:
    assert a.targets == b.targets and a.models == b.models and a.t0_ms == b.t0_ms
    for name in ("x", "present", "counts", "signals"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=name != "present"), name


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_build_equals_the_row_by_row_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    req, gpu, pol = _random_frames(rng, 40)
    slos = slo_mod.from_config(config_mod.load(env={}))
    assert features.targets_of(req) == targets_reference(req)
    assert features.targets_of(req, pools=False) == targets_reference(req, pools=False)
    for targets in (features.targets_of(req), features.targets_of(req, pools=False),
                    [Target("a", ""), Target("b", "r9"), Target("zz", "r0")]):
        got = features.build(req, gpu, pol, targets=targets, t0_ms=T0, n_steps=40, slos=slos)
        want = build_reference(req, gpu, pol, targets=targets, t0_ms=T0, n_steps=40, slos=slos)
        _assert_same(got, want)


def test_vectorised_build_equals_the_reference_on_a_simulated_run() -> None:
    cfg = config_mod.load(env={})
    sc = scenarios.Scenario("azure_conv", 7, "6b:5", 300.0, 600.0, 2.0,
                            (faults.Fault(200.0, 400.0, "leak", "r2", 0.02),), 2.0)
    col = windowing.Collector()
    scenarios.run(sc, col, start_ms=T0)
    req = windowing.request_windows(col.requests, ttft_slo_ms=cfg.slo.ttft_ms, e2e_slo_ms=cfg.slo.e2e_ms)
    gpu = windowing.gpu_windows(col.gpus)
    pol = windowing.empty(windowing.POLICY_KEYS, windowing.POLICY_VALUES)
    slos = slo_mod.from_config(cfg)
    targets = features.targets_of(req)
    _assert_same(features.build(req, gpu, pol, targets=targets, t0_ms=T0, n_steps=120, slos=slos),
                 build_reference(req, gpu, pol, targets=targets, t0_ms=T0, n_steps=120, slos=slos))
