"""A minimal keep-alive HTTP/1.1 GET client for scrapes: one request at a time per connection,
a strict response reader, a size cap, no redirects, no proxies, no compression.

aiohttp's client costs about half a millisecond of CPU per request (request and response
objects, header multidicts, stream readers, tracing hooks); at 256 replicas a second that alone
was several times the scraper's budget. A scrape needs one thing: ``GET path`` and the body
of a ``200``. The reader takes the status line, headers, then a ``Content-Length`` or
``chunked`` body (or, without either, the body up to the connection's close), and refuses
anything else with a :class:`FetchError` whose ``reason`` is one of
``names.ENGINE_FAIL_REASONS``. Connections are kept per (scheme, host, port) and reused;
one the server closed while idle is replaced once, transparently. See docs/engines.md.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast
from urllib.parse import urlsplit

from llmsla import names

#: Status line and headers together; a longer head is refused (reason ``parse``).
MAX_HEAD = 64 * 1024
#: Idle keep-alive connections kept per (scheme, host, port).
MAX_IDLE = 1024


class FetchError(Exception):
    """A failed GET; ``reason`` is one of ``names.ENGINE_FAIL_REASONS``, ``status`` the HTTP
    status of a non-200 answer (None for other failures)."""

    def __init__(self, reason: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


class Response:
    """What a scrape keeps of a ``200``: the body and its Content-Type."""

    __slots__ = ("body", "content_type")

    def __init__(self, body: bytes, content_type: str | None) -> None:
        self.body = body
        self.content_type = content_type


class _Conn(asyncio.Protocol):
    """One connection; reads one response per :meth:`request`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[None] | None = None
        self.eof = False
        self.closed = False
        self.error: BaseException | None = None

    # -- protocol callbacks --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP and SSL transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = self.eof = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _more(self) -> None:
        """Wait for more bytes (or the end of the stream)."""
        if self.eof:
            raise FetchError(names.ENGINE_FAIL_PARSE, "connection closed mid-response"
                             + (f" ({self.error})" if self.error else ""))
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- one exchange --------------------------------------------------------------------------
    async def request(self, head: bytes) -> tuple[Response, bool]:
        """Send ``head``, read the response; (response, whether the connection can be reused).
        A non-200 is a :class:`FetchError` (``http_status``) after its head is read."""
        assert self.transport is not None
        self.transport.write(head)
        buf = self.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buf) > MAX_HEAD:
                raise FetchError(names.ENGINE_FAIL_PARSE, f"response head longer than {MAX_HEAD} bytes")
            if self.eof and not buf:
                raise _Stale()
            await self._more()
        if end > MAX_HEAD:
            raise FetchError(names.ENGINE_FAIL_PARSE, f"response head longer than {MAX_HEAD} bytes")
        status, version, headers = _head(bytes(buf[:end]))
        del buf[:end + 4]
        if status != 200:
            raise FetchError(names.ENGINE_FAIL_HTTP, f"HTTP {status}", status)
        if headers.get("content-encoding", "identity").strip().lower() != "identity":
            raise FetchError(names.ENGINE_FAIL_PARSE, f"Content-Encoding {headers['content-encoding']!r} not asked for")
        conn = headers.get("connection", "").lower()
        keep = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
        te = headers.get("transfer-encoding")
        if te is not None:
            if te.strip().lower() != "chunked":
                raise FetchError(names.ENGINE_FAIL_PARSE, f"Transfer-Encoding {te!r} not supported")
            body = await self._chunked()
        elif (cl := headers.get("content-length")) is not None:
            body = await self._sized(cl)
        else:
            body, keep = await self._to_close(), False
        if buf:  # bytes after the response: nothing was asked for, the connection is not trusted
            keep = False
        return Response(body, headers.get("content-type")), keep and not self.eof

    def _too_large(self, what: str) -> FetchError:
        return FetchError(names.ENGINE_FAIL_TOO_LARGE, f"{what} past engine.max_bytes {self.max_bytes}")

    async def _sized(self, raw: str) -> bytes:
        if not raw.strip().isdigit():
            raise FetchError(names.ENGINE_FAIL_PARSE, f"bad Content-Length {raw!r}")
        n = int(raw)
        if n > self.max_bytes:
            raise FetchError(names.ENGINE_FAIL_TOO_LARGE, f"Content-Length {n} > engine.max_bytes {self.max_bytes}")
        buf = self.buf
        while len(buf) < n:
            await self._more()
        if len(buf) == n:  # the usual case: the body is all there is, copied once
            body = bytes(buf)
            buf.clear()
            return body
        body = bytes(buf[:n])
        del buf[:n]
        return body

    async def _to_close(self) -> bytes:
        buf = self.buf
        while not self.eof:
            if len(buf) > self.max_bytes:
                raise self._too_large("body")
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if len(buf) > self.max_bytes:
            raise self._too_large("body")
        body = bytes(buf)
        buf.clear()
        return body

    async def _line(self) -> bytes:
        buf = self.buf
        while True:
            i = buf.find(b"\r\n")
            if i >= 0:
                line = bytes(buf[:i])
                del buf[:i + 2]
                return line
            if len(buf) > 4096:
                raise FetchError(names.ENGINE_FAIL_PARSE, "chunk-size line longer than 4096 bytes")
            await self._more()

    async def _chunked(self) -> bytes:
        out = bytearray()
        buf = self.buf
        while True:
            line = (await self._line()).split(b";", 1)[0].strip()
            try:
                if not line or line.lstrip(b"0123456789abcdefABCDEF"):
                    raise ValueError
                size = int(line, 16)
            except ValueError:
                raise FetchError(names.ENGINE_FAIL_PARSE, f"bad chunk size {line[:40]!r}") from None
            if size == 0:
                while await self._line():  # trailers up to the empty line
                    pass
                return bytes(out)
            if len(out) + size > self.max_bytes:
                raise self._too_large("chunked body")
            while len(buf) < size + 2:
                await self._more()
            if buf[size:size + 2] != b"\r\n":
                raise FetchError(names.ENGINE_FAIL_PARSE, "chunk not followed by CRLF")
            out += buf[:size]
            del buf[:size + 2]


class _Stale(Exception):
    """A kept connection closed by the server before any byte of the answer."""


def _head(raw: bytes) -> tuple[int, str, dict[str, str]]:
    """(status, HTTP version, lower-cased headers) of a response head; strict."""
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise FetchError(names.ENGINE_FAIL_PARSE, "undecodable response head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise FetchError(names.ENGINE_FAIL_PARSE, f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or "\n" in line:
            raise FetchError(names.ENGINE_FAIL_PARSE, f"bad header line {line[:80]!r}")
        key = name.lower()
        value = value.strip()
        if key in headers:
            if key in ("content-length", "transfer-encoding", "content-type"):
                if headers[key] != value:
                    raise FetchError(names.ENGINE_FAIL_PARSE, f"conflicting {name} headers")
                continue
            headers[key] = f"{headers[key]}, {value}"
        else:
            headers[key] = value
    if "transfer-encoding" in headers and "content-length" in headers:
        raise FetchError(names.ENGINE_FAIL_PARSE, "both Transfer-Encoding and Content-Length")
    return int(parts[1]), parts[0], headers


class Client:
    """GETs with kept connections; :meth:`close` drops them all."""

    def __init__(self, max_bytes: int, accept: str) -> None:
        self.max_bytes = max_bytes
        self.accept = accept
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._urls: dict[str, tuple[tuple[str, str, int], bytes]] = {}
        self._ssl: ssl.SSLContext | None = None

    def _target(self, url: str) -> tuple[tuple[str, str, int], bytes]:
        hit = self._urls.get(url)
        if hit is not None:
            return hit
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise FetchError(names.ENGINE_FAIL_CONNECT, f"not an http(s) URL: {url!r}")
        try:
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            raise FetchError(names.ENGINE_FAIL_CONNECT, f"bad port in {url!r}") from None
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        host = u.netloc.rpartition("@")[2]
        head = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: {self.accept}\r\n"
                "Accept-Encoding: identity\r\nUser-Agent: llmsla-engines\r\n\r\n").encode("latin-1", "replace")
        if len(self._urls) > 65536:
            self._urls.clear()
        hit = self._urls[url] = ((u.scheme, u.hostname, port), head)
        return hit

    async def _connect(self, key: tuple[str, str, int]) -> _Conn:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        ctx = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ctx = self._ssl
        try:
            _, proto = await loop.create_connection(lambda: _Conn(self.max_bytes), host, port, ssl=ctx)
        except (OSError, ssl.SSLError) as exc:
            raise FetchError(names.ENGINE_FAIL_CONNECT, f"{type(exc).__name__}: {exc}") from None
        return proto

    async def get(self, url: str) -> Response:
        """The body of a ``200`` from ``url``; :class:`FetchError` otherwise. No timeout of its
        own: the caller bounds it (a cancelled GET closes its connection)."""
        key, head = self._target(url)
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.closed or conn.eof or conn.buf:
                conn.close()
                continue
            try:
                return await self._exchange(key, conn, head)
            except _Stale:
                continue  # closed while idle: try the next kept one, then a fresh one
        conn = await self._connect(key)
        try:
            return await self._exchange(key, conn, head)
        except _Stale:
            raise FetchError(names.ENGINE_FAIL_CONNECT, "connection closed before any answer") from None

    async def _exchange(self, key: tuple[str, str, int], conn: _Conn, head: bytes) -> Response:
        try:
            resp, keep = await conn.request(head)
        except BaseException:
            conn.close()
            raise
        if keep:
            idle = self._idle.setdefault(key, [])
            if len(idle) < MAX_IDLE:
                idle.append(conn)
                return resp
        conn.close()
        return resp

    def close(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()
