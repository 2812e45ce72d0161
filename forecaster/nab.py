"""Real labelled series in univariate mode: any folder laid out like NAB.

``DIR/*.csv`` with a ``timestamp,value`` header, plus ``DIR/labels_windows.json`` mapping a key
that ends with the file name (NAB keeps a ``group/`` prefix) to ``[[start, end], ...]``
timestamps. Steps are the series' own (5 min for realAWSCloudwatch); a step is labelled when it
lies inside a window, and the forecast target is, as in fleet mode, "labelled within the next H
steps", so an alarm before a window's start is an early warning.

There is no training split in NAB, so learned methods are cross-validated over whole series
(``folds``, by sorted file name): each series is scored by models that never saw it, and each
fold's threshold comes from one of its training series groups. A bad row is an error naming
the file, the line and the field.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
from pathlib import Path

import numpy as np

from llmsla.forecaster.dataset import Dataset


class NabError(ValueError):
    """A malformed NAB-style folder; the message names the file, line and field."""


def _ts(raw: str, where: str) -> float:
    try:
        t = dt.datetime.fromisoformat(raw.strip())
    except ValueError:
        raise NabError(f"{where}: timestamp: not a timestamp: {raw!r}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()


def read_series(path: Path, skipped: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(epoch seconds, values) of one ``timestamp,value`` CSV. A row whose timestamp is not
    after the previous one is skipped and its line number appended to ``skipped`` (real NAB
    files repeat a stamp); any other bad row is an error naming file, line and field."""
    skipped = [] if skipped is None else skipped
    ts: list[float] = []
    vs: list[float] = []
    with open(path, newline="", encoding="utf-8") as fh:
        r = csv.reader(fh)
        header = next(r, None)
        if header is None or [h.strip() for h in header] != ["timestamp", "value"]:
            raise NabError(f"{path}:1: expected header timestamp,value, got {header!r}")
        for row in r:
            where = f"{path}:{r.line_num}"
            if len(row) != 2:
                raise NabError(f"{where}: expected 2 columns, got {len(row)}")
            t = _ts(row[0], where)
            try:
                v = float(row[1])
            except ValueError:
                raise NabError(f"{where}: value: not a number: {row[1]!r}") from None
            if not np.isfinite(v):
                raise NabError(f"{where}: value: not finite: {row[1]!r}")
            if ts and t <= ts[-1]:  # a repeated or out-of-order stamp: keep the first, say so
                skipped.append(r.line_num)
                continue
            ts.append(t)
            vs.append(v)
    if len(ts) < 2:
        raise NabError(f"{path}: fewer than 2 rows")
    return np.asarray(ts), np.asarray(vs)


def load(folder: Path, *, window: int, horizon: int, folds: int = 4) -> tuple[Dataset, list[str]]:
    """All series of ``folder`` in one univariate data set (every series split ``test``;
    :func:`fold_splits` assigns train/val per fold). Returns the data set and file names."""
    folder = Path(folder)
    lab_path = folder / "labels_windows.json"
    try:
        labels = json.loads(lab_path.read_text())
    except FileNotFoundError:
        raise NabError(f"{lab_path}: missing") from None
    except json.JSONDecodeError as exc:
        raise NabError(f"{lab_path}: not valid JSON: {exc}") from None
    if not isinstance(labels, dict):
        raise NabError(f"{lab_path}: expected an object of file -> windows")
    files = sorted(folder.glob("*.csv"))
    if not files:
        raise NabError(f"{folder}: no *.csv series")
    by_name = {Path(k).name: v for k, v in labels.items()}
    step_s = None
    ds = Dataset.empty("univariate", window, horizon, 300.0, {"source": str(folder), "folds": folds,
                                                               "precursor_kinds": ["labelled"],
                                                               # a labelled window is the anomaly itself:
                                                               # its early warning comes before it
                                                               "causal_kinds": []})
    parts = []
    for i, f in enumerate(files):
        skipped: list[int] = []
        ts, vs = read_series(f, skipped)
        if skipped:
            ds.info.setdefault("skipped_rows", {})[f.name] = skipped
        step = float(np.median(np.diff(ts)))
        step_s = step if step_s is None else step_s
        inside = np.zeros(len(ts), bool)
        wins = by_name.get(f.name, [])
        if not isinstance(wins, list):
            raise NabError(f"{lab_path}: {f.name}: expected a list of [start, end]")
        fault_rows = []
        for k, w in enumerate(wins):
            if not (isinstance(w, list) and len(w) == 2):
                raise NabError(f"{lab_path}: {f.name}[{k}]: expected [start, end]")
            a, b = _ts(str(w[0]), f"{lab_path}: {f.name}[{k}]"), _ts(str(w[1]), f"{lab_path}: {f.name}[{k}]")
            inside |= (ts >= a) & (ts <= b)
            fault_rows.append({"kind": "labelled", "replica": "", "start_ms": int(a * 1000),
                               "end_ms": int(b * 1000)})
        meta = {"split": "test", "run": f.name, "trace": "nab", "seed": 0, "pool": "", "replica": f.name,
                "t0_ms": int(ts[0] * 1000), "fold": i % folds, "faults": fault_rows, "step_s": step}
        v = vs[:, None]
        parts.append((v, np.zeros((len(vs), 0), bool), v, inside, meta))
    ds.extend(parts)
    ds.step_s = float(step_s or 300.0)
    return ds, [f.name for f in files]


def fold_splits(ds: Dataset, fold: int) -> Dataset:
    """A view of ``ds`` for one fold: its series are ``test``, the next fold's are ``val``, the
    rest ``train``."""
    k = int(ds.info["folds"])
    meta = []
    for m in ds.meta:
        f = int(m["fold"])
        split = "test" if f == fold else "val" if f == (fold + 1) % k else "train"
        meta.append({**m, "split": split})
    return Dataset(ds.mode, ds.window, ds.horizon, ds.step_s, ds.feats, ds.present, ds.signals, ds.breach,
                   ds.y, ds.offsets, meta, ds.info)
