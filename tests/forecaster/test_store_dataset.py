"""The forecaster learns from the store: ``forecast dataset --from-store`` and ``forecast backtest``.

Two hours of request and GPU windows for two replicas are written into the embedded PostgreSQL,
with known SLO breaches (every request of r0 over the E2E threshold for three steps) at chosen
steps: 5 in the training part, 2 in validation, 2 in test. Each makes two breach episodes (r0's
and its pool's), so the counts the errors quote are known in advance. The data set must hold
them as labels, in time-ordered splits; a short history, an empty range, a gap and too few
breaches are one line and exit 2; the backtest writes the page with the model and every
baseline. A store-built window equals the online scorer's input at the same step.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest

from llmsla import config as config_mod
from llmsla import names
from llmsla.app.cli import main
from llmsla.forecaster import artifact, features, online, store_dataset, store_io, windowing
from llmsla.forecaster import slo as slo_mod
from llmsla.forecaster.dataset import Dataset
from llmsla.store.migrate import migrate

from .test_online import T0 as RAMP_T0
from .test_online import ramp_in_store

#: four hours ago, on an hour boundary: inside the store's retention and the time parser's range
T0 = (int(time.time() * 1000) // 3_600_000 - 4) * 3_600_000
STEP_MS = features.STEP_MS
N = 1440  # two hours of 5 s steps: train [0, 864), val [864, 1152), test [1152, 1440)
BAD = {"train": (100, 250, 400, 550, 700), "val": (900, 1000), "test": (1200, 1300)}
GAP = (600, 612)  # steps without any window (the streaming job down for a minute)
METHODS = ("persistence", "ewma", "predict_linear", "holt_winters", "logistic_regression", "gradient_boosting")


def _iso(step: int) -> str:
    return dt.datetime.fromtimestamp((T0 + step * STEP_MS) / 1000, dt.UTC).isoformat()


def _history(skip: tuple[int, int] = (0, 0)) -> tuple[windowing.Frame, windowing.Frame]:
    bad = {k + i for ks in BAD.values() for k in ks for i in range(3)}
    req: dict[str, list] = {k: [] for k in (*windowing.REQUEST_KEYS, *windowing.REQUEST_VALUES)}
    gpu: dict[str, list] = {k: [] for k in (*windowing.GPU_KEYS, *windowing.GPU_VALUES)}
    for k in range(N):
        if skip[0] <= k < skip[1]:
            continue
        for i, rep in enumerate(("r0", "r1")):
            for col in windowing.REQUEST_VALUES:
                req[col].append(0.0)
            for key, v in (("bucket", T0 + k * STEP_MS), ("model", "6b"), ("pool", names.DEFAULT_POOL),
                           ("replica", rep), ("arm", ""),
                           (names.L_TENANT, names.DEFAULT_TENANT), (names.L_CLASS, names.DEFAULT_CLASS)):
                req[key].append(v)
            slow = rep == "r0" and k in bad
            for col, v in (("requests", 20), ("ok", 20), ("ttft_count", 20), ("ttft_within_slo", 20),
                           ("e2e_within_slo", 0 if slow else 20), ("qps", 4.0), ("ttft_p50_ms", 200.0 + k % 7),
                           ("ttft_p99_ms", 400.0 + 3 * (k % 11)), ("e2e_p99_ms", 12000.0 if slow else 4000.0 + k % 13),
                           ("ttft_slo_ms", 800.0), ("e2e_slo_ms", 8000.0), ("output_tokens", 2000),
                           ("output_tps", 400.0), ("itl_n", 2000), ("itl_sum_ms", 30000.0 + 100 * (k % 5)),
                           ("itl_sumsq_ms2", 500000.0)):
                req[col][-1] = float(v)
            node, g = features.sim_gpu_map(rep)  # type: ignore[misc]  # r0, r1 are on the simulator's layout
            for col in windowing.GPU_VALUES:
                gpu[col].append(float("nan"))
            for key, v in (("bucket", T0 + k * STEP_MS), ("node", node), ("gpu", g)):
                gpu[key].append(v)
            used = (0.5 + 0.001 * (k % 17) + 0.1 * i) * 80e9
            for col, v in (("samples", 5), ("mem_used_max_bytes", used), ("mem_used_mean_bytes", used),
                           ("mem_total_bytes", 80e9), ("util_mean", 0.7), ("temp_max_c", 60.0 + k % 3),
                           ("power_mean_w", 300.0)):
                gpu[col][-1] = float(v)
    def frame(rows: dict[str, list], keys: tuple[str, ...]) -> windowing.Frame:
        return {c: np.asarray(v, dtype=np.int64 if c in ("bucket", "gpu") else object if c in keys else float)
                for c, v in rows.items()}
    return frame(req, windowing.REQUEST_KEYS), frame(gpu, windowing.GPU_KEYS)


def _store(pg_dsn: str, **kw) -> None:
    cfg = config_mod.load(env={})
    req, gpu = _history(**kw)
    with psycopg.connect(pg_dsn) as conn:
        migrate(conn, cfg)
        store_io.write_frame(conn, names.T_REQUEST_WINDOWS, windowing.REQUEST_KEYS, windowing.REQUEST_VALUES, req)
        store_io.write_frame(conn, names.T_GPU_WINDOWS, windowing.GPU_KEYS, windowing.GPU_VALUES, gpu)


def _run(capsys, pg_dsn: str, *args: str) -> tuple[int, str, str]:
    rc = main(["--dsn", pg_dsn, "forecast", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc: int, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, (rc, err)
    return lines[0]


def test_a_data_set_from_the_store_holds_its_breaches_in_time_order(pg_dsn, tmp_path, capsys) -> None:
    _store(pg_dsn)
    out = tmp_path / "store.npz"
    rc, text, err = _run(capsys, pg_dsn, "dataset", "--from-store", "--from", _iso(0), "--to", _iso(N),
                         "--min-breaches", "4", "--out", str(out))
    assert rc == 0, err
    ds = Dataset.load(out)
    assert ds.info["source"] == "store" and ds.window == 64 and ds.horizon == 5
    # r0 and the pool breach at every bad stretch; r1 never does
    assert ds.info["store"]["breach_episodes"] == {"train": 10, "val": 4, "test": 4}
    assert "10 breach episodes" in text and "4 breach episodes" in text
    assert {(m["split"], m["replica"]) for m in ds.meta} == {(s, r) for s in ("train", "val", "test")
                                                             for r in ("r0", "r1", "")}
    for s in range(ds.n_series):
        meta, lo, hi = ds.meta[s], int(ds.offsets[s]), int(ds.offsets[s + 1])
        onsets = [int(e) for e in np.flatnonzero(np.diff(ds.breach[lo:hi].astype(int)) == 1) + 1]
        first = (int(meta["t0_ms"]) - T0) // STEP_MS
        ctx = int(meta["context_steps"])
        assert ctx == (0 if meta["split"] == "train" else ds.window - 1)
        assert (ds.y[lo:lo + ctx] == -1).all()  # context steps are the previous split's: no label here
        if meta["replica"] == "r1":
            assert not ds.breach[lo:hi].any()
        elif meta["replica"] == "r0":  # the breach begins in the step its bad requests are in
            assert [first + o for o in onsets] == list(BAD[meta["split"]])
        else:  # the pool's share of bad requests crosses the objective a step or two later
            assert all(0 <= first + o - k <= 2 for o, k in zip(onsets, BAD[meta["split"]], strict=True))
        assert meta["replica"] == "r1" or (ds.y[lo:hi] == 1).sum() > 0
    # time order: every validation step after every training step, test after validation
    assert store_dataset.time_order(ds) == []
    span = {sp: [(int(m["t0_ms"]), int(m["t0_ms"]) + ds.series_len(i) * STEP_MS) for i, m in enumerate(ds.meta)
                 if m["split"] == sp] for sp in ("train", "val", "test")}
    own = {sp: [(a + (ds.window - 1 if sp != "train" else 0) * STEP_MS, b) for a, b in v] for sp, v in span.items()}
    assert max(b for _, b in own["train"]) == min(a for a, _ in own["val"]) == T0 + 864 * STEP_MS
    assert max(b for _, b in own["val"]) == min(a for a, _ in own["test"]) == T0 + 1152 * STEP_MS
    assert min(a for a, _ in span["train"]) == T0 and max(b for _, b in span["test"]) == T0 + N * STEP_MS
    # a shuffled split is caught
    ds.meta[0]["split"], ds.meta[-1]["split"] = ds.meta[-1]["split"], ds.meta[0]["split"]
    assert store_dataset.time_order(ds)


def test_short_empty_gapped_and_breach_poor_histories_are_one_line(pg_dsn, tmp_path, capsys) -> None:
    _store(pg_dsn, skip=GAP)
    out = str(tmp_path / "x.npz")
    base = ("dataset", "--from-store", "--out", out)
    line = _one_line_error(*_run(capsys, pg_dsn, *base, "--from", _iso(0), "--to", _iso(300))[::2])
    assert "history too short: 300 steps" in line and "needs >= 345 steps" in line, line
    line = _one_line_error(*_run(capsys, pg_dsn, *base, "--from", _iso(-3 * N), "--to", _iso(-N))[::2])
    assert "no request windows in the store" in line, line
    line = _one_line_error(*_run(capsys, pg_dsn, *base, "--from", _iso(0), "--to", _iso(N))[::2])
    assert "1 gap(s)" in line and _iso(GAP[0])[:19] in line and "--allow-gaps" in line, line
    line = _one_line_error(*_run(capsys, pg_dsn, *base, "--from", _iso(0), "--to", _iso(N), "--allow-gaps")[::2])
    assert "validation part" in line and "holds 4 breach episode(s)" in line and "needs >= 5" in line, line
    line = _one_line_error(*_run(capsys, pg_dsn, *base, "--from", _iso(0), "--to", _iso(N), "--allow-gaps",
                                 "--min-breaches", "11")[::2])
    assert "training part" in line and "holds 10 breach episode(s)" in line and "needs >= 11" in line, line
    line = _one_line_error(*_run(capsys, pg_dsn, "dataset", "--from", _iso(0), "--out", out)[::2])
    assert "--from-store" in line
    assert not Path(out).exists()
    # with --allow-gaps the series are cut at the gap: no window straddles it
    rc, _, err = _run(capsys, pg_dsn, *base, "--from", _iso(0), "--to", _iso(N), "--allow-gaps", "--min-breaches", "4")
    assert rc == 0, err
    ds = Dataset.load(Path(out))
    train = [(int(m["t0_ms"]), ds.series_len(i)) for i, m in enumerate(ds.meta) if m["split"] == "train"]
    assert sorted({(t0 - T0) // STEP_MS for t0, _ in train}) == [0, GAP[1]]  # cut at the gap
    assert all(not (a < GAP[1] and a + n > GAP[0]) for a, n in (((t0 - T0) // STEP_MS, n) for t0, n in train))
    # the store keeps serving after the refusals
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {names.T_REQUEST_WINDOWS}").fetchone()[0] == 2 * (N - 12)


def test_backtest_writes_the_page_for_the_model_and_every_baseline(pg_dsn, tmp_path, capsys) -> None:
    _store(pg_dsn)
    page = tmp_path / "backtest.md"
    rc, text, err = _run(capsys, pg_dsn, "backtest", "--from", _iso(0), "--to", _iso(N), "--min-breaches", "4",
                         "--model", str(artifact.PRETRAINED), "--out", str(page))
    assert rc == 0, err
    md = page.read_text()
    assert "# Forecaster backtest" in md and "## Held-out part, against every baseline" in md
    for meth in ("lstm (serving threshold)", *METHODS):
        assert f"| {meth} |" in md, meth
    res = json.loads(page.with_suffix(".json").read_text())
    assert [r["method"] for r in res["held_out"]] == ["lstm (serving threshold)", *METHODS]
    art = artifact.load(artifact.PRETRAINED)
    lstm = res["held_out"][0]
    assert lstm["threshold"] == pytest.approx(art.threshold)  # the serving threshold, not re-picked
    assert lstm["test"]["policy"] == lstm["val"]["policy"] == res["whole"]["policy"]
    # every breach of the history is an event judged over the whole history (all causes "none":
    # the store has no fault labels): 9 stretches, r0's and the pool's
    assert res["whole"]["events"]["none"] == 18
    assert lstm["test"]["events"]["none"] == 4
    assert "whole history:" in text


def test_backtest_refuses_a_model_reading_a_feature_it_cannot_build(pg_dsn, tmp_path, capsys) -> None:
    import shutil

    _store(pg_dsn)
    model = tmp_path / "model"
    shutil.copytree(artifact.PRETRAINED, model)
    meta = json.loads((model / "artifact.json").read_text())
    # a feature this llmsla cannot build (a model from a newer one); gpu_temp_c or the engine's
    # state it builds, and a backtest reads the model's own list (test_registry)
    meta["features"] = [*meta["features"][:-1], "gpu_fan_rpm"]
    (model / "artifact.json").write_text(json.dumps(meta))
    line = _one_line_error(*_run(capsys, pg_dsn, "backtest", "--from", _iso(0), "--to", _iso(N), "--model",
                                 str(model), "--out", str(tmp_path / "p.md"))[::2])
    assert str(model) in line and "gpu_fan_rpm" in line, line
    assert not (tmp_path / "p.md").exists()


def test_a_store_built_window_equals_the_online_scorers_input(pg_dsn) -> None:
    """The online scorer steps through a simulated run in the store (real request and GPU windows,
    a ramp fault); at several steps its features and model inputs must equal the data set's
    window ending at that step, built from the same store by ``read_history``."""
    ramp = ramp_in_store(pg_dsn)
    cfg, art = ramp.cfg, ramp.art
    slos = slo_mod.from_config(cfg)
    scorer = online.OnlineScorer(art, cfg, pg_dsn)
    seen: list[np.ndarray] = []
    score = scorer.scorer.score
    scorer.scorer.score = lambda x: (seen.append(x.copy()), score(x))[1]  # type: ignore[method-assign]  # observe
    end_ms = RAMP_T0 + ramp.n_steps * STEP_MS
    with psycopg.connect(pg_dsn) as conn:
        h = store_dataset.read_history(conn, RAMP_T0, end_ms, slos=slos, slo_window_steps=cfg.forecast.slo_window_steps,
                                       chunk_steps=50)  # chunk edges inside the compared windows
    spec = store_dataset.StoreSpec(art.window, art.horizon, cfg.forecast.slo_window_steps, (0.4, 0.3, 0.3),
                                   min_breaches=0)
    ds = store_dataset.to_dataset(h, spec, slos)
    steps = (art.window - 1, 90, 150, ramp.n_steps - 1)  # train (its first window), train, validation, test
    try:
        for k in steps:
            res = scorer.step(RAMP_T0 + (k + 1) * STEP_MS)  # lag 0: window k has just ended
            assert res.step_ms == RAMP_T0 + k * STEP_MS and res.scored
            live = scorer.features.last
            assert live is not None
            rows = [h.ts.targets.index(t) for t in live.targets]
            sl = slice(k - art.window + 1, k + 1)
            np.testing.assert_array_equal(h.ts.x[rows, sl], live.x)  # bit for bit, NaN where missing
            np.testing.assert_array_equal(h.ts.present[rows, sl], live.present)
            np.testing.assert_array_equal(h.ts.signals[rows, sl], live.signals)
            assert h.ts.present[rows, sl, 1].any(), "GPU windows take part"
            x = seen[-1]
            # the data set keeps features as float32 (what training reads): equal to that precision
            for j, t in enumerate(live.targets):
                s = next(i for i, m in enumerate(ds.meta) if (m["pool"], m["replica"]) == (t.pool, t.replica)
                         and int(m["t0_ms"]) <= RAMP_T0 + k * STEP_MS < int(m["t0_ms"]) + ds.series_len(i) * STEP_MS)
                end = int(ds.offsets[s]) + (RAMP_T0 + k * STEP_MS - int(ds.meta[s]["t0_ms"])) // STEP_MS
                assert end - int(ds.offsets[s]) >= ds.window - 1  # a validation window holds its context
                np.testing.assert_allclose(ds.inputs(np.array([end]), art.scaler)[0], x[j], rtol=1e-5, atol=1e-5)
    finally:
        scorer.close()


def _engine_reading_artifact(tmp_path: Path, window: int) -> artifact.Artifact:
    """A small LSTM (random weights) that reads the engine's state beside the default list."""
    import torch

    from llmsla.forecaster.model import LstmForecaster, ModelConfig
    from llmsla.forecaster.scaler import RobustScaler

    names_ = [*features.FEATURES, *features.ENGINE_FEATURES]
    torch.manual_seed(0)
    model = LstmForecaster(ModelConfig(len(names_) + len(features.MASKS), hidden=4, dense=4))
    scaler = RobustScaler(np.zeros(len(names_)), np.ones(len(names_)))
    meta = {"mode": "fleet", "window": window, "horizon": 5, "step_s": 5.0, "threshold": 0.5,
            "features": names_, "masks": list(features.MASKS)}
    artifact.save(tmp_path / "eng", model, scaler, meta)
    return artifact.load(tmp_path / "eng")


def test_engine_features_from_the_store_equal_the_online_scorers(pg_dsn, tmp_path) -> None:
    """A model that reads the engine's queue, KV usage and preemptions: the online scorer (its
    incremental reads of ``engine_windows``) and ``read_history`` (the store data set) build
    the same engine features, bit for bit, from the simulated run's engine windows."""
    ramp = ramp_in_store(pg_dsn)
    cfg = ramp.cfg
    art = _engine_reading_artifact(tmp_path, 32)
    slos = slo_mod.from_config(cfg)
    scorer = online.OnlineScorer(art, cfg, pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        h = store_dataset.read_history(conn, RAMP_T0, RAMP_T0 + ramp.n_steps * STEP_MS, slos=slos,
                                       slo_window_steps=cfg.forecast.slo_window_steps, chunk_steps=50,
                                       feature_names=art.meta["features"])
    eng_cols = [art.meta["features"].index(n) for n in features.ENGINE_FEATURES]
    waiting = h.ts.x[..., eng_cols[0]]
    assert np.isfinite(waiting).mean() > 0.9 and np.nanmax(waiting) > 0, "engine windows take part"
    assert np.nanmax(h.ts.x[..., eng_cols[1]]) > 0.1  # the KV cache fills under the ramp
    try:
        for k in range(art.window - 1, ramp.n_steps, 37):  # consecutive scorer steps read incrementally
            res = scorer.step(RAMP_T0 + (k + 1) * STEP_MS)
            assert res.scored
            live = scorer.features.last
            assert live is not None
            rows = [h.ts.targets.index(t) for t in live.targets]
            sl = slice(k - art.window + 1, k + 1)
            np.testing.assert_array_equal(h.ts.x[rows, sl][..., eng_cols], live.x[..., eng_cols])
            np.testing.assert_array_equal(h.ts.x[rows, sl], live.x)
    finally:
        scorer.close()
