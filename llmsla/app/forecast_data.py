"""Composition root for ``llmsla forecast dataset``: fleet scenarios -> windows -> data set.

The forecaster imports core only, and the fleet simulator knows nothing of forecasting; this
module joins them. Each split owns a disjoint part of every trace's (stretched) timeline - train
the first half, validation the next 20 %, test the last 30 % - and its own seed range, so the
test runs' trace slices and seeds never appear in training. Windows are computed in memory with
the store's definitions (``forecaster.windowing``, proven equal to the streaming job's by
``tests/forecaster/test_windowing_parity.py``); features come from the same
``forecaster.features.build`` the online scorer uses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from llmsla import names, slo_catalog
from llmsla.config import Config
from llmsla.fleet import faults as faults_mod
from llmsla.fleet import scenarios
from llmsla.forecaster import features, windowing
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.dataset import Dataset
from llmsla.goodput import GoodputBounds

#: Share of each trace's timeline per split, in time order.
SPLIT_SPANS: dict[str, tuple[float, float]] = {"train": (0.0, 0.5), "val": (0.5, 0.7), "test": (0.7, 1.0)}
#: First seed of each split (seeds never repeat across splits).
SPLIT_SEEDS: dict[str, int] = {"train": 0, "val": 1000, "test": 2000}
START_MS = 1_700_000_000_000  # simulated time 0 of run 0; runs are laid end to end after it


@dataclass
class DataSpec:
    traces: tuple[str, ...] = ("azure_conv", "azure_code")
    # validation must hold enough healthy target-days to set a threshold for a few false alarms
    # per day (4 runs held 0.45: one false alarm was 2.2/day); more training runs, more faults seen
    runs: dict[str, int] = field(default_factory=lambda: {"train": 16, "val": 10, "test": 10})
    duration_s: dict[str, float] = field(default_factory=lambda: {"train": 1500.0, "val": 1200.0, "test": 1500.0})
    seed: int = 0  # offsets every split's seed range

    def scenarios(self) -> list[tuple[str, scenarios.Scenario]]:
        out = []
        for split, (a, b) in SPLIT_SPANS.items():
            for trace in self.traces:
                setup = scenarios.TRACES.get(trace, scenarios.TraceSetup("6b:4"))
                span = setup.span_s * setup.time_scale
                for k in range(self.runs[split]):
                    seed = self.seed + SPLIT_SEEDS[split] + k
                    out.append((split, scenarios.make(trace, seed, lo_s=a * span, hi_s=b * span,
                                                      duration_s=self.duration_s[split])))
        return out


def build(cfg: Config, spec: DataSpec, *, log: Callable[[str], None] | None = None) -> Dataset:
    fc = cfg.forecast
    slos = slo_mod.from_config(cfg)
    ttft_ms, e2e_ms = (next(s.threshold for s in slos if s.sli == sli) for sli in (slo_mod.SLI_TTFT, slo_mod.SLI_E2E))
    good = GoodputBounds.from_catalog(slo_catalog.load(cfg))  # as the stream job counts goodput
    ds = Dataset.empty("fleet", fc.window_steps, fc.horizon_steps, float(names.REQUEST_WINDOW_S), {
        "slos": [s.__dict__ for s in slos], "slo_window_steps": fc.slo_window_steps,
        "precursor_kinds": list(faults_mod.PRECURSOR_KINDS), "spec": {
            "traces": list(spec.traces), "runs": spec.runs, "duration_s": spec.duration_s, "seed": spec.seed},
        "scenarios": [], "features": list(features.KNOWN),
    })
    cache: dict[str, list] = {}
    t_ms = START_MS
    for i, (split, sc) in enumerate(spec.scenarios()):
        t0 = time.perf_counter()
        col = windowing.Collector()
        res = scenarios.run(sc, col, start_ms=t_ms, cache=cache, gpu_interval_s=cfg.gpu.interval_s,
                            timeout_s=cfg.gateway.request_timeout_s, max_concurrency=cfg.gateway.max_concurrency,
                            max_in_flight=cfg.gateway.max_in_flight, engine_sink=col.engine)
        req = windowing.request_windows(col.requests, ttft_slo_ms=ttft_ms, e2e_slo_ms=e2e_ms, goodput=good)
        gpu = windowing.gpu_windows(col.gpus)
        pol = windowing.empty(windowing.POLICY_KEYS, windowing.POLICY_VALUES)  # the simulator has no policy
        eng = windowing.engine_windows(col.engines)  # what `llmsla engines` + the stream job would store
        n_steps = int(sc.duration_s // names.REQUEST_WINDOW_S)
        targets = features.targets_of(req)
        ts = features.build(req, gpu, pol, targets=targets, t0_ms=t_ms, n_steps=n_steps, slos=slos,
                            feature_names=features.KNOWN, eng=eng)
        labels = faults_mod.labels(list(sc.faults), t_ms)
        for f in labels:
            f["pool"] = names.DEFAULT_POOL
        run_id = f"{sc.trace}/{sc.seed}"
        ds.add_fleet_run(ts, slos, fc.slo_window_steps,
                         {"split": split, "run": run_id, "trace": sc.trace, "seed": sc.seed}, labels)
        ds.info["scenarios"].append({"split": split, **sc.to_dict(), "start_ms": t_ms, "requests": len(res.rows)})
        if log:
            log(f"[{i + 1}] {split:5s} {run_id:16s} {len(res.rows):6d} requests, "
                f"{len(sc.faults)} faults ({', '.join(f.kind for f in sc.faults)}), {time.perf_counter() - t0:.1f} s")
        # the next run starts on a fresh 5 s boundary after this one, so runs never share a window
        t_ms += (n_steps + 2 * fc.window_steps) * names.REQUEST_WINDOW_S * 1000
    return ds
