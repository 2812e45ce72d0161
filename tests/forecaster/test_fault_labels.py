"""Training labels and weights from injected faults: by hand on a built series, equal to the
plain labels where no fault is known, and applied by training."""

from __future__ import annotations

import numpy as np

from llmsla.forecaster import fault_labels, features, slo
from llmsla.forecaster.dataset import Dataset
from llmsla.forecaster.train import train_lstm

from .conftest import tiny_train

STEP_S = 5.0


def _series(n: int, breaches: list[tuple[int, int]], faults: list[dict], split: str = "train") -> tuple:
    breach = np.zeros(n, bool)
    for a, b in breaches:
        breach[a: b + 1] = True
    x = np.zeros((n, len(features.FEATURES)), np.float32)
    return (x, np.ones((n, len(features.MASKS)), bool), np.zeros((n, len(features.SIGNALS)), np.float32), breach,
            {"split": split, "run": f"run-{split}-{len(faults)}", "t0_ms": 0, "faults": faults})


def _fault(kind: str, start_step: int, end_step: int) -> dict:
    return {"kind": kind, "replica": "r0", "start_ms": int(start_step * STEP_S * 1000),
            "end_ms": int(end_step * STEP_S * 1000)}


def _dataset(parts: list[tuple]) -> Dataset:
    ds = Dataset.empty("fleet", 8, 3, STEP_S, {"precursor_kinds": ["leak", "ramp"], "slo_window_steps": 2})
    ds.extend(parts)
    return ds


def test_a_precursor_breach_is_positive_only_from_its_fault_start() -> None:
    """Leak from step 30, breach 40-44, horizon 12: the plain label is 1 from step 28 (a breach
    within 12 steps); from the fault's start it is 1 from 30. A crash's breach (70-72) keeps its
    plain label, as does everything after the breaches."""
    ds = _dataset([_series(120, [(40, 44), (70, 72)], [_fault("leak", 30, 60), _fault("crash", 69, 72)])])
    got = fault_labels.from_fault_start(ds, [12])[:, 0]
    plain = slo.future_label(ds.breach, 12)
    assert plain[28] == plain[29] == 1 and got[28] == got[29] == 0
    expected = plain.copy()
    expected[28:30] = 0
    assert np.array_equal(got, expected)
    assert got[30] == 1 and got[43] == 1 and got[44] == 0  # y[t] = a breach in (t, t + 12]
    assert (got[58:70] == 1).all() and got[57] == 0  # the crash: from onset - 12, as before
    assert (got[-12:] == -1).all()  # the future past the end is not known


def test_without_faults_the_labels_are_the_plain_ones() -> None:
    ds = _dataset([_series(200, [(50, 55), (120, 150)], []), _series(90, [(10, 12)], [], "val")])
    hs = [1, 6, 24]
    assert np.array_equal(fault_labels.from_fault_start(ds, hs), ds.labels(hs))


def test_in_fault_marks_precursor_fault_spans_only() -> None:
    """From the step holding the fault's start to slo_window_steps + horizon steps after its end
    (``metrics.fault_span``); a crash is not a precursor fault."""
    ds = _dataset([_series(100, [], [_fault("ramp", 20, 30), _fault("crash", 60, 65)])])
    got = np.flatnonzero(fault_labels.in_fault(ds))
    assert got.tolist() == list(range(20, 30 + 2 + 3 + 1))


def test_training_weighs_the_negatives_inside_a_fault(tiny_ds) -> None:
    """The weight changes what is learnt (same seed, same data, other weights) and the labels
    from the fault's start train too; on a data set without faults the options change nothing."""
    plain = train_lstm(tiny_ds, tiny_train(epochs=1, patience=1))
    weighted = train_lstm(tiny_ds, tiny_train(epochs=1, patience=1, fault_negative_weight=5.0,
                                              label_from_fault_start=True))
    x = tiny_ds.inputs(tiny_ds.samples("test")[:64], plain.scaler)
    import torch

    with torch.no_grad():
        a, b = plain.model.risk(torch.from_numpy(x)).numpy(), weighted.model.risk(torch.from_numpy(x)).numpy()
    assert fault_labels.in_fault(tiny_ds).any()
    assert not np.allclose(a, b)
    bare = Dataset(tiny_ds.mode, tiny_ds.window, tiny_ds.horizon, tiny_ds.step_s, tiny_ds.feats, tiny_ds.present,
                   tiny_ds.signals, tiny_ds.breach, tiny_ds.y, tiny_ds.offsets,
                   [{**meta, "faults": []} for meta in tiny_ds.meta], tiny_ds.info)
    c = train_lstm(bare, tiny_train(epochs=1, patience=1))
    d = train_lstm(bare, tiny_train(epochs=1, patience=1, fault_negative_weight=5.0, label_from_fault_start=True))
    with torch.no_grad():
        xb = torch.from_numpy(bare.inputs(bare.samples("test")[:64], c.scaler))
        assert np.array_equal(c.model.risk(xb).numpy(), d.model.risk(xb).numpy())
