"""``llmsla forecast dataset|train|eval|backtest|models|serve``: the degradation forecaster's commands.

A composition-root module (it may import everything): ``dataset`` drives the fleet simulator,
the rest use the forecaster, which itself imports core only. Heavy imports (torch, sklearn)
happen inside the handlers so ``llmsla --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmsla import argtypes, extras
from llmsla.config import Config

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("forecast", help="degradation forecaster: dataset, train, eval, backtest, models, serve (docs/forecaster.md)")
    sub = p.add_subparsers(dest="forecast_command", metavar="SUBCOMMAND")
    d = sub.add_parser("dataset", help="simulate trace replays with random faults into a labelled data set")
    d.add_argument("--out", type=argtypes.output_file, help="data set file (default <forecast.dir>/dataset.npz)")
    d.add_argument("--traces", default="azure_conv,azure_code", help="comma-separated traces (default azure_conv,azure_code)")
    d.add_argument("--runs", default="16,10,10", type=argtypes.each(argtypes.positive_int, 3, "train,val,test"), help="runs per trace for train,val,test (default 16,10,10)")
    d.add_argument("--duration-s", default="1500,1200,1500",
                   type=argtypes.each(argtypes.positive_duration_s, 3, "train,val,test"), help="seconds per run for train,val,test")
    d.add_argument("--seed", type=argtypes.non_negative_int, default=0, help="offset of every split's seed range")
    d.add_argument("--from-store", action="store_true",
                   help="build it from the store's windows (--from..--to) instead of simulating; labels = SLO breaches")
    _history_args(d, split=True)
    d.set_defaults(handler=cmd_dataset)
    t = sub.add_parser("train", help="train the LSTM; threshold from validation; write the artifact")
    t.add_argument("--data", type=argtypes.input_file, help="data set (default <forecast.dir>/dataset.npz)")
    t.add_argument("--out", type=argtypes.writable_dir, help="artifact directory (default <forecast.dir>/model)")
    t.add_argument("--epochs", type=argtypes.key("forecast.epochs"), help="maximum epochs (default forecast.epochs)")
    t.add_argument("--seed", type=argtypes.key("forecast.seed"), help="training seed (default forecast.seed)")
    t.add_argument("--from-store", action="store_true",
                   help="train on the store's history (--from..--to), register the model and gate it against the champion")
    _history_args(t, split=True)
    t.add_argument("--trained-by", type=argtypes.label, help="--from-store: who trained it, for the registry (default user@host)")
    t.add_argument("--no-gate", action="store_true", help="--from-store: register the model as a candidate, do not gate it")
    t.set_defaults(handler=cmd_train)
    mo = sub.add_parser("models", help="the model registry: every model trained from the store, its status and metrics")
    mo.add_argument("--limit", type=argtypes.non_negative_int, default=20, help="newest first, at most this many (0 = all; default 20)")
    mo.add_argument("--json", action="store_true", help="one JSON object per model")
    mo.add_argument("--promote", metavar="MODEL",
                    help="make this model (id or version) the champion by hand, e.g. to roll back; it is loaded and checked first")
    mo.set_defaults(handler=cmd_models)
    e = sub.add_parser("eval", help="every method on held-out data: (a) simulated test runs, (b) --nab")
    e.add_argument("--data", type=argtypes.input_file, help="data set (default <forecast.dir>/dataset.npz)")
    e.add_argument("--model", type=argtypes.input_dir, help="artifact directory (default <forecast.dir>/model)")
    e.add_argument("--nab", metavar="DIR", type=argtypes.input_dir, help="a NAB-style folder (*.csv timestamp,value + labels_windows.json)")
    e.add_argument("--folds", type=argtypes.number(int, minimum=2), default=4, help="--nab: cross-validation folds over series (default 4)")
    e.add_argument("--nab-epochs", type=argtypes.positive_int, default=8, help="--nab: LSTM epochs per fold (default 8)")
    e.add_argument("--nab-stride", type=argtypes.positive_int, default=4,
                   help="--nab: every n-th window trains the fold's LSTM (default 4; validation every 2nd)")
    e.add_argument("--learned-max-windows", type=argtypes.non_negative_int, default=12000,
                   help="training windows of a learned baseline, evenly spaced (default 12000; 0 = every 3rd)")
    e.add_argument("--methods", help="comma-separated baselines (default all)")
    e.add_argument("--doc", default="docs/forecaster-eval.md", help="write the markdown table here ('' = none)")
    e.add_argument("--json", type=argtypes.output_file, help="write all results as JSON")
    e.set_defaults(handler=cmd_eval)
    b = sub.add_parser("backtest", help="score a model on the store's history as the online loop would; write the page")
    _history_args(b, split=False)
    b.add_argument("--model", type=argtypes.input_dir, help="artifact directory (default <forecast.dir>/model if trained, else the shipped model)")
    b.add_argument("--registry", metavar="MODEL", help="a model of the registry instead: its id, version or 'champion'")
    b.add_argument("--out", type=argtypes.output_file, help="evaluation page (default <forecast.dir>/backtest.md; JSON beside it)")
    b.add_argument("--methods", help="comma-separated baselines (default all)")
    b.add_argument("--learned-max-windows", type=argtypes.non_negative_int, default=12000,
                   help="training windows of a learned baseline, evenly spaced (default 12000; 0 = every 3rd)")
    b.set_defaults(handler=cmd_backtest)
    # "serve" like every other service's verb; "run" is its old spelling, kept for one release
    r = sub.add_parser("serve", aliases=["run"], help="score every target online: metrics, forecasts table, alerts to the receiver")
    r.add_argument("--model", type=argtypes.input_dir,
                   help="serve this artifact directory (default: the registry's champion, else <forecast.dir>/model if trained, else the shipped model)")
    r.add_argument("--steps", type=argtypes.non_negative_int, default=0, help="stop after this many steps (0 = until Ctrl-C)")
    r.add_argument("--receiver", type=argtypes.key("forecast.receiver_url"), help="webhook v4 URL (default forecast.receiver_url)")
    r.set_defaults(handler=cmd_serve)
    p.set_defaults(handler=lambda args, cfg: (p.print_help(), 2)[1])


def _history_args(p: argparse.ArgumentParser, *, split: bool) -> None:
    """--from/--to of a store history, and how it is cut into train, validation and test."""
    p.add_argument("--from", dest="start", metavar="TIME", type=argtypes.time,
                   help="start of the history (-14d, ISO 8601, epoch seconds)" + ("; needs --from-store" if split else ""))
    p.add_argument("--to", dest="end", metavar="TIME", type=argtypes.time, default="now", help="end of the history (default now)")
    p.add_argument("--split", default="0.6,0.2,0.2", type=argtypes.each(argtypes.number(float, above=0), 3, "train,val,test"),
                   help="shares of the history for train, validation, test, in time order (default 0.6,0.2,0.2)")
    p.add_argument("--min-breaches", type=argtypes.positive_int, default=5,
                   help="breach episodes needed in the training and the validation part (default 5)")
    p.add_argument("--allow-gaps", action="store_true",
                   help="cut the series at a gap in the request windows instead of refusing the history")


def _store_dataset(cfg: Config, args: argparse.Namespace, window: int, horizon: int,
                   feature_names: Sequence[str]) -> Any:
    """The store's history ``--from``..``--to`` as a data set of ``feature_names``; one line and
    exit 2 when it cannot be."""
    import psycopg

    from llmsla.errors import CliError
    from llmsla.forecaster import features
    from llmsla.forecaster import slo as slo_mod
    from llmsla.forecaster import store_dataset as sd
    from llmsla.store import open_store

    if args.start is None:
        raise CliError("--from is required with a store history (e.g. --from -14d)")
    fc = cfg.forecast
    slos = slo_mod.from_config(cfg)
    spec = sd.StoreSpec(window, horizon, fc.slo_window_steps, tuple(args.split), args.min_breaches, args.allow_gaps)
    from_ms, to_ms = (int(t.timestamp() * 1000) for t in (args.start, args.end))
    handle = open_store(cfg)
    try:
        with handle.connect() as conn:
            h = sd.read_history(conn, from_ms, to_ms, slos=slos, slo_window_steps=fc.slo_window_steps,
                                gpu_map=features.gpu_map_from(fc.gpu_map), feature_names=feature_names)
        return sd.to_dataset(h, spec, slos)
    except sd.HistoryError as exc:
        raise CliError(str(exc)) from None
    except psycopg.Error as exc:
        raise CliError(f"store: {str(exc).strip().splitlines()[0]}") from None
    finally:
        handle.close()


def _paths(cfg: Config, args: argparse.Namespace) -> tuple[Path, Path]:
    """(data set file, artifact directory) of a subcommand, defaults under forecast.dir."""
    root = cfg.forecast.root()
    cmd = args.forecast_command
    data = getattr(args, "out", None) if cmd == "dataset" else getattr(args, "data", None)
    model = getattr(args, "out", None) if cmd == "train" else getattr(args, "model", None)
    return Path(data or root / "dataset.npz"), Path(model or root / "model")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cmd_dataset(args: argparse.Namespace, cfg: Config) -> int:
    extras.require("forecast", "llmsla forecast dataset")
    from llmsla.app.forecast_data import DataSpec, build
    from llmsla.errors import CliError
    from llmsla.fleet import scenarios

    out, _ = _paths(cfg, args)
    if args.from_store:
        return _dataset_from_store(cfg, args, out)
    if args.start is not None:
        raise CliError("--from reads the store's history: add --from-store")
    traces = tuple(t.strip() for t in args.traces.split(",") if t.strip())
    for t in traces:
        if t not in scenarios.TRACES:
            raise CliError(f"--traces: unknown trace {t!r} (known: {', '.join(scenarios.TRACES)})")
    splits = ("train", "val", "test")
    spec = DataSpec(traces, dict(zip(splits, args.runs, strict=True)), dict(zip(splits, args.duration_s, strict=True)),
                    args.seed)
    t0 = time.perf_counter()
    try:
        ds = build(cfg, spec, log=_log)
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    ds.save(out)
    pos = {s: float(ds.y[ds.samples(s)].mean()) for s in ("train", "val", "test")}
    print(f"data set: {out} ({ds.n_series} series, {len(ds.y)} steps, sha256 {ds.digest()[:12]}) "
          f"in {time.perf_counter() - t0:.1f} s")
    for s in ("train", "val", "test"):
        print(f"  {s:5s} {len(ds.samples(s)):7d} windows, {pos[s]:.1%} positive")
    return 0


def _dataset_from_store(cfg: Config, args: argparse.Namespace, out: Path) -> int:
    from llmsla.errors import CliError
    from llmsla.forecaster import features, store_dataset

    t0 = time.perf_counter()
    # every feature this llmsla builds, like the simulated set: train then reads forecast.features
    ds = _store_dataset(cfg, args, cfg.forecast.window_steps, cfg.forecast.horizon_steps, features.KNOWN)
    problems = store_dataset.time_order(ds)
    if problems:  # to_dataset cuts by time; this would be a bug, never a user error
        raise CliError(f"the splits are not in time order: {problems[0]}")
    ds.save(out)
    st = ds.info["store"]
    print(f"data set: {out} ({ds.n_series} series, {len(ds.y)} steps from {st['from']} to {st['to']}, "
          f"sha256 {ds.digest()[:12]}) in {time.perf_counter() - t0:.1f} s")
    for s in ("train", "val", "test"):
        a, b = st["bounds"][s]
        print(f"  {s:5s} {a} .. {b} {len(ds.samples(s)):7d} windows, {ds.y[ds.samples(s)].mean():.1%} positive, "
              f"{st['breach_episodes'][s]} breach episodes")
    return 0


def _load_data(path: Path):
    from llmsla.errors import CliError
    from llmsla.forecaster.dataset import Dataset, DatasetError

    try:
        return Dataset.load(path)
    except DatasetError as exc:
        raise CliError(str(exc)) from None


def _features_of(ds: Any, feature_names: list[str], whose: str) -> Any:
    """``ds`` with the columns ``whose`` reads; a set built without one of them is a CliError."""
    from llmsla.errors import CliError
    from llmsla.forecaster.dataset import DatasetError

    try:
        return ds.select(feature_names)
    except DatasetError as exc:
        raise CliError(f"{whose}: {exc}") from None


def _train_config(cfg: Config, **over: Any):
    from llmsla.forecaster.train import TrainConfig

    fc = cfg.forecast
    tc = TrainConfig(hidden=fc.hidden, layers=fc.layers, dropout=fc.dropout, dense=fc.dense, epochs=fc.epochs,
                     batch_size=fc.batch_size, lr=fc.lr, patience=fc.patience, seed=fc.seed, threads=fc.threads,
                     balance_onsets=fc.balance_onsets, label_from_fault_start=fc.label_from_fault_start,
                     fault_negative_weight=fc.fault_negative_weight)
    for k, v in over.items():
        if v is not None:
            setattr(tc, k, v)
    return tc


def _eval_config(cfg: Config, **over: Any):
    """Evaluation settings from ``[forecast]``: the alarm the online loop raises (its
    hysteresis) is the alarm every method is judged and thresholded by, and the threshold rule
    (``threshold_confidence``) the one every command picks thresholds with."""
    from llmsla.forecaster.evaluate import EvalConfig
    from llmsla.forecaster.hysteresis import AlarmPolicy

    return EvalConfig(false_alarms_per_day=cfg.forecast.false_alarms_per_day,
                      lead_max_steps=cfg.forecast.lead_max_steps, seed=cfg.forecast.seed,
                      policy=AlarmPolicy.from_config(cfg.forecast),
                      confidence=cfg.forecast.threshold_confidence, **over)


def threshold_rule(ec: Any) -> str:
    p = ec.policy
    rule = (f"the upper {ec.confidence:.0%} Poisson bound of its false alarms <= {ec.false_alarms_per_day:g} per"
            if ec.confidence > 0 else f"<= {ec.false_alarms_per_day:g} false alarms per")
    fire = (f"{p.fire_steps} of {p.window} steps at or above it (firing on one that is)" if p.window > p.fire_steps
            else f"{p.fire_steps} steps at or above it")
    return (f"lowest with {rule} target per healthy day on validation, "
            f"alarm = {fire}, resolved after {p.resolve_steps} below "
            f"{p.resolve_ratio:g} x it, re-notified every {p.repeat_s:g} s while on")


def train_and_save(cfg: Config, ds: Any, out: Path, tc: Any, log: Any = None) -> Any:
    """Train, pick the threshold on validation, score the test split, write the artifact. With
    ``forecast.horizons_s`` (fleet mode) the model has one head per horizon, each with its own
    threshold and metrics; the shortest stays the artifact's ``horizon``/``threshold``."""
    from llmsla.forecaster import artifact, evaluate, features, horizons, train

    hs = horizons.steps_of(cfg.forecast.horizons_s, ds.step_s) if cfg.forecast.horizons_s and ds.mode == "fleet" else ()
    tc.horizons = hs
    res = train.train_lstm(ds, tc, log=log)
    ec = _eval_config(cfg)
    if hs:
        per = horizons.evaluate_heads(ds, res.model, res.scaler, hs, ec)
    else:
        scorer = lambda ends: train.predict(res.model, ds.inputs(ends, res.scaler))  # noqa: E731
        per = [evaluate.run_model(ds, evaluate.LSTM, scorer, ec, {}, time.perf_counter())]
    mr = per[0]
    meta = {
        "mode": ds.mode, "window": ds.window, "horizon": hs[0] if hs else ds.horizon, "step_s": ds.step_s,
        "features": ds.features,
        "masks": list(features.MASKS) if ds.mode == "fleet" else [],
        "log_features": sorted(features.LOG_FEATURES) if ds.mode == "fleet" else [],
        "slos": ds.info.get("slos"), "slo_window_steps": ds.info.get("slo_window_steps"),
        "threshold": mr.threshold,
        "threshold_rule": threshold_rule(ec), "threshold_confidence": ec.confidence,
        "alarm_policy": ec.policy.to_dict(),
        "train": {**tc.to_dict(), "best_epoch": res.best_epoch, "seconds": round(res.seconds, 1),
                  "pos_weight": res.pos_weight, "history": res.history},
        "metrics": {"val": mr.val.to_dict(), "test": mr.test.to_dict()},
        "data_sha256": ds.digest(),
    }
    if hs:
        meta |= {"horizons": list(hs), "thresholds": [r.threshold for r in per],
                 "horizon_metrics": [{"horizon": h, "val": r.val.to_dict(), "test": r.test.to_dict()}
                                     for h, r in zip(hs, per, strict=True)]}
    artifact.save(out, res.model, res.scaler, meta)
    return res, mr


def cmd_train(args: argparse.Namespace, cfg: Config) -> int:
    extras.require("forecast", "llmsla forecast train")
    from llmsla.errors import CliError
    from llmsla.forecaster import features

    if args.from_store:
        if args.data:
            raise CliError("--data and --from-store name two data sets: pick one")
        return _train_from_store(cfg, args)
    if args.start is not None:
        raise CliError("--from reads the store's history: add --from-store")
    if args.trained_by or args.no_gate:
        raise CliError("--trained-by and --no-gate are for the registry: add --from-store")
    data, out = _paths(cfg, args)
    ds = _load_data(data)
    if ds.mode == "fleet":  # new models read forecast.features, whatever else the set holds
        ds = _features_of(ds, list(features.configured(cfg.forecast.features)), "forecast.features")
        if absent := ds.absent_features():
            raise CliError(f"forecast.features: {', '.join(absent)} has no value in {data}: a model would "
                           "learn a constant; rebuild the data set where its source is recorded, or drop it")
    tc = _train_config(cfg, epochs=args.epochs, seed=args.seed)
    res, mr = train_and_save(cfg, ds, out, tc, log=_log)
    t = mr.test
    # a data set from the store has no fault labels: every breach is an event of cause "none"
    cause, what = ("precursor", "precursor recall") if t.events["precursor"] else ("none", "breach recall")
    print(f"artifact: {out} (trained {res.seconds:.0f} s, best epoch {res.best_epoch}, threshold {mr.threshold:.3f})")
    print(f"  test AUC-PR {t.auc_pr:.3f}; {what} {t.recall[cause]:.2f} "
          f"(mean lead {t.mean_lead_s[cause]:.0f} s); {t.false_alarms_per_day:.1f} false alarms/day")
    return 0


def _history_spec(args: argparse.Namespace) -> Any:
    from llmsla.app.forecast_retrain import HistorySpec
    from llmsla.errors import CliError

    if args.start is None:
        raise CliError("--from is required with a store history (e.g. --from -14d)")
    return HistorySpec(int(args.start.timestamp() * 1000), int(args.end.timestamp() * 1000), tuple(args.split),
                       args.min_breaches, args.allow_gaps)


def _train_from_store(cfg: Config, args: argparse.Namespace) -> int:
    """Train on the store's history, register the model as a candidate, gate it (docs/forecaster.md#model-registry)."""
    import psycopg

    from llmsla.app import forecast_retrain
    from llmsla.errors import CliError
    from llmsla.forecaster import registry
    from llmsla.forecaster import store_dataset as sd
    from llmsla.store import open_store

    spec = _history_spec(args)
    tc = _train_config(cfg, epochs=args.epochs, seed=args.seed)
    handle = open_store(cfg)
    try:
        with handle.connect(autocommit=True) as conn:
            res = forecast_retrain.cycle(cfg, conn, spec, by=args.trained_by or forecast_retrain.trained_by(), tc=tc,
                                         out=args.out, run_the_gate=not args.no_gate, log=_log)
    except (sd.HistoryError, registry.RegistryError) as exc:
        raise CliError(str(exc)) from None
    except psycopg.Error as exc:
        raise CliError(f"store: {str(exc).strip().splitlines()[0]}") from None
    finally:
        handle.close()
    print(f"{res.row.label}: {res.row.status}: {res.message}")
    return 0


def cmd_models(args: argparse.Namespace, cfg: Config) -> int:
    """The registry, newest first: id, version, status, when, by whom, on what, held-out recall."""
    import psycopg

    from llmsla.errors import CliError
    from llmsla.forecaster import registry
    from llmsla.store import open_store

    handle = open_store(cfg)
    try:
        with handle.connect(autocommit=True) as conn:
            if args.promote:
                row = registry.get(conn, args.promote)
                registry.load(conn, row)  # never make a champion that cannot be served
                from llmsla.app.forecast_retrain import trained_by

                old = registry.promote(conn, row, f"promoted by hand by {trained_by()}")
                print(f"{row.label} is the champion" + (f"; {old.label} retired" if old else ""))
            rows = registry.list_models(conn, limit=args.limit)
    except registry.RegistryError as exc:
        raise CliError(str(exc)) from None
    except psycopg.Error as exc:
        raise CliError(f"store: {str(exc).strip().splitlines()[0]}") from None
    finally:
        handle.close()
    if args.json:
        for r in rows:
            print(json.dumps({k: v for k, v in r.__dict__.items() if k != "label"}, default=str))
        return 0
    if not rows:
        print("no models in the registry (train one: llmsla forecast train --from-store --from -14d); "
              "forecast serve serves the shipped model")
        return 0

    def day(t: Any) -> str:
        import datetime as dt

        return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M") if t is not None else "-"

    print(f"{'id':>4}  {'version':12s}  {'status':9s}  {'created (UTC)':16s}  {'trained by':20s}  "
          f"{'history':33s}  {'recall':>6s}  {'FA/day':>6s}  reason")
    for r in rows:
        test = (r.metrics.get("gate") or {}).get("candidate") or {}
        rec = f"{test['recall']:.2f}" if "recall" in test else "-"
        fa = f"{test['false_alarms_per_day']:.1f}" if "false_alarms_per_day" in test else "-"
        print(f"{r.id:>4}  {r.version:12s}  {r.status:9s}  {day(r.created_at):16s}  {r.trained_by[:20]:20s}  "
              f"{day(r.train_from)} .. {day(r.train_to)[5:]:11s}  {rec:>6s}  {fa:>6s}  {r.reason}")
    return 0


def _registry_artifact(cfg: Config, ref: str) -> tuple[Any, str]:
    """A registry model by id, version or 'champion', checked; one line and exit 2 when it is not there or corrupt."""
    import psycopg

    from llmsla.errors import CliError
    from llmsla.forecaster import registry
    from llmsla.store import open_store

    handle = open_store(cfg)
    try:
        with handle.connect(autocommit=True) as conn:
            row = registry.champion(conn) if ref == "champion" else registry.get(conn, ref)
            if row is None:
                raise CliError("no champion in the registry (forecast serve serves the shipped model)")
            return registry.load(conn, row), row.label
    except registry.RegistryError as exc:
        raise CliError(str(exc)) from None
    except psycopg.Error as exc:
        raise CliError(f"store: {str(exc).strip().splitlines()[0]}") from None
    finally:
        handle.close()


def _load_artifact(path: Path):
    from llmsla.errors import CliError
    from llmsla.forecaster import artifact

    try:
        return artifact.load(path)
    except artifact.ArtifactError as exc:
        raise CliError(str(exc)) from None


def cmd_eval(args: argparse.Namespace, cfg: Config) -> int:
    extras.require("forecast", "llmsla forecast eval")
    from llmsla.errors import CliError
    from llmsla.forecaster import baselines, evaluate, horizons, nab, report, train

    data, model_dir = _paths(cfg, args)
    ec = _eval_config(cfg, learned_max_windows=args.learned_max_windows, budgets=(1.0, 2.0, 4.0, 8.0, 16.0))
    methods = tuple(m.strip() for m in args.methods.split(",")) if args.methods else baselines.METHODS
    for m in methods:
        if m not in baselines.METHODS:
            raise CliError(f"--methods: unknown method {m!r} (known: {', '.join(baselines.METHODS)})")
    ds = _load_data(data)
    art = _load_artifact(model_dir)
    if ds.mode == "fleet" and art.meta.get("mode") == "fleet":
        ds = _features_of(ds, list(art.meta.get("features") or []), f"model {art.version}")
    if art.meta.get("data_sha256") != ds.digest():
        _log(f"note: {model_dir} was trained on another data set than {data}")
    train.seed_everything(cfg.forecast.seed, cfg.forecast.threads)
    scorer = horizons.head_scorer(art.model, ds, art.scaler, 0)  # several horizons: the shortest head
    _log("(a) held-out simulated replays")
    fleet = evaluate.run_all(ds, scorer, art.scaler, ec, methods, lstm_seconds=art.meta["train"]["seconds"], log=_log)
    nab_res = None
    facts: dict[str, Any] = {"fa_target": ec.false_alarms_per_day}
    if args.nab:
        try:
            nds, files = nab.load(Path(args.nab), window=ds.window, horizon=ds.horizon, folds=args.folds)
        except (nab.NabError, OSError) as exc:
            raise CliError(str(exc)) from None
        tc = _train_config(cfg, epochs=args.nab_epochs, stride=args.nab_stride, val_stride=2)

        def make_lstm(fds: Any) -> Any:
            res = train.train_lstm(fds, tc)
            return lambda ends: train.predict(res.model, fds.inputs(ends, None))

        _log(f"(b) {len(files)} series from {args.nab}, {args.folds}-fold cross-validation over series")
        try:
            nab_res = evaluate.cross_validate(nds, args.folds, make_lstm, ec, methods, log=_log)
        except evaluate.EvalError as exc:
            raise CliError(f"--nab {args.nab}: {exc}") from None
        facts["nab_note"] = (
            f"{len(files)} series from `{args.nab}` ({nds.step_s:.0f} s steps; W = {nds.window}, H = {nds.horizon} "
            f"steps = {nds.horizon * nds.step_s / 60:.0f} min). {args.folds}-fold cross-validation over whole series: "
            "each series is scored by models and a threshold fitted without it (the threshold on the next fold's "
            "series, the models on the other two folds). A labelled window is an event; an alarm up to the lead "
            f"limit ({ec.lead_max_steps} steps = {ec.lead_max_steps * nds.step_s / 3600:.0f} h) before its start "
            "is an early warning, and the same alarm policy applies in 5-minute steps. Bounds for two cores: "
            f"the LSTM trains {args.nab_epochs} epochs per fold on every {args.nab_stride}th window (early "
            "stopping on every 2nd validation window), the learned baselines on every "
            f"{ec.learned_stride}rd window. **NAB's published scoreboard is not comparable with these numbers**: "
            "it scores 58 series (these are the 17 realAWSCloudwatch ones) with its own window-weighted, "
            "detection-oriented score, where an alarm anywhere inside a window counts; here only an alarm "
            "before the window starts counts, since the question is early warning.")
    header = {
        "data": f"`{data.name}` sha256 {ds.digest()[:12]} (`llmsla forecast dataset` "
                + (f"--from-store, {ds.info['store']['from']} to {ds.info['store']['to']}); "
                   if ds.info.get("source") == "store" else
                   f"--runs {','.join(str(ds.info['spec']['runs'][k]) for k in ('train', 'val', 'test'))}); ")
                + f"{ds.n_series} series; "
                + ", ".join(f"{s} {len(ds.samples(s))} windows ({ds.y[ds.samples(s)].mean():.1%} positive)"
                            for s in ("train", "val", "test")),
        "model": f"LSTM version {art.version}, trained {art.meta['train']['seconds']:.0f} s "
                 f"(best epoch {art.meta['train']['best_epoch']} of {len(art.meta['train']['history'])}, "
                 f"{art.meta['train']['threads']} torch thread(s), onsets balanced: "
                 f"{art.meta['train'].get('balance_onsets', False)})",
        "labels": f"W = {ds.window} steps of 5 s, H = {ds.horizon} steps; an SLO breach = a "
                  f"{ds.info.get('slo_window_steps')}-step SLO window below its objective: "
                  + ", ".join(f"{s['name']} ({s['sli']} {s['threshold']:g} ms, {s['objective']:.2%})"
                              if s['sli'] != 'availability' else f"{s['name']} ({s['objective']:.2%})"
                              for s in ds.info.get("slos", [])),
        "alarms": f"what the online loop raises: {threshold_rule(ec)}; an event is warned when the alarm is "
                  f"on 1..{ec.lead_max_steps} steps ({ec.lead_max_steps * ds.step_s:.0f} s) before the breach "
                  "onset and, for a precursor fault's breach, not before the fault began (an alarm before it "
                  "is a false alarm); its lead is the onset minus the first such step",
        "learned baselines": f"logistic regression and gradient boosting on the flattened input window "
                             f"({ds.window} x {art.model.cfg.inputs}), trained on every {ec.learned_stride}rd "
                             f"training window, at most {ec.learned_max_windows or 'all'} of them evenly "
                             "spaced (keeps gradient boosting on 960 inputs within minutes on two cores)",
    }
    facts["header"] = header
    facts["fleet_note"] = (
        "Test runs: the last 30 % of each trace's timeline with seeds 2000+, never seen in training "
        "(train: first 50 %, seeds 0+; validation: next 20 %, seeds 1000+). Precursor faults: ramp, leak, "
        "thermal, surge; crashes have none, so their recall should sit near chance (in brackets: the share "
        "of healthy steps the alarm covers in the lead window before them) - a method well above it on "
        "crashes is leaking. Lead: mean over warned events. False alarms: the alarm's notifications (its "
        "onset and a repeat every repeat interval while it stays on) outside every event's [onset - lead limit, "
        "end] (for a precursor fault's breach from the fault's start at the earliest) and the steps its alarm "
        "takes to resolve after it, per target per healthy day; on validation (where the threshold was set) "
        "and on test, with the "
        "test count and how many per day were sent while an injected fault was on (a real degradation that "
        "did not break the SLO). AUC-PR ahead: AUC-PR over the steps whose own SLO "
        "window is not breaching, where a positive needs foresight.")
    if args.doc:
        Path(args.doc).write_text(report.render(fleet, nab_res, facts))
        print(f"wrote {args.doc}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "fleet": [_res_dict(r) for r in fleet], "nab": [_res_dict(r) for r in nab_res] if nab_res else None,
            "facts": facts}, indent=1, default=str) + "\n")
    for r in fleet:
        print(f"  (a) {r.method:20s} AUC-PR {r.test.auc_pr:.3f}  precursor recall {r.test.recall['precursor']:.2f}"
              f"  crash recall {r.test.recall['crash']:.2f}  FA/day {r.test.false_alarms_per_day:.1f}")
    for r in nab_res or []:
        print(f"  (b) {r.method:20s} AUC-PR {r.test.auc_pr:.3f}  window recall {r.test.recall['precursor']:.2f}"
              f"  FA/day {r.test.false_alarms_per_day:.1f}")
    return 0


def _res_dict(r: Any) -> dict:
    return {"method": r.method, "params": r.params, "threshold": r.threshold, "val": r.val.to_dict(),
            "test": r.test.to_dict(), "seconds": r.seconds, **r.extra}


def _model_dir(cfg: Config, args: argparse.Namespace) -> Path:
    """--model, else ``<forecast.dir>/model`` if trained, else the shipped model."""
    from llmsla.forecaster import artifact

    _, model_dir = _paths(cfg, args)
    if not args.model and not model_dir.exists():
        model_dir = artifact.PRETRAINED  # nothing trained here yet: the model llmsla ships
    return model_dir


def cmd_backtest(args: argparse.Namespace, cfg: Config) -> int:
    """The model on the store's history with its own threshold and the online alarm policy,
    beside every baseline: the evaluation page and its JSON."""
    extras.require("forecast", "llmsla forecast backtest")
    from llmsla.errors import CliError
    from llmsla.forecaster import backtest, baselines, report, train
    from llmsla.forecaster import metrics as m

    methods = tuple(x.strip() for x in args.methods.split(",")) if args.methods else baselines.METHODS
    for meth in methods:
        if meth not in baselines.METHODS:
            raise CliError(f"--methods: unknown method {meth!r} (known: {', '.join(baselines.METHODS)})")
    if args.registry and args.model:
        raise CliError("--model and --registry name two models: pick one")
    if args.registry:
        art, model_name = _registry_artifact(cfg, args.registry)
    else:
        model_dir = _model_dir(cfg, args)
        art, model_name = _load_artifact(model_dir), str(model_dir)
    try:
        backtest.check(art)
    except backtest.BacktestError as exc:
        raise CliError(f"{model_name}: {exc}") from None
    out = Path(args.out or cfg.forecast.root() / "backtest.md")
    ds = _store_dataset(cfg, args, art.window, art.horizon, art.meta["features"])
    if absent := ds.absent_features():
        raise CliError(f"{model_name} reads {', '.join(absent)}, which has no value in this history: "
                       "the backtest would judge it on a constant")
    train.seed_everything(cfg.forecast.seed, cfg.forecast.threads)
    ec = _eval_config(cfg, learned_max_windows=args.learned_max_windows)
    bt = backtest.run(ds, art, ec, methods, log=_log)
    st = ds.info["store"]
    facts = {"header": {
        "history": f"{st['from']} to {st['to']} from the store ({ds.n_series} series; gaps cut: {st['gaps']}); "
                   + ", ".join(f"{s} {st['bounds'][s][0]} .. {st['bounds'][s][1]} ({st['breach_episodes'][s]} "
                               f"breach episodes)" for s in ("train", "val", "test")),
        "model": f"{model_name} (LSTM version {art.version}, threshold {art.threshold:.3f} from its own validation)",
        "labels": f"an SLO breach = a {ds.info['slo_window_steps']}-step SLO window below its objective: "
                  + ", ".join(s["name"] for s in ds.info["slos"]) + "; every breach episode is an event",
        "alarms": f"what the online loop raises: {threshold_rule(ec)}; a breach is warned when the alarm is on "
                  f"1..{ec.lead_max_steps} steps ({ec.lead_max_steps * ds.step_s:.0f} s) before its onset",
    }, "note": (
        "Test = the last part of the history. The model keeps its serving threshold; each baseline learns on the "
        "training part, takes its parameters and its threshold (the same false-alarm budget, "
        f"{ec.false_alarms_per_day:g} per target-day) from the validation part. Recall in brackets beside it: "
        "chance, the share of healthy steps the alarm covers in the lead window before them.")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.render_backtest(bt.results, bt.whole, facts))
    js = out.with_suffix(".json")
    js.write_text(json.dumps({"whole": bt.whole.to_dict(), "held_out": [_res_dict(r) for r in bt.results],
                              "facts": facts, "data_sha256": ds.digest()}, indent=1, default=str) + "\n")
    w = bt.whole
    print(f"wrote {out} and {js}")
    print(f"  whole history: {w.warned[m.NONE]}/{w.events[m.NONE]} breaches warned, mean lead "
          f"{w.mean_lead_s[m.NONE]:.0f} s, {w.false_alarms_per_day:.1f} false alarms per target-day")
    for r in bt.results:
        print(f"  held-out {r.method:26s} recall {r.test.recall[m.NONE]:.2f} ({r.test.warned[m.NONE]}/"
              f"{r.test.events[m.NONE]})  FA/day {r.test.false_alarms_per_day:.1f}")
    return 0


def cmd_serve(args: argparse.Namespace, cfg: Config) -> int:
    """Score every target each ``forecast.interval_s``; ``/metrics`` through the HTTP kit like
    every llmsla server; SIGTERM/SIGINT stop it cleanly."""
    if args.forecast_command == "run":
        log.warning("llmsla forecast run is renamed llmsla forecast serve; the old name works for one more release")
    extras.require("forecast", "llmsla forecast serve")
    import asyncio
    import signal

    from prometheus_client import CollectorRegistry

    from llmsla.config import duration_s
    from llmsla.forecaster import alerts, online, train
    from llmsla.forecaster.service import ForecastService
    from llmsla.store import open_store

    handle = open_store(cfg)
    if args.model:
        art = _load_artifact(args.model)
        source, watch = f"--model {args.model} (the model registry is not watched)", None
    else:
        art, source, watch = _serving_model(cfg, args, handle)
    train.seed_everything(cfg.forecast.seed, cfg.forecast.threads)
    registry = CollectorRegistry()
    receiver = args.receiver or cfg.forecast.receiver_url
    poster = alerts.WebhookPoster(receiver, token=cfg.forecast.receiver_token) if receiver else None

    def make_scorer(url: str) -> online.OnlineScorer:
        return online.OnlineScorer(art, cfg, handle.dsn, registry=registry, poster=poster, external_url=url)

    def on_step(n: int, res: online.StepResult) -> None:
        if res.skipped:
            print(f"step {n}: skipped: {res.skipped}", flush=True)
        else:
            top = max(res.risks.items(), key=lambda kv: kv[1])
            print(f"step {n}: {res.scored} targets scored in {res.score_seconds * 1000:.1f} ms "
                  f"(max risk {top[1]:.2f} {top[0]}); {len(res.notifications)} notifications", flush=True)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        fc = cfg.forecast
        svc = ForecastService(cfg, registry, make_scorer, watch=watch if fc.registry_poll_s > 0 else None,
                              watch_every_s=fc.registry_poll_s, retrain=lambda: _retrain(cfg, handle),
                              retrain_every_s=duration_s(fc.retrain_every))
        url = await svc.start()
        print(f"llmsla forecast: serving {source}", flush=True)
        print(f"llmsla forecast: model {art.version} (threshold {art.threshold:.3f}), /metrics on {url}/metrics, "
              f"alerts to {receiver or 'nowhere (no forecast.receiver_url)'}", flush=True)
        try:
            await svc.run(stop, steps=args.steps, on_step=on_step)
        finally:
            await svc.close()

    try:
        asyncio.run(main())
    finally:
        handle.close()
    return 0


def _serving_model(cfg: Config, args: argparse.Namespace, handle: Any) -> tuple[Any, str, Any]:
    """The model ``forecast serve`` starts with - the registry's champion, else the local default
    (``<forecast.dir>/model`` if trained, else the shipped model) -, the line that says which, and
    the watch that hands over a newly promoted champion (``None`` while there is none)."""
    import psycopg

    from llmsla.forecaster import registry

    serving: dict[str, int | None] = {"id": None}
    started = False
    refused: list[str] = []  # champions that did not load
    bad: set[tuple[int, str]] = set()  # rows that did not load: logged once, not every poll

    def load_champion(conn: psycopg.Connection) -> Any:
        row = registry.champion(conn)
        if row is None or row.id == serving["id"] or (row.id, row.artifact_sha256) in bad:
            return None
        try:
            art = registry.load(conn, row)
        except registry.RegistryError as exc:
            bad.add((row.id, row.artifact_sha256))
            refused.append(row.label)
            log.error("%s; serving %s as before", exc, "the previous model" if serving["id"] else "the local model")
            return None
        first = serving["id"] is None and not started
        serving["id"] = row.id
        if not first:
            log.warning("serving the registry's new champion %s from the next step", row.label)
        return art

    def watch() -> Any:
        try:
            with handle.connect(autocommit=True) as conn:
                return load_champion(conn)
        except psycopg.Error as exc:
            log.warning("model registry not read (%s); serving the same model", str(exc).strip().splitlines()[0])
            return None

    try:
        with handle.connect(autocommit=True) as conn:
            art = load_champion(conn)
    except psycopg.Error as exc:
        log.warning("model registry not read (%s)", str(exc).strip().splitlines()[0])
        art = None
    started = True
    if art is not None:
        return art, f"the model registry's champion model {serving['id']} (v{art.version})", watch
    model_dir = _model_dir(cfg, args)
    art = _load_artifact(model_dir)
    which = "the shipped model" if model_dir == _shipped() else str(model_dir)
    why = f"the registry's champion {refused[0]} does not load" if refused else "no champion in the model registry"
    return art, f"{which} (v{art.version}): {why}", watch


def _shipped() -> Path:
    from llmsla.forecaster import artifact

    return artifact.PRETRAINED


def _retrain(cfg: Config, handle: Any) -> None:
    """One unattended cycle of ``forecast serve`` (``forecast.retrain_every``): the last
    ``forecast.retrain_history`` of the store, trained, registered, gated. A history no data
    set can be built from, or a store error, is one log line; the champion keeps serving."""
    import psycopg

    from llmsla.app import forecast_retrain
    from llmsla.config import duration_s
    from llmsla.forecaster import store_dataset as sd

    now = time.time()
    spec = forecast_retrain.HistorySpec(int((now - duration_s(cfg.forecast.retrain_history)) * 1000), int(now * 1000))
    t0 = time.perf_counter()
    try:
        with handle.connect(autocommit=True) as conn:
            out = forecast_retrain.cycle(cfg, conn, spec, by=f"{forecast_retrain.trained_by()} (forecast serve)",
                                         log=log.debug)
    except sd.HistoryError as exc:
        log.warning("forecast retrain skipped: %s; serving the champion as before", exc)
        return
    except psycopg.Error as exc:
        log.warning("forecast retrain failed: store: %s; serving the champion as before",
                    str(exc).strip().splitlines()[0])
        return
    log.warning("forecast retrain (%.0f s): %s", time.perf_counter() - t0, out.message)
