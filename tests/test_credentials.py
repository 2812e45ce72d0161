"""No credential in any output: malformed and unreachable DSNs, URLs of every configured
service, log lines, tracebacks. Each case runs the real CLI in a subprocess and searches
stdout and stderr for the secret (as written and percent-decoded)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from llmsla import config as config_mod
from llmsla.redaction import ScrubFilter, redact, scrub, secrets_of
from tests.test_cli import llmsla

PASSWORDS = {
    "postgresql://app:s3cr%zzet@127.0.0.1:1/db": "s3cr%zzet",  # not a percent escape
    "postgresql://app:s3cr et@127.0.0.1:1/db": "s3cr et",  # a space
    "postgresql://app:p@ss/w0rd@127.0.0.1:1/db": "p@ss/w0rd",  # unencoded @ and /
    "host=127.0.0.1 port=1 user=app password='s3cr et": "s3cr et",  # unterminated quote
    "host=127.0.0.1 port=1 user=app password=hunter22": "hunter22",  # well formed, unreachable
    "postgresql://app:hunter%2022@127.0.0.1:1/db": "hunter 22",  # the decoded form leaks too
}


def _assert_clean(out: subprocess.CompletedProcess, secret: str) -> None:
    text = out.stdout + out.stderr
    for form in {secret, secret.replace(" ", "%20")}:
        assert form not in text, text
    assert "Traceback" not in text, text


@pytest.mark.parametrize("dsn", list(PASSWORDS))
@pytest.mark.parametrize("command", [("store", "status"), ("migrate",), ("doctor",)])
def test_malformed_or_unreachable_dsn_is_one_line_naming_the_key(dsn: str, command: tuple[str, ...]) -> None:
    out = llmsla("--dsn", dsn, *command, env={"LLMSLA_STORE_CONNECT_TIMEOUT_S": "0.5"})
    _assert_clean(out, PASSWORDS[dsn])
    assert out.returncode != 0
    if config_mod.dsn_problem(dsn) is not None:  # refused where --dsn is set, before any command runs
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert lines[0].startswith("llmsla: error: --dsn: store.dsn: malformed DSN: "), out.stderr
    elif command != ("doctor",):  # doctor prints its table; the row names the key
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("llmsla: error: store.dsn (from --dsn):"), out.stderr
    else:
        assert "store.dsn (from --dsn)" in out.stdout.replace("\n", " ") or "store.dsn" in out.stdout


def test_dsn_from_environment_names_the_variable() -> None:
    out = llmsla("migrate", env={"LLMSLA_DSN": "postgresql://app:s3cr%zzet@127.0.0.1:1/db"})
    _assert_clean(out, "s3cr%zzet")
    assert "environment variable LLMSLA_DSN: store.dsn: malformed DSN" in out.stderr


def test_config_show_masks_every_credential_whatever_the_key(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(
        '[control]\nredis_url = "redis://:redis-pw-1@127.0.0.1:6379/0"\ntoken = "tok-en-1-masked-everywhere"\n'
        '[otel]\nendpoint = "https://otel:otel-pw-2@collector:4318/v1/traces"\n'
        '[gateway]\nupstreams = ["http://u:up-pw-3@10.0.0.1:9001", "http://10.0.0.2:9001"]\n'
    )
    out = llmsla("--config", str(toml), "config", "show",
                 env={"LLMSLA_DSN": "postgresql://app:pg-pw-4@db/x?sslpassword=ssl-pw-5"})
    assert out.returncode == 0, out.stderr
    for secret in ("redis-pw-1", "tok-en-1-masked-everywhere", "otel-pw-2", "up-pw-3", "pg-pw-4", "ssl-pw-5"):
        assert secret not in out.stdout
    assert 'redis_url = "redis://:***@127.0.0.1:6379/0"' in out.stdout
    assert 'token = "***"' in out.stdout
    assert '"http://u:***@10.0.0.1:9001", "http://10.0.0.2:9001"' in out.stdout


def test_config_show_into_a_closed_pipe_is_quiet() -> None:
    proc = subprocess.run(f"{sys.executable} -m llmsla config show | head -1", shell=True,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[store]"
    assert proc.stderr == "", proc.stderr


def test_log_lines_and_tracebacks_are_scrubbed(capfd: pytest.CaptureFixture[str]) -> None:
    cfg = config_mod.load(env={"LLMSLA_DSN": "postgresql://app:pg-pw-4@db/x", "LLMSLA_CONTROL_TOKEN": "tok-en-1-masked-everywhere"})
    secrets = config_mod.secrets(cfg)
    assert {"pg-pw-4", "tok-en-1-masked-everywhere"} <= secrets
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ScrubFilter(secrets))
    logger = logging.getLogger("llmsla.test.scrub")
    logger.addHandler(handler)
    try:
        logger.warning("cannot reach %s with %s", cfg.store.dsn, cfg.control.token)
        try:
            raise RuntimeError(f"driver said: password pg-pw-4 rejected for {cfg.store.dsn}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    err = capfd.readouterr().err
    assert "pg-pw-4" not in err and "tok-en-1-masked-everywhere" not in err
    assert "cannot reach postgresql://app:***@db/x with ***" in err
    assert "RuntimeError: driver said: password *** rejected" in err


def test_redact_and_scrub_units() -> None:
    for dsn, secret in PASSWORDS.items():
        assert secret not in redact(dsn)
        assert scrub(f"error near {secret!r}", secrets_of(dsn)) == "error near '***'"


def test_bind_addresses_and_ports_are_validated(tmp_path: Path) -> None:
    cases = {
        '[gateway]\nhost = ""\n': "gateway.host: empty listen address",
        '[control]\nhost = ""\n': "control.host: empty listen address",
        '[gateway]\nport = 99999\n': "gateway.port: port must be 1..65535, got 99999",
        '[control]\nport = 0\n': "control.port: port must be 1..65535, got 0",
        '[worker]\nhost = "not a host"\n': "worker.host: 'not a host' is neither an IP address nor a host name",
    }
    for text, message in cases.items():
        toml = tmp_path / "c.toml"
        toml.write_text(text)
        out = llmsla("--config", str(toml), "config", "check")
        assert out.returncode == 2 and message in out.stderr, (text, out.stderr)
    out = llmsla("config", "check", env={"LLMSLA_GATEWAY_HOST": "::1", "LLMSLA_CONTROL_HOST": "gw-1.example"})
    assert out.returncode == 0, out.stderr
    for args, message in (
        (("gateway", "--host", "", "--upstream", "http://127.0.0.1:9"), "--host: empty listen address"),
        (("gateway", "--port", "99999", "--upstream", "http://127.0.0.1:9"), "--port: port must be 0..65535"),
        (("worker", "--host", "a b"), "--host: 'a b' is neither"),
        (("control", "serve", "--port", "70000", "--upstream", "http://127.0.0.1:9"), "--port: port must be"),
        (("gpu", "--host", ""), "--host: empty listen address"),
    ):
        out = llmsla(*args)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
