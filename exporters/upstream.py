"""A lean HTTP/1.1 client for the gateway's proxied requests (keep-alive pool, no framework).

aiohttp's client costs a handful of objects and task wake-ups per request, much of it on the
TTFT path; the gateway needs one prepared request and body pieces handed on as they arrive.
llhttp (``httptools``) does all the framing: do not add a hand-written parser here, where a
framing bug would be a request-smuggling bug. After a timeout or cancellation the caller must
``close`` the response so the upstream sees the disconnect and stops generating.
See docs/gateway.md#the-hot-path-why-it-is-built-this-way.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from urllib.parse import unquote, urlsplit

import httptools

from llmsla.redaction import redact

#: Pause reading from the upstream while this many decoded bytes wait for a slow client.
HIGH_WATER = 256 * 1024


class UpstreamProtocolError(ConnectionError):
    """The upstream broke HTTP/1.1 framing (bad status line, bad chunk size)."""


class _Conn(asyncio.Protocol):
    """One keep-alive connection; at most one response in flight. Framing is llhttp's (through
    ``httptools``, the parser uvicorn uses): status line, headers, chunked or content-length
    bodies, 1xx interim responses; this class only routes its callbacks."""

    __slots__ = ("key", "tr", "idle_since", "parser", "head_size", "until_close", "status", "headers",
                 "keep_alive", "queue", "queued", "waiter", "head_fut", "error", "got_bytes", "paused",
                 "done", "sink", "told_end")

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.tr: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.head_size = 0
        self.until_close = False  # no length, not chunked: the body ends when the upstream closes
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = True
        self.queue: deque[bytes] = deque()
        self.queued = 0
        self.waiter: asyncio.Future[None] | None = None
        self.head_fut: asyncio.Future[None] | None = None
        self.error: BaseException | None = None
        self.got_bytes = False
        self.paused = False
        self.done = False
        #: :meth:`UpstreamResponse.relay`'s callback: pieces go to it after each read, not the queue
        self.sink: Callable[[bytes, bool], None] | None = None
        #: the sink was told the body ended (a piece handed over with ``last`` True)
        self.told_end = False

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, tr: asyncio.BaseTransport) -> None:
        self.tr = tr  # type: ignore[assignment]  # a stream connection's: an asyncio.Transport
        sock = tr.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.tr = None
        if self.until_close and self.status and not self.done:  # the close ends the body
            self._finish()
            return
        if not self.done:
            self._fail(exc or ConnectionResetError("upstream closed the connection"
                                                   + (" mid-response" if self.got_bytes else "")))

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if self.done:  # bytes after a complete response: not reusable
            self.keep_alive = False
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, UpstreamProtocolError) as exc:
            self.keep_alive = False
            self._fail(UpstreamProtocolError(f"malformed upstream response: {exc}"))
            if self.tr is not None:
                self.tr.abort()
            return
        # this read's pieces to the relay's sink, in one call (the last with the end of the body);
        # an exception from the sink (its client gone) ends the relay with it. Inline: once per
        # token of a stream
        sink, q = self.sink, self.queue
        if sink is not None and (q or self.done):
            piece = q.popleft() if len(q) == 1 else b"".join(q)
            q.clear()
            self.queued = 0
            self.told_end = done = self.done
            try:
                sink(piece, done)
            except Exception as exc:  # noqa: BLE001 - handed to the relay's caller
                self.sink = None
                self._fail(exc)

    def pause_writing(self) -> None:  # the request body is small; nothing to pause
        pass

    # -- httptools callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.done:  # a second response on one request: a protocol violation for keep-alive
            self.keep_alive = False
            raise UpstreamProtocolError("bytes after the end of the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        if self.head_size > 65536:
            raise UpstreamProtocolError("response head over 64 KiB")
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # 1xx (e.g. 100 Continue): skip, the real head follows
            self.headers, self.head_size = {}, 0
            return
        self.status = status
        self.keep_alive = self.parser.should_keep_alive()
        hdrs = self.headers
        self.until_close = ("content-length" not in hdrs and "chunked" not in hdrs.get("transfer-encoding", "").lower()
                            and status not in (204, 304))
        if self.until_close:
            self.keep_alive = False
        if self.head_fut is not None and not self.head_fut.done():
            self.head_fut.set_result(None)

    def on_body(self, body: bytes) -> None:
        if not body:
            return
        self.queue.append(body)
        self.queued += len(body)
        if self.sink is not None:  # the relay's sink takes it at the end of this read: its task sleeps on
            return
        if self.queued > HIGH_WATER and not self.paused and self.tr is not None:
            self.paused = True
            self.tr.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status >= 200:
            self._finish()

    def _finish(self) -> None:
        self.done = True
        if self.head_fut is not None and not self.head_fut.done():
            self.head_fut.set_result(None)
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.keep_alive = False
        if self.head_fut is not None and not self.head_fut.done():
            self.head_fut.set_exception(exc)
            self.head_fut.exception()  # marked retrieved: the caller may be gone already
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)


class UpstreamResponse:
    """Status, lower-cased headers and the decoded body of one upstream response."""

    __slots__ = ("_pool", "_conn", "status", "headers", "_released")

    def __init__(self, pool: UpstreamPool, conn: _Conn) -> None:
        self._pool, self._conn = pool, conn
        self.status = conn.status
        self.headers: Mapping[str, str] = conn.headers
        self._released = False

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """Body pieces as they arrive (framing removed); raises ``ConnectionError`` when the
        upstream goes away before the body is complete."""
        c = self._conn
        q = c.queue
        while True:
            if q:
                data = q.popleft()
                c.queued -= len(data)
                if c.paused and c.queued < HIGH_WATER // 2 and c.tr is not None:
                    c.paused = False
                    c.tr.resume_reading()
                yield data
                continue
            if c.done:
                self.release()
                return
            if c.error is not None:
                raise c.error
            c.waiter = asyncio.get_running_loop().create_future()
            try:
                await c.waiter
            finally:
                c.waiter = None

    async def relay(self, sink: Callable[[bytes, bool], None]) -> None:
        """Hand the body to ``sink(data, last)`` from the connection's own read callback: each
        read's pieces in one call as they arrive, ``last`` True on the call that ends the body
        (its data may be empty), with no task step per piece. Returns when the body is complete;
        raises ``ConnectionError`` when the upstream goes away first, or what ``sink`` raised.
        Back-pressure is the caller's: :meth:`pause_reading` / :meth:`resume_reading`."""
        c = self._conn
        if c.queue or c.done:  # what arrived with the head
            data = b"".join(c.queue)
            c.queue.clear()
            c.queued = 0
            if c.paused and c.tr is not None:
                c.paused = False
                c.tr.resume_reading()
            c.told_end = c.done and c.error is None
            sink(data, c.told_end)
        while not c.done and c.error is None:
            c.sink = sink
            c.waiter = asyncio.get_running_loop().create_future()
            try:
                await c.waiter
            finally:
                c.waiter = None
                c.sink = None
        if c.error is not None:
            raise c.error
        if not c.told_end:  # the body ended with the connection (no length, not chunked)
            sink(b"", True)
        self.release()

    def pause_reading(self) -> None:
        c = self._conn
        if not c.paused and c.tr is not None:
            c.paused = True
            c.tr.pause_reading()

    def resume_reading(self) -> None:
        c = self._conn
        if c.paused and c.tr is not None:
            c.paused = False
            c.tr.resume_reading()

    @property
    def complete(self) -> bool:
        """The whole body has arrived and every piece was handed out: the piece just taken from
        :meth:`iter_chunks` was the last (the caller may send it with its own end of stream)."""
        c = self._conn
        return c.done and not c.queue and c.error is None

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([d async for d in self.iter_chunks()])

    def release(self) -> None:
        """Back to the pool when the body was read to its end on a keep-alive connection,
        else closed."""
        if self._released:
            return
        self._released = True
        c = self._conn
        if c.done and c.keep_alive and c.error is None and not c.queue and c.tr is not None \
                and not c.tr.is_closing():
            self._pool._put(c)
        else:
            self._pool._drop(c)

    close = release


class ConnectFailed(ConnectionError):
    """No connection to the replica could be opened (refused, unreachable, connect timeout):
    nothing of the request was sent, so another replica may take it."""


class UpstreamPool:
    """Keep-alive connections per ``(host, port)``; unlimited in number (the gateway bounds
    concurrency with its own semaphore). Idle connections older than ``keepalive_s`` are
    closed instead of reused (the upstream may have timed them out)."""

    def __init__(self, *, keepalive_s: float = 30.0, connect_timeout_s: float = 10.0) -> None:
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._hosts: dict[str, tuple[str, int, str]] = {}
        self._busy: set[_Conn] = set()
        self.connects = 0

    def _target(self, base_url: str) -> tuple[str, int, str]:
        """(host, port, the request head's fixed lines): ``Host`` without the URL's user info, and
        ``Authorization: Basic`` from it when the URL carries one (what aiohttp sends for the
        prober and ``/v1/models`` to the same URL), in place of a client's Authorization."""
        t = self._hosts.get(base_url)
        if t is None:
            u = urlsplit(base_url)
            if u.scheme != "http" or not u.hostname:
                raise ValueError(f"upstream URL must be http://host[:port], got {redact(base_url)!r}")
            port = u.port or 80
            hostport = u.netloc.rpartition("@")[2]
            fixed = f"Host: {hostport}\r\n"
            if u.username is not None:
                cred = f"{unquote(u.username)}:{unquote(u.password or '')}".encode()
                fixed += f"Authorization: Basic {base64.b64encode(cred).decode('ascii')}\r\n"
            t = self._hosts[base_url] = (u.hostname, port, fixed)
        return t

    async def _acquire(self, key: tuple[str, int]) -> tuple[_Conn, bool]:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            c = idle.pop()
            if c.tr is not None and not c.tr.is_closing() and now - c.idle_since < self.keepalive_s:
                c._reset()
                return c, True
            if c.tr is not None:
                c.tr.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, c = await loop.create_connection(lambda: _Conn(key), key[0], key[1])
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"cannot connect to {key[0]}:{key[1]}: {exc or type(exc).__name__}") from exc
        self.connects += 1
        return c, False

    async def request(self, base_url: str, method: str, path: str, headers: Mapping[str, str],
                      body: bytes = b"") -> UpstreamResponse:
        """Send one request and wait for the response head. A reused keep-alive connection
        that the upstream closed before answering a single byte is retried once on a new one
        (the request never reached a live server)."""
        host, port, fixed = self._target(base_url)
        head = [f"{method} {path} HTTP/1.1\r\n{fixed}Content-Length: {len(body)}\r\n"]
        own_auth = "Authorization" in fixed
        for k, v in headers.items():
            if own_auth and k.lower() == "authorization":
                continue
            head.append(f"{k}: {v}\r\n")
        head.append("\r\n")
        req = "".join(head).encode("latin-1") + body
        for attempt in (0, 1):
            c, reused = await self._acquire((host, port))
            self._busy.add(c)
            c.head_fut = asyncio.get_running_loop().create_future()
            c.tr.write(req)  # type: ignore[union-attr]  # _acquire returns a connected one
            try:
                await c.head_fut
            except ConnectionError:
                self._drop(c)
                if reused and attempt == 0 and not c.got_bytes:
                    continue
                raise
            except BaseException:  # timeout / cancellation while waiting for the head
                self._drop(c)
                raise
            return UpstreamResponse(self, c)
        raise AssertionError("unreachable")

    def _put(self, c: _Conn) -> None:
        self._busy.discard(c)
        c.idle_since = time.monotonic()
        c.head_fut = None
        self._idle.setdefault(c.key, []).append(c)

    def _drop(self, c: _Conn) -> None:
        self._busy.discard(c)
        if c.tr is not None:
            c.tr.abort()
            c.tr = None

    async def close(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                if c.tr is not None:
                    c.tr.close()
        self._idle.clear()
        for c in list(self._busy):
            self._drop(c)
        await asyncio.sleep(0)
