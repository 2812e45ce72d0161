"""Control API over real HTTP on 127.0.0.1: auth, 4xx reasons, state changes, audit in the store."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import aiohttp
import psycopg

from llmsla import config as config_mod
from llmsla import names, services
from llmsla.control import api
from llmsla.control.audit import AuditLog
from llmsla.control.distill import DistillControls
from llmsla.control.router import Replica, Router
from llmsla.store.connection import connect, start_embedded
from llmsla.store.migrate import migrate

TOKEN = "s3cret-token-control-api"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _setup(token: str = TOKEN, dsn: str = "") -> tuple[Router, DistillControls, aiohttp.web.Application]:
    router = Router([Replica("r0", "default", role="teacher"), Replica("r1", "default", role="student"),
                     Replica("b0", "solo")], "ladr")
    distill = DistillControls(router.pools(), max_share_step_pct=20, audit=AuditLog(dsn))
    return router, distill, api.make_app(router, distill, token=token)


async def _serve(app):
    served = await api.start(app, "127.0.0.1", 0)
    return served, served.url


def _run(coro):
    return asyncio.run(coro)


def test_writes_need_the_bearer_token():
    async def main():
        router, distill, app = _setup()
        runner, base = await _serve(app)
        try:
            async with aiohttp.ClientSession() as s:
                url = f"{base}/v1/replicas/r0/weight"
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                                {"Authorization": "Bearer"}, {"Authorization": f"Bearer \t{TOKEN}"},
                                {"Authorization": f"Bearer  {TOKEN}"}):  # compared exactly, never stripped
                    async with s.post(url, json={"weight": 0.5}, headers=headers) as resp:
                        assert resp.status == 401, headers
                        assert resp.headers["WWW-Authenticate"] == "Bearer"
                        assert "token" in (await resp.json())["error"]["message"]
                assert router.replicas()[0].weight == 1.0  # nothing changed
                async with s.post(url, json={"weight": 0.5}, headers=AUTH) as resp:
                    assert resp.status == 200
                async with s.get(f"{base}/v1/state") as resp:  # reads are open (loopback only)
                    assert resp.status == 200
        finally:
            await runner.stop()

    _run(main())


def test_a_bearer_value_that_is_not_utf8_is_a_401():
    """A token byte that is not UTF-8 is a wrong token (401), not a codec error (it was a 400)."""
    async def main():
        router, distill, app = _setup()
        served, _ = await _serve(app)
        try:
            body = b'{"weight": 0.5}'
            r, w = await asyncio.open_connection(served.host, served.port)
            w.write(b"POST /v1/replicas/r0/weight HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    b"Content-Type: application/json\r\nAuthorization: Bearer s3cret-\xfftoken\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            answer = await asyncio.wait_for(r.read(), 10)
            w.close()
            head, _, payload = answer.partition(b"\r\n\r\n")
            assert head.split(b" ", 2)[1] == b"401", answer[:300]
            assert json.loads(payload)["error"]["message"] == "invalid bearer token"
            assert router.replicas()[0].weight == 1.0
        finally:
            await served.stop()

    _run(main())


async def _post_encoded(served, encoding: str, data: bytes) -> tuple[int, dict]:
    """A weight write whose body says ``Content-Encoding: encoding``, by hand (aiohttp's client
    would encode it): (status, JSON answer)."""
    r, w = await asyncio.open_connection(served.host, served.port)
    w.write(b"POST /v1/replicas/r0/weight HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nAuthorization: Bearer " + TOKEN.encode() +
            b"\r\nContent-Encoding: " + encoding.encode() +
            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
    answer = await asyncio.wait_for(r.read(), 10)
    w.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(payload)


def test_a_body_that_does_not_decode_as_its_content_encoding_is_a_400():
    """gzip/deflate bodies decode; one that does not is a 400 with a reason (it was a 500)."""
    import gzip
    import zlib

    async def main():
        router, distill, app = _setup()
        served, _ = await _serve(app)
        answers = []
        try:
            body = b'{"weight": 0.5}'
            for enc, data in (("gzip", body), ("deflate", body), ("gzip", gzip.compress(body)),
                              ("deflate", zlib.compress(body))):
                answers.append(await _post_encoded(served, enc, data))
        finally:
            await served.stop()
        return answers

    answers = _run(main())
    assert [a[0] for a in answers] == [400, 400, 200, 200], answers
    for _status, payload in answers[:2]:
        assert payload["error"]["code"] == "invalid_encoding"
        assert "does not decode as its Content-Encoding" in payload["error"]["message"]


def test_a_content_coding_the_server_does_not_decode_is_a_415():
    """A coding nobody decodes here (``compress``, a typo, a list of codings) would reach the
    handler undecoded, and br/zstd without their libraries got aiohttp's plain-text 400: every
    one is an OpenAI-shaped 415 naming the coding, and the connection's server keeps serving."""
    from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD

    codings = ["compress", "foo", "gzip, br", "x-gzip"] + [c for c, has in (("br", HAS_BROTLI), ("zstd", HAS_ZSTD))
                                                           if not has]

    async def main():
        router, distill, app = _setup()
        served, _ = await _serve(app)
        answers = {}
        try:
            body = b'{"weight": 0.5}'
            for enc in [*codings, "identity"]:
                answers[enc] = await _post_encoded(served, enc, body)
        finally:
            await served.stop()
        return answers

    answers = _run(main())
    assert answers.pop("identity")[0] == 200
    for enc, (status, payload) in answers.items():
        assert status == 415, (enc, payload)
        assert payload["error"]["code"] == "unsupported_encoding"
        assert repr(enc) in payload["error"]["message"], payload


def test_weight_zero_on_the_last_serving_replica_is_a_409():
    """Weight 0 takes a replica out like a drain, so the last-replica guard covers it too."""
    async def main():
        router, distill, app = _setup()
        served, base = await _serve(app)
        try:
            async with aiohttp.ClientSession() as s:
                async def weight(rid, w):
                    async with s.post(f"{base}/v1/replicas/{rid}/weight", json={"weight": w}, headers=AUTH) as r:
                        return r.status, await r.json()

                assert (await weight("b0", 0))[0] == 409  # solo's only replica
                assert (await weight("r0", 0))[0] == 200  # r1 still serves "default"
                status, body = await weight("r1", 0)
                assert status == 409 and "last serving" in body["error"]["message"], body
                assert (await weight("r1", 0.5))[0] == 200  # a non-zero weight is always fine
        finally:
            await served.stop()
        return {r.id: r.weight for r in router.replicas()}

    assert _run(main()) == {"r0": 0.0, "r1": 0.5, "b0": 1.0}


def test_a_change_whose_audit_row_cannot_be_written_is_refused():
    """A NUL in ``reason`` or an ``actor`` that is not text used to be applied (200) and never
    reach ``action_log``; now it is a 400 and nothing changes."""
    async def main():
        router, distill, app = _setup()
        served, base = await _serve(app)
        try:
            async with aiohttp.ClientSession() as s:
                url = f"{base}/v1/replicas/r0/weight"
                for body in ({"weight": 0.5, "reason": "a\x00b"}, {"weight": 0.5, "actor": "x\ud800"}):
                    async with s.post(url, data=json.dumps(body).encode(), headers=AUTH) as resp:
                        assert resp.status == 400, body
                        assert (await resp.json())["error"]["message"], body
            r, w = await asyncio.open_connection(served.host, served.port)
            data = b'{"weight": 0.5}'
            w.write(b"POST /v1/replicas/r0/weight HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    b"Authorization: Bearer " + TOKEN.encode() + b"\r\nX-Actor: ops-\xff\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
            answer = await asyncio.wait_for(r.read(), 10)
            w.close()
            assert answer.split(b" ", 2)[1] == b"400", answer[:300]
            assert b"X-Actor: contains a lone surrogate" in answer
        finally:
            await served.stop()
        return router.replicas()[0].weight

    assert _run(main()) == 1.0  # nothing applied


def test_state_never_shows_an_upstream_password():
    """GET /v1/state needs no token, so a replica URL's password is masked in it."""
    async def main():
        router = Router([Replica("r0", "default", url="http://ops:hunter2-secret@10.0.0.7:8000")], "ladr")
        app = api.make_app(router, DistillControls(router.pools(), max_share_step_pct=20, audit=AuditLog("")),
                           token=TOKEN)
        served, base = await _serve(app)
        try:
            async with aiohttp.ClientSession() as s, s.get(f"{base}/v1/state") as resp:
                return resp.status, await resp.text()
        finally:
            await served.stop()

    status, text = _run(main())
    assert status == 200 and "hunter2-secret" not in text
    assert "http://ops:***@10.0.0.7:8000" in text


def test_empty_token_refuses_every_write():
    async def main():
        router, distill, app = _setup(token="")
        runner, base = await _serve(app)
        try:
            async with aiohttp.ClientSession() as s:
                for path in ("/v1/replicas/r0/drain", "/v1/router/params"):
                    async with s.post(base + path, json={"alpha": 2}, headers={"Authorization": "Bearer "}) as resp:
                        assert resp.status == 503
                        assert "control.token is empty" in (await resp.json())["error"]["message"]
            assert not router.is_drained("r0")
        finally:
            await runner.stop()

    _run(main())


def test_bad_requests_get_4xx_with_a_reason():
    async def main():
        router, distill, app = _setup()
        runner, base = await _serve(app)
        cases = [
            ("/v1/replicas/r0/weight", b"{not json", 400, "not valid JSON"),
            ("/v1/replicas/r0/weight", b"[1, 2]", 400, "JSON object"),
            ("/v1/replicas/r0/weight", b"", 400, "empty body"),
            ("/v1/replicas/r0/weight", {"weight": "heavy"}, 400, "weight"),
            ("/v1/replicas/r0/weight", {"weight": -2}, 400, "weight"),
            ("/v1/replicas/r0/weight", b'{"weight": NaN}', 400, "finite"),
            ("/v1/replicas/r0/weight", b'{"weight": ' + b"9" * 400 + b"}", 400, "64-bit range"),
            ("/v1/router/params", b'{"alpha": ' + b"1" * 30 + b"}", 400, "64-bit range"),
            ("/v1/replicas/r0/weight", b'{"weight": 1e400}', 400, "finite"),
            ("/v1/replicas/r0/weight", {"weigth": 1}, 400, "unknown field"),
            ("/v1/replicas/r0/weight", {"weight": 1, "actor": 7}, 400, "actor"),
            ("/v1/replicas/nope/weight", {"weight": 1}, 404, "unknown replica"),
            ("/v1/replicas/nope/drain", {}, 404, "unknown replica"),
            ("/v1/router/params", {"theta": 1.5}, 400, "theta"),
            ("/v1/router/params", {"policy": "random"}, 400, "policy"),
            ("/v1/router/params", {"gamma": 1}, 400, "unknown field"),
            ("/v1/router/params", {}, 400, "no parameters"),
            ("/v1/pools/default/student_share", {"pct": 150}, 400, "student_share_pct"),
            ("/v1/pools/default/student_share", {"pct": 10, "clamp": "yes"}, 400, "clamp"),
            ("/v1/pools/default/student_share", {"pct": 50, "clamp": False}, 409, "max step"),
            ("/v1/pools/nowhere/student_share", {"pct": 10}, 404, "unknown pool"),
            ("/v1/pools/default/temperature_schedule", {"name": "warp"}, 400, "schedule.name"),
            ("/v1/pools/default/temperature_schedule", {"params": {}}, 400, "name"),
            ("/v1/pools/default/temperature_schedule", {"name": "linear", "params": {"t_max": 9}}, 409, "t_max"),
        ]
        try:
            async with aiohttp.ClientSession() as s:
                for path, body, status, reason in cases:
                    kw = {"data": body} if isinstance(body, bytes) else {"json": body}
                    async with s.post(base + path, headers=AUTH, **kw) as resp:
                        payload = await resp.json()
                        assert resp.status == status, (path, body, payload)
                        assert reason in payload["error"]["message"], (path, body, payload)
                big = {"weight": 1, "reason": "x" * (api.MAX_BODY_BYTES + 10)}
                async with s.post(base + "/v1/replicas/r0/weight", json=big, headers=AUTH) as resp:
                    assert resp.status == 413
                async with s.get(base + "/v1/audit?n=abc") as resp:
                    assert resp.status == 400
            snap = router.snapshot()
            assert snap["params"]["theta"] == 0.7 and snap["policy"] == "ladr"
            assert all(x["weight"] == 1.0 for x in snap["pools"]["default"])
            assert distill.student_share_pct("default") == 0
        finally:
            await runner.stop()

    _run(main())


def test_state_changes_are_visible_and_audited_in_the_store(pg_dsn):
    with connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, config_mod.load(env={}))

    async def main():
        router, distill, app = _setup(dsn=pg_dsn)
        runner, base = await _serve(app)
        try:
            async with aiohttp.ClientSession(headers=AUTH) as s:

                async def post(path, body, status=200):
                    async with s.post(base + path, json=body) as resp:
                        payload = await resp.json()
                        assert resp.status == status, payload
                        return payload

                await post("/v1/replicas/r1/weight", {"weight": 2.5, "actor": "alice", "reason": "bigger GPU"})
                await post("/v1/replicas/r0/drain", {"actor": "bob", "reason": "maintenance"})
                refused = await post("/v1/replicas/r1/drain", {"actor": "bob"}, 409)
                assert "last healthy" in refused["error"]["message"]
                refused = await post("/v1/replicas/b0/drain", {}, 409)
                await post("/v1/router/params", {"alpha": 2.0, "beta": 0.25, "policy": "p2c", "actor": "carol"})
                clamped = await post("/v1/pools/default/student_share", {"pct": 50, "actor": "dave"})
                assert clamped["audit"]["outcome"] == "clamped" and clamped["audit"]["after"] == 20
                await post("/v1/pools/default/temperature_schedule",
                           {"name": "cosine", "params": {"t_max": 1.2, "horizon": 64}, "actor": "erin"})
                await post("/v1/replicas/r0/undrain", {"actor": "bob"})
                async with s.get(base + "/v1/state") as resp:
                    state = await resp.json()
                async with s.get(base + "/metrics") as resp:
                    metrics = await resp.text()
                async with s.get(base + "/v1/audit?n=3") as resp:
                    audit_tail = (await resp.json())["records"]
        finally:
            await runner.stop()
        return state, metrics, audit_tail, distill

    state, metrics, audit_tail, distill = _run(main())
    reps = {x["id"]: x for x in state["router"]["pools"]["default"]}
    assert reps["r1"]["weight"] == 2.5 and not reps["r0"]["drained"] and not reps["r1"]["drained"]
    assert state["router"]["policy"] == "p2c"
    assert state["router"]["params"]["alpha"] == 2.0 and state["router"]["params"]["beta"] == 0.25
    pool = state["distill"]["pools"]["default"]
    assert pool["student_share_pct"] == 20
    assert pool["schedule"]["name"] == "cosine" and pool["schedule"]["params"]["t_max"] == 1.2
    assert f'{names.ROUTER_WEIGHT}{{pool="default",replica="r1"}} 2.5' in metrics
    assert f'{names.DISTILL_STUDENT_SHARE_RATIO}{{pool="default"}} 0.2' in metrics
    assert [r["action"] for r in audit_tail] == ["set_student_share", "set_temperature_schedule", "undrain"]

    assert distill.audit.flush(10)
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            f"SELECT actor, action, target, params, reason, outcome, source FROM {names.T_ACTION_LOG} ORDER BY id"
        ).fetchall()
    got = [(a, act, t, o) for a, act, t, _p, _r, o, _s in rows]
    assert got == [
        ("alice", "set_weight", "r1", "applied"),
        ("bob", "drain", "r0", "applied"),
        ("bob", "drain", "r1", "refused"),
        ("api", "drain", "b0", "refused"),
        ("carol", "set_router_params", "router", "applied"),
        ("dave", "set_student_share", "default", "clamped"),
        ("erin", "set_temperature_schedule", "default", "applied"),
        ("bob", "undrain", "r0", "applied"),
    ]
    assert rows[0][3] == {"before": 1.0, "after": 2.5} and rows[0][4] == "bigger GPU"
    assert rows[4][3]["before"] == {"policy": "ladr", "alpha": 1.0, "beta": 1.0}
    assert rows[4][3]["after"] == {"policy": "p2c", "alpha": 2.0, "beta": 0.25}
    assert rows[5][3]["requested"] == 50 and all(r[6] == "control_api" for r in rows)


def test_cli_serve_binds_loopback_and_answers(tmp_path, redis_service):
    port = services.free_port()
    pg_root = Path(tempfile.mkdtemp(prefix="llmsla-test-ctl-pg-"))  # outside pytest's 0700 tmp tree
    env = {**os.environ, "LLMSLA_CONTROL_TOKEN": TOKEN, "LLMSLA_CONTROL_PORT": str(port),
           "LLMSLA_CONTROL_REDIS_URL": redis_service.extra["url"],
           "LLMSLA_STORE_DATA_DIR": str(pg_root / "pg")}  # the default: the embedded store
    env.pop("LLMSLA_DSN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmsla", "control", "serve", "--upstream", "http://127.0.0.1:9101",
         "--upstream", "http://127.0.0.1:9102", "--duration-s", "20"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        services.wait_http(f"http://127.0.0.1:{port}/healthz", timeout_s=90, proc=proc)  # initdb of a new embedded store first
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/state", timeout=5) as resp:
            state = json.load(resp)
        assert [x["url"] for x in state["router"]["pools"]["default"]] == [
            "http://127.0.0.1:9101", "http://127.0.0.1:9102"]
        assert state["router"]["policy"] == "ladr"
        assert state["router"]["shared"]["backend"] == "redis" and state["router"]["shared"]["healthy"]
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/replicas/r0/drain", data=b"{}",
                                     headers=AUTH, method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200
        # bound to 127.0.0.1 only: the kernel's socket table lists the listener as 0100007F:<port>
        listeners = [ln.split()[1] for ln in Path("/proc/net/tcp").read_text().splitlines()[1:] if ln.split()[3] == "0A"]
        assert f"0100007F:{port:04X}" in listeners
        assert not any(addr.endswith(f":{port:04X}") and addr != f"0100007F:{port:04X}" for addr in listeners)
        assert config_mod.load(env={}).control.host == "127.0.0.1"
        proc.terminate()  # SIGTERM: a clean stop writes the pending audit rows
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "control API on http://127.0.0.1:" in proc.stdout.read()
    dsn, server = start_embedded(pg_root / "pg", keep_running=False)
    try:
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(f"SELECT action, target, outcome FROM {names.T_ACTION_LOG}").fetchall()
        assert rows == [("drain", "r0", "applied")]
    finally:
        server.cleanup()
        shutil.rmtree(pg_root, ignore_errors=True)
