"""The gateway's lean HTTP/1.1 upstream client against raw loopback servers.

The servers write exact bytes (split at awkward places, closed early, malformed) so framing,
keep-alive reuse, retry of a stale pooled connection, flow control and error mapping are
checked against a reference computed independently: the body the server meant to send.
"""

from __future__ import annotations

import asyncio
import random
import sys

import pytest

from llmsla.exporters.upstream import UpstreamPool, UpstreamProtocolError, UpstreamResponse


def _chunked(parts: list[bytes]) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"


class RawServer:
    """Answers each request with ``script(request_bytes)`` -> list of (bytes, delay_s); a None
    entry closes the connection."""

    def __init__(self, script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        nth = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                cl = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        cl = int(line.split(b":")[1])
                body = await reader.readexactly(cl)
                self.requests.append(head + body)
                nth += 1
                if nth > 1 and b"/silent-close" in head:  # an idle keep-alive the server dropped
                    return
                for piece in self.script(head + body):
                    if piece is None:
                        writer.close()
                        return
                    data, delay = piece
                    if delay:
                        await asyncio.sleep(delay)
                    writer.write(data)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _split(data: bytes, rng: random.Random) -> list[tuple[bytes, float]]:
    """``data`` in random small pieces, each flushed separately (splits land inside chunk-size
    lines, CRLFs and the head)."""
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, 9)
        out.append((data[i:i + n], 0.0005))
        i += n
    return out


def test_chunked_content_length_and_close_delimited_bodies() -> None:
    rng = random.Random(3)
    parts = [b'data: {"choices":[{"text":"%d"}]}\n\n' % i for i in range(20)] + [b"data: [DONE]\n\n"]
    chunked = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
               + _chunked(parts))
    plain = b'{"ok": true, "text": "' + b"y" * 5000 + b'"}'
    fixed = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(plain), plain)

    def script(req: bytes):
        if b"/chunked" in req:
            return _split(chunked, rng)
        if b"/fixed" in req:
            return [(fixed[:30], 0), (fixed[30:], 0.001)]
        if b"/close" in req:
            return [(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil", 0), (b" close", 0.001), None]
        return [(b"HTTP/1.1 204 No Content\r\n\r\n", 0)]

    async def main() -> None:
        async with RawServer(script) as srv:
            pool = UpstreamPool()
            r = await pool.request(srv.url, "POST", "/chunked", {"Content-Type": "application/json"}, b'{"a":1}')
            assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
            got = [d async for d in r.iter_chunks()]
            assert b"".join(got) == b"".join(parts)
            r = await pool.request(srv.url, "POST", "/fixed", {}, b"x")
            assert (r.status, await r.read()) == (201, plain)
            r = await pool.request(srv.url, "GET", "/nobody", {})
            assert (r.status, await r.read()) == (204, b"")
            assert srv.connections == 1  # keep-alive: one connection so far
            r = await pool.request(srv.url, "GET", "/close", {})
            assert await r.read() == b"until close"
            r = await pool.request(srv.url, "POST", "/chunked", {}, b"")
            assert b"".join([d async for d in r.iter_chunks()]) == b"".join(parts)
            assert srv.connections == 2  # the HTTP/1.0 close-delimited answer was not reused
            assert srv.requests[0].startswith(b"POST /chunked HTTP/1.1\r\n")
            assert b"Content-Length: 7\r\n" in srv.requests[0] and srv.requests[0].endswith(b'{"a":1}')
            await pool.close()

    asyncio.run(main())


def test_stale_pooled_connection_is_retried_once_and_errors_map_to_connection_errors() -> None:
    calls = {"n": 0}

    def script(req: bytes):
        calls["n"] += 1
        if b"/drop-after" in req:  # answers, then closes the idle keep-alive connection
            return [(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 0), (b"", 0.05), None]
        if b"/truncated" in req:
            return [(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", 0), None]
        if b"/garbage" in req:
            return [(b"SPDY/9 what\r\n\r\n", 0)]
        if b"/badchunk" in req:
            return [(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 0)]
        return [(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nyes", 0)]

    async def main() -> None:
        async with RawServer(script) as srv:
            pool = UpstreamPool()
            r = await pool.request(srv.url, "GET", "/drop-after", {})
            assert await r.read() == b"ok"
            await asyncio.sleep(0.2)  # the server closed the pooled connection meanwhile
            r = await pool.request(srv.url, "GET", "/fine", {})
            assert await r.read() == b"yes"
            # the pooled connection looks alive but the server closes it on the next request
            # without a byte: sent again, once, on a new connection
            r = await pool.request(srv.url, "GET", "/silent-close", {})
            assert await r.read() == b"yes"
            conns = srv.connections
            r = await pool.request(srv.url, "GET", "/silent-close", {})
            assert await r.read() == b"yes"
            assert srv.connections == conns + 1 and calls["n"] == 4
            r = await pool.request(srv.url, "GET", "/truncated", {})
            with pytest.raises(ConnectionError):
                await r.read()
            r.close()
            with pytest.raises(UpstreamProtocolError):
                await pool.request(srv.url, "GET", "/garbage", {})
            r = await pool.request(srv.url, "GET", "/badchunk", {})
            with pytest.raises(UpstreamProtocolError):
                await r.read()
            r.close()
            await pool.close()
        # nothing listening: a plain OSError the gateway maps to 502
        pool = UpstreamPool()
        with pytest.raises(OSError):
            await pool.request(srv.url, "GET", "/", {})

    asyncio.run(main())


def test_cancelled_request_drops_its_connection_and_big_bodies_flow() -> None:
    big = bytes(random.Random(5).randbytes(3_000_000))

    def script(req: bytes):
        if b"/stall" in req:
            return [(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 0), (b"", 30)]
        return [(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big), 0)] + \
            [(big[i:i + 65536], 0) for i in range(0, len(big), 65536)]

    async def main() -> None:
        async with RawServer(script) as srv:
            pool = UpstreamPool()
            r = await pool.request(srv.url, "GET", "/stall", {})
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await r.read()
            r.close()  # aborts: the connection must not go back to the pool
            assert not pool._idle.get(("127.0.0.1", srv.port))
            r = await pool.request(srv.url, "GET", "/big", {})
            got = bytearray()
            async for d in r.iter_chunks():  # a slow consumer: reading pauses and resumes
                got += d
                await asyncio.sleep(0)
            assert bytes(got) == big
            assert len(pool._idle[("127.0.0.1", srv.port)]) == 1
            await pool.close()

    asyncio.run(main())


def test_gateway_loop_is_uvloop_with_an_asyncio_fallback() -> None:
    import subprocess
    import sys

    from llmsla.exporters.cli import run_loop

    async def kind() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run_loop(kind()).startswith("uvloop")
    code = ("import sys, asyncio; sys.modules['uvloop'] = None\n"  # as if uvloop were not installed
            "from llmsla.exporters.cli import run_loop\n"
            "async def k(): return type(asyncio.get_running_loop()).__module__\n"
            "print(run_loop(k()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip().startswith("asyncio")


def test_ambiguous_framing_is_refused_never_reused() -> None:
    """Responses shaped like request-smuggling payloads: llhttp refuses them, the client maps it
    to UpstreamProtocolError and never returns that connection to the pool."""
    bad = {
        b"/cl-te": b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"/two-cl": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nhello",
        b"/neg-cl": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"/bad-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5x\r\nhello\r\n0\r\n\r\n",
        b"/fold": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n X-Folded: yes\r\n\r\nok",
        b"/space": b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok",
        b"/status": b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok",
        b"/extra": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno",
    }

    def script(req: bytes):
        for path, resp in bad.items():
            if path + b" " in req:
                return [(resp, 0)]
        return [(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 0)]

    async def main() -> None:
        async with RawServer(script) as srv:
            pool = UpstreamPool()
            for path in bad:
                try:
                    r = await pool.request(srv.url, "GET", path.decode(), {})
                    body = await r.read()
                    if path == b"/extra":  # the first response is well formed; the rest poisons reuse
                        assert body == b"ok"
                        continue
                    raise AssertionError(f"{path!r} accepted: {r.status} {body!r}")
                except UpstreamProtocolError:
                    pass
            before = srv.connections
            r = await pool.request(srv.url, "GET", "/good", {})
            assert await r.read() == b"ok"
            assert srv.connections == before + 1  # nothing from the bad answers was reused
            await pool.close()

    asyncio.run(main())


def test_complete_marks_exactly_the_last_piece_and_never_a_truncated_body() -> None:
    """The gateway sends the piece after which ``complete`` is True together with the end of
    its own response: it must be the body's last piece, and a body cut short is never complete."""
    parts = [b"data: %d\n\n" % i for i in range(5)]
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    pieces = _chunked(parts)

    def script(req: bytes):
        if b"/cut" in req:  # two chunks, then the upstream goes away
            return [(head + _chunked(parts)[:20], 0), (b"", 0.002), None]
        # each chunk flushed on its own, the last one together with the terminator
        return [(head, 0)] + [(f"{len(p):x}\r\n".encode() + p + b"\r\n", 0.002) for p in parts[:-1]] + [
            (pieces[-(len(parts[-1]) + 10):], 0.002)]

    async def main() -> None:
        async with RawServer(script) as srv:
            pool = UpstreamPool()
            r = await pool.request(srv.url, "POST", "/ok", {}, b"")
            seen = [(d, r.complete) async for d in r.iter_chunks()]
            assert b"".join(d for d, _ in seen) == b"".join(parts)
            assert [c for _, c in seen] == [False] * (len(seen) - 1) + [True]
            r = await pool.request(srv.url, "POST", "/cut", {}, b"")
            flags = []
            with pytest.raises(ConnectionError):
                async for _ in r.iter_chunks():
                    flags.append(r.complete)
            assert flags and not any(flags) and not r.complete
            await pool.close()

    asyncio.run(main())


def test_relay_hands_reads_to_the_sink_without_waking_its_task() -> None:
    """``relay`` gives each read to the sink from the connection's read callback; its own task
    sleeps until the body ends (one wake-up per response, not one per read: a 256-token stream
    is 256 reads). Counted by the futures the relay itself makes to wait on."""
    parts = [b"data: %d\n\n" % i for i in range(6)]
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"

    def script(req: bytes):
        return [(head, 0)] + [(f"{len(p):x}\r\n".encode() + p + b"\r\n", 0.01) for p in parts] + [(b"0\r\n\r\n", 0.01)]

    async def main() -> None:
        async with RawServer(script) as srv:
            pool = UpstreamPool()
            r = await pool.request(srv.url, "POST", "/ok", {}, b"")
            loop = asyncio.get_running_loop()
            made = 0
            create = loop.create_future

            def counted():
                nonlocal made
                made += sys._getframe(1).f_code is UpstreamResponse.relay.__code__
                return create()

            got: list[tuple[bytes, bool]] = []
            loop.create_future = counted  # type: ignore[method-assign]
            try:
                await r.relay(lambda data, last: got.append((data, last)))
            finally:
                del loop.create_future
            assert b"".join(d for d, _ in got) == b"".join(parts)
            assert [last for _, last in got] == [False] * (len(got) - 1) + [True]
            assert len(got) >= 3  # pieces flushed 10 ms apart came in reads of their own (a stalled loop may join some)
            assert made == 1, f"the relay's task woke {made} times for one response"
            await pool.close()

    asyncio.run(main())
