"""The gateway's fast path (exporters/fastpath.py) against real clients: aiohttp's client and raw
sockets, a real loopback upstream, the spooled events.

Each test checks that the fast path served the request (``RunningGateway.fast.served``) or handed
it to aiohttp (``handed_over``), what the client got, and what was recorded.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client import CollectorRegistry

from llmsla import names, tcpinfo
from llmsla.app import wiring
from llmsla.control.router import Router
from llmsla.exporters import fastpath
from llmsla.exporters import gateway as gw_mod
from tests.exporters.test_gateway_errors import MODEL, _cfg, events, good, upstream


def _request(body: bytes, *, path: str = "/v1/completions", extra: str = "", chunked: bool = False) -> bytes:
    if chunked:
        half = len(body) // 2
        framed = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
        return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Transfer-Encoding: chunked\r\n{extra}\r\n").encode() + framed
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (Content-Length or chunked) off a raw connection."""
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            await reader.readline()
            return status, headers, body
        body += await reader.readexactly(size)
        await reader.readline()


def _run(tmp_path: Path, scenario, http: dict | None = None, **gateway) -> tuple[object, list]:
    cfg = _cfg(tmp_path, **gateway)
    for k, v in (http or {}).items():
        setattr(cfg.http, k, v)
    reg = CollectorRegistry()

    async def main() -> object:
        async with upstream() as (url, up):
            router = Router([gw_mod.Replica("r0", cfg.gateway.pool, url)], policy="round_robin", registry=reg)
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=reg, router=router) as gw:
                return await scenario(gw, up)

    got = asyncio.run(main())
    return got, events(cfg)


def test_keep_alive_reuse_and_other_paths_on_aiohttp(tmp_path: Path) -> None:
    async def scenario(gw, up) -> dict:
        conn = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=conn) as s:
            out = []
            for stream in (True, False, True):
                async with s.post(gw.url + "/v1/completions", json=good(stream=stream)) as r:
                    out.append((r.status, await r.text(), r.headers.get("X-Request-Id")))
            served, handed = gw.fast.served, gw.fast.handed_over
            async with s.get(gw.url + "/v1/models") as r:  # a new request on the same kept-alive connection
                models = r.status, await r.json()
            async with s.post(gw.url + "/v1/completions", json=good()) as r:  # now on aiohttp's protocol
                after = r.status, await r.text()
            return {"out": out, "served": served, "handed": handed, "models": models, "after": after,
                    "handed_after": gw.fast.handed_over, "served_after": gw.fast.served}

    got, evs = _run(tmp_path, scenario)
    assert got["served"] == 3 and got["handed"] == 0  # one connection, three requests on the fast path
    assert [o[0] for o in got["out"]] == [200, 200, 200]
    assert got["out"][0][1].endswith("data: [DONE]\n\n") and json.loads(got["out"][1][1])["choices"]
    assert [o[2] for o in got["out"]] == [e.trace_id for e in evs[:3]]  # X-Request-Id: the trace id
    assert got["models"][0] == 200 and got["models"][1]["data"][0]["id"] == MODEL
    assert got["handed_after"] == 1 and got["served_after"] == 3 and got["after"][0] == 200
    assert [e.status for e in evs] == ["ok"] * 4
    assert all(e.output_tokens == 3 for e in evs)


def test_pipelined_requests_answered_in_order(tmp_path: Path) -> None:
    async def scenario(gw, up) -> list:
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        bodies = [json.dumps({**good(stream=i % 2 == 0, n=i + 1)}).encode() for i in range(3)]
        writer.write(b"".join(_request(b) for b in bodies))  # three requests in one write
        await writer.drain()
        out = [await _read_response(reader) for _ in bodies]
        writer.close()
        return [*out, gw.fast.served]

    got, evs = _run(tmp_path, scenario)
    *answers, served = got
    assert served == 3
    assert [a[0] for a in answers] == [200, 200, 200]
    assert answers[0][2].count(b"data: {") == 1 and answers[2][2].count(b"data: {") == 3  # in order
    assert json.loads(answers[1][2])["choices"][0]["text"] == "xx"
    assert [e.output_tokens for e in evs] == [1, 2, 3]


def test_oversized_and_malformed_requests_get_4xx_with_a_reason(tmp_path: Path) -> None:
    async def scenario(gw, up) -> dict:
        got = {}
        big = json.dumps({**good(), "prompt": "y" * 5000}).encode()
        async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/completions", data=big,
                                                        headers={"Content-Type": "application/json"}) as r:
            got["too_large"] = r.status, await r.json()
        # chunked: no Content-Length to refuse up front, the cap applies as the body grows
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        writer.write(_request(big, chunked=True))
        got["too_large_chunked"] = await _read_response(reader)
        writer.close()
        # a header name with a space: the parser's reason in a 400, and the connection closed
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\nContent-Length: 2\r\n\r\n{}")
        got["malformed"] = await _read_response(reader)
        got["malformed_eof"] = await reader.read()
        writer.close()
        # broken chunk framing after a good head: the handler, waiting for the body, answers 400
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        got["bad_chunk"] = await _read_response(reader)
        writer.close()
        async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/completions", json=good()) as r:
            got["ok"] = r.status  # still serving
        got["served"] = gw.fast.served
        return got

    got, evs = _run(tmp_path, scenario, max_body_bytes=4096)
    status, body = got["too_large"]
    assert status == 413 and body["error"]["code"] == "body_too_large" and "4096" in body["error"]["message"]
    status, _, raw = got["too_large_chunked"]
    assert status == 413 and json.loads(raw)["error"]["code"] == "body_too_large"
    status, headers, raw = got["malformed"]
    assert status == 400 and "malformed HTTP request" in json.loads(raw)["error"]["message"]
    assert headers["connection"] == "close" and got["malformed_eof"] == b""
    status, _, raw = got["bad_chunk"]
    assert status == 400 and "malformed request body" in json.loads(raw)["error"]["message"]
    assert got["ok"] == 200 and got["served"] >= 4
    assert [e.status for e in evs] == ["ok"]  # refused before validation: no event, as on aiohttp's path


def test_chunked_request_body_is_served(tmp_path: Path) -> None:
    async def scenario(gw, up) -> tuple:
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        writer.write(_request(json.dumps(good(n=4)).encode(), chunked=True))
        got = await _read_response(reader)
        writer.close()
        return got, gw.fast.served

    (answer, served), evs = _run(tmp_path, scenario)
    assert served == 1 and answer[0] == 200 and answer[2].count(b"data: {") == 4
    assert [(e.status, e.output_tokens) for e in evs] == [("ok", 4)]


def test_client_disconnect_mid_stream_releases_and_records(tmp_path: Path) -> None:
    async def scenario(gw, up) -> dict:
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        writer.write(_request(json.dumps({**good(n=50), "prompt": "slow"}).encode()))
        await reader.readuntil(b"data: ")  # the first token arrived
        in_flight = gw.gateway.in_flight
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        writer.close()
        deadline = time.monotonic() + 5
        while (gw.gateway.in_flight or not up.cancelled) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return {"in_flight_during": in_flight, "in_flight_after": gw.gateway.in_flight,
                "upstream_cancelled": up.cancelled, "served": gw.fast.served}

    got, evs = _run(tmp_path, scenario)
    assert got["served"] == 1 and got["in_flight_during"] == 1
    assert got["in_flight_after"] == 0  # its slot released
    assert got["upstream_cancelled"] == 1  # the upstream stream aborted, not generating for nobody
    assert len(evs) == 1 and evs[0].status == names.STATUS_CANCELLED
    assert evs[0].ttft_ms is not None and 1 <= evs[0].output_tokens < 50


def test_arrival_is_the_first_bytes_read_and_unusual_heads_go_to_aiohttp(tmp_path: Path) -> None:
    async def scenario(gw, up) -> dict:
        got = {}
        # a head split over two reads: aiohttp's protocol takes the connection (its header timeouts)
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        raw = _request(json.dumps(good()).encode())
        writer.write(raw[:20])
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(raw[20:])
        got["split"] = (await _read_response(reader))[0]
        writer.close()
        got["handed"] = gw.fast.handed_over
        # a gzip body: aiohttp decodes it
        zipped = gzip.compress(json.dumps(good()).encode())
        async with aiohttp.ClientSession() as s, s.post(
                gw.url + "/v1/completions", data=zipped,
                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}) as r:
            got["gzip"] = r.status
        got["handed_gzip"] = gw.fast.handed_over
        # the clock: a request whose handler runs late (a busy loop) still counts the wait from
        # the read of its first byte
        complete = gw.fast.handler

        async def late(ex):
            time.sleep(0.2)  # the loop busy for 200 ms after the bytes were read
            await complete(ex)

        gw.fast.handler = late
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        writer.write(_request(json.dumps(good(stream=False)).encode()))
        got["blocked"] = (await _read_response(reader))[0]
        writer.close()
        got["served"] = gw.fast.served
        return got

    got, evs = _run(tmp_path, scenario)
    assert got["split"] == 200 and got["handed"] == 1
    assert got["gzip"] == 200 and got["handed_gzip"] == 2
    assert got["blocked"] == 200 and got["served"] == 1
    assert [e.status for e in evs] == ["ok", "ok", "ok"]
    assert evs[2].e2e_ms >= 150  # from the first byte read, not from when the handler ran


def test_fast_path_off_serves_everything_on_aiohttp(tmp_path: Path) -> None:
    async def scenario(gw, up) -> tuple:
        async with aiohttp.ClientSession() as s, s.post(gw.url + "/v1/completions", json=good()) as r:
            return r.status, gw.fast

    (status, fast), evs = _run(tmp_path, scenario, fast_path=False)
    assert status == 200 and fast is None and [e.status for e in evs] == ["ok"]


def test_a_slow_reader_gets_back_pressure_and_the_whole_stream(tmp_path: Path, monkeypatch) -> None:
    made = fastpath.FastProtocol.connection_made

    def small_buffers(self, transport) -> None:  # a slow network: the kernel buffers little
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        made(self, transport)

    monkeypatch.setattr(fastpath.FastProtocol, "connection_made", small_buffers)

    async def scenario(gw, up) -> dict:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the gateway's buffer fills
        sock.connect((gw.host, gw.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(_request(json.dumps(good(n=3000)).encode()))
        await asyncio.sleep(1.0)  # not reading while the upstream sends ~180 KB
        paused = gw.fast.write_pauses
        answer = await _read_response(reader)
        writer.close()
        return {"paused": paused, "answer": answer}

    got, evs = _run(tmp_path, scenario)
    status, _, body = got["answer"]
    assert got["paused"] >= 1  # reading (client and upstream) paused while the client's buffer was full
    assert status == 200 and body.count(b"data: {") == 3000 and body.endswith(b"data: [DONE]\n\n")
    assert [(e.status, e.output_tokens) for e in evs] == [("ok", 3000)]


def test_silent_and_idle_connections_are_closed(tmp_path: Path) -> None:
    async def scenario(gw, up) -> dict:
        got = {}
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection(gw.host, gw.port)  # says nothing
        got["silent_eof"] = await asyncio.wait_for(reader.read(), 5)
        got["silent_s"] = time.monotonic() - t0
        writer.close()
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        writer.write(_request(json.dumps(good(stream=False)).encode()))
        got["answer"] = (await _read_response(reader))[0]
        t0 = time.monotonic()
        got["idle_eof"] = await asyncio.wait_for(reader.read(), 5)  # kept alive, then idle too long
        got["idle_s"] = time.monotonic() - t0
        writer.close()
        got["timed_out"] = gw.served.guard.timed_out
        got["open"] = gw.served.guard.open
        return got

    got, evs = _run(tmp_path, scenario, http={"header_timeout_s": 0.3, "keepalive_timeout_s": 0.6})
    assert got["silent_eof"] == b"" and 0.25 <= got["silent_s"] < 3
    assert got["answer"] == 200 and got["idle_eof"] == b"" and 0.5 <= got["idle_s"] < 3
    assert got["timed_out"] == 1  # the silent one; an idle kept-alive connection is not a slow head
    assert got["open"] == 0
    assert [e.status for e in evs] == ["ok"]


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_client_leaving_after_done_was_answered(tmp_path: Path, fast_path: bool) -> None:
    """OpenAI's SDK closes the connection at ``data: [DONE]``, before the chunked body's end; a
    replica that sends that end later (here 0.5 s) must not turn an answered request into a
    cancelled one. A client leaving before [DONE] still counts as cancelled."""
    async def scenario(gw, up) -> dict:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
        stream = await client.completions.create(model=MODEL, prompt="linger", max_tokens=4, stream=True)
        texts = [c.choices[0].text async for c in stream]
        await client.close()
        # a client leaving mid-stream, for contrast
        reader, writer = await asyncio.open_connection(gw.host, gw.port)
        writer.write(_request(json.dumps({**good(n=50), "prompt": "slow"}).encode()))
        await reader.readuntil(b"data: ")
        writer.close()
        deadline = time.monotonic() + 5
        while (gw.gateway.in_flight or up.cancelled < 2) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return {"texts": texts, "cancelled_upstream": up.cancelled}

    got, evs = _run(tmp_path, scenario, fast_path=fast_path)
    assert got["texts"] == ["x"] * 4
    assert got["cancelled_upstream"] == 2  # both upstream streams were aborted when the client left
    by_status = {e.status: e.output_tokens for e in evs}  # whichever was recorded first
    assert len(evs) == 2 and by_status.keys() == {names.STATUS_OK, names.STATUS_CANCELLED}, evs
    assert by_status[names.STATUS_OK] == 4 and by_status[names.STATUS_CANCELLED] < 50


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_head_the_busy_loop_read_late_is_timed_from_its_arrival(tmp_path: Path, fast_path: bool) -> None:
    """A head that sat in the kernel while the gateway's loop was busy (here: blocked 120 ms
    after the client sent it) is timed from when the kernel had it, to within two ticks: that
    wait is the client's, so it is in the request's queue time and TTFT."""
    block_s = 0.12

    async def scenario(gw, up) -> float:
        sock = socket.create_connection((gw.host, gw.port))
        await asyncio.sleep(0.05)  # accepted
        sent = time.perf_counter()
        sock.sendall(_request(json.dumps(good(n=3)).encode()))
        time.sleep(block_s)  # the loop is busy elsewhere: the head waits in the kernel
        reader, writer = await asyncio.open_connection(sock=sock)
        status, _, body = await _read_response(reader)
        elapsed = time.perf_counter() - sent
        writer.close()
        assert status == 200 and body.endswith(b"data: [DONE]\n\n")
        return elapsed

    elapsed, evs = _run(tmp_path, scenario, fast_path=fast_path)
    tick_ms = tcpinfo.prime()
    assert tick_ms > 0
    (ev,) = evs
    assert block_s * 1000 - 2 * tick_ms <= ev.queue_ms <= ev.ttft_ms <= ev.e2e_ms <= elapsed * 1000, (ev, tick_ms)


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_replica_leaving_after_done_has_answered(tmp_path: Path, fast_path: bool) -> None:
    """A replica whose connection drops, or that hangs past ``gateway.request_timeout_s``, after
    its ``data: [DONE]`` (before the body's end) has given the client the whole answer: the
    client's stream ends cleanly, without an error event, and the request is ``ok``. One
    dropping before [DONE] is still an error."""
    async def scenario(gw, up) -> list:
        out = []
        for prompt in ("die-after-done", "hang-after-done", "die-mid"):
            reader, writer = await asyncio.open_connection(gw.host, gw.port)
            writer.write(_request(json.dumps({**good(n=3), "prompt": prompt}).encode()))
            out.append(await _read_response(reader))
            writer.close()
        return out

    (died, hung, mid), evs = _run(tmp_path, scenario, fast_path=fast_path, request_timeout_s=1.0)
    for done in (died, hung):
        assert done[0] == 200 and done[2].endswith(b"data: [DONE]\n\n") and b"event: error" not in done[2]
    assert mid[0] == 200 and b"event: error" in mid[2] and b"data: [DONE]" not in mid[2]
    assert sorted((e.status, e.output_tokens) for e in evs) == [
        (names.STATUS_ERROR, 1), (names.STATUS_OK, 3), (names.STATUS_OK, 3)]
