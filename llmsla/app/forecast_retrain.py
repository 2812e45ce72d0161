"""Retrain on the store and gate the result: the cycle behind ``forecast train --from-store`` and
``forecast serve``'s ``forecast.retrain_every``.

One code path for both: the store's history becomes a data set (``store_dataset``, the same as
``forecast dataset --from-store``), the LSTM trains on it (``train_and_save``), the artifact goes
into the model registry as a candidate, and the gate (:mod:`llmsla.forecaster.gate`) scores it
and the serving champion - the registry's, else the shipped model - with the backtest on the
same history's held-out part, then promotes or refuses it with the reason. A composition-root
module: it wires the forecaster's parts with the training helpers of the command line.
See docs/forecaster.md#model-registry.
"""

from __future__ import annotations

import datetime as dt
import getpass
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from llmsla.app.forecast_cli import _eval_config, _train_config, train_and_save
from llmsla.config import Config
from llmsla.forecaster import artifact, backtest, features, gate, registry
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster import store_dataset as sd
from llmsla.forecaster.dataset import Dataset

Log = Callable[[str], None]


def trained_by() -> str:
    """``user@host`` of this process: who trained a model, for the registry."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "uid-unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class HistorySpec:
    """Which history a cycle reads and how it cuts it (``--from/--to/--split/...``)."""

    from_ms: int
    to_ms: int
    split: tuple[float, float, float] = sd.DEFAULT_SPLIT
    min_breaches: int = 5
    allow_gaps: bool = False

    def store_spec(self, cfg: Config, window: int, horizon: int) -> sd.StoreSpec:
        return sd.StoreSpec(window, horizon, cfg.forecast.slo_window_steps, self.split, self.min_breaches,
                            self.allow_gaps)


@dataclass
class Outcome:
    row: registry.ModelRow
    verdict: gate.Verdict | None  # None: not gated (--no-gate, or the model is the champion already)
    message: str


def read(cfg: Config, conn: psycopg.Connection, spec: HistorySpec) -> sd.History:
    """Every feature this llmsla builds: the candidate reads ``forecast.features`` and the
    champion its own list, each selected from the same history."""
    fc = cfg.forecast
    return sd.read_history(conn, spec.from_ms, spec.to_ms, slos=slo_mod.from_config(cfg),
                           slo_window_steps=fc.slo_window_steps, gpu_map=features.gpu_map_from(fc.gpu_map),
                           feature_names=features.KNOWN)


def _source_of(absent: list[str]) -> str:
    """What fills the features a history lacks."""
    if set(absent) <= set(features.ENGINE_FEATURES):
        return "the store has no engine windows (is `llmsla engines` scraping the replicas?)"
    return "the store has no windows of its source for these targets; remove it from forecast.features"


def champion(conn: psycopg.Connection, log: Log) -> tuple[artifact.Artifact, str, registry.ModelRow | None]:
    """The model serving now: the registry's champion, else (none, or one that does not load:
    logged) the shipped model. Returns (artifact, label, row)."""
    row = registry.champion(conn)
    if row is not None:
        try:
            return registry.load(conn, row), f"v{row.version} (model {row.id})", row
        except registry.RegistryError as exc:
            log(f"the registry's champion does not load ({exc}); comparing with the shipped model")
    art = artifact.load(artifact.PRETRAINED)
    return art, f"the shipped model v{art.version}", None


def run_gate(cfg: Config, conn: psycopg.Connection, h: sd.History, spec: HistorySpec, ds: Dataset,
             row: registry.ModelRow, cand: artifact.Artifact, log: Log) -> gate.Verdict:
    """Score the candidate and the champion on the same history's held-out part, each on its own
    features out of ``ds`` (built with every known one); promote or refuse."""
    champ, label, _ = champion(conn, log)
    ec = _eval_config(cfg)
    slos = slo_mod.from_config(cfg)
    try:
        champ_ds = ds if (champ.window, champ.horizon) == (ds.window, ds.horizon) else \
            sd.to_dataset(h, spec.store_spec(cfg, champ.window, champ.horizon), slos)
    except sd.HistoryError as exc:  # e.g. too short for the champion's longer window: no fair comparison
        v = gate.Verdict(False, f"kept champion {label}: it cannot be scored on this history ({exc})",
                         gate.Score.of(cand.version, backtest.score(ds, cand, ec)["test"]),
                         gate.Score(champ.version, float("nan"), 0, 0, float("nan"), float("nan")), label)
        registry.record_metrics(conn, row, "gate", v.to_dict())
        registry.set_status(conn, row, registry.REFUSED, v.reason)
        return v
    cs = gate.Score.of(cand.version, backtest.score(ds, cand, ec)["test"])
    try:
        chs = gate.Score.of(champ.version, backtest.score(champ_ds, champ, ec)["test"])
    except backtest.BacktestError as exc:  # a champion whose features are not the scorer's cannot be served
        chs = gate.Score(champ.version, 0.0, 0, 0, float("inf"), float("nan"))
        log(f"champion {label} cannot be scored ({exc}): any candidate beats it")
    v = gate.judge(cs, chs, margin=cfg.forecast.promote_margin, fa_budget=cfg.forecast.false_alarms_per_day,
                   champion_label=label)
    registry.record_metrics(conn, row, "gate", v.to_dict())
    if v.promote:
        registry.promote(conn, row, v.reason)
    else:
        registry.set_status(conn, row, registry.REFUSED, v.reason)
    return v


def cycle(cfg: Config, conn: psycopg.Connection, spec: HistorySpec, *, by: str, tc: Any = None,
          out: Path | None = None, run_the_gate: bool = True, log: Log = lambda _msg: None) -> Outcome:
    """Train on the history, register the candidate, gate it (``conn`` in autocommit mode).

    Raises :class:`store_dataset.HistoryError` for a history no data set can be built from and
    ``psycopg.Error`` for the store; neither leaves a row behind."""
    h = read(cfg, conn, spec)
    fc = cfg.forecast
    every = sd.to_dataset(h, spec.store_spec(cfg, fc.window_steps, fc.horizon_steps), slo_mod.from_config(cfg))
    ds = every.select(features.configured(fc.features))
    if absent := ds.absent_features():
        raise sd.HistoryError(f"forecast.features: {', '.join(absent)} has no value in this history "
                              f"({sd.iso(spec.from_ms)} to {sd.iso(spec.to_ms)}): {_source_of(absent)}")
    tc = tc if tc is not None else _train_config(cfg)
    with tempfile.TemporaryDirectory(prefix="llmsla-train-") as tmp:
        art_dir = Path(out) if out is not None else Path(tmp) / "model"
        _, mr = train_and_save(cfg, ds, art_dir, tc, log=log)
        st = ds.info["store"]
        row = registry.put(conn, art_dir, trained_by=by,
                           train_from=dt.datetime.fromtimestamp(spec.from_ms / 1000, dt.UTC),
                           train_to=dt.datetime.fromtimestamp(spec.to_ms / 1000, dt.UTC),
                           metrics={"bounds": st["bounds"], "breach_episodes": st["breach_episodes"]})
    log(f"registered {row.label}: threshold {mr.threshold:.3f}, held-out breach recall "
        f"{mr.test.recall['none']:.2f}, {mr.test.false_alarms_per_day:.1f} false alarms per target-day")
    mute = gate.silent(mr.val, fc.false_alarms_per_day)
    if mute is not None:
        log(f"warning: {row.label}: {mute}")
        registry.record_metrics(conn, row, "warning", {"silent": mute})
    if row.status == registry.CHAMPION:
        return Outcome(row, None, f"{row.label} is the champion already (same weights and settings)")
    if not run_the_gate:
        return Outcome(row, None, f"{row.label} stays a candidate (not gated)")
    try:
        cand = registry.load(conn, row)  # what serve would load: the round trip is checked too
    except registry.RegistryError as exc:
        registry.set_status(conn, row, registry.REFUSED, str(exc))
        return Outcome(row, None, f"{row.label} refused: {exc}")
    v = run_gate(cfg, conn, h, spec, every, row, cand, log)
    return Outcome(registry.get(conn, row.id), v, v.reason if mute is None else f"{v.reason} ({mute})")
