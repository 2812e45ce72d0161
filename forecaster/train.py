"""Training the LSTM: time-ordered splits, class weighting, early stopping, determinism.

The scaler is fitted on the train split only, early stopping and the threshold use validation,
and the test split is only ever scored. With ``balance_onsets`` the positives that need
foresight carry half of the positive weight, so the loss does not spend itself on persistence.
Deterministic for a seed on the CPU. With ``horizons`` the model has one head per horizon and
learns them together (multi-label BCE, each horizon its own positive weight and onset balance, a
label whose future is not known masked out); docs/forecaster.md#several-horizons. On simulated
replays the labels can count from a fault's start and the negatives inside a fault weigh more
(:mod:`llmsla.forecaster.fault_labels`).
See docs/forecaster.md#design.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch import nn

from llmsla.forecaster import fault_labels
from llmsla.forecaster.dataset import Dataset
from llmsla.forecaster.metrics import auc_pr
from llmsla.forecaster.model import LstmForecaster, ModelConfig
from llmsla.forecaster.scaler import RobustScaler


@dataclass
class TrainConfig:
    hidden: int = 50
    layers: int = 1
    dropout: float = 0.3
    dense: int = 32
    epochs: int = 30
    batch_size: int = 256
    lr: float = 1e-3
    patience: int = 4
    seed: int = 0
    threads: int = 2
    stride: int = 2  # every stride-th training window (neighbouring windows overlap in W - 1 steps)
    balance_onsets: bool = True  # positives before an onset weigh as much as those inside a breach
    val_stride: int = 1  # every val_stride-th validation window for early stopping (NAB folds: 2)
    #: label horizons in steps, one head each; empty = the data set's own horizon, one output
    horizons: tuple[int, ...] = ()
    #: labels counted from a precursor fault's start (:func:`fault_labels.from_fault_start`)
    label_from_fault_start: bool = False
    #: loss weight of the negatives inside a precursor fault (:func:`fault_labels.in_fault`)
    fault_negative_weight: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainResult:
    model: LstmForecaster
    scaler: RobustScaler | None
    history: list[dict] = field(default_factory=list)
    best_epoch: int = 0
    seconds: float = 0.0
    pos_weight: float | list[float] = 1.0  # one per horizon with several


def seed_everything(seed: int, threads: int) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def predict(model: LstmForecaster, x: np.ndarray, *, batch: int = 4096) -> np.ndarray:
    model.eval()
    out = [model.risk(torch.from_numpy(x[i: i + batch])).numpy() for i in range(0, len(x), batch)]
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def sample_weights(y: np.ndarray, breaching_now: np.ndarray, balance_onsets: bool) -> np.ndarray:
    """Per-window loss weights: 1, or with ``balance_onsets`` the positives split into those
    ahead of an onset and those inside a breach, each kind weighing half of the positives."""
    w = np.ones(len(y), np.float32)
    pos = y == 1
    ahead, inside = pos & ~breaching_now, pos & breaching_now
    if balance_onsets and ahead.any() and inside.any():
        w[ahead] = pos.sum() / (2 * ahead.sum())
        w[inside] = pos.sum() / (2 * inside.sum())
    return w


def val_auc_pr(y: np.ndarray, score: np.ndarray) -> float:
    """Validation AUC-PR; with several horizons the mean over them, each on its known labels."""
    if y.ndim == 1:
        return auc_pr(y, score)
    return float(np.mean([auc_pr(y[y[:, k] >= 0, k], score[y[:, k] >= 0, k]) for k in range(y.shape[1])]))


def train_lstm(ds: Dataset, tc: TrainConfig, *, log: Callable[[str], None] | None = None) -> TrainResult:
    t_start = time.perf_counter()
    seed_everything(tc.seed, tc.threads)
    scaler = ds.fit_scaler() if ds.mode == "fleet" else None
    multi = len(tc.horizons) > 0
    if tc.label_from_fault_start:
        labels = fault_labels.from_fault_start(ds, list(tc.horizons) or [ds.horizon])
        labels = labels if multi else labels[:, 0]
    else:
        labels = ds.labels(list(tc.horizons)) if multi else ds.y
    tr = ds.samples("train", stride=tc.stride)
    va = ds.samples("val", stride=tc.val_stride)
    if multi:  # a window counts while its shortest horizon's future is known; longer ones masked
        tr, va = tr[labels[tr, 0] >= 0], va[labels[va, 0] >= 0]
    if len(tr) == 0 or len(va) == 0:
        raise ValueError("training needs windows in both the train and the val split")
    known = (labels[tr] >= 0).astype(np.float32)
    ytr = np.maximum(labels[tr], 0).astype(np.float32)
    yva = labels[va]
    xtr = ds.inputs(tr, scaler)
    xva = ds.inputs(va, scaler)
    pos = (ytr * known).sum(axis=0)
    n_known = known.sum(axis=0)
    pos_weight = np.where(pos > 0, (n_known - pos) / np.maximum(pos, 1), 1.0)
    if multi:
        weight = np.stack([sample_weights(np.where(known[:, k] > 0, ytr[:, k], 0), ds.breach[tr], tc.balance_onsets)
                           for k in range(ytr.shape[1])], axis=1) * known
    else:
        weight = sample_weights(ytr, ds.breach[tr], tc.balance_onsets)
    if tc.fault_negative_weight != 1.0:
        inside = fault_labels.in_fault(ds)[tr]
        inside = inside[:, None] if multi else inside
        weight = weight * np.where(inside & (ytr == 0), tc.fault_negative_weight, 1.0).astype(np.float32)
    outputs = len(tc.horizons) if multi else 1
    model = LstmForecaster(ModelConfig(xtr.shape[-1], tc.hidden, tc.layers, tc.dropout, tc.dense, outputs))
    opt = torch.optim.Adam(model.parameters(), lr=tc.lr)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pos_weight, dtype=torch.float32), reduction="none")
    rng = np.random.default_rng(tc.seed)
    best, best_state, best_epoch, bad = -1.0, copy.deepcopy(model.state_dict()), 0, 0
    history = []
    xt, yt, wt = torch.from_numpy(xtr), torch.from_numpy(ytr), torch.from_numpy(weight)
    for epoch in range(1, tc.epochs + 1):
        model.train()
        order = torch.from_numpy(rng.permutation(len(xtr)))
        total = 0.0
        for i in range(0, len(order), tc.batch_size):
            b = order[i: i + tc.batch_size]
            opt.zero_grad()
            loss = (loss_fn(model(xt[b]), yt[b]) * wt[b]).mean()
            loss.backward()
            opt.step()
            total += loss.item() * len(b)
        ap = val_auc_pr(yva, predict(model, xva))
        history.append({"epoch": epoch, "train_loss": total / len(xtr), "val_auc_pr": ap})
        if log:
            log(f"epoch {epoch}: train loss {total / len(xtr):.4f}, val AUC-PR {ap:.4f}")
        if ap > best + 1e-4:
            best, best_state, best_epoch, bad = ap, copy.deepcopy(model.state_dict()), epoch, 0
        else:
            bad += 1
            if bad >= tc.patience:
                break
    model.load_state_dict(best_state)
    model.eval()
    pw = [float(p) for p in np.atleast_1d(pos_weight)]
    return TrainResult(model, scaler, history, best_epoch, time.perf_counter() - t_start, pw if multi else pw[0])
