"""Configuration errors are precise: file and key named, for each class of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmsla import config as config_mod
from llmsla.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "llmsla.toml"
    p.write_text(text)
    return p


def test_defaults_are_valid() -> None:
    cfg = config_mod.load(env={})
    assert cfg.slo.ttft_ms == 800.0
    assert 0.8 in cfg.metrics.ttft_buckets


def test_file_then_env_override(tmp_path: Path) -> None:
    p = write(tmp_path, '[store]\nretention_days = 7\n[gateway]\nupstreams = ["http://a:1"]\n')
    cfg = config_mod.load(p, env={"LLMSLA_STORE_RETENTION_DAYS": "9", "LLMSLA_GATEWAY_UPSTREAMS": "http://b:2, http://c:3",
                                  "LLMSLA_DSN": "postgresql://u:secret@h/db", "LLMSLA_TEST_DSN": "ignored"})
    assert cfg.store.retention_days == 9
    assert cfg.gateway.upstreams == ["http://b:2", "http://c:3"]
    assert cfg.store.dsn == "postgresql://u:secret@h/db"
    assert cfg.source == str(p)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[store]\nretention_dayz = 3\n", "unknown key 'store.retention_dayz'"),
        ("[stor]\nx = 1\n", "unknown section [stor]"),
        ("[store]\nretention_days = 'three'\n", "store.retention_days: expected int, got a string"),
        ("[store]\nretention_days = 0\n", "store.retention_days: must be >= 1"),
        ("[store]\ntimescale = 'maybe'\n", "store.timescale: must be one of auto, require, off"),
        ("[slo]\nttft_ms = 750\n", "slo.ttft_ms = 750 ms is not a bucket bound of metrics.ttft_buckets"),
        ("[metrics]\ne2e_buckets = [1.0, 0.5, 10.0]\n", "metrics.e2e_buckets: bounds must be strictly increasing"),
        ("[gateway]\nupstreams = 'http://a'\n", "gateway.upstreams: expected a list"),
        ("[gateway]\nport = 1.5\n", "gateway.port: expected an integer"),
        ("store = 1\n", "[store] must be a table"),
        ("[store\n", "not valid TOML"),
    ],
)
def test_file_errors_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        config_mod.load(p, env={})
    assert message in str(err.value)
    assert str(p) in str(err.value)


def test_deprecated_slo_keys_load_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = write(tmp_path, "[slo]\nlatency_target = 0.9\nwindow_days = 7\n")
    with caplog.at_level("WARNING", logger="llmsla.config"):
        config_mod.load(p, env={})
    said = caplog.text
    assert "slo.latency_target is deprecated, no effect" in said and "slo.window_days is deprecated" in said
    assert str(p) in said


def test_renamed_keys_still_set_the_new_key_with_a_warning(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    p = write(tmp_path, '[worker]\nzone = "eu-1"\n[receiver]\npolicy = "/etc/llmsla/actions.yaml"\n')
    with caplog.at_level("WARNING", logger="llmsla.config"):
        cfg = config_mod.load(p, env={"LLMSLA_WORKER_POLICY": "entropy"})
    assert (cfg.worker.pool, cfg.worker.temperature_policy) == ("eu-1", "entropy")
    assert cfg.receiver.action_policy == "/etc/llmsla/actions.yaml"
    assert cfg.origins["worker.pool"] == str(p)
    assert cfg.origins["worker.temperature_policy"] == "environment variable LLMSLA_WORKER_POLICY"
    said = caplog.text
    assert f"{p}: worker.zone is renamed worker.pool" in said
    assert "environment variable LLMSLA_WORKER_POLICY: worker.policy is renamed worker.temperature_policy" in said
    # the old name keeps the new key's checks
    with pytest.raises(ConfigError, match="worker.temperature_policy: must be one of"):
        config_mod.load(None, env={"LLMSLA_WORKER_POLICY": "warm"})
    # every old name is one the doc lists, and never a current key
    doc = config_mod.render_doc()
    for old, new in config_mod.RENAMED_KEYS.items():
        assert f"| `{old}` | `{new}` |" in doc
        section, _, key = old.partition(".")
        assert key not in config_mod.SECTIONS[section].__dataclass_fields__


def test_one_key_says_where_the_control_api_is(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """receiver.control_urls and ab.control_url both became control.urls; a lone URL is a list
    of one, and without any the clients reach the control API at its own listen address."""
    assert config_mod.load(None, env={}).control.client_urls() == ["http://127.0.0.1:8100"]
    cfg = config_mod.load(None, env={"LLMSLA_CONTROL_HOST": "0.0.0.0", "LLMSLA_CONTROL_PORT": "9100"})
    assert cfg.control.client_urls() == ["http://127.0.0.1:9100"]  # a wildcard listen is reached on loopback
    cfg = config_mod.load(None, env={"LLMSLA_CONTROL_HOST": "::1"})
    assert cfg.control.client_urls() == ["http://[::1]:8100"]
    p = write(tmp_path, '[ab]\ncontrol_url = "http://ctl:8100/"\n')
    with caplog.at_level("WARNING", logger="llmsla.config"):
        cfg = config_mod.load(p, env={})
    assert cfg.control.urls == ["http://ctl:8100/"] and cfg.control.client_urls() == ["http://ctl:8100"]
    assert cfg.origins["control.urls"] == str(p)
    assert "ab.control_url is renamed control.urls" in caplog.text
    cfg = config_mod.load(None, env={"LLMSLA_RECEIVER_CONTROL_URLS": "http://a:1,http://b:2"})
    assert cfg.control.client_urls() == ["http://a:1", "http://b:2"]
    with pytest.raises(ConfigError, match=r"control.urls\[0\]|control.urls"):
        config_mod.load(write(tmp_path, '[receiver]\ncontrol_urls = ["ctl:8100"]\n'), env={})


def test_slo_error_fixed_by_adding_the_bucket(tmp_path: Path) -> None:
    p = write(tmp_path, "[slo]\nttft_ms = 750\n[metrics]\nttft_buckets = [0.25, 0.5, 0.75, 1.0]\n")
    assert config_mod.load(p, env={}).slo.ttft_ms == 750


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LLMSLA_STORE_NOPE": "1"}, "environment variable LLMSLA_STORE_NOPE: unknown key 'store.nope'"),
        ({"LLMSLA_GATEWAY_PORT": "eighty"}, "environment variable LLMSLA_GATEWAY_PORT: gateway.port: expected an integer"),
        ({"LLMSLA_SLO_TTFT_MS": "nan"}, "slo.ttft_ms: expected a finite number"),
    ],
)
def test_env_errors_name_variable(env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        config_mod.load(env=env)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        config_mod.load("/nonexistent/llmsla.toml", env={})


def test_ab_experiments_from_file_and_env_name_the_key(tmp_path: Path) -> None:
    p = write(tmp_path, """
[ab.experiments.checkout]
seed = 7
coverage = 0.05
[ab.experiments.checkout.arms.baseline]
[ab.experiments.checkout.arms.p2c]
route_policy = "p2c"
schedule = { name = "cosine", params = { t_min = 0.3 } }
""")
    cfg = config_mod.load(p, env={})
    assert list(cfg.ab.experiments["checkout"]["arms"]) == ["baseline", "p2c"]
    env = {"LLMSLA_AB_EXPERIMENTS": '{"x": {"arms": {"a": {}, "b": {"student_share_pct": 120}}}}'}
    with pytest.raises(ConfigError, match=r"^environment variable LLMSLA_AB_EXPERIMENTS: ab\.experiments\.x\.arms\.b\.student_share_pct: must be in \[0, 100\]"):
        config_mod.load(env=env)
    with pytest.raises(ConfigError, match="LLMSLA_AB_EXPERIMENTS: ab.experiments: expected a JSON object"):
        config_mod.load(env={"LLMSLA_AB_EXPERIMENTS": "{not json"})
    bad = write(tmp_path, '[ab.experiments.checkout]\ncoverage = 0.5\n[ab.experiments.checkout.arms.a]\n'
                          '[ab.experiments.checkout.arms.b]\nroute_policy = "fastest"\n')
    with pytest.raises(ConfigError, match=rf"^{bad}: ab\.experiments\.checkout\.arms\.b\.route_policy: must be one of"):
        config_mod.load(bad, env={})


def test_type_errors_do_not_echo_a_secret(tmp_path: Path) -> None:
    """A DSN given as a list or a token given as a number: the error names the type, never the value."""
    for text, secret in (('[store]\ndsn = ["postgresql://u:hunter2-secret@db/x"]\n', "hunter2-secret"),
                         ("[control]\ntoken = 918273645546372819\n", "918273645546372819")):
        p = tmp_path / "llmsla.toml"
        p.write_text(text)
        with pytest.raises(ConfigError) as err:
            config_mod.load(p, env={})
        assert secret not in str(err.value) and "expected a string" in str(err.value), err.value
