"""The model registry, the champion/challenger gate and unattended retraining, on the real store.

Two hours of windows for two replicas go into a fresh PostgreSQL database. Replica r0 breaks its
E2E SLO every five minutes, and each time its GPU memory creeps up for a minute before (a leak:
a precursor a model can learn, and one the shipped model is known to miss). A tiny LSTM trained
on that history (``forecast train --from-store``) must beat the shipped model on the held-out
part and be promoted; one trained on the same windows with their labels shuffled must be
refused, the reason saying by how much. Corrupt registry rows are one line and exit 2 for a
command; ``forecast serve`` picks up a newly promoted champion without a restart, and keeps
scoring through retrains that fail.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import io
import json
import logging
import shutil
import tarfile
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla import names
from llmsla.app import forecast_cli, forecast_retrain
from llmsla.app.cli import main
from llmsla.forecaster import artifact, features, gate, online, registry, store_io, windowing
from llmsla.forecaster import metrics as m
from llmsla.forecaster.service import ForecastService
from llmsla.store import open_store
from llmsla.store.migrate import migrate

from .conftest import tiny_train
from .test_online import T0 as RAMP_T0
from .test_online import ramp_in_store

STEP_MS = features.STEP_MS
#: four hours ago, on an hour boundary: inside the store's retention and the time parser's range
T0 = (int(time.time() * 1000) // 3_600_000 - 4) * 3_600_000
N = 1440  # two hours of 5 s steps: train [0, 864), validation [864, 1152), test [1152, 1440)
BREACHES = tuple(range(80, N - 40, 83))  # r0 breaks its E2E SLO for 3 steps at each (not on the
#: alarm's 60-step repeat: an alarm left on is charged)
LEAK = 12  # steps of GPU memory creeping up before each breach
#: tiny model and labels (seconds of training) through the environment, as a user would set them
TINY_ENV = {"LLMSLA_FORECAST_WINDOW_STEPS": "16", "LLMSLA_FORECAST_HORIZON_STEPS": "3",
            "LLMSLA_FORECAST_SLO_WINDOW_STEPS": "6", "LLMSLA_FORECAST_LEAD_MAX_STEPS": "12",
            "LLMSLA_FORECAST_HIDDEN": "16", "LLMSLA_FORECAST_DENSE": "8", "LLMSLA_FORECAST_EPOCHS": "20", "LLMSLA_FORECAST_LR": "0.01",
            "LLMSLA_FORECAST_BATCH_SIZE": "128", "LLMSLA_FORECAST_THREADS": "1"}


def _iso(step: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp((T0 + step * STEP_MS) / 1000, dt.UTC).isoformat()


def _history() -> tuple[windowing.Frame, windowing.Frame]:
    bad = {k + i for k in BREACHES for i in range(3)}
    leak = {k - LEAK + i: (i + 1) / LEAK for k in BREACHES for i in range(LEAK)}
    req: dict[str, list] = {k: [] for k in (*windowing.REQUEST_KEYS, *windowing.REQUEST_VALUES)}
    gpu: dict[str, list] = {k: [] for k in (*windowing.GPU_KEYS, *windowing.GPU_VALUES)}
    for k in range(N):
        for rep in ("r0", "r1"):
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
            ratio = 0.5 + 0.01 * (k % 5) + (0.45 * leak.get(k, 0.0) if rep == "r0" else 0.0)
            for col, v in (("samples", 5), ("mem_used_max_bytes", ratio * 80e9), ("mem_used_mean_bytes", ratio * 80e9),
                           ("mem_total_bytes", 80e9), ("util_mean", 0.7), ("temp_max_c", 60.0),
                           ("power_mean_w", 300.0)):
                gpu[col][-1] = float(v)

    def frame(rows: dict[str, list], keys: tuple[str, ...]) -> windowing.Frame:
        return {c: np.asarray(v, dtype=np.int64 if c in ("bucket", "gpu") else object if c in keys else float)
                for c, v in rows.items()}
    return frame(req, windowing.REQUEST_KEYS), frame(gpu, windowing.GPU_KEYS)


def _engine_history() -> windowing.Frame:
    """What ``llmsla engines`` would have windowed: r0's waiting queue builds up before each of
    its breaches, r1's stays flat."""
    build = {k - LEAK + i: (i + 1) / LEAK for k in BREACHES for i in range(LEAK)}
    rows: dict[str, list] = {k: [] for k in (*windowing.ENGINE_KEYS, *windowing.ENGINE_VALUES)}
    for k in range(N):
        for rep in ("r0", "r1"):
            waiting = 2.0 + (k % 3) + (30.0 * build.get(k, 0.0) if rep == "r0" else 0.0)
            for key, v in (("bucket", T0 + k * STEP_MS), ("pool", names.DEFAULT_POOL), ("replica", rep),
                           ("engine", "vllm"), ("samples", 5.0), ("waiting_mean", waiting),
                           ("waiting_max", waiting + 1), ("running_mean", 8.0), ("running_max", 8.0),
                           ("kv_usage_mean", 0.4 + waiting / 100), ("kv_usage_max", 0.45 + waiting / 100),
                           ("preemptions", 0.0), ("counter_resets", 0.0)):
                rows[key].append(v)
    return {c: np.asarray(v, dtype=np.int64 if c == "bucket" else object if c in windowing.ENGINE_KEYS else float)
            for c, v in rows.items()}


def _store(pg_dsn: str, *, engines: bool = False) -> None:
    req, gpu = _history()
    with psycopg.connect(pg_dsn) as conn:
        migrate(conn, config_mod.load(env={}))
        store_io.write_frame(conn, names.T_REQUEST_WINDOWS, windowing.REQUEST_KEYS, windowing.REQUEST_VALUES, req)
        store_io.write_frame(conn, names.T_GPU_WINDOWS, windowing.GPU_KEYS, windowing.GPU_VALUES, gpu)
        if engines:
            store_io.write_frame(conn, names.T_ENGINE_WINDOWS, windowing.ENGINE_KEYS, windowing.ENGINE_VALUES,
                                 _engine_history())


def _migrated(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        migrate(conn, config_mod.load(env={}))


def _run(capsys, pg_dsn: str, *args: str) -> tuple[int, str, str]:
    rc = main(["--dsn", pg_dsn, "forecast", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc: int, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, (rc, err)
    return lines[0]


def _variant(tmp: Path, threshold: float, seed: int) -> Path:
    """A real artifact other than the shipped one: its weights, another threshold and recorded
    seed (so another version), saved through ``artifact.save``."""
    art = artifact.load(artifact.PRETRAINED)
    meta = {k: v for k, v in art.meta.items() if k not in ("version", "weights_sha256", "format", "created")}
    meta["threshold"] = threshold
    meta["train"] = {**meta["train"], "seed": seed}
    out = tmp / f"variant-{seed}"
    artifact.save(out, art.model, art.scaler, meta)
    return out


def test_registry_round_trip_and_one_champion(pg_dsn, tmp_path, capsys) -> None:
    _migrated(pg_dsn)
    rc, out, _ = _run(capsys, pg_dsn, "models")
    assert rc == 0 and out.startswith("no models in the registry") and "shipped model" in out
    (tmp_path / "d.npz").write_bytes(b"x")
    for args, says in ((("--from-store",), "--from is required"),
                       (("--from-store", "--from=-1d", "--data", str(tmp_path / "d.npz")), "pick one"),
                       (("--no-gate",), "add --from-store"), (("--from=-1d",), "add --from-store")):
        line = _one_line_error(*_run(capsys, pg_dsn, "train", *args)[::2])
        assert says in line, (args, line)
    a, b = _variant(tmp_path, 0.9, 1), _variant(tmp_path, 0.8, 2)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ra = registry.put(conn, a, trained_by="alice@host")
        rb = registry.put(conn, b, trained_by="bob@host", metrics={"note": "x"})
        assert registry.put(conn, a, trained_by="carol@host").id == ra.id  # same version: the row as it is
        assert (ra.status, rb.status) == (registry.CANDIDATE, registry.CANDIDATE)
        assert [r.id for r in registry.list_models(conn)] == [rb.id, ra.id]
        assert registry.get(conn, ra.version).id == ra.id == registry.get(conn, str(ra.id)).id
        assert registry.get(conn, rb.id).metrics["note"] == "x" and "val" in rb.metrics
        loaded = registry.load(conn, ra)
        want = artifact.load(a)
        assert loaded.version == want.version and loaded.threshold == pytest.approx(0.9)
        for k, v in want.model.state_dict().items():
            assert np.array_equal(loaded.model.state_dict()[k].numpy(), v.numpy()), k
        assert registry.champion(conn) is None
        assert registry.promote(conn, ra, "by hand") is None
        retired = registry.promote(conn, rb, "better")
        assert retired is not None and retired.id == ra.id
        champ = registry.champion(conn)
        assert champ is not None and champ.id == rb.id and champ.reason == "better"
        assert registry.get(conn, ra.id).status == registry.RETIRED
        assert registry.get(conn, ra.id).reason == f"replaced by v{rb.version}"
        with pytest.raises(psycopg.errors.UniqueViolation):  # the store itself holds one champion
            conn.execute(f"UPDATE {names.T_FORECAST_MODELS} SET status = 'champion' WHERE id = %s", (ra.id,))
        with pytest.raises(registry.RegistryError, match="no model 'nope'"):
            registry.get(conn, "nope")
    rc, out, err = _run(capsys, pg_dsn, "models")
    assert rc == 0, err
    lines = out.splitlines()
    assert "champion" in lines[1] and rb.version in lines[1] and "bob@host" in lines[1], out
    assert "retired" in lines[2] and f"replaced by v{rb.version}" in lines[2], out
    rc, out, _ = _run(capsys, pg_dsn, "models", "--json")
    assert [json.loads(ln)["status"] for ln in out.splitlines()] == ["champion", "retired"]
    # a roll-back by hand: the retired model is the champion again
    rc, out, err = _run(capsys, pg_dsn, "models", "--promote", ra.version, "--json")
    assert rc == 0, err
    assert out.splitlines()[0] == f"model {ra.id} (v{ra.version}) is the champion; model {rb.id} (v{rb.version}) retired"
    assert [json.loads(ln)["status"] for ln in out.splitlines()[1:]] == ["retired", "champion"]
    assert json.loads(out.splitlines()[2])["reason"].startswith("promoted by hand by ")
    line = _one_line_error(*_run(capsys, pg_dsn, "models", "--promote", "999")[::2])
    assert "no model '999'" in line


def _rewrite(conn: psycopg.Connection, row: registry.ModelRow, blob: bytes, *, keep_sha: bool = False) -> None:
    sha = row.artifact_sha256 if keep_sha else hashlib.sha256(blob).hexdigest()
    conn.execute(f"UPDATE {names.T_FORECAST_MODELS} SET artifact = %s, artifact_sha256 = %s WHERE id = %s",
                 (blob, sha, row.id))


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_a_corrupt_registry_artifact_is_one_line_and_exit_2(pg_dsn, tmp_path, capsys) -> None:
    _migrated(pg_dsn)
    src = _variant(tmp_path, 0.9, 1)
    meta = json.loads((src / artifact.META).read_text())
    weights = (src / artifact.WEIGHTS).read_bytes()
    other_features = json.dumps({**meta, "features": [*meta["features"][:-1], "gpu_fan_rpm"]}).encode()
    cases = {  # what is wrong -> (bytes stored, keep the old sha256, what the line must say)
        "sha256": (None, True, "differs from the recorded"),
        "truncated": (None, False, "not a readable tar"),
        "features": (_tar({artifact.META: other_features, artifact.WEIGHTS: weights}), False, "gpu_fan_rpm"),
        "members": (_tar({artifact.META: other_features}), False, "expected the files"),
    }
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = registry.put(conn, src, trained_by="t")
        good = bytes(conn.execute(f"SELECT artifact FROM {names.T_FORECAST_MODELS}").fetchone()[0])
    for what, (blob, keep_sha, says) in cases.items():
        if what == "sha256":
            blob = good[:-600] + bytes([good[-600] ^ 0xFF]) + good[-599:]  # one byte of the weights flipped
        elif what == "truncated":
            blob = good[: len(good) // 2]
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            _rewrite(conn, row, blob, keep_sha=keep_sha)
            with pytest.raises(registry.RegistryError, match=says):
                registry.load(conn, registry.get(conn, row.id))
        line = _one_line_error(*_run(capsys, pg_dsn, "backtest", "--registry", str(row.id), "--from", _iso(0),
                                     "--out", str(tmp_path / "p.md"))[::2])
        assert f"model {row.id} (v{row.version})" in line and says in line, (what, line)
    assert not (tmp_path / "p.md").exists()
    line = _one_line_error(*_run(capsys, pg_dsn, "backtest", "--registry", "champion", "--from", _iso(0))[::2])
    assert "no champion" in line
    line = _one_line_error(*_run(capsys, pg_dsn, "models", "--promote", str(row.id))[::2])
    assert f"model {row.id} (v{row.version})" in line  # a corrupt model is never made the champion
    rc, out, err = _run(capsys, pg_dsn, "models")  # the registry still lists it: nothing else broke
    assert rc == 0 and row.version in out and "candidate" in out, err


def test_the_gate_promotes_a_better_model_and_refuses_a_worse_one(pg_dsn, tmp_path, capsys, monkeypatch) -> None:
    _store(pg_dsn)
    for k, v in TINY_ENV.items():
        monkeypatch.setenv(k, v)
    # cold start: no champion in the registry, so the shipped model is the one to beat
    rc, out, err = _run(capsys, pg_dsn, "train", "--from-store", "--from", _iso(0), "--to", _iso(N),
                        "--trained-by", "ci@test", "--min-breaches", "3")
    assert rc == 0, err
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        good = registry.list_models(conn)[0]
    g = good.metrics["gate"]
    assert good.status == registry.CHAMPION, (out, good.reason, g)
    assert g["champion_label"].startswith("the shipped model v") and good.reason.startswith("promoted over the shipped")
    assert g["candidate"]["events"] == g["champion"]["events"] > 0  # the same breaches judged for both
    assert g["candidate"]["recall"] >= g["champion"]["recall"] + 0.02
    assert good.trained_by == "ci@test" and good.train_from is not None and good.data_sha256
    assert "champion" in out and "promoted over" in out

    # the challenger: the same history, the same training, its labels shuffled
    cfg = config_mod.load()
    spec = forecast_retrain.HistorySpec(T0, T0 + N * STEP_MS, min_breaches=3)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        h = forecast_retrain.read(cfg, conn, spec)
        from llmsla.forecaster import slo as slo_mod
        from llmsla.forecaster import store_dataset as sd

        # the history holds every known feature; the challenger reads the default list
        ds = sd.to_dataset(h, spec.store_spec(cfg, 16, 3), slo_mod.from_config(cfg)).select(features.FEATURES)
        shuffled = copy.copy(ds)
        shuffled.y = ds.y.copy()
        labelled = np.flatnonzero(ds.y >= 0)
        shuffled.y[labelled] = np.random.default_rng(0).permutation(ds.y[labelled])
        forecast_cli.train_and_save(cfg, shuffled, tmp_path / "worse", tiny_train(epochs=12))
        worse = registry.put(conn, tmp_path / "worse", trained_by="ci@test (shuffled labels)")
        v = forecast_retrain.run_gate(cfg, conn, h, spec, ds, worse, registry.load(conn, worse), lambda _m: None)
        assert not v.promote
        worse = registry.get(conn, worse.id)
        assert worse.status == registry.REFUSED and worse.reason == v.reason
        assert v.reason.startswith(f"kept champion v{good.version} (model {good.id}): ")
        assert v.candidate.recall < v.champion.recall + 0.02 or "false alarms" in v.reason, v
        assert registry.champion(conn).id == good.id  # type: ignore[union-attr]
    rc, out, _ = _run(capsys, pg_dsn, "models")
    assert "refused" in out and "kept champion" in out


def test_a_fleet_opts_into_the_engine_features(pg_dsn, tmp_path, capsys, monkeypatch) -> None:
    """``forecast.features`` with the engine's state: refused while the store has no engine
    windows (a model would learn a constant), then trained from the store, registered and gated
    against the shipped model on the same breaches (each on its own features), and backtested on
    its own list; the default list is unchanged beside it."""
    _store(pg_dsn)
    for k, v in TINY_ENV.items():
        monkeypatch.setenv(k, v)
    opted = [*features.FEATURES, *features.ENGINE_FEATURES]
    monkeypatch.setenv("LLMSLA_FORECAST_FEATURES", ",".join(opted))
    history = ("--from", _iso(0), "--to", _iso(N), "--min-breaches", "3")
    line = _one_line_error(*_run(capsys, pg_dsn, "train", "--from-store", *history)[::2])
    assert "forecast.features: engine_waiting, engine_kv_usage, engine_preemptions_per_s" in line, line
    assert "`llmsla engines`" in line, line
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert registry.list_models(conn) == []  # nothing registered from a refused history

    with psycopg.connect(pg_dsn) as conn:
        store_io.write_frame(conn, names.T_ENGINE_WINDOWS, windowing.ENGINE_KEYS, windowing.ENGINE_VALUES,
                             _engine_history())
    rc, out, err = _run(capsys, pg_dsn, "train", "--from-store", *history, "--trained-by", "ci@test")
    assert rc == 0, err
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        (row,) = registry.list_models(conn)
        art = registry.load(conn, row)
    assert art.meta["features"] == opted and art.scaler is not None and len(art.scaler.median) == len(opted)
    g = row.metrics["gate"]
    assert g["champion_label"].startswith("the shipped model v")  # read its twelve from the same history
    assert g["candidate"]["events"] == g["champion"]["events"] > 0

    page = tmp_path / "backtest.md"
    rc, text, err = _run(capsys, pg_dsn, "backtest", "--registry", str(row.id), *history, "--out", str(page),
                         "--methods", "persistence,logistic_regression")
    assert rc == 0, err
    res = json.loads(page.with_suffix(".json").read_text())
    assert [r["method"] for r in res["held_out"]] == ["lstm (serving threshold)", "persistence", "logistic_regression"]
    held_out = res["held_out"][0]["test"]["events"]["none"]
    assert held_out == g["candidate"]["events"]  # the gate judged the same held-out breaches
    assert res["whole"]["events"]["none"] > held_out > 0

    # the data set of the store carries every known feature; train reads the configured list
    data = tmp_path / "store.npz"
    rc, _, err = _run(capsys, pg_dsn, "dataset", "--from-store", *history, "--out", str(data))
    assert rc == 0, err
    from llmsla.forecaster.dataset import Dataset

    ds = Dataset.load(data)
    assert ds.features == list(features.KNOWN)
    eng = ds.select(features.ENGINE_FEATURES).feats
    # (log1p of) r0's queue before its breaches, and the pool's (r0's and r1's summed)
    assert np.isfinite(eng).all() and eng[:, 0].max() > np.log1p(32)
    monkeypatch.setenv("LLMSLA_FORECAST_FEATURES", "")
    rc, _, err = _run(capsys, pg_dsn, "train", "--data", str(data), "--out", str(tmp_path / "default"))
    assert rc == 0, err
    assert artifact.load(tmp_path / "default").meta["features"] == list(features.FEATURES)


def test_forecast_features_are_checked_where_they_are_set() -> None:
    for value, says in (("qps,gpu_fan_rpm", "unknown feature 'gpu_fan_rpm'"), ("qps,qps", "features repeat")):
        with pytest.raises(config_mod.ConfigError, match=says) as err:
            config_mod.load(env={"LLMSLA_FORECAST_FEATURES": value})
        assert "forecast.features" in str(err.value)
    assert config_mod.load(env={"LLMSLA_FORECAST_FEATURES": "qps,engine_waiting"}).forecast.features == [
        "qps", "engine_waiting"]
    assert features.configured([]) == features.FEATURES


def test_gate_rule() -> None:
    champ = gate.Score("c", 0.44, 11, 25, 2.0, 20.0)
    lower = gate.judge(gate.Score("n", 0.41, 10, 25, 1.0, 20.0), champ, margin=0.02, fa_budget=4.0,
                       champion_label="v c")
    assert not lower.promote and "recall 0.41 (10/25) vs 0.46 needed" in lower.reason
    noisy = gate.judge(gate.Score("n", 0.6, 15, 25, 5.0, 20.0), champ, margin=0.02, fa_budget=4.0,
                       champion_label="v c")
    assert not noisy.promote and "5.0 false alarms per target-day vs at most 4.0" in noisy.reason
    ok = gate.judge(gate.Score("n", 0.48, 12, 25, 3.9, 20.0), champ, margin=0.02, fa_budget=4.0, champion_label="v c")
    assert ok.promote and ok.reason.startswith("promoted over v c")
    perfect = gate.judge(gate.Score("n", 1.0, 25, 25, 0.0, 20.0), gate.Score("c", 1.0, 25, 25, 0.0, 20.0), margin=0.02,
                         fa_budget=4.0, champion_label="v c")
    assert perfect.promote  # a perfect champion is matched, not beaten by an impossible 1.02
    none = gate.judge(gate.Score("n", 0.0, 0, 0, 0.0, float("nan")), champ, margin=0.0, fa_budget=4.0,
                      champion_label="v c")
    assert not none.promote and "no breach" in none.reason


def test_gate_names_a_candidate_its_short_validation_left_silent() -> None:
    """Four hours of one target's validation (0.17 healthy days) at 4 false alarms per day
    allow 0.7: three high-scoring healthy moments put the threshold above every score. The
    candidate never alarms, and the retrain says why instead of only "recall 0.00"; with room
    for the three (20 per day), the same scores warn of the breach and nothing is said."""
    n, step_s, lead = 2880, 5.0, 5
    score = np.random.default_rng(0).uniform(0.0, 0.5, n)  # healthy noise: many false alarms low down
    score[[400, 1200, 2400]] = 0.99  # healthy: three false alarms at any threshold that sees them
    score[1996:2000] = 0.9  # ahead of the breach, inside the lead window
    breach = np.zeros(n, dtype=bool)
    breach[2000:2012] = True
    y = np.zeros(n, dtype=np.int8)
    y[2000 - lead:2012] = 1
    s = [m.SeriesScores(score, y, breach, m.episodes(breach, 1))]

    def val_report(budget: float) -> m.Report:
        thr = m.threshold_for(s, budget, lead, step_s)
        return m.report(s, thr, lead, step_s, min_onset=0)

    tight = val_report(4.0)
    assert tight.threshold > score.max()
    why = gate.silent(tight, 4.0)
    assert why is not None and "never alarms" in why and "allow 0.7" in why and "longer history" in why, why
    roomy = val_report(20.0)  # room for 3.3
    assert roomy.threshold < score.max() and roomy.warned[m.NONE] == roomy.events[m.NONE] == 1, roomy
    assert gate.silent(roomy, 20.0) is None


def test_serve_picks_up_a_promoted_champion_and_scores_through_failing_retrains(pg_dsn, tmp_path, caplog) -> None:
    ramp = ramp_in_store(pg_dsn)
    cfg, shipped = ramp.cfg, ramp.art
    caplog.set_level(logging.WARNING)
    handle = open_store(cfg, dsn=pg_dsn, migrate=False)
    args = forecast_cli.argparse.Namespace(model=None, forecast_command="serve", out=None, data=None)
    art, source, watch = forecast_cli._serving_model(cfg, args, handle)
    assert art.version == shipped.version and source.startswith("the shipped model") and "no champion" in source
    new = _variant(tmp_path, 0.5, 7)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = registry.put(conn, new, trained_by="t")
    calls = {"retrain": 0}

    def retrain() -> None:  # the real cycle on the last 14 days (none here: logged), then a crash
        calls["retrain"] += 1
        if calls["retrain"] == 1:
            forecast_cli._retrain(cfg, handle)
        else:
            raise RuntimeError("retrain blew up")

    registry_ = CollectorRegistry()
    results: list[online.StepResult] = []
    now = [RAMP_T0 + art.window * STEP_MS]
    promote_at = 20

    def on_step(n: int, res: online.StepResult) -> None:
        results.append(res)
        now[0] += STEP_MS
        if n == promote_at:
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                registry.promote(conn, row, "test")
        time.sleep(0.02)  # the retrain thread gets its turns; a live step is 5 s apart

    async def run() -> ForecastService:
        svc = ForecastService(cfg, registry_, lambda url: online.OnlineScorer(art, cfg, pg_dsn, registry=registry_),
                              watch=watch, watch_every_s=0.0, retrain=retrain, retrain_every_s=0.05)
        await svc.start("127.0.0.1", 0)
        try:
            await svc.run(asyncio.Event(), steps=80, interval_s=0.0, clock=lambda: now[0] / 1000, on_step=on_step)
        finally:
            await svc.close()
        return svc

    try:
        svc = asyncio.run(run())
    finally:
        handle.close()
    assert calls["retrain"] >= 2 and svc.retrain_failures >= 1, calls
    assert all(r.scored for r in results), [r.skipped for r in results if not r.scored]
    assert len(results) == 80
    with psycopg.connect(pg_dsn) as conn:
        by_model = dict(conn.execute(f"SELECT forecaster, count(DISTINCT ts) FROM {names.T_FORECASTS} GROUP BY 1"))
        stored = conn.execute(f"SELECT DISTINCT threshold FROM {names.T_FORECASTS} WHERE forecaster = %s",
                              (f"lstm-{row.version}",)).fetchall()
    # served the shipped model up to the promotion, the new champion from the next step on
    assert by_model == {f"lstm-{shipped.version}": promote_at, f"lstm-{row.version}": 80 - promote_at}, by_model
    assert stored == [(pytest.approx(0.5),)]
    logs = caplog.text
    assert f"serving the registry's new champion model {row.id} (v{row.version})" in logs
    assert "forecast retrain skipped: no request windows in the store" in logs, logs  # its history lies ahead
    assert "forecast retrain failed" in logs and "retrain blew up" in logs


def test_serve_starts_with_the_champion_and_keeps_its_model_over_a_corrupt_one(pg_dsn, tmp_path, caplog) -> None:
    _migrated(pg_dsn)
    cfg = config_mod.load(env={})
    caplog.set_level(logging.WARNING)
    a, b = _variant(tmp_path, 0.9, 1), _variant(tmp_path, 0.8, 2)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        ra, rb = registry.put(conn, a, trained_by="t"), registry.put(conn, b, trained_by="t")
        registry.promote(conn, ra, "test")
    handle = open_store(cfg, dsn=pg_dsn, migrate=False)
    try:
        args = forecast_cli.argparse.Namespace(model=None, forecast_command="serve", out=None, data=None)
        art, source, watch = forecast_cli._serving_model(cfg, args, handle)
        assert art.version == ra.version and source == f"the model registry's champion model {ra.id} (v{ra.version})"
        assert watch() is None  # the same champion: nothing to swap
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            registry.promote(conn, rb, "test")
            _rewrite(conn, rb, b"not a tar at all")
        assert watch() is None and watch() is None  # refused, logged once
        assert caplog.text.count(f"model {rb.id} (v{rb.version}): artifact") == 1, caplog.text
        assert "serving the previous model as before" in caplog.text
        # a corrupt champion at start: the local default serves, said in the start line
        art2, source2, _ = forecast_cli._serving_model(cfg, args, handle)
        assert art2.version == artifact.load(artifact.PRETRAINED).version
        assert source2.startswith("the shipped model") and f"champion model {rb.id} (v{rb.version}) does not load" in source2
    finally:
        handle.close()
    shutil.rmtree(a)


def test_a_champion_the_history_cannot_score_is_kept(pg_dsn, capsys, monkeypatch) -> None:
    """A held-out part of 57 steps holds the tiny model's window (16) but not the shipped model's
    (64): no fair comparison, so the candidate is refused with the history's own error."""
    _store(pg_dsn)
    for k, v in TINY_ENV.items():
        monkeypatch.setenv(k, v)
    rc, out, err = _run(capsys, pg_dsn, "train", "--from-store", "--from", _iso(0), "--to", _iso(N),
                        "--split", "0.92,0.04,0.04", "--min-breaches", "1")
    assert rc == 0, err
    assert "refused: kept champion the shipped model v" in out and "cannot be scored on this history" in out, out
    assert "history too short" in out, out
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert registry.champion(conn) is None and registry.list_models(conn)[0].status == registry.REFUSED
