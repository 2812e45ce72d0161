"""The scrape GET client against real loopback servers that answer with hand-written bytes:
well-formed (Content-Length, chunked, read to close, kept alive) and hostile (truncated,
oversize, slow, reset, non-200, redirect, malformed heads and chunks). Each failure carries the
reason the scraper exports."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from llmsla import names
from llmsla.engines.httpget import Client, FetchError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
BODY = b'vllm:num_requests_running{model_name="m"} 3.0\n'


@contextlib.asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A real TCP server; yields its base URL and a list that counts connections."""
    conns: list[int] = []

    async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        conns.append(1)
        try:
            await handler(r, w)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", conns
    finally:
        srv.close()


def answer(raw: bytes, *, keep: bool = True) -> Handler:
    """Answer every request on a connection with ``raw``; close after one unless ``keep``."""

    async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while True:
            await r.readuntil(b"\r\n\r\n")
            w.write(raw)
            await w.drain()
            if not keep:
                return

    return h


def ok(body: bytes = BODY, extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {len(body)}\r\n"
            f"{extra}\r\n").encode() + body


async def get(url: str, *, max_bytes: int = 1024, timeout: float = 1.0, client: Client | None = None) -> bytes:
    c = client or Client(max_bytes, "text/plain")
    try:
        async with asyncio.timeout(timeout):
            return (await c.get(url)).body
    finally:
        if client is None:
            c.close()


async def fails(url: str, reason: str, **kw: float) -> str:
    with pytest.raises(FetchError) as info:
        await get(url, **kw)  # type: ignore[arg-type]
    assert info.value.reason == reason, (info.value.reason, str(info.value))
    return str(info.value)


def test_content_length_body_and_request_head() -> None:
    async def run() -> None:
        seen: list[bytes] = []

        async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            seen.append(await r.readuntil(b"\r\n\r\n"))
            w.write(ok())
            await w.drain()

        async with server(h) as (base, _):
            c = Client(1024, "application/openmetrics-text")
            resp = await c.get(f"{base}/r/0/metrics?x=1")
            c.close()
        assert resp.body == BODY and resp.content_type == "text/plain; version=0.0.4"
        head = seen[0].decode()
        assert head.startswith("GET /r/0/metrics?x=1 HTTP/1.1\r\n")
        assert f"Host: {base[7:]}\r\n" in head and "Accept: application/openmetrics-text\r\n" in head
        assert "Accept-Encoding: identity\r\n" in head

    asyncio.run(run())


def test_connection_is_kept_and_reused() -> None:
    async def run() -> None:
        async with server(answer(ok())) as (base, conns):
            c = Client(1024, "text/plain")
            for _ in range(5):
                assert (await c.get(f"{base}/metrics")).body == BODY
            c.close()
            assert len(conns) == 1

    asyncio.run(run())


def test_client_runs_on_uvloop() -> None:
    """The gateway (engine signals) and ``llmsla engines`` run on uvloop, whose transports are
    not asyncio.Transport subclasses: kept connections, a chunked body and a failure there too."""
    uvloop = pytest.importorskip("uvloop", reason="uvloop is not built for Windows, where the gateway runs asyncio's own loop")
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               + f"{len(BODY):x}\r\n".encode() + BODY + b"\r\n0\r\n\r\n")

    async def run() -> None:
        async with server(answer(ok())) as (base, conns):
            c = Client(1024, "text/plain")
            for _ in range(3):
                assert (await c.get(f"{base}/metrics")).body == BODY
            c.close()
            assert len(conns) == 1
        async with server(answer(chunked)) as (base, _):
            assert await get(f"{base}/metrics") == BODY
        async with server(answer(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n")) as (base, _):
            await fails(f"{base}/metrics", names.ENGINE_FAIL_HTTP)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


def test_connection_close_and_a_server_closing_idle_ones_are_handled() -> None:
    async def run() -> None:
        # the server closes after each answer (no header saying so): the next GET finds the
        # kept connection closed before any byte and opens a fresh one, transparently
        async with server(answer(ok(), keep=False)) as (base, conns):
            c = Client(1024, "text/plain")
            for _ in range(3):
                assert (await c.get(f"{base}/metrics")).body == BODY
                await asyncio.sleep(0.05)
            c.close()
            assert len(conns) == 3
        async with server(answer(ok(extra="Connection: close\r\n"))) as (base, conns):
            c = Client(1024, "text/plain")
            for _ in range(3):
                assert (await c.get(f"{base}/metrics")).body == BODY
            c.close()
            assert len(conns) == 3

    asyncio.run(run())


def test_chunked_body_with_extensions_and_trailers() -> None:
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n"
           + b"5;ext=1\r\n" + BODY[:5] + b"\r\n" + f"{len(BODY) - 5:x}\r\n".encode() + BODY[5:] + b"\r\n"
           + b"0\r\nX-Trailer: 1\r\n\r\n")

    async def run() -> None:
        async with server(answer(raw)) as (base, conns):
            c = Client(1024, "text/plain")
            for _ in range(2):
                assert (await c.get(f"{base}/metrics")).body == BODY
            c.close()
            assert len(conns) == 1

    asyncio.run(run())


def test_body_to_close_without_length() -> None:
    async def run() -> None:
        async with server(answer(b"HTTP/1.0 200 OK\r\n\r\n" + BODY, keep=False)) as (base, _):
            assert await get(f"{base}/metrics") == BODY

    asyncio.run(run())


@pytest.mark.parametrize("raw, reason", [
    (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\noops!", names.ENGINE_FAIL_HTTP),
    (b"HTTP/1.1 302 Found\r\nLocation: http://10.0.0.1/metrics\r\nContent-Length: 0\r\n\r\n", names.ENGINE_FAIL_HTTP),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + BODY, names.ENGINE_FAIL_PARSE),  # truncated
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n" + BODY[:8], names.ENGINE_FAIL_PARSE),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", names.ENGINE_FAIL_PARSE),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n", names.ENGINE_FAIL_PARSE),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx", names.ENGINE_FAIL_PARSE),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nxx", names.ENGINE_FAIL_PARSE),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nxxx", names.ENGINE_FAIL_PARSE),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", names.ENGINE_FAIL_PARSE),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", names.ENGINE_FAIL_PARSE),
    (b"HTTP/1.1 200 OK\r\nbad header line\r\nContent-Length: 0\r\n\r\n", names.ENGINE_FAIL_PARSE),
    (b"<html>not http</html>\r\n\r\n", names.ENGINE_FAIL_PARSE),
    (b"SSH-2.0-OpenSSH_9.6\r\n", names.ENGINE_FAIL_PARSE),  # a head that never ends, then close
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000, names.ENGINE_FAIL_TOO_LARGE),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"200\r\n" + b"x" * 512 + b"\r\n"
     + b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n", names.ENGINE_FAIL_TOO_LARGE),
    (b"HTTP/1.0 200 OK\r\n\r\n" + b"x" * 3000, names.ENGINE_FAIL_TOO_LARGE),
])
def test_hostile_answers_fail_with_their_reason(raw: bytes, reason: str) -> None:
    async def run() -> None:
        async with server(answer(raw, keep=False)) as (base, _):
            await fails(f"{base}/metrics", reason)

    asyncio.run(run())


def test_head_too_long_is_refused() -> None:
    async def run() -> None:
        async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 200 OK\r\n")
            for _ in range(2000):  # headers without end
                w.write(b"X-Filler: " + b"y" * 60 + b"\r\n")
                await w.drain()
            await asyncio.sleep(5)

        async with server(h) as (base, _):
            assert "head longer" in await fails(f"{base}/metrics", names.ENGINE_FAIL_PARSE)

    asyncio.run(run())


def test_slow_answer_is_bounded_by_the_callers_timeout_and_closed() -> None:
    async def run() -> None:
        closed = asyncio.Event()

        async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nvllm")  # then a byte a while
            await w.drain()
            try:
                for _ in range(100):
                    await asyncio.sleep(0.05)
                    w.write(b"x")
                    await w.drain()
            except ConnectionError:
                closed.set()
            if r.at_eof() or w.is_closing():
                closed.set()

        async with server(h) as (base, _):
            c = Client(1024, "text/plain")
            with pytest.raises(TimeoutError):
                await get(f"{base}/metrics", timeout=0.3, client=c)
            assert not c._idle.get(("http", "127.0.0.1", int(base.rsplit(":", 1)[1])))  # not kept
            await asyncio.wait_for(closed.wait(), 3)  # the server saw the connection go
            c.close()

    asyncio.run(run())


def test_connection_reset_and_refused() -> None:
    async def run() -> None:
        async def reset(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nvllm")
            await w.drain()
            sock = w.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST on close
            w.transport.abort()

        async with server(reset) as (base, _):
            await fails(f"{base}/metrics", names.ENGINE_FAIL_PARSE)  # cut mid-body

        async def reset_first(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")
            sock = w.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()

        async with server(reset_first) as (base, _):
            await fails(f"{base}/metrics", names.ENGINE_FAIL_CONNECT)  # no answer at all

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        await fails(f"http://127.0.0.1:{port}/metrics", names.ENGINE_FAIL_CONNECT)
        await fails("ftp://127.0.0.1/metrics", names.ENGINE_FAIL_CONNECT)

    asyncio.run(run())


def test_client_keeps_working_after_a_bad_answer() -> None:
    async def run() -> None:
        answers = [b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nshort", ok()]

        async def h(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.readuntil(b"\r\n\r\n")
            w.write(answers.pop(0))
            await w.drain()
            if answers:
                w.close()  # the truncated one: cut
            else:
                await r.read()

        async with server(h) as (base, _):
            c = Client(1024, "text/plain")
            with pytest.raises(FetchError):
                await c.get(f"{base}/metrics")
            assert (await c.get(f"{base}/metrics")).body == BODY
            c.close()

    asyncio.run(run())
