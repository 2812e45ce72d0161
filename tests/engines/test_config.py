"""``[engine]``: ``types`` is validated on the key (pool=engine, engine known, each pool once)."""

from __future__ import annotations

import pytest

from llmsla import config as config_mod


def test_types_are_checked_on_the_key() -> None:
    cfg = config_mod.load(env={"LLMSLA_ENGINE_TYPES": "default=vllm,canary=triton"})
    assert cfg.engine.types == ["default=vllm", "canary=triton"]
    assert (cfg.engine.engine_of("canary"), cfg.engine.engine_of("other")) == ("triton", "auto")
    for bad, why in (("canary=tgi", "must be one of"), ("canary", "expected pool=engine"),
                     ("a=vllm,a=sglang", "listed twice"), ("=vllm", "must not be empty")):
        with pytest.raises(config_mod.ConfigError) as err:
            config_mod.load(env={"LLMSLA_ENGINE_TYPES": bad})
        assert "engine.types" in str(err.value) and why in str(err.value), (bad, str(err.value))
    assert config_mod.split_engine_spec("p=auto") == ("p", "auto")
