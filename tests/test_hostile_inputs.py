"""Issue 39's hostile-input catalogue: every probe class, run against the real ``llmsla``
processes, each row asserting the promised behaviour precisely.

One stack per module, each component the command an operator runs (``llmsla worker``,
``llmsla gateway`` in front of it, ``llmsla control serve``, ``llmsla receiver``), on loopback,
audited to one migrated database, with an upstream password and every token configured. Every
answer any of them gives is checked for those secrets as it arrives; their logs are checked at
the end. Other rows run the CLI as a subprocess.

Probe classes, by item of issue 39. Three items have files of their own, each against the real
processes too: 4, junk model names flooding the store (``tests/streaming/test_label_admission.py``:
3,000 names through gateway, worker and stream job are one ``other`` series); 6, one client
holding every in-flight slot (``tests/exporters/test_gateway_client_share.py``); 8, every bad
command-line value as the user types it (``tests/test_cli_args.py``). The rest are here:

1. Input that is not text or not decodable, at EVERY server (gateway, worker, control API,
   receiver; the worker's admin endpoint for the bearer row): a lone surrogate in a prompt or a
   chat message (gateway before a real worker, and the worker directly: 400 with a reason, the
   replica not charged an ``error``); a ``Content-Encoding`` that does not match the body or that
   no server here decodes (gzip/deflate on plain bytes: 400 ``invalid_encoding``; br without
   its library, compress, a typo, a list: 415 ``unsupported_encoding``); JSON nested past the
   decoder (400); a bearer token with a non-UTF-8 byte (401).
2. Secrets: an upstream URL's password absent from every process's output and every answer
   (``/v1/state``, ``/v1/audit``, ``/metrics``, errors), shown masked where the URL is shown; a
   config type error (a DSN as a list, a token as a number) names the type, not the value, in
   ``config check`` and in the server that reads the key; ``config show``, ``config check`` and
   ``doctor`` print no DSN password, token, Redis password, OTLP password or OTLP header; a
   token shorter than 16 characters stops the server that reads it, in one line.
3. Spool: ``llmsla spool recover`` never overwrites a published segment. (A full or read-only
   spool at start-up for every writer, and a full disk while serving counted in
   ``llmsla_spool_dropped_total{kind,reason}``, are ``tests/test_spool_disk.py`` on tmpfs: a
   tmpfs cannot be remounted read-only under a writer's open segment.)
5. Audit: a change whose ``reason`` holds a NUL or whose ``X-Actor`` is not text is a 400 and
   nothing is applied (no change without its ``action_log`` row); weight 0 on the last serving
   replica is a 409 with its ``refused`` row in the store; the receiver audits an action on an
   unknown replica once, as permanent, and never retries it.
7. Config: the servers refuse at start-up exactly what ``config check`` refuses (same one line:
   a 300-character pool, a malformed ``control.redis_url``, ``notaurl``/``ftp://`` upstreams,
   ``dsn = notadsn``, a token with whitespace); a typo'd ``LLMSLA_*`` name stops a server with a
   did-you-mean; a 1 MB value costs ``config show`` well under a second; a config path (through
   ``$LLMSLA_CONFIG``, to a server) that is a directory, a FIFO, unreadable or not UTF-8 is one
   line, no traceback, no hang. (``config check`` on each of these is
   ``tests/test_config_parity.py``.)
9. A command that starts the embedded PostgreSQL stops it when it exits, on success and when it
   fails after starting it.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp.compression_utils import HAS_BROTLI

from llmsla import names, spool
from llmsla.redaction import MASK
from tests.alerting.harness import alert, migrated, note
from tests.conftest import fresh_database
from tests.test_cli import llmsla
from tests.test_config_parity import _toml
from tests.test_spool_disk import send, stop
from tests.test_spool_disk import start_gateway as start_gateway_process
from tests.test_store_lifecycle import llmsla as llmsla_on_data_dir
from tests.test_store_lifecycle import postmasters
from tests.test_store_lifecycle import wait_gone as wait_no_postmaster

ROOT = Path(__file__).resolve().parents[1]

UPSTREAM_PASSWORD = "s3cret-pass-h39-upstream"
CONTROL_TOKEN = "control-token-h39-hostile"
RECEIVER_TOKEN = "receiver-token-h39-hostile"
ADMIN_TOKEN = "worker-admin-token-h39-hostile"
SECRETS = (UPSTREAM_PASSWORD, CONTROL_TOKEN, RECEIVER_TOKEN, ADMIN_TOKEN)


def assert_no_secret(text: str | bytes, where: str, secrets: tuple[str, ...] = SECRETS) -> None:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    for secret in secrets:
        assert secret not in text and urllib.parse.quote(secret) not in text, f"{secret!r} in {where}:\n{text[:2000]}"


def clean_env(**llmsla_vars: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSLA_")}
    env.update(llmsla_vars)
    return env


# -- the stack ----------------------------------------------------------------------------------
class Proc:
    """One ``llmsla`` command, its stdout and stderr in one log file read at any time."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.log = name, log_dir / f"{name}.log"
        with open(self.log, "wb") as out:
            self.popen = subprocess.Popen([sys.executable, "-m", "llmsla", *args], env=env, cwd=ROOT,
                                          stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float = 120) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if m := re.search(pattern, self.output()):
                return m
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        pytest.fail(f"llmsla {self.name} (exit {self.popen.poll()}) never printed {pattern!r}:\n{self.output()}")

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode


@dataclass
class Answer:
    status: int
    head: bytes
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> dict[str, Any]:
        return self.json()["error"]


@dataclass
class Stack:
    worker: str
    admin: str
    gateway: str
    control: str
    receiver: str
    dsn: str
    spool_dir: Path
    procs: dict[str, Proc]
    answers: list[bytes] = field(default_factory=list)

    def request(self, base: str, path: str, body: bytes = b"", *, method: str = "POST",
                headers: dict[str, str | bytes] | None = None) -> Answer:
        """One request over a raw socket (a client library would normalise what we send), the
        answer read to EOF and checked for every secret at once."""
        url = urllib.parse.urlsplit(base)
        head = f"{method} {path} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n".encode()
        if method == "POST":
            head += b"Content-Length: %d\r\n" % len(body)
        for k, v in (headers or {}).items():
            head += k.encode() + b": " + (v if isinstance(v, bytes) else v.encode()) + b"\r\n"
        with socket.create_connection((url.hostname, url.port), timeout=30) as s:
            s.sendall(head + b"\r\n" + body)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        assert_no_secret(data, f"{method} {base}{path}")
        self.answers.append(data)
        raw_head, _, payload = data.partition(b"\r\n\r\n")
        return Answer(int(raw_head.split(b" ", 2)[1]), raw_head, payload)

    def get(self, base: str, path: str) -> Answer:
        return self.request(base, path, method="GET")

    def rows(self, where: str) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn) as conn:
            cur = conn.execute(f"SELECT action, target, outcome, reason, actor, params, source "
                               f"FROM {names.T_ACTION_LOG} WHERE {where} ORDER BY id")
            cols = [d.name for d in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def wait_rows(self, where: str, n: int, timeout_s: float = 15) -> list[dict[str, Any]]:
        """The rows matching ``where`` once there are ``n`` (audit rows are written behind the answer)."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.rows(where)
            if len(rows) >= n or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)


@pytest.fixture(scope="module")
def stack(pg_server_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("hostile")
    admin_port = _free_port()
    with fresh_database(pg_server_dsn) as dsn:
        migrated(dsn)
        env = clean_env(LLMSLA_DSN=dsn, LLMSLA_SPOOL_DIR=str(tmp / "spool"), LLMSLA_SPOOL_SEGMENT_MAX_AGE_S="0.2",
                        LLMSLA_CONTROL_TOKEN=CONTROL_TOKEN, LLMSLA_RECEIVER_TOKEN=RECEIVER_TOKEN,
                        LLMSLA_WORKER_ADMIN_TOKEN=ADMIN_TOKEN, LLMSLA_RECEIVER_TICK_S="0.1")
        procs: dict[str, Proc] = {}
        try:
            procs["worker"] = Proc("worker", ["worker", "--port", "0", "--admin-port", str(admin_port)], env, tmp)
            worker = procs["worker"].wait_for(r"serving \S+ at (http://\S+)").group(1)
            secret_url = worker.replace("http://", f"http://ops:{UPSTREAM_PASSWORD}@")
            procs["gateway"] = Proc("gateway", ["gateway", "--port", "0", "--upstream", secret_url], env, tmp)
            # two replicas, both the worker (healthy): r0 named with the password
            procs["control"] = Proc("control", ["control", "serve", "--port", "0", "--upstream", secret_url,
                                                "--upstream", worker], env, tmp)
            gateway = procs["gateway"].wait_for(r"listening on (http://\S+)").group(1)
            control = procs["control"].wait_for(r"control API on (http://\S+)").group(1)
            procs["receiver"] = Proc("receiver", ["receiver", "--port", "0", "--control-url", control], env, tmp)
            receiver = procs["receiver"].wait_for(r"receiver on (http://\S+)/v1/alerts").group(1)
            yield Stack(worker, f"http://127.0.0.1:{admin_port}", gateway, control, receiver, dsn, tmp / "spool",
                        procs)
        finally:
            for p in reversed(procs.values()):
                p.stop()


def _free_port() -> int:
    from llmsla.services import free_port

    return free_port()


# -- item 1: bytes that are not text, bodies that do not decode, at every server ------------------
#: (server, path, a body the endpoint accepts, auth headers): every llmsla server's JSON write
SERVERS = {
    "gateway": ("gateway", "/v1/completions", b'{"model": "llmsla-tiny", "prompt": "hi", "max_tokens": 1}', {}),
    "worker": ("worker", "/v1/completions", b'{"model": "llmsla-tiny", "prompt": "hi", "max_tokens": 1}', {}),
    "control": ("control", "/v1/replicas/r1/weight", b'{"weight": 1.0}', {"Authorization": f"Bearer {CONTROL_TOKEN}"}),
    "receiver": ("receiver", "/v1/alerts", json.dumps(note(alert("firing", replica="r1"))).encode(),
                 {"Authorization": f"Bearer {RECEIVER_TOKEN}"}),
}

#: (Content-Encoding, body transform, status, error code): what every server answers
ENCODINGS = [
    ("gzip", None, 400, "invalid_encoding"),  # says gzip, is not: was a 500 with a traceback
    ("deflate", None, 400, "invalid_encoding"),
    ("br", None, 400 if HAS_BROTLI else 415, "invalid_encoding" if HAS_BROTLI else "unsupported_encoding"),
    ("compress", None, 415, "unsupported_encoding"),  # known to nobody here: reached handlers undecoded
    ("gzpi", None, 415, "unsupported_encoding"),
    ("gzip, br", gzip.compress, 415, "unsupported_encoding"),
    ("identity, gzip", None, 415, "unsupported_encoding"),
]


@pytest.mark.parametrize(("encoding", "transform", "status", "code"), ENCODINGS, ids=[e[0] for e in ENCODINGS])
@pytest.mark.parametrize("server", sorted(SERVERS))
def test_content_encoding_the_body_does_not_match_is_a_4xx_with_a_reason(
        stack: Stack, server: str, encoding: str, transform: Any, status: int, code: str) -> None:
    attr, path, body, auth = SERVERS[server]
    base = getattr(stack, attr)
    got = stack.request(base, path, transform(body) if transform else body,
                        headers={"Content-Type": "application/json", "Content-Encoding": encoding, **auth})
    assert got.status == status, (server, encoding, got.body[:300])
    err = got.error()
    assert err["code"] == code and repr(encoding) in err["message"], err
    assert stack.get(base, "/metrics").status == 200  # still serving


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_json_nested_past_the_decoder_is_a_400(stack: Stack, server: str) -> None:
    attr, path, _, auth = SERVERS[server]
    got = stack.request(getattr(stack, attr), path, b"[" * 50_000,  # under every body limit
                        headers={"Content-Type": "application/json", **auth})
    assert got.status == 400, (server, got.body[:300])
    assert got.error()["message"].endswith("body is not valid JSON: nested too deeply"), got.body[:300]


#: (server, path, body): every endpoint that takes a bearer token
BEARERS = {
    "control": ("control", "/v1/replicas/r1/weight", b'{"weight": 0.5}', CONTROL_TOKEN),
    "receiver": ("receiver", "/v1/alerts", json.dumps(note(alert("firing", replica="r1"))).encode(), RECEIVER_TOKEN),
    "worker-admin": ("admin", "/admin/fault", b'{"slowdown": 2}', ADMIN_TOKEN),
}


@pytest.mark.parametrize("server", sorted(BEARERS))
def test_bearer_token_with_a_non_utf8_byte_is_a_401(stack: Stack, server: str) -> None:
    attr, path, body, token = BEARERS[server]
    got = stack.request(getattr(stack, attr), path, body, headers={  # the right token, one byte more
        "Content-Type": "application/json", "Authorization": b"Bearer " + token.encode() + b"\xff"})
    assert got.status == 401, (server, got.body[:300])
    assert got.error()["message"] == "invalid bearer token" and b"WWW-Authenticate: Bearer" in got.head


SURROGATES = {
    "completions": ("/v1/completions", {"model": "llmsla-tiny", "prompt": "hi \ud800", "max_tokens": 2},
                    "body.prompt: contains a lone surrogate U+D800 at character 3"),
    "chat": ("/v1/chat/completions", {"model": "llmsla-tiny", "max_tokens": 2,
                                      "messages": [{"role": "user", "content": "x\udfff"}]},
             "body.messages[0].content: contains a lone surrogate U+DFFF at character 1"),
}


def _error_requests(metrics: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
            if line.startswith(names.REQUESTS + "_total{") and f'status="{names.STATUS_ERROR}"' in line
            and float(line.rsplit(" ", 1)[1]) > 0}


@pytest.mark.parametrize("endpoint", sorted(SURROGATES))
@pytest.mark.parametrize("server", ["gateway", "worker"])
def test_lone_surrogate_is_a_400_and_never_charged_to_the_replica(stack: Stack, server: str, endpoint: str) -> None:
    path, body, reason = SURROGATES[endpoint]
    base = getattr(stack, server)
    raw = json.dumps(body).encode()  # \ud800 escaped, as a hostile client sends it
    assert b"\\ud800" in raw or b"\\udfff" in raw
    got = stack.request(base, path, raw, headers={"Content-Type": "application/json"})
    assert got.status == 400, got.body[:300]
    assert reason in got.error()["message"], got.error()
    metrics = stack.get(stack.gateway, "/metrics").body.decode()  # the replica is not charged an error
    assert names.REQUESTS + "_total" in metrics and _error_requests(metrics) == {}, _error_requests(metrics)
    worker_metrics = stack.get(stack.worker, "/metrics").body.decode()
    assert f'status="{names.STATUS_ERROR}"' not in worker_metrics
    good = stack.request(base, path, json.dumps({**body, "prompt": "hi"} if "prompt" in body else
                                                {**body, "messages": [{"role": "user", "content": "x"}]}).encode(),
                         headers={"Content-Type": "application/json"})
    assert good.status == 200, good.body[:300]


def test_no_error_event_reaches_the_spool(stack: Stack) -> None:
    """Lone surrogates to the gateway leave no ``error`` event in the spool, next to a good request."""
    for path, body, _ in SURROGATES.values():
        assert stack.request(stack.gateway, path, json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"}).status == 400
    good = stack.request(stack.gateway, "/v1/completions", SERVERS["gateway"][2],
                         headers={"Content-Type": "application/json"})
    assert good.status == 200, good.body[:300]
    time.sleep(0.8)  # segments publish after spool.segment_max_age_s
    events = [e for p in spool.published_segments(stack.spool_dir, names.SPOOL_REQUESTS)
              for e in spool.read_segment(p, names.SPOOL_REQUESTS)]
    assert events, "the good requests of the surrogate rows are spooled"
    assert [e for e in events if getattr(e, "status", None) == names.STATUS_ERROR] == []


# -- item 5: audit ------------------------------------------------------------------------------
def _weight(stack: Stack, rid: str) -> float:
    state = stack.get(stack.control, "/v1/state").json()
    return {r["id"]: r["weight"] for r in state["router"]["pools"]["default"]}[rid]


CONTROL_AUTH = {"Authorization": f"Bearer {CONTROL_TOKEN}", "Content-Type": "application/json"}


@pytest.mark.parametrize(("body", "headers", "reason"), [
    (b'{"weight": 0.37, "reason": "a\\u0000b"}', {}, "reason: contains NUL"),
    (b'{"weight": 0.37}', {"X-Actor": b"ops-\xff"}, "X-Actor: contains a lone surrogate"),
    (b'{"weight": 0.37, "actor": "ops-\\udc80"}', {}, "body.actor: contains a lone surrogate"),
], ids=["nul-in-reason", "x-actor-not-utf8", "actor-lone-surrogate"])
def test_a_change_that_cannot_be_audited_is_refused_and_not_applied(
        stack: Stack, body: bytes, headers: dict[str, bytes], reason: str) -> None:
    try:
        got = stack.request(stack.control, "/v1/replicas/r1/weight", body, headers={**CONTROL_AUTH, **headers})
        assert got.status == 400, got.body[:300]
        assert reason in got.error()["message"], got.error()
        assert _weight(stack, "r1") == 1.0  # nothing applied ...
    finally:  # ... so nothing to audit: a valid change right after is audited, the refused one is not
        ok = stack.request(stack.control, "/v1/replicas/r1/weight",
                           b'{"weight": 1.0, "actor": "h39", "reason": "probe"}', headers=CONTROL_AUTH)
    assert ok.status == 200, ok.body[:300]
    rows = stack.wait_rows("source = 'control_api' AND actor = 'h39'", 1)
    assert rows and rows[-1]["outcome"] == "applied"
    assert not stack.rows("source = 'control_api' AND params->>'after' = '0.37'")


def _weight_zero_on_the_last(stack: Stack, actor: str) -> list[dict[str, Any]]:
    """r0 to weight 0 (r1 still serves), then r1 to 0: refused; r0 restored. The audit rows."""
    def weight(rid: str, w: float) -> Answer:
        return stack.request(stack.control, f"/v1/replicas/{rid}/weight",
                             json.dumps({"weight": w, "actor": actor}).encode(), headers=CONTROL_AUTH)

    assert weight("r0", 0).status == 200
    try:
        refused = weight("r1", 0)
        assert refused.status == 409, refused.body[:300]
        assert refused.error()["code"] == "conflict", refused.error()
        assert refused.error()["message"].startswith(
            "refusing weight 0 for 'r1': it is the last serving (non-drained, weight > 0) replica of pool 'default'")
        assert _weight(stack, "r1") == 1.0
    finally:
        assert weight("r0", 1.0).status == 200
    return stack.wait_rows(f"actor = '{actor}'", 3, timeout_s=3)


def test_weight_zero_on_the_last_serving_replica_is_a_409(stack: Stack) -> None:
    rows = _weight_zero_on_the_last(stack, "h39-w0")
    assert [(r["target"], r["outcome"]) for r in rows if r["outcome"] == "applied"] == [("r0", "applied")] * 2


def test_weight_zero_on_the_last_serving_replica_is_audited_as_refused(stack: Stack) -> None:
    rows = _weight_zero_on_the_last(stack, "h39-w0-audit")
    assert [(r["target"], r["outcome"]) for r in rows] == [("r0", "applied"), ("r1", "refused"), ("r0", "applied")]


def test_receiver_audits_an_unknown_replica_once_and_never_retries(stack: Stack) -> None:
    got = stack.request(stack.receiver, "/v1/alerts", json.dumps(note(alert("firing", replica="ghost-h39"))).encode(),
                        headers={"Authorization": f"Bearer {RECEIVER_TOKEN}", "Content-Type": "application/json"})
    assert got.status == 200, got.body[:300]
    where = "source = 'alert_receiver' AND target LIKE '%ghost-h39' AND outcome IN ('refused', 'failed')"
    stack.wait_rows(where, 1)
    time.sleep(2.0)  # 20 reconciler ticks (receiver.tick_s = 0.1)
    rows = stack.rows(where)
    assert len(rows) == 1, rows  # audited once: no retry, no second row
    assert rows[0]["outcome"] == "refused" and "not retried" in rows[0]["reason"], rows


# -- item 2: secrets in every output --------------------------------------------------------------
@pytest.mark.parametrize(("server", "path"), [
    ("control", "/v1/state"), ("control", "/v1/audit?n=100"), ("control", "/metrics"),
    ("gateway", "/metrics"), ("gateway", "/v1/models"), ("receiver", "/v1/state"), ("receiver", "/metrics"),
    ("worker", "/metrics"),
])
def test_no_read_endpoint_shows_a_secret(stack: Stack, server: str, path: str) -> None:
    got = stack.get(getattr(stack, server), path)  # request() fails on any secret in the answer
    assert got.status == 200, got.body[:300]
    if path == "/v1/state" and server == "control":  # the URL is there, masked
        assert f"http://ops:{MASK}@127.0.0.1:" in got.body.decode()


def test_no_process_output_shows_a_secret(stack: Stack) -> None:
    """After the rows above: the logs of every process (refusals, errors included)."""
    for name, proc in stack.procs.items():
        assert_no_secret(proc.output(), f"the output of llmsla {name}")
    assert f"-> http://ops:{MASK}@127.0.0.1:" in stack.procs["gateway"].output()
    assert stack.answers  # and every answer was checked as it came


def test_hostile_bodies_leave_no_traceback_in_any_log(stack: Stack) -> None:
    for encoding in ("gzip", "deflate"):  # the rows above sent these too; again, so this row stands alone
        for attr, path, body, auth in SERVERS.values():
            stack.request(getattr(stack, attr), path, body, headers={"Content-Encoding": encoding, **auth})
    for name, proc in stack.procs.items():
        assert "Traceback" not in proc.output() and " ERROR " not in proc.output(), f"llmsla {name}:\n{proc.output()}"


# -- item 2: secrets in config errors and in what the CLI prints ----------------------------------
@pytest.mark.parametrize("command", [["config", "check"], ["control", "serve", "--port", "0"]],
                         ids=["config-check", "control-serve"])
@pytest.mark.parametrize(("toml", "key", "secret"), [
    ('[store]\ndsn = ["postgresql://u:hunter2-list-dsn@db/x"]\n', "store.dsn", "hunter2-list-dsn"),
    ("[control]\ntoken = 918273645546372819\n", "control.token", "918273645546372819"),
], ids=["dsn-as-list", "token-as-number"])
def test_a_type_error_names_the_type_never_the_value(tmp_path: Path, command: list[str], toml: str, key: str,
                                                      secret: str) -> None:
    path = tmp_path / "llmsla.toml"
    path.write_text(toml)
    out = llmsla("--config", str(path), *command)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"llmsla: error: {path}: {key}: expected a string"), out.stderr
    assert_no_secret(out.stdout + out.stderr, " ".join(command), (secret,))


ALL_SECRETS_TOML = """\
[control]
redis_url = "redis://:redis-pw-h39x@127.0.0.1:1/0"
token = "control-token-h39-in-a-file"
[receiver]
token = "receiver-token-h39-in-a-file"
[worker]
admin_token = "admin-token-h39-in-a-file"
[otel]
endpoint = "https://otel:otlp-pw-h39x@127.0.0.1:1/v1/traces"
[gateway]
upstreams = ["http://u:upstream-pw-h39x@127.0.0.1:9"]
"""
FILE_SECRETS = ("redis-pw-h39x", "control-token-h39-in-a-file", "receiver-token-h39-in-a-file",
                "admin-token-h39-in-a-file", "otlp-pw-h39x", "upstream-pw-h39x", "pg-pw-h39x", "otlp-header-h39x")


@pytest.mark.parametrize("command", [["config", "show"], ["config", "check"], ["doctor"]], ids=" ".join)
def test_config_show_check_and_doctor_print_no_secret(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "llmsla.toml"
    path.write_text(ALL_SECRETS_TOML)
    out = llmsla("--config", str(path), *command, env={
        "LLMSLA_DSN": "postgresql://app:pg-pw-h39x@127.0.0.1:1/db", "LLMSLA_STORE_CONNECT_TIMEOUT_S": "0.5",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer otlp-header-h39x"})
    assert_no_secret(out.stdout + out.stderr, " ".join(command), FILE_SECRETS)
    assert "Traceback" not in out.stderr, out.stderr
    if command == ["config", "show"]:
        assert out.returncode == 0, out.stderr
        assert 'redis_url = "redis://:***@127.0.0.1:1/0"' in out.stdout and 'admin_token = "***"' in out.stdout
        assert "https://otel:***@127.0.0.1:1/v1/traces" in out.stdout and "postgresql://app:***@127.0.0.1:1/db" in out.stdout
    elif command == ["config", "check"]:
        assert out.returncode == 0, out.stderr
    else:
        assert "127.0.0.1:1" in out.stdout  # the store row names where it looked


@pytest.mark.parametrize(("command", "var"), [
    (["control", "serve", "--port", "0", "--upstream", "http://127.0.0.1:9"], "LLMSLA_CONTROL_TOKEN"),
    (["receiver", "--port", "0"], "LLMSLA_RECEIVER_TOKEN"),
    (["worker", "--port", "0"], "LLMSLA_WORKER_ADMIN_TOKEN"),
    (["gateway", "--port", "0", "--upstream", "http://127.0.0.1:9"], "LLMSLA_CONTROL_TOKEN"),
], ids=lambda v: v if isinstance(v, str) else v[0])
def test_a_short_token_stops_the_server_in_one_line(command: list[str], var: str) -> None:
    short = "h39-short-tok"  # 13 characters
    out = llmsla(*command, env={var: short})
    key = var.removeprefix("LLMSLA_").lower().replace("_", ".", 1)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"llmsla: error: environment variable {var}: {key}: too short: 13 characters, at least 16 are required"), out.stderr
    assert_no_secret(out.stdout + out.stderr, " ".join(command), (short,))


# -- item 7: the servers refuse what config check refuses -----------------------------------------
PARITY = [
    ("gateway.pool", "p" * 300, ["gateway", "--port", "0", "--upstream", "http://127.0.0.1:9"]),
    ("control.redis_url", "redis://:pw-of-redis-h39@127.0.0.1:abc/0",
     ["control", "serve", "--port", "0", "--upstream", "http://127.0.0.1:9"]),
    ("gateway.upstreams", ["notaurl"], ["gateway", "--port", "0"]),
    ("gateway.upstreams", ["ftp://127.0.0.1:9001"], ["gateway", "--port", "0"]),
    ("store.dsn", "notadsn", ["migrate"]),
    ("control.token", "a token with spaces in it", ["control", "serve", "--port", "0", "--upstream", "http://127.0.0.1:9"]),
    ("receiver.token", "tab\tseparated-token-value", ["receiver", "--port", "0"]),
]


@pytest.mark.parametrize(("key", "value", "command"), PARITY,
                         ids=["pool-300", "redis-url", "notaurl", "ftp", "notadsn", "token-space", "token-tab"])
def test_the_server_refuses_at_start_what_config_check_refuses(tmp_path: Path, key: str, value: Any,
                                                                command: list[str]) -> None:
    path = tmp_path / "llmsla.toml"
    path.write_text(_toml(key, value))
    check = llmsla("--config", str(path), "config", "check")
    start = llmsla("--config", str(path), *command)
    assert check.returncode == 2 and start.returncode == 2, (check.stderr, start.stdout, start.stderr)
    assert len(check.stderr.strip().splitlines()) == 1 and start.stderr == check.stderr, (check.stderr, start.stderr)
    assert check.stderr.startswith(f"llmsla: error: {path}: {key}: "), check.stderr
    if "token" in key or "pw" in str(value):
        assert_no_secret(start.stdout + start.stderr, " ".join(command),
                         ("pw-of-redis-h39",) if "pw" in str(value) else (value,))


def test_an_env_typo_stops_a_server_with_a_did_you_mean() -> None:
    out = llmsla("gateway", "--port", "0", "--upstream", "http://127.0.0.1:9", env={"LLMSLA_GATWAY_PORT": "9000"})
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmsla: error: environment variable LLMSLA_GATWAY_PORT: ")
    assert "did you mean LLMSLA_GATEWAY_PORT?" in lines[0], lines[0]


def test_a_1mb_value_costs_config_show_well_under_a_second(tmp_path: Path) -> None:
    def show(n: int) -> tuple[float, subprocess.CompletedProcess]:
        path = tmp_path / f"c{n}.toml"
        path.write_text(f'[gateway]\nupstreams = ["http://u:pw-1mb-h39@127.0.0.1:9/{"a" * n}"]\n'
                        f'[stream]\nkafka_bootstrap = "{"b" * n}"\n')
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = llmsla("--config", str(path), "config", "show")
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        # the child's CPU seconds, not the wall clock: on a busy machine (other tests beside
        # this one) the wait for a core can be seconds, and it is not what the value cost
        return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, out

    small_s, _ = show(10)
    big_s, out = show(1_000_000)
    assert out.returncode == 0, out.stderr[-500:]
    assert "pw-1mb-h39" not in out.stdout and f"http://u:{MASK}@127.0.0.1:9/aaa" in out.stdout
    assert big_s - small_s < 1.0, (small_s, big_s)  # the same process, plus the 1 MB value


def _config_paths(tmp_path: Path) -> dict[str, tuple[str, str]]:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b'[gateway]\npool = "caf\xe9"\n')
    return {
        "directory": (str(tmp_path), "is a directory, not a config file (give the TOML file in it)"),
        "fifo": (str(fifo), "not a regular file (a FIFO, socket or device); give a TOML file"),
        # chmod 000 reads fine as root: a file the kernel refuses to read whoever asks
        "unreadable": ("/proc/self/mem", "cannot read the config file: Input/output error"),
        "not-utf8": (str(latin1), "not UTF-8 text (byte 0xe9 on line 2); TOML files are UTF-8"),
    }


@pytest.mark.parametrize("kind", ["directory", "fifo", "unreadable", "not-utf8"])
def test_a_config_path_that_is_not_a_toml_file_stops_a_server_in_one_line(tmp_path: Path, kind: str) -> None:
    path, message = _config_paths(tmp_path)[kind]
    t0 = time.monotonic()
    out = llmsla("gateway", "--port", "0", "--upstream", "http://127.0.0.1:9", env={"LLMSLA_CONFIG": path})
    assert time.monotonic() - t0 < 60  # a FIFO is never opened: no wait for a writer
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr == f"llmsla: error: {path}: {message}\n", out.stderr
    assert out.stdout == ""


# -- item 3: the spool ----------------------------------------------------------------------------
def test_spool_recover_never_overwrites_a_published_segment(tmp_path: Path) -> None:
    from tests.test_spool import make_event

    d = tmp_path / names.SPOOL_REQUESTS
    (d / spool.INPROGRESS).mkdir(parents=True)
    name = "0000000000001-host-7-abcd-000003.jsonl"
    published = "".join(make_event(0, i).to_json() + "\n" for i in range(5))
    (d / name).write_text(published)
    stale = d / spool.INPROGRESS / name
    stale.write_text("".join(make_event(1, i).to_json() + "\n" for i in range(3)))
    os.utime(stale, (time.time() - 120, time.time() - 120))
    out = llmsla("spool", "recover", env={"LLMSLA_SPOOL_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert f"{names.SPOOL_REQUESTS}: published 1 abandoned segments" in out.stdout
    assert (d / name).read_text() == published  # untouched
    assert sorted(p.name for p in spool.published_segments(tmp_path, names.SPOOL_REQUESTS)) == [
        name, "0000000000001-host-7-abcd-000003001.jsonl"]


# -- item 9: whoever starts the embedded PostgreSQL stops it ---------------------------------------
@pytest.fixture(scope="module")
def embedded_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from tests.conftest import pg_temp_root

    root = pg_temp_root("llmsla-test-h39-pg-")
    data = root / "pg"
    out = llmsla_on_data_dir(data, "migrate")  # initdb once for the rows below
    assert out.returncode == 0, out.stderr
    yield data
    with contextlib.suppress(Exception):
        from llmsla.store import embedded

        embedded.stop(data)


@pytest.mark.parametrize(("command", "ran"), [
    (["migrate"], "applied: nothing (up to date)"),
    (["store", "status"], "server: not running (started for this status and stopped again)"),
    (["store", "maintain"], "partitions created:"),
    (["doctor"], "store"),  # its exit status is about the other components
    (["control", "serve", "--port", "0", "--upstream", "http://127.0.0.1:9", "--duration-s", "0.5"], "control API on"),
], ids=lambda c: "-".join(c[:2]) if isinstance(c, list) else None)
def test_a_command_stops_the_embedded_server_it_started(embedded_data_dir: Path, command: list[str], ran: str) -> None:
    assert postmasters(embedded_data_dir) == []
    out = llmsla_on_data_dir(embedded_data_dir, *command)
    assert ran in out.stdout, out.stdout + out.stderr
    assert command == ["doctor"] or out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    wait_no_postmaster(embedded_data_dir, 10)


@pytest.mark.parametrize("command", [["control", "serve", "--upstream", "http://127.0.0.1:9", "--port"],
                                     ["receiver", "--control-url", "http://127.0.0.1:9", "--port"]],
                         ids=["control-serve", "receiver"])
def test_a_command_that_fails_after_starting_it_stops_it_too(embedded_data_dir: Path, command: list[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        out = llmsla_on_data_dir(embedded_data_dir, *command, str(busy.getsockname()[1]))
    # one line, as every failed listen is (httpkit.BindError), never a traceback
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert "cannot listen on 127.0.0.1:" in out.stderr and "address already in use" in out.stderr.lower(), out.stderr
    wait_no_postmaster(embedded_data_dir, 10)  # the store was opened before the bind failed


# -- item 2: what the gateway sends upstream ------------------------------------------------------
class HeadRecorder:
    """A loopback upstream that records each request head it gets and answers one completion."""

    def __init__(self) -> None:
        import threading

        self.heads: list[bytes] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        body = json.dumps({"id": "x", "object": "text_completion", "model": "m", "choices": [
            {"index": 0, "text": "hi", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                self.heads.append(data.partition(b"\r\n\r\n")[0])
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def close(self) -> None:
        self._sock.close()


def test_the_gateway_never_sends_the_upstream_password_in_a_header(tmp_path: Path) -> None:
    from tests.test_spool_disk import _env

    up = HeadRecorder()
    proc, url = start_gateway_process(_env(tmp_path / "spool"),
                                      f"http://ops:{UPSTREAM_PASSWORD}@127.0.0.1:{up.port}")
    try:
        send(url, 1)
    finally:
        out = stop(proc)
        up.close()
    assert up.heads, out
    assert_no_secret(b"\n".join(up.heads), "the request head the upstream got", (UPSTREAM_PASSWORD,))
    # the URL's credentials travel as what they are for: Basic auth, as aiohttp sends them to the
    # same URL for the health probe and /v1/models; Host is host:port
    basic = base64.b64encode(f"ops:{UPSTREAM_PASSWORD}".encode())
    for head in up.heads:
        lines = head.split(b"\r\n")
        assert f"Host: 127.0.0.1:{up.port}".encode() in lines, head
        assert b"Authorization: Basic " + basic in lines, head
