"""Backtest: a model scored on the store's history as the online loop would have scored it.

The model sees the windows the online scorer would have read (the history as a data set,
:mod:`llmsla.forecaster.store_dataset`), with its own scaler and its own threshold, under the
online loop's alarm policy: the alarm it would have raised, judged by the evaluation's
definitions (:mod:`llmsla.forecaster.metrics`: recall, lead, false alarms per target-day). The
baselines have no artifact, so they learn on the history's first part, take their parameters and
threshold from the next and are reported, with the model, on the last (held-out) part; the
model is also reported over the whole history. See docs/forecaster.md#train-on-your-own-fleet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from llmsla.forecaster import evaluate, features, horizons
from llmsla.forecaster import metrics as m
from llmsla.forecaster.artifact import Artifact
from llmsla.forecaster.baselines import RULES
from llmsla.forecaster.dataset import SPLITS, Dataset, DatasetError

#: the name of the model's row in the backtest's tables
MODEL = "lstm (serving threshold)"


class BacktestError(ValueError):
    """A model the history cannot be scored with (one line naming what)."""


def check(art: Artifact) -> None:
    """The model must read features and masks the scorer can build (its own list, in its order)."""
    if art.meta.get("mode") != "fleet" or art.scaler is None:
        raise BacktestError("a backtest needs a fleet-mode model with its scaler (not a univariate one)")
    names_ = list(art.meta.get("features") or [])
    masks = list(art.meta.get("masks") or [])
    unknown = features.unknown_features(names_)
    if not names_ or unknown or masks != list(features.MASKS):
        raise BacktestError(f"model {art.version} reads features {names_} + masks {masks}; this scorer builds "
                            f"features out of {list(features.KNOWN)} + masks {list(features.MASKS)}: "
                            "retrain it with this llmsla")


def own_columns(ds: Dataset, art: Artifact) -> Dataset:
    """``ds`` (built with the model's features, or more) with the model's columns, in its order;
    ``ds`` itself when it has exactly those (``run`` and ``score`` both ask: no second copy)."""
    if ds.features == list(art.meta["features"]):
        return ds
    try:
        return ds.select(art.meta["features"])
    except DatasetError as exc:
        raise BacktestError(f"model {art.version}: {exc}") from None


def score(ds: Dataset, art: Artifact, ec: evaluate.EvalConfig) -> dict[str, m.Report]:
    """The model's alarm (its own scaler and serving threshold, the online alarm policy) judged
    on each split of ``ds`` and on the whole history: ``val``, ``test``, ``whole``. The gate
    compares a candidate with the champion by these same reports."""
    check(art)
    ds = own_columns(ds, art)

    # a model with several horizons is judged by its shortest head: the artifact's horizon and
    # threshold, the ones ``ds`` was built for
    scorer = horizons.head_scorer(art.model, ds, art.scaler, 0)

    scores = {s: evaluate.series_scores(ds, s, scorer) for s in SPLITS}
    thr, min_onset = art.threshold, ds.window - 1

    def rep(series: list[m.SeriesScores]) -> m.Report:
        return m.report(series, thr, ec.lead_max_steps, ds.step_s, min_onset, ec.policy)

    return {"val": rep(scores["val"]), "test": rep(scores["test"]),
            "whole": rep([s for split in SPLITS for s in scores[split]])}


@dataclass
class Backtest:
    results: list[evaluate.MethodResult]  # the model first, then every baseline (held-out part)
    whole: m.Report  # the model over every split of the history


def run(ds: Dataset, art: Artifact, ec: evaluate.EvalConfig, methods: tuple[str, ...], *,
        log: Callable[[str], None] | None = None) -> Backtest:
    """Score ``ds`` (built with the model's window and horizon) with the model and ``methods``;
    the learned baselines read the model's features too."""
    t0 = time.perf_counter()
    reports = score(ds, art, ec)
    ds = own_columns(ds, art)
    model = evaluate.MethodResult(MODEL, {"version": art.version}, art.threshold, reports["val"], reports["test"],
                                  time.perf_counter() - t0)
    whole = reports["whole"]
    if log:
        log(f"{MODEL}: {whole.warned[m.NONE]}/{whole.events[m.NONE]} breaches warned over the whole history")
    out = [model]
    scaler = ds.fit_scaler()
    for meth in methods:
        r = evaluate.run_rule(ds, meth, ec) if meth in RULES else evaluate.run_learned(ds, meth, scaler, ec)
        out.append(r)
        if log:
            log(f"{meth}: {r.test.warned[m.NONE]}/{r.test.events[m.NONE]} held-out breaches warned ({r.seconds:.1f} s)")
    return Backtest(out, whole)
