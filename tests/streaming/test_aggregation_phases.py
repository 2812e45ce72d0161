"""With one subtask the job's windows aggregate in one phase; with more, Flink's default (a local
pre-aggregation before the shuffle) stays. Planned, not run: the windows' results are the same
either way (test_windows.py runs the one-phase plan against the pandas reference)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmsla import config as config_mod
from llmsla import names
from llmsla.streaming import job


@pytest.mark.parametrize(("parallelism", "local_aggregates"), [(1, False), (2, True)])
def test_local_pre_aggregation_only_with_several_subtasks(tmp_path: Path, parallelism: int,
                                                          local_aggregates: bool) -> None:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.stream.checkpoint_dir = str(tmp_path / "ckpt")
    cfg.stream.parallelism = parallelism
    for kind in names.SPOOL_ALL_KINDS:
        (cfg.spool_dir() / kind).mkdir(parents=True)
    env, _t_env, _ = job.build(cfg, job.JobOptions(bounded=True, resume=False))
    kinds = [n["type"] for n in json.loads(env.get_execution_plan())["nodes"]]
    windows = [k for k in kinds if "WindowAggregate" in k]
    assert windows, kinds
    assert any(k.startswith("LocalWindowAggregate") for k in windows) == local_aggregates, windows
