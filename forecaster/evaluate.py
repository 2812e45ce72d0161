"""The evaluation harness: every method on the same windows, thresholds from validation only.

For each method: parameters (rules) or weights (learned) come from the train split, parameter
choice and the alarm threshold from the validation split (the lowest threshold whose alarms -
under the online loop's alarm policy, :mod:`llmsla.forecaster.hysteresis` - stay within
``false_alarms_per_day`` false alarms per healthy day), and the reported numbers from the test
split, which nothing before has looked at.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from llmsla.forecaster import baselines, fault_labels
from llmsla.forecaster import metrics as m
from llmsla.forecaster.dataset import Dataset
from llmsla.forecaster.hysteresis import AlarmPolicy
from llmsla.forecaster.scaler import RobustScaler

LSTM = "lstm"
#: A scorer maps window end indices of the data set to risk scores.
Scorer = Callable[[np.ndarray], np.ndarray]


class EvalError(ValueError):
    """Data the harness cannot evaluate on (say, a fold without a labelled window to learn from)."""


@dataclass
class EvalConfig:
    false_alarms_per_day: float = 4.0
    lead_max_steps: int = 24
    learned_stride: int = 3
    seed: int = 0
    policy: AlarmPolicy = field(default_factory=AlarmPolicy)  # the online loop's alarm
    #: at most this many training windows for a learned baseline (evenly spaced; 0 = all):
    #: keeps gradient boosting on 960 inputs within minutes on two cores
    learned_max_windows: int = 0
    #: extra false-alarm budgets (per target-day) to report operating points at: for each, a
    #: threshold from validation and the test numbers it gives (the trade-off an SRE chooses on)
    budgets: tuple[float, ...] = ()
    #: > 0: thresholds hold the budget at this confidence (Poisson upper bound of the validation
    #: count), not on the count alone (:func:`llmsla.forecaster.metrics.threshold_for`)
    confidence: float = 0.0


@dataclass
class MethodResult:
    method: str
    params: dict
    threshold: float
    val: m.Report
    test: m.Report
    seconds: float
    extra: dict = field(default_factory=dict)


def series_scores(ds: Dataset, split: str, scorer: Scorer, *, batch: int = 8192) -> list[m.SeriesScores]:
    """Score every full window of every series of ``split``; episodes attributed to faults."""
    out = []
    for s in ds.series_of(split):
        lo, hi = int(ds.offsets[s]), int(ds.offsets[s + 1])
        score = np.full(hi - lo, np.nan)
        ends = np.arange(lo + ds.window - 1, hi)
        for i in range(0, len(ends), batch):
            score[ends[i: i + batch] - lo] = scorer(ends[i: i + batch])
        if not np.all(np.isfinite(score[ds.window - 1:])):
            raise FloatingPointError(f"series {s}: a scorer returned a non-finite score")
        eps, spans = fault_labels.episodes(ds, s)
        out.append(m.SeriesScores(score, ds.y[lo:hi], ds.breach[lo:hi], eps, fault_spans=spans))
    return out


def _calibrated(method: str, params: dict, ds: Dataset, scorer: Scorer, ec: EvalConfig, t0: float,
                extra: dict | None = None) -> MethodResult:
    val = series_scores(ds, "val", scorer)
    thr = m.threshold_for(val, ec.false_alarms_per_day, ec.lead_max_steps, ds.step_s, ec.policy, ec.confidence)
    test = series_scores(ds, "test", scorer)
    min_onset = ds.window - 1
    extra = dict(extra or {})
    if ec.budgets:
        extra["operating_points"] = operating_points(val, test, ds, ec)
    return MethodResult(method, params, thr, m.report(val, thr, ec.lead_max_steps, ds.step_s, min_onset, ec.policy),
                        m.report(test, thr, ec.lead_max_steps, ds.step_s, min_onset, ec.policy),
                        time.perf_counter() - t0, extra)


def operating_points(val: list[m.SeriesScores], test: list[m.SeriesScores], ds: Dataset,
                     ec: EvalConfig) -> list[dict]:
    """For each budget of ``ec.budgets``: the validation threshold and the test report at it."""
    out = []
    for budget in ec.budgets:
        thr = m.threshold_for(val, budget, ec.lead_max_steps, ds.step_s, ec.policy, ec.confidence)
        v, t = (m.report(x, thr, ec.lead_max_steps, ds.step_s, ds.window - 1, ec.policy) for x in (val, test))
        out.append({"budget": budget, "threshold": thr, "val_false_alarms_per_day": v.false_alarms_per_day,
                    "test": t.to_dict()})
    return out


def rule_scorer(ds: Dataset, method: str, params: dict) -> Scorer:
    if ds.mode == "fleet":
        return lambda ends: baselines.fleet_score(method, ds.signal_windows(ends), ds.horizon, **params)
    return lambda ends: baselines.univariate_score(method, ds.signal_windows(ends), ds.horizon, **params)


def tune_rule(ds: Dataset, method: str) -> dict:
    """The grid point with the best validation AUC-PR."""
    va = ds.samples("val")
    points = baselines.grid(method, ds.window)
    best, best_p = -1.0, points[0]
    for p in points:
        ap = m.auc_pr(ds.y[va], rule_scorer(ds, method, p)(va))
        if ap > best:
            best, best_p = ap, p
    return best_p


def run_rule(ds: Dataset, method: str, ec: EvalConfig) -> MethodResult:
    t0 = time.perf_counter()
    params = tune_rule(ds, method)
    return _calibrated(method, params, ds, rule_scorer(ds, method, params), ec, t0)


def training_windows(ds: Dataset, ec: EvalConfig) -> np.ndarray:
    """A learned baseline's training windows: every ``learned_stride``-th, then at most
    ``learned_max_windows`` of them, evenly spaced (deterministic, no sampling noise)."""
    tr = ds.samples("train", stride=ec.learned_stride)
    if ec.learned_max_windows and len(tr) > ec.learned_max_windows:
        tr = tr[np.linspace(0, len(tr) - 1, ec.learned_max_windows).round().astype(np.int64)]
    return tr


def run_learned(ds: Dataset, method: str, scaler: RobustScaler | None, ec: EvalConfig) -> MethodResult:
    t0 = time.perf_counter()
    tr = training_windows(ds, ec)
    model = baselines.fit_learned(method, ds.inputs(tr, scaler), ds.y[tr], seed=ec.seed)
    return _calibrated(method, {"train_windows": len(tr), "train_stride": ec.learned_stride}, ds,
                       lambda ends: model.score(ds.inputs(ends, scaler)), ec, t0)


def run_model(ds: Dataset, name: str, scorer: Scorer, ec: EvalConfig, params: dict, t0: float,
              extra: dict | None = None) -> MethodResult:
    return _calibrated(name, params, ds, scorer, ec, t0, extra)


def run_all(ds: Dataset, lstm_scorer: Scorer | None, scaler: RobustScaler | None, ec: EvalConfig,
            methods: tuple[str, ...] = baselines.METHODS, *, lstm_params: dict | None = None,
            lstm_seconds: float = 0.0, log: Callable[[str], None] | None = None) -> list[MethodResult]:
    out: list[MethodResult] = []
    if lstm_scorer is not None:
        t0 = time.perf_counter() - lstm_seconds
        out.append(run_model(ds, LSTM, lstm_scorer, ec, lstm_params or {}, t0))
        if log:
            log(f"{LSTM}: test AUC-PR {out[-1].test.auc_pr:.4f}")
    for meth in methods:
        r = run_rule(ds, meth, ec) if meth in baselines.RULES else run_learned(ds, meth, scaler, ec)
        out.append(r)
        if log:
            log(f"{meth}: test AUC-PR {r.test.auc_pr:.4f} ({r.seconds:.1f} s)")
    return out


def _learned_scorer(model: baselines.Learned, ds: Dataset) -> Scorer:
    return lambda ends: model.score(ds.inputs(ends, None))


def cross_validate(ds: Dataset, folds: int, make_lstm: Callable[[Dataset], Scorer] | None, ec: EvalConfig,
                   methods: tuple[str, ...] = baselines.METHODS,
                   log: Callable[[str], None] | None = None) -> list[MethodResult]:
    """Univariate mode over whole series: every series is scored once, by models (and a
    threshold) fitted without it. ``make_lstm`` trains an LSTM on a fold's train/val split."""
    from llmsla.forecaster.nab import fold_splits

    names_ = ([LSTM] if make_lstm is not None else []) + list(methods)
    test: dict[str, list[m.SeriesScores]] = {n: [] for n in names_}
    val: dict[str, list[m.SeriesScores]] = {n: [] for n in names_}
    secs = dict.fromkeys(names_, 0.0)
    for fold in range(folds):
        fds = fold_splits(ds, fold)
        for split in ("train", "val"):
            if not (fds.y[fds.samples(split)] == 1).any():
                raise EvalError(f"fold {fold + 1}/{folds}: its {split} series hold no labelled window to "
                                "learn from or to set a threshold on; use fewer folds or more series")
        for name in names_:
            t0 = time.perf_counter()
            if name == LSTM:
                scorer = make_lstm(fds)  # type: ignore[misc]  # LSTM is in names_ only with make_lstm
            elif name in baselines.RULES:
                scorer = rule_scorer(fds, name, tune_rule(fds, name))
            else:
                tr = training_windows(fds, ec)
                model = baselines.fit_learned(name, fds.inputs(tr, None), fds.y[tr], seed=ec.seed)
                scorer = _learned_scorer(model, fds)
            v = series_scores(fds, "val", scorer)
            thr = m.threshold_for(v, ec.false_alarms_per_day, ec.lead_max_steps, ds.step_s, ec.policy,
                                  ec.confidence)
            for s in v:
                s.threshold = thr
            t = series_scores(fds, "test", scorer)
            for s in t:
                s.threshold = thr
            val[name] += v
            test[name] += t
            secs[name] += time.perf_counter() - t0
        if log:
            log(f"fold {fold + 1}/{folds} done")
    out = []
    for name in names_:
        out.append(MethodResult(name, {"folds": folds}, float("nan"),
                                m.report(val[name], float("nan"), ec.lead_max_steps, ds.step_s, ds.window - 1,
                                         ec.policy),
                                m.report(test[name], float("nan"), ec.lead_max_steps, ds.step_s, ds.window - 1,
                                         ec.policy),
                                secs[name]))
    return out
