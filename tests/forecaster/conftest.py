"""A tiny configuration (seconds, not minutes): short windows, a handful of short runs."""

from __future__ import annotations

import pytest

from llmsla import config as config_mod
from llmsla.app.forecast_data import DataSpec, build
from llmsla.forecaster.train import TrainConfig

TINY_SPEC = DataSpec(traces=("azure_conv",), runs={"train": 4, "val": 2, "test": 2},
                     duration_s={"train": 900.0, "val": 900.0, "test": 900.0})


def tiny_config() -> config_mod.Config:
    c = config_mod.load(env={})
    c.forecast.window_steps = 16
    c.forecast.horizon_steps = 3
    c.forecast.slo_window_steps = 6
    c.forecast.lead_max_steps = 12
    return c


def tiny_train(**over) -> TrainConfig:
    return TrainConfig(**{"hidden": 16, "dense": 8, "epochs": 4, "patience": 2, "batch_size": 128,
                          "threads": 1, "stride": 2, **over})


@pytest.fixture(scope="session")
def tiny_cfg() -> config_mod.Config:
    return tiny_config()


@pytest.fixture(scope="session")
def tiny_ds(tiny_cfg):
    return build(tiny_cfg, TINY_SPEC)


@pytest.fixture(scope="session")
def tiny_trained(tiny_cfg, tiny_ds, tmp_path_factory):
    """(TrainResult, MethodResult, artifact dir) of a tiny LSTM, trained and saved once."""
    from llmsla.app.forecast_cli import train_and_save

    out = tmp_path_factory.mktemp("forecast") / "model"
    res, mr = train_and_save(tiny_cfg, tiny_ds, out, tiny_train())
    return res, mr, out
