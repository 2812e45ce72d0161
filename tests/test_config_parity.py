"""`llmsla config check` refuses exactly what the components refuse; typos in env var names,
config paths that are not files, short tokens and huge values are each one clear line.

The parity cases run the real CLI (a subprocess) and, in this process, the start-up of the
component the key belongs to (the gateway, the router with its Redis client, the store handle,
the receiver's control client) from the same file: an invalid value must stop both with the same
message, a valid one must pass both.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla.config import ConfigError
from llmsla.redaction import MASK, redact, scrub, secrets_of

GOOD_TOKEN = "a-token-of-24-characters"


def llmsla(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "llmsla", *args], capture_output=True, text=True,
                          env=full_env, timeout=120)


def _toml(key: str, value: Any) -> str:
    section, name = key.split(".")
    # JSON strings are TOML basic strings (escapes included: a NUL is \\u0000)
    body = json.dumps(value) if isinstance(value, str | list) else repr(value)
    return f"[{section}]\n{name} = {body}\n"


def _start(cfg: config_mod.Config, key: str, tmp_path: Path) -> None:
    """The start-up of the component that reads ``key``, from ``cfg``, then its shutdown."""
    section = key.split(".")[0]
    if section in ("gateway", "otel", "metrics") or key == "control.ladr_theta":
        from llmsla.app.wiring import gateway as build_gateway

        cfg.spool.dir = str(tmp_path / "spool")
        if not cfg.gateway.upstreams:
            cfg.gateway.upstreams = ["http://127.0.0.1:9"]
        gw = build_gateway(cfg, registry=CollectorRegistry(), spool=None)
        gw.telemetry.shutdown()
    elif key == "control.redis_url":
        from llmsla.control.router import Replica
        from llmsla.control.router import from_config as router_from_config

        router = router_from_config(cfg, [Replica("r0", "default", url="http://127.0.0.1:9")])
        router.shared.close()
    elif key == "store.dsn":
        from llmsla.store import open_store

        open_store(cfg, migrate=False).close()  # the DSN check; connecting is not start-up's
    elif key == "control.urls":
        from llmsla.control_client import ControlClient

        ControlClient(cfg.control.client_urls(), cfg.control.token, timeout_s=0.1)
    # tokens, worker.* and gpu.node: load() is the whole of their start-up check


# (key, value, accepted?): for each key the values the component takes and those it cannot
CASES: list[tuple[str, Any, bool]] = [
    ("gateway.pool", "p" * 256, True),
    ("gateway.pool", "p" * 300, False),  # every event would fail its contract: nothing recorded
    ("gateway.pool", "", False),
    ("gateway.pool", "nul\x00pool", False),
    ("gateway.upstreams", ["http://127.0.0.1:9001", "https://gpu-1.example/v1"], True),
    ("gateway.upstreams", ["notaurl"], False),
    ("gateway.upstreams", ["ftp://127.0.0.1:9001"], False),
    ("gateway.upstreams", ["http://127.0.0.1:99999"], False),
    ("gateway.upstreams", ["http://"], False),
    ("gateway.student_upstreams", ["http:/127.0.0.1:9"], False),
    ("gateway.pools", ["canary=http://127.0.0.1:9002"], True),
    ("gateway.pools", ["canary=notaurl"], False),
    ("gateway.pools", ["=http://127.0.0.1:9002"], False),
    ("gateway.pools", ["http://127.0.0.1:9002"], False),
    ("gateway.pools", ["canary"], False),  # a pool name alone needs a discovery source to fill it
    ("gateway.client_share", 0.25, True),
    ("gateway.client_share", 1.0, True),  # no per-client bound
    ("gateway.client_share", 0, False),
    ("gateway.client_share", 1.5, False),
    ("gateway.client_share", float("nan"), False),
    ("gateway.client_share", -0.5, False),
    ("gateway.trusted_proxies", ["10.0.0.0/8", "192.0.2.7", "fd00::/8"], True),
    ("gateway.trusted_proxies", ["10.0.0.0/33"], False),
    ("gateway.trusted_proxies", ["10.0.0.1/8"], False),  # host bits set: the network or the host?
    ("gateway.trusted_proxies", ["ingress.local"], False),
    ("gateway.client_header", "X-Client-Id", True),
    ("gateway.client_header", "X Client", False),
    ("gateway.client_header", "", False),
    ("control.redis_url", "redis://127.0.0.1:1/0", True),
    ("control.redis_url", "redis://:pw-of-redis@127.0.0.1:abc/0", False),  # crashed the gateway
    ("control.redis_url", "http://127.0.0.1:6379", False),
    ("control.redis_url", "127.0.0.1:6379", False),
    ("control.ladr_theta", 0.9, True),
    ("control.ladr_theta", 1.0, False),
    ("store.dsn", "postgresql://app:pw@127.0.0.1:1/db", True),
    ("store.dsn", "host=127.0.0.1 port=1 dbname=x", True),
    ("store.dsn", "notadsn", False),
    ("store.dsn", "host=h password='unterminated", False),
    ("otel.endpoint", "http://127.0.0.1:1/v1/traces", True),
    ("otel.endpoint", "collector:4318", False),
    ("otel.metrics_endpoint", "ftp://collector/v1/metrics", False),
    ("control.urls", ["http://127.0.0.1:8100"], True),
    ("control.urls", ["127.0.0.1:8100"], False),
    ("metrics.allowed_pools", ["default", "canary"], True),
    ("metrics.allowed_pools", ["x" * 257], False),
    ("worker.model", "m" * 300, False),
    ("worker.pool", "", False),
    ("gpu.node", "", True),
    ("gpu.node", "n" * 300, False),
    ("control.token", GOOD_TOKEN, True),
    ("control.token", "", True),  # empty keeps its documented meaning: writes refused
    ("control.token", "x", False),
    ("control.token", "fifteen-chars!!", False),
    ("control.token", "a token with spaces in it", False),
    ("receiver.token", "tab\tseparated-token-value", False),
    ("worker.admin_token", "qzv7-adm", False),
    ("forecast.receiver_token", "é" * 20, False),
]


@pytest.mark.parametrize(("key", "value", "accepted"), CASES,
                         ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(CASES)])
def test_config_check_refuses_exactly_what_the_component_refuses(
        tmp_path: Path, key: str, value: Any, accepted: bool) -> None:
    path = tmp_path / "llmsla.toml"
    path.write_text(_toml(key, value))
    out = llmsla("--config", str(path), "config", "check")
    try:
        cfg = config_mod.load(path, env={})
        _start(cfg, key, tmp_path)
        runtime_error = None
    except ConfigError as exc:
        runtime_error = str(exc)
    if accepted:
        assert out.returncode == 0, out.stderr
        assert runtime_error is None, runtime_error
        return
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert runtime_error is not None, f"{key} = {value!r} started"
    assert lines[0] == f"llmsla: error: {runtime_error}"
    assert f"{path}: {key}: " in lines[0]
    if "token" in key or "pw" in str(value):  # a refused secret is named, never shown
        secret = value if "token" in key else "pw-of-redis"
        assert repr(secret) not in out.stderr and (len(secret) < 4 or secret not in out.stderr), out.stderr


def test_the_component_itself_refuses_what_config_check_refuses(tmp_path: Path) -> None:
    """A Config built in code (not through load) meets the same declared checks at the
    gateway's and the store's own start-up."""
    from llmsla.replicas import replicas_from_config
    from llmsla.store import open_store
    from llmsla.store.connection import StoreError

    cfg = config_mod.Config()
    cfg.gateway.upstreams = ["http://127.0.0.1:9"]
    cfg.gateway.pools = ["canary=notaurl"]
    with pytest.raises(ConfigError, match=r"gateway\.pools: \[0\] 'canary=notaurl': after 'canary=': must start with http://"):
        replicas_from_config(cfg)
    cfg.store.dsn = "notadsn"
    with pytest.raises(StoreError, match=r"store\.dsn: malformed DSN: missing \"=\" after \"notadsn\""):
        open_store(cfg, migrate=False)


def test_arm_pool_without_replicas_is_refused_by_config_check(tmp_path: Path) -> None:
    """A cross-key start-up check of the gateway (an A/B arm's pool must have replicas here):
    config check runs it too."""
    path = tmp_path / "llmsla.toml"
    path.write_text('[ab.experiments.exp]\npool = "default"\n[ab.experiments.exp.arms.a]\n'
                    '[ab.experiments.exp.arms.b]\npool = "nowhere"\n')
    out = llmsla("--config", str(path), "config", "check")
    assert out.returncode == 2 and "ab.experiments.exp.arms.b.pool: pool 'nowhere' has no replicas here" in out.stderr
    path.write_text(path.read_text() + '[gateway]\npools = ["nowhere=http://127.0.0.1:9002"]\n')
    out = llmsla("--config", str(path), "config", "check")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("var", "hint"), [
    ("LLMSLA_GATWAY_PORT", "did you mean LLMSLA_GATEWAY_PORT?"),
    ("LLMSLA_CONTRL_TOKEN", "did you mean LLMSLA_CONTROL_TOKEN?"),
    ("LLMSLA_DATADIR", "did you mean LLMSLA_DATA_DIR?"),
    ("LLMSLA_GATEWAY_PROT", "did you mean 'gateway.port'?"),
])
def test_env_typo_is_an_error_with_a_suggestion(var: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=rf"^environment variable {var}: .*{hint}"):
        config_mod.load(env={var: "9000"})
    out = llmsla("config", "check", env={var: "9000"})
    assert out.returncode == 2 and hint in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_env_names_that_are_not_keys_stay_allowed() -> None:
    env = {"LLMSLA_DATA_DIR": "/data", "LLMSLA_TEST_DSN": "postgresql://h/db", "LLMSLA_FLINK_CLUSTER": "/x",
           "LLMSLA_GRAFANA_DB_PASSWORD": "pw", "LLMSLA_DSN": "postgresql://h/db", "PATH": "/bin"}
    assert config_mod.load(env=env).store.dsn == "postgresql://h/db"


def test_every_llmsla_name_the_project_uses_is_a_key_or_allowed() -> None:
    """The allow-list is complete: each LLMSLA_* name the code and manifests set or read (a
    string literal in Python, an env entry in YAML) is a key, an alias or an allowed non-key."""
    root = Path(__file__).resolve().parent.parent
    used: dict[str, str] = {}
    for sub in ("llmsla", "exporters", "control", "alerting", "forecaster", "fleet", "worker", "streaming",
                "dashboards", "deploy", "scripts", "bench"):
        for p in (root / sub).rglob("*"):
            if p.suffix == ".py":
                found = re.findall(r"[\"'](LLMSLA_[A-Z0-9_]*[A-Z0-9])[\"']", p.read_text())
            elif p.suffix in (".yaml", ".yml"):
                found = re.findall(r"(?:name:\s*|-\s+)(LLMSLA_[A-Z0-9_]*[A-Z0-9])\b", p.read_text())
            else:
                continue
            for name in found:
                used.setdefault(name, str(p.relative_to(root)))
    sql_functions = {"LLMSLA_HIST", "LLMSLA_HIST_SUM", "LLMSLA_HIST_QUANTILE", "LLMSLA_BASE64",
                     "LLMSLA_NATIVE_HIST_DELTA"}  # streaming/sql.py
    assert "LLMSLA_DATA_DIR" in used and "LLMSLA_GATEWAY_DISCOVERY" in used  # the scan sees both kinds
    known = set(config_mod.env_names())
    unknown = {n: where for n, where in used.items()
               if n not in known and n not in sql_functions and not n.startswith(config_mod.ENV_NOT_KEY_PREFIXES)}
    assert unknown == {}


def test_config_paths_that_are_not_files_are_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.toml"
    loop.symlink_to(loop)
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b'[gateway]\npool = "caf\xe9"\n')
    cases = {
        str(tmp_path): "is a directory, not a config file (give the TOML file in it)",
        str(fifo): "not a regular file (a FIFO, socket or device); give a TOML file",
        "/proc/self/mem": "cannot read the config file: Input/output error",  # unreadable, even for root
        str(loop): "cannot read the config file: Too many levels of symbolic links",
        str(latin1): "not UTF-8 text (byte 0xe9 on line 2); TOML files are UTF-8",
        str(tmp_path / "missing.toml"): "config file not found",
    }
    for path, message in cases.items():
        start = time.monotonic()
        out = llmsla("--config", path, "config", "check")
        assert time.monotonic() - start < 60  # a FIFO is never opened: no wait for a writer
        assert out.returncode == 2, (path, out.stderr)
        assert out.stderr == f"llmsla: error: {path}: {message}\n", out.stderr
    with pytest.raises(ConfigError, match="not a regular file"):
        config_mod.load(fifo, env={})


def _load_time(tmp_path: Path, n: int) -> float:
    path = tmp_path / f"big-{n}.toml"
    path.write_text(f'[gateway]\nupstreams = ["http://127.0.0.1:9/{"a" * n}"]\n[stream]\nkafka_bootstrap = "{"b" * n}"\n')
    start = time.perf_counter()
    cfg = config_mod.load(path, env={})
    config_mod.secrets(cfg)  # what the CLI computes for its log scrubber
    config_mod.shown(cfg)  # what `config show` prints
    return time.perf_counter() - start


def test_loading_is_linear_in_a_value_length(tmp_path: Path) -> None:
    """A regex in the redaction retried at every letter: 100,000 characters took 14 s, 1 MB did
    not finish in 120 s. Generous bounds (a shared, noisy machine): 1 MB under 5 s, and 10x the
    length costs well under 20x the time."""
    _load_time(tmp_path, 1000)  # warm-up: imports, first-call costs
    small = min(_load_time(tmp_path, 100_000) for _ in range(3))
    big = min(_load_time(tmp_path, 1_000_000) for _ in range(3))
    assert big < 5.0, big
    assert big / max(small, 1e-3) < 20, (small, big)


def test_redaction_units_stay_linear_and_exact() -> None:
    text = "x" * 1_000_000 + "://" + "postgresql://u:pw-1@h/db"
    start = time.perf_counter()
    assert redact(text).endswith("postgresql://u:***@h/db")
    assert secrets_of("a" * 1_000_000) == set()
    assert time.perf_counter() - start < 5.0
    assert redact("1a://u:pw-2@h and redis://:pw-3@r:6379") == "1a://u:***@h and redis://:***@r:6379"


def test_short_secret_never_masks_characters_of_other_text() -> None:
    """Masking a one-character token turned every occurrence of that character into ***; a token
    is now refused below 16 characters, and scrub leaves anything shorter than 4 alone."""
    message = "cannot reach http://127.0.0.1:8100: connection refused"
    assert scrub(message, {"e", "1", "ab"}) == message
    assert scrub(f"token {GOOD_TOKEN} rejected", {GOOD_TOKEN}) == f"token {MASK} rejected"
    with pytest.raises(ConfigError, match=r"control\.token: too short: 1 characters, at least 16"):
        config_mod.load(env={"LLMSLA_CONTROL_TOKEN": "e"})
