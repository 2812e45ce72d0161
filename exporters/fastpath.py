"""The gateway's fast path: its own HTTP/1.1 protocol (httptools) for the completion endpoints.

A proxied stream costs the gateway's core mostly in its HTTP server (aiohttp's request objects,
middleware chain, response machinery and chunk writer); this protocol serves ``POST
/v1/chat/completions`` and ``POST /v1/completions`` with a parser in C and a few writes, and hands
every other connection to aiohttp's protocol on the same socket (``httpkit.serve(front=...)``),
so /metrics, /v1/models, /healthz, 404s and anything unusual keep the general server.

What it takes: a request whose whole head arrived in one read (at the start of a connection or
after a finished request), whose line names a hot path, without ``Content-Encoding``, ``Expect``
or ``Upgrade``, framed by ``Content-Length`` or chunked. Anything else (a slow or split head, a
coded body, another path) hands the connection, with the bytes read so far, to aiohttp for the
rest of its life. The handler is the gateway's (``Gateway.complete``, through
:class:`exporters.exchange.Exchange`): both servers run the same request logic.

Kept from aiohttp's server: keep-alive and its idle timeout, pipelined requests answered in
order, the body size cap (413 from ``Content-Length`` before reading, or as the body grows), the
body timeout (408), 400 for a malformed request, a handler cancelled when its client disconnects,
reading paused while the transport's write buffer is high, the connection bound, and the clock:
a request's ``arrival`` is the ``data_received`` of its first byte, less the time the kernel held
it (:mod:`llmsla.tcpinfo`). See docs/gateway.md#the-fast-path.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from llmsla import tcpinfo
from llmsla.exporters.exchange import ClientGone, Push, error_body, json_headers
from llmsla.httpkit import LINGER_S, ApiError, Guard, GuardedHandler, Limits, derived_request_id

log = logging.getLogger(__name__)

#: Request lines the fast path serves (the path exactly, or followed by a query)
HOT_PATHS = (b"/v1/chat/completions", b"/v1/completions")
_HOT_PREFIXES = tuple(b"POST " + p + end for p in HOT_PATHS for end in (b" ", b"?"))
#: A head longer than this is left to aiohttp (its limits, its messages)
MAX_HEAD = 16 * 1024
#: Headers that send a request to aiohttp: a coded body, ``Expect: 100-continue``, an upgrade
_NOT_FAST = re.compile(rb"\r\n(?:content-encoding|expect|upgrade)[ \t]*:", re.IGNORECASE)
#: Control characters in a head (CR LF and TAB aside), and aiohttp's line limit: its 400s, not ours
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
MAX_LINE = 8190
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*([0-9]{1,18})[ \t]*\r\n", re.IGNORECASE)
_ANY_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding[ \t]*:", re.IGNORECASE)
#: Bytes buffered for the next pipelined request before reading pauses
MAX_BUFFERED = 256 * 1024
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_reasons: dict[int, bytes] = {}
_date: list[Any] = [0, b""]


def _status_line(status: int) -> bytes:
    line = _reasons.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Unknown"
        line = _reasons[status] = f"HTTP/1.1 {status} {phrase}\r\n".encode()
    return line


def _date_header() -> bytes:
    now = int(time.time())
    if _date[0] != now:
        _date[0], _date[1] = now, f"Date: {formatdate(now, usegmt=True)}\r\n".encode()
    return _date[1]


class _Message:
    """One request as the parser delivers it: its head, its body as it arrives."""

    __slots__ = ("arrival", "url", "raw_headers", "method", "headers", "keep_alive", "content_length",
                 "parts", "size", "done", "too_large", "error", "waiter", "sniffed", "version")

    def __init__(self, arrival: float, sniffed: bool) -> None:
        self.arrival = arrival
        self.sniffed = sniffed  # its head was checked before parsing (see the module's docstring)
        self.url = b""
        self.raw_headers: list[tuple[str, str]] = []
        self.method = ""
        self.headers: Mapping[str, str] = {}
        self.keep_alive = True
        self.version = "1.1"
        self.content_length: int | None = None
        self.parts: list[bytes] = []
        self.size = 0
        self.done = False
        self.too_large = False
        self.error: str | None = None
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class FastFront:
    """The protocol factory of a listening socket (``httpkit.serve(front=...)``): one
    :class:`FastProtocol` per connection, sharing the gateway's handler and the server's
    connection accounting, able to make aiohttp's protocol for a connection it hands over."""

    def __init__(self, handler: Callable[[FastExchange], Awaitable[None]], fallback: Callable[[], GuardedHandler],
                 guard: Guard, limits: Limits, max_body: int) -> None:
        self.handler = handler
        self.fallback = fallback
        self.guard = guard
        self.limits = limits
        self.max_body = max_body
        self.loop = asyncio.get_running_loop()
        #: requests served here / connections handed to aiohttp (tests and docs read them)
        self.served = 0
        self.handed_over = 0
        self.write_pauses = 0  # times a client's full write buffer paused reading (back-pressure)

    def __call__(self) -> FastProtocol:
        return FastProtocol(self)


class FastProtocol(asyncio.Protocol):
    """One client connection on the fast path (see the module's docstring)."""

    def __init__(self, front: FastFront) -> None:
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.buf = bytearray()
        self.buf_at = 0.0  # when the first byte now in ``buf`` was read, less its wait in the kernel
        self.sock: tuple[int, int] | None = None  # the connection's socket (descriptor, family), asked
        # how long bytes waited in the kernel
        self.msg: _Message | None = None  # the message the parser is in
        self.header_name = ""
        self.remaining = 0  # bytes of a Content-Length message still to feed the parser
        self.next_sniffed = False
        self.queue: deque[_Message] = deque()
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.closing = False
        self.write_paused = False
        self.reading_paused = False
        self.drain: asyncio.Future[None] | None = None
        self.on_resume: Callable[[], None] | None = None  # a paused relay's source, resumed on drain
        self.armed_for = 0.0  # what the timer was set for (the head timeout, keep-alive, linger)
        self.served = 0  # requests answered on this connection

    # -- connection ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream server's transport (uvloop's is not an asyncio.Transport subclass)
        transport = cast(asyncio.Transport, transport)
        guard = self.front.guard
        if guard.open >= guard.limits.max_connections:
            guard.refused += 1
            transport.write(_BUSY)
            transport.close()
            self.closing = True
            return
        guard.open += 1
        self.transport = transport
        self.sock = tcpinfo.descriptor(transport.get_extra_info("socket"))
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) and peer else None
        self._arm(self.front.limits.header_timeout_s)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.transport is None:
            return  # refused at the bound, or handed over
        self.transport = None
        self.closing = True
        self.front.guard.open -= 1
        self._disarm()
        if self.task is not None:
            self.task.cancel()  # the client left: its handler records ``cancelled``, aborts upstream
        if self.drain is not None and not self.drain.done():
            self.drain.set_exception(ConnectionResetError("client disconnected"))
        for m in self.queue:
            m.wake()

    def eof_received(self) -> bool:
        return False  # a half-closed client is gone: close, which cancels its handler

    def pause_writing(self) -> None:
        self.front.write_pauses += 1
        self.write_paused = True
        self._reading(pause=True)

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.on_resume is not None:
            resume, self.on_resume = self.on_resume, None
            resume()
        if self.drain is not None and not self.drain.done():
            self.drain.set_result(None)
        self.drain = None
        if len(self.buf) < MAX_BUFFERED:
            self._reading(pause=False)

    def _reading(self, *, pause: bool) -> None:
        t = self.transport
        if t is None or self.closing or pause == self.reading_paused:
            return
        self.reading_paused = pause
        if pause:
            t.pause_reading()
        else:
            t.resume_reading()

    def _arm(self, after_s: float) -> None:
        self._disarm()
        self.armed_for = after_s
        self.timer = self.front.loop.call_later(after_s, self._expire)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        if self.task is None and self.transport is not None:  # idle, or a lingering body's time is up
            if self.front.limits.header_timeout_s == self.armed_for and not self.served:
                self.front.guard.timed_out += 1  # no request head in time (aiohttp's count)
            self._close()

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    # -- reading ---------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if not self.buf:
            self.buf_at = time.perf_counter()
            if self.msg is None and not self.remaining:  # a new head, which a busy loop reads late:
                self.buf_at -= tcpinfo.waited_fd_s(self.sock)  # its clock starts when the kernel had it
        self.buf += data
        if self.timer is not None and self.task is None:
            self._disarm()
        self._process()

    def _process(self) -> None:
        buf = self.buf
        while buf and not self.closing:
            if self.remaining > 0:  # inside a Content-Length message
                n = min(self.remaining, len(buf))
                chunk = bytes(buf[:n])
                del buf[:n]
                self.remaining -= n
                if not self._feed(chunk):
                    return
            elif self.msg is not None:  # inside a chunked message (or one after it): the parser frames it
                chunk = bytes(buf)
                buf.clear()
                if not self._feed(chunk):
                    return
            elif self.task is not None:  # a response is going out: the next request waits its turn
                if len(buf) >= MAX_BUFFERED:
                    self._reading(pause=True)
                return
            elif not self._sniff():
                return

    def _sniff(self) -> bool:
        """At a message boundary with a response done: take the next request (True) or hand the
        connection to aiohttp (False)."""
        buf = self.buf
        end = buf.find(b"\r\n\r\n", 0, MAX_HEAD)
        if end < 0 or not buf.startswith(_HOT_PREFIXES):
            self._handover()
            return False
        head = bytes(buf[:end + 2])
        if _NOT_FAST.search(head) or _CONTROL.search(head) or (end > MAX_LINE and _long_line(head)):
            self._handover()
            return False
        length = _CONTENT_LENGTH.findall(head)
        if len(length) != len(_ANY_LENGTH.findall(head)) or len(length) > 1:  # odd framing: aiohttp's answer
            self._handover()
            return False
        if _CHUNKED.search(head):
            self.remaining = 0  # the parser finds the end (self.msg is set by the first feed)
        else:
            self.remaining = end + 4 + (int(length[0]) if length else 0)
        self.next_sniffed = True
        if self.remaining == 0:
            chunk = bytes(buf)
            buf.clear()
            return self._feed(chunk)
        return True

    def _feed(self, chunk: bytes) -> bool:
        try:
            self.parser.feed_data(chunk)
        except httptools.HttpParserError as exc:
            self._malformed(exc)
            return False
        return True

    def _handover(self) -> None:
        """aiohttp's protocol takes this connection, and the bytes read so far."""
        t = self.transport
        if t is None:
            return
        data = bytes(self.buf)
        self.buf.clear()
        self._disarm()
        if self.reading_paused:
            t.resume_reading()
        self.transport = None
        self.closing = True
        self.front.guard.open -= 1  # aiohttp's protocol counts it again
        self.front.handed_over += 1
        proto = self.front.fallback()
        t.set_protocol(proto)
        proto.connection_made(t)
        if data:
            proto.data_received(data)

    def _malformed(self, exc: Exception) -> None:
        """400 and close: a request the parser rejects (its reason in the answer)."""
        self.front.guard.malformed += 1
        log.debug("malformed request: %s", exc)
        reason = str(exc) or type(exc).__name__
        m = self.msg
        self.remaining = 0
        self.buf.clear()
        if m is not None and m in self.queue:  # its handler waits for the body: it answers
            m.error = reason
            m.wake()
            self.closing = True  # read no more
            return
        if self.task is None and self.transport is not None:
            body = error_body(f"malformed HTTP request: {reason}", code="bad_request")
            self.transport.write(_head(400, json_headers(), len(body), derived_request_id({}), close=True) + body)
        self._close()

    # -- httptools callbacks -----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.msg = _Message(self.buf_at, self.next_sniffed)
        self.next_sniffed = False

    def on_url(self, url: bytes) -> None:
        assert self.msg is not None
        self.msg.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.msg is not None
        self.msg.raw_headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        m = self.msg
        assert m is not None
        p = self.parser
        m.method = p.get_method().decode("ascii", "replace")
        m.keep_alive = p.should_keep_alive()
        m.version = p.get_http_version()
        headers = CIMultiDictProxy(CIMultiDict(m.raw_headers))
        m.headers = headers
        cl = headers.get("Content-Length")
        m.content_length = int(cl) if cl is not None and cl.isdigit() else None
        self.queue.append(m)
        if self.task is None:
            self.task = self.front.loop.create_task(self._run())

    def on_body(self, body: bytes) -> None:
        m = self.msg
        assert m is not None
        m.size += len(body)
        if m.size > self.front.max_body:
            m.too_large = True
            m.parts.clear()
            m.wake()
        elif not m.too_large:
            m.parts.append(body)

    def on_message_complete(self) -> None:
        m = self.msg
        assert m is not None
        m.done = True
        self.msg = None
        m.wake()
        if self.closing and self.task is None:
            self._close()  # a lingering body (answered already) ends: now close

    # -- serving ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        """Serve the queued requests in order; then take the next one, or wait idle."""
        try:
            while self.queue and self.transport is not None:
                m = self.queue[0]
                ex = FastExchange(self, m)
                try:
                    if m.sniffed or _is_hot(m):
                        self.front.served += 1
                        await self.front.handler(ex)
                    else:  # pipelined behind a chunked body in one read: not this protocol's to serve
                        await ex.respond(400, json_headers(), error_body(
                            f"{m.method} {m.url.decode('latin-1')} cannot be pipelined behind a chunked request "
                            "on this connection: send it on its own", code="bad_request"), close=True)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the handler answers everything itself: this is a bug, still answered
                    log.exception("fast path handler failed")
                    if not ex.prepared:
                        await ex.respond(500, json_headers(), error_body("internal error", code="internal_error",
                                                                         type_="gateway_error"), close=True)
                    else:
                        ex.close = True
                self.queue.popleft()
                self.served += 1
                if not ex.prepared:  # a handler that wrote nothing: still one answer
                    await ex.respond(500, json_headers(), error_body("no response", code="internal_error",
                                                                     type_="gateway_error"), close=True)
                if ex.close or not m.keep_alive or m.error is not None:
                    self._finish_close(m)
                    return
                if not m.done:  # answered before its body was read (413, 429): read no more of it
                    self._finish_close(m)
                    return
        finally:
            self.task = None
        if self.transport is None or self.closing:
            return
        self._arm(self.front.limits.keepalive_timeout_s)
        if self.buf:
            self._reading(pause=False)
            self._process()

    def _finish_close(self, m: _Message) -> None:
        """Close after this answer; a body still arriving is read and dropped for a short while
        first (``httpkit.LINGER_S``), so the client sees the answer rather than a reset."""
        self.queue.clear()
        t = self.transport
        if m.done or t is None or m.error is not None:
            self._close()
            return
        self.closing = True  # no new request on this connection
        m.too_large = True  # keep none of its bytes
        n = min(self.remaining, len(self.buf))
        self.remaining -= n
        self.buf.clear()
        if self.remaining == 0 and self.msg is None:
            self._close()
            return
        self._arm(LINGER_S)
        t.set_protocol(_Drain(t, self))
        if self.reading_paused:
            t.resume_reading()

    # -- writing ---------------------------------------------------------------------------------
    async def wait_drained(self) -> None:
        if self.transport is None:
            raise ConnectionResetError("client disconnected")
        if not self.write_paused:
            return
        if self.drain is None:
            self.drain = self.front.loop.create_future()
        await self.drain


class _Drain(asyncio.Protocol):
    """After an answer to a request whose body was not read: read and drop the rest of that body
    (the parser frames it), then close; the timer set before bounds how long."""

    def __init__(self, transport: asyncio.Transport, owner: FastProtocol) -> None:
        self.transport = transport
        self.owner = owner

    def data_received(self, data: bytes) -> None:
        o = self.owner
        if o.remaining > 0:
            n = min(o.remaining, len(data))
            o.remaining -= n
            if o.remaining == 0:
                self.transport.close()
            return
        try:
            o.parser.feed_data(data)  # chunked: on_message_complete closes
        except httptools.HttpParserError:
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        o = self.owner
        o._disarm()
        if o.transport is not None:
            o.transport = None
            o.front.guard.open -= 1

    def eof_received(self) -> bool:
        return False


def _long_line(head: bytes) -> bool:
    return any(len(line) > MAX_LINE for line in head.split(b"\r\n"))


def _is_hot(m: _Message) -> bool:
    path = m.url.split(b"?", 1)[0]
    return m.method == "POST" and path in HOT_PATHS


def _head(status: int, headers: Mapping[str, str], length: int | None, rid: str, *, close: bool,
          version: str = "1.1") -> bytes:
    """A response head: status line, ``headers``, ``X-Request-Id``, framing, Date."""
    out = [_status_line(status)]
    for k, v in headers.items():
        out.append(f"{k}: {v}\r\n".encode("utf-8", "surrogateescape"))
    out.append(f"X-Request-Id: {rid}\r\n".encode())
    if length is not None:
        out.append(b"Content-Length: %d\r\n" % length)
    elif version != "1.0":
        out.append(b"Transfer-Encoding: chunked\r\n")
    if close:
        out.append(b"Connection: close\r\n")
    out.append(_date_header())
    out.append(b"\r\n")
    return b"".join(out)


class FastExchange:
    """:class:`exporters.exchange.Exchange` on the fast path: the parsed request, the answer
    written straight to the transport (a streamed one chunked, its head sent with its first piece)."""

    __slots__ = ("proto", "msg", "method", "path", "remote", "headers", "arrival", "rid", "_status", "head",
                 "close", "chunked", "_prepared")

    def __init__(self, proto: FastProtocol, msg: _Message) -> None:
        self.proto = proto
        self.msg = msg
        self.method = msg.method
        self.path = msg.url.split(b"?", 1)[0].decode("latin-1")
        self.remote = proto.remote
        self.headers: Mapping[str, str] = msg.headers
        self.arrival = msg.arrival
        self.rid: str | None = None
        self._status: int | None = None
        self._prepared = False
        self.head = b""  # a streamed answer's head, sent with its first piece
        self.close = False
        self.chunked = msg.version != "1.0"

    def set_request_id(self, rid: str) -> None:
        self.rid = rid

    @property
    def prepared(self) -> bool:
        return self._prepared

    @property
    def status(self) -> int | None:
        return self._status

    def _rid(self) -> str:
        if self.rid is None:
            self.rid = derived_request_id(self.headers)
        return self.rid

    async def read_body(self, *, max_bytes: int, timeout_s: float) -> bytes:
        m = self.msg
        if m.content_length is not None and m.content_length > max_bytes:
            raise ApiError(413, f"request body of {m.content_length} bytes exceeds the limit of {max_bytes}",
                           code="body_too_large")
        if not m.done and not m.too_large and m.error is None:
            m.waiter = self.proto.front.loop.create_future()
            try:
                async with asyncio.timeout(timeout_s):
                    while not m.done and not m.too_large and m.error is None:
                        if self.proto.transport is None:
                            raise ConnectionResetError("client disconnected")
                        await m.waiter
                        m.waiter = self.proto.front.loop.create_future()
            except TimeoutError:
                raise ApiError(408, f"request body not received within {timeout_s:g} s", code="body_timeout") from None
            finally:
                m.waiter = None
        if m.error is not None:
            raise ApiError(400, f"malformed request body: {m.error}", code="bad_request")
        if m.too_large or m.size > max_bytes:
            raise ApiError(413, f"request body exceeds the limit of {max_bytes} bytes", code="body_too_large")
        return m.parts[0] if len(m.parts) == 1 else b"".join(m.parts)

    def _transport(self) -> asyncio.Transport:
        t = self.proto.transport
        if t is None or t.is_closing():
            raise ClientGone("client disconnected")
        return t

    async def respond(self, status: int, headers: Mapping[str, str], body: bytes, *, flush: bool = False,
                      close: bool = False) -> None:
        self._status, self._prepared = status, True
        self.close = self.close or close or not self.msg.keep_alive
        try:
            t = self._transport()
        except ConnectionResetError:
            if flush:
                raise
            return
        t.write(_head(status, headers, len(body), self._rid(), close=self.close) + body)
        if flush:
            await self.proto.wait_drained()

    async def start(self, status: int, headers: Mapping[str, str]) -> None:
        self._status, self._prepared = status, True
        if not self.chunked:
            self.close = True  # HTTP/1.0: the end of the connection ends the body
        self.close = self.close or not self.msg.keep_alive
        self.head = _head(status, headers, None, self._rid(), close=self.close, version=self.msg.version)

    async def write(self, data: bytes) -> None:
        if not data:
            return
        t = self._transport()
        if self.chunked:
            t.write(b"%s%x\r\n%s\r\n" % (self.head, len(data), data))
        else:
            t.write(self.head + data)
        self.head = b""
        if self.proto.write_paused:
            await self.proto.wait_drained()

    def pusher(self, pause: Callable[[], None], resume: Callable[[], None]) -> Push | None:
        proto, chunked = self.proto, self.chunked

        def push(data: bytes, last: bool) -> None:
            t = proto.transport
            if t is None or t.is_closing():
                raise ClientGone("client disconnected")
            if chunked:
                out = b"%s%x\r\n%s\r\n" % (self.head, len(data), data) if data else self.head
                if last:
                    out += b"0\r\n\r\n"
            else:
                out = self.head + data
            self.head = b""
            if out:
                t.write(out)
            if proto.write_paused and not last:  # the client reads slower than the upstream sends
                pause()
                proto.on_resume = resume

        return push

    async def end(self, last: bytes = b"") -> None:
        t = self._transport()
        out = self.head
        if last:
            out += b"%x\r\n%s\r\n" % (len(last), last) if self.chunked else last
        if self.chunked:
            out += b"0\r\n\r\n"
        t.write(out)
        self.head = b""
        if self.proto.write_paused:
            await self.proto.wait_drained()
