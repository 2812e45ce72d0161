"""The HTTP kit every llmsla server uses: one way to listen, to bound slow or numerous clients,
to read a request body, to answer an error (the OpenAI shape), to continue a W3C trace and to
serve ``/metrics``.

aiohttp alone leaves slow heads, unbounded connections and trickled bodies open to a hostile or
broken client; :func:`serve` and :func:`read_body` close them once for every server, so no
server can forget a bound. See docs/gateway.md#slow-and-numerous-clients.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import itertools
import json
import logging
import os
import random
import re
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from opentelemetry import trace as otel_trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CONTENT_TYPE_LATEST

from llmsla import tcpinfo
from llmsla.errors import UserError
from llmsla.events import string_problem
from llmsla.exposition import exposition

log = logging.getLogger(__name__)

#: After answering a request whose body was not read (413, 408), aiohttp keeps reading and
#: discarding for this long so the client sees the answer rather than a reset (its default, 10 s,
#: would let a trickling client keep the socket).
LINGER_S = 2.0
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True)
class Limits:
    """How long and how many: the slow-client bounds of one server (config ``[http]``)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 4096

    @classmethod
    def from_config(cls, cfg: Any) -> Limits:
        h = cfg.http
        return cls(h.header_timeout_s, h.body_timeout_s, h.keepalive_timeout_s, h.max_connections)


DEFAULT_LIMITS = Limits()


class ApiError(Exception):
    """An error answered with the OpenAI error shape, ``{"error": {message, type, param, code}}``:
    SDK clients surface the message whichever llmsla server (gateway, worker, control API,
    receiver) sent it."""

    def __init__(self, status: int, message: str, *, code: str, param: str | None = None,
                 type_: str = "invalid_request_error", headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = status, message, code, param, type_
        self.headers = headers

    def response(self) -> web.Response:
        return error_response(self.status, self.message, code=self.code, param=self.param, type_=self.type,
                              headers=self.headers)


def error_response(status: int, message: str, *, code: str, param: str | None = None,
                   type_: str = "invalid_request_error", headers: Mapping[str, str] | None = None) -> web.Response:
    """An OpenAI-shaped JSON error."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def check_bearer(request: web.Request, token: str, *, setting: str) -> None:
    """Control endpoints: ``Authorization: Bearer <token>``, compared exactly (never stripped) in
    constant time, else 401 with ``WWW-Authenticate``; an empty configured token refuses every
    call (503, naming ``setting``) instead of leaving the endpoint open."""
    if not token:
        raise ApiError(503, f"writes are disabled: {setting} is empty (set it, or its LLMSLA_* variable)",
                       code="writes_disabled")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    challenge = {"WWW-Authenticate": "Bearer"}
    if scheme.lower() != "bearer" or not given:
        raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <token>'", code="unauthorized",
                       headers=challenge)
    # the header's bytes as sent (aiohttp keeps a non-UTF-8 byte as a surrogate escape): such a
    # value is a wrong token, not a codec error
    if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode()):
        raise ApiError(401, "invalid bearer token", code="unauthorized", headers=challenge)


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error in the OpenAI shape: an :class:`ApiError` from a handler, and aiohttp's own
    answers (404, 405, 413 ...), which would otherwise be plain text without a reason."""
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "Retry-After")}
        if exc.status in (404, 405):  # OpenAI's wording for a path or method it does not serve
            return error_response(exc.status, f"Invalid URL ({request.method} {request.path})",
                                  code="unknown_url" if exc.status == 404 else "method_not_allowed", headers=headers)
        return error_response(exc.status, exc.reason or exc.text or "error",
                              code=exc.reason.lower().replace(" ", "_") if exc.reason else "error", headers=headers)


#: ``request[REQUEST_ID]``: the id a handler wants in the response's ``X-Request-Id`` (the gateway
#: puts its trace id there); without one, :func:`add_request_id` derives it.
REQUEST_ID: Any = web.RequestKey("llmsla_request_id", str) if hasattr(web, "RequestKey") else "llmsla_request_id"
REQUEST_ID_HEADER = "X-Request-Id"
#: ``time.perf_counter()`` of the socket read that completed the request's head (its first byte,
#: for any head that arrives in one read: all but a slowloris's), less the time those bytes had
#: waited in the kernel for a busy loop to read them (:mod:`llmsla.tcpinfo`), set by every
#: llmsla server before the handler runs: the start of the clock of what the client feels,
#: queueing included.
HEAD_READ: Any = web.RequestKey("llmsla_head_read", float) if hasattr(web, "RequestKey") else "llmsla_head_read"


def request_id(request: web.Request) -> str:
    """The request's id: what the handler set, else the trace id of its ``traceparent``, else a
    fresh random trace-id-shaped value (32 hex digits), so every response has one."""
    rid = request.get(REQUEST_ID)
    if rid is None:
        rid = request[REQUEST_ID] = derived_request_id(request.headers)
    return rid


def derived_request_id(headers: Mapping[str, str]) -> str:
    """The id of a request whose handler set none: the trace id of its ``traceparent``, else a
    fresh random trace-id-shaped value (32 hex digits)."""
    ctx = incoming_span(headers) if "traceparent" in headers else None
    return f"{ctx.trace_id:032x}" if ctx is not None and ctx.is_valid else f"{_rand(128) or 1:032x}"


def add_request_id(app: web.Application) -> None:
    """``X-Request-Id`` on every response of ``app`` (errors, 404s, streams and /metrics
    included), as OpenAI's API sends it: set just before the head goes out, so a streamed
    response gets it too."""

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        if REQUEST_ID_HEADER not in response.headers:
            response.headers[REQUEST_ID_HEADER] = request_id(request)

    app.on_response_prepare.append(on_prepare)


#: Content codings a request body may carry: what aiohttp's parser decodes here (br and zstd
#: only with their optional libraries). Anything else would be read as if it were plain.
ACCEPTED_ENCODINGS = frozenset({"identity", "gzip", "deflate"} | ({"br"} if HAS_BROTLI else set())
                               | ({"zstd"} if HAS_ZSTD else set()))


def unsupported_encoding(value: str) -> ApiError:
    """415 for a ``Content-Encoding`` this server does not decode (RFC 9110, 15.5.16)."""
    shown = value[:40] + ("..." if len(value) > 40 else "")
    return ApiError(415, f"Content-Encoding {shown!r} is not supported: send the body as "
                    f"{', '.join(sorted(ACCEPTED_ENCODINGS))} (one coding)", code="unsupported_encoding")


def check_encoding(request: web.Request) -> None:
    """:class:`ApiError` 415 unless the body's ``Content-Encoding`` is one coding this server
    decodes: a coding aiohttp does not know (``compress``, a typo) or a list of them would
    otherwise reach the handler undecoded."""
    value = request.headers.get("Content-Encoding")
    if value is None:
        return
    codings = [c.strip().lower() for c in value.split(",") if c.strip()]
    if len(codings) > 1 or any(c not in ACCEPTED_ENCODINGS for c in codings):
        raise unsupported_encoding(value)


async def read_body(request: web.Request, *, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body, decoded per its ``Content-Encoding``, or :class:`ApiError` 413 (too large)
    / 408 (not sent within ``timeout_s``: a client that trickles its body must not hold a slot
    forever) / 400 (a body that does not decode: one answer for every server, never a 500) /
    415 (a coding this server does not decode)."""
    check_encoding(request)
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(413, f"request body of {request.content_length} bytes exceeds the limit of {max_bytes}",
                       code="body_too_large")
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body exceeds the limit of {max_bytes} bytes", code="body_too_large") from None
    except TimeoutError:
        raise ApiError(408, f"request body not received within {timeout_s:g} s", code="body_timeout") from None
    except RequestPayloadError:  # e.g. "Content-Encoding: gzip" on a body that is not gzip
        encoding = request.headers.get("Content-Encoding", "")[:40]
        raise ApiError(400, f"request body does not decode as its Content-Encoding {encoding!r}",
                       code="invalid_encoding") from None


_INT_LIMIT = 2**63


def _bounded_int(text: str) -> int:
    value = int(text)
    if not -_INT_LIMIT <= value < _INT_LIMIT:
        raise ValueError(f"integer {text[:20]}{'...' if len(text) > 20 else ''} is out of the 64-bit range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite JSON number")


#: The decoder of :func:`loads_json`, made once: ``json.loads`` given hooks builds a new one at
#: every call, and the gateway decodes every request body.
_DECODER = json.JSONDecoder(parse_int=_bounded_int, parse_constant=_no_constant)

#: A ``\\uD800``-``\\uDFFF`` escape: the only way a lone surrogate gets into decoded JSON (raw
#: UTF-8 cannot carry one), so bodies without it skip the walk over their strings.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def text_problem(value: Any, what: str = "body") -> str | None:
    """Why some string in decoded JSON ``value`` (a key or a value) is not Unicode text, else None.

    A lone surrogate passes ``json.loads`` but crashes whatever later encodes it as UTF-8 (the
    worker's tokenizer, the spool, the store), so every input path refuses it up front."""
    stack: list[tuple[str, Any]] = [(what, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return f"{where}: {string_problem(v)}"
        elif isinstance(v, dict):
            for k, item in v.items():
                if not k.isascii() and (p := text_problem(k, f"{where} key")) is not None:
                    return p
                stack.append((f"{where}.{k}", item))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(v))
    return None


def loads_json(raw: bytes, *, what: str = "body", text: bool = True) -> Any:
    """The one JSON decode for every HTTP input path: ``ValueError`` with the reason for bytes
    that are not JSON, integers beyond 64 bits, ``NaN``/``Infinity``, nesting beyond what the
    decoder can hold, or (``text``) a string that is not Unicode text (a lone surrogate escape).
    A caller that audits bad strings item by item (the receiver's alerts) passes ``text=False``."""
    try:
        # what json.loads does with bytes and these hooks, with the shared decoder
        value = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except ValueError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{what} is not valid JSON: nested too deeply") from None
    if text and _SURROGATE_ESCAPE.search(raw) and (problem := text_problem(value, what)) is not None:
        raise ValueError(problem)
    return value


def parse_json_object(raw: bytes, *, what: str = "body") -> dict[str, Any]:
    """A JSON object, or :class:`ApiError` 400 saying why (see :func:`loads_json`), so no
    handler meets an int that overflows a float, a number that is not finite or a string
    that cannot be encoded."""
    if not raw.strip():
        raise ApiError(400, f"empty {what}: expected a JSON object", code="invalid_json")
    try:
        value = loads_json(raw, what=what)
    except ValueError as exc:
        raise ApiError(400, str(exc), code="invalid_json") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"{what} must be a JSON object, got {type(value).__name__}", code="invalid_json")
    return value


# -- W3C trace context ------------------------------------------------------------------------
_PROPAGATOR = TraceContextTextMapPropagator()
#: Span ids need uniqueness, not secrecy (OTel's SDK uses the same generator); the module
#: generator is reseeded in forked children, and unlike ``secrets`` it costs no syscall.
_rand = random.getrandbits


def trace_context(headers: Mapping[str, str], sample_ratio: float = 1.0) -> tuple[str, str]:
    """``(trace_id, traceparent for the next hop)``: the caller's W3C trace continued with a new
    span id (the caller's flags kept), or a fresh trace when the caller sent none or a broken
    one. Parsed by OpenTelemetry's propagator, the one parser every llmsla process uses.

    A fresh trace is sampled (flags ``01``) with probability ``sample_ratio``, decided on its
    trace id exactly as OpenTelemetry's ``TraceIdRatioBased`` sampler decides, so a process that
    records no spans of its own still makes the edge's sampling decision for everything below it.
    """
    return next_hop(incoming_span(headers), sample_ratio)


def incoming_span(headers: Mapping[str, str]) -> otel_trace.SpanContext:
    """The caller's span context from its ``traceparent`` (invalid if none or broken). A
    request without the header (most clients send none) is answered without the propagator,
    as it would answer: it looks the header up the same way, and has nothing else to read."""
    if headers.get("traceparent") is None:
        return otel_trace.INVALID_SPAN_CONTEXT
    return otel_trace.get_current_span(_PROPAGATOR.extract(headers)).get_span_context()


def next_hop(parent: otel_trace.SpanContext, sample_ratio: float = 1.0) -> tuple[str, str]:
    """:func:`trace_context` from an already parsed caller context."""
    if parent.is_valid:
        trace_id, flags = f"{parent.trace_id:032x}", f"{int(parent.trace_flags):02x}"
    else:
        tid = _rand(128) or 1
        trace_id, flags = f"{tid:032x}", "01" if ratio_sampled(tid, sample_ratio) else "00"
    return trace_id, f"00-{trace_id}-{_rand(64) or 1:016x}-{flags}"


def ratio_sampled(trace_id: int, sample_ratio: float) -> bool:
    """OpenTelemetry's ``TraceIdRatioBased`` rule: a trace is recorded iff the low 64 bits of
    its id fall below ``ratio * 2**64``, so every process decides alike on the same trace."""
    return sample_ratio >= 1.0 or (trace_id & _LOW64) < round(sample_ratio * _SPAN64)


_LOW64 = (1 << 64) - 1
_SPAN64 = 1 << 64


# -- /metrics -----------------------------------------------------------------------------------
def add_metrics(app: web.Application, *registries: Any) -> None:
    """``GET /metrics``: the text exposition of ``registries`` (none: the process's default
    registry, or the multi-process merge), rendered off the event loop."""

    unique = tuple(dict.fromkeys(registries)) or (None,)  # a registry shared by two owners, once

    async def handler(request: web.Request) -> web.Response:
        parts = await asyncio.to_thread(lambda: [exposition(r)[0] for r in unique])
        return web.Response(body=b"".join(parts), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/metrics", handler)


class Guard:
    """Connection accounting shared by the handlers of one server."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open = 0
        self.refused = 0  # connections turned away at the bound
        self.timed_out = 0  # connections closed for an incomplete request head
        self.malformed = 0  # requests aiohttp's parser rejected (400)


#: ``serve(front=...)``: (aiohttp's protocol factory, the connection accounting) -> the factory used
Front = Callable[[Callable[[], "GuardedHandler"], "Guard"], Callable[[], asyncio.BaseProtocol]]


class GuardedHandler(RequestHandler):
    """aiohttp's protocol plus a deadline on each request head and the connection bound.

    A head is complete when aiohttp's parser has produced a message (its request count moved);
    the deadline starts when the connection opens and when the first byte of a later head
    arrives, and closes the connection if that head is still incomplete when it fires."""

    def __init__(self, manager: web.Server, *, guard: Guard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._admitted = False
        self._heads = 0  # complete heads seen, to tell "a new head started" from "body bytes"
        self._head_timer: asyncio.TimerHandle | None = None
        self._sock: tuple[int, int] | None = None  # the connection's socket (descriptor, family),
        # asked how long a head waited in the kernel
        # when each parsed head was read, in the order aiohttp hands them to its request factory
        # (one per message, error placeholders included), so a request waiting behind others,
        # or for a busy event loop to run its handler, is timed from when it arrived
        self._head_reads: deque[float] = deque()
        make = self._request_factory
        assert make is not None
        reads = self._head_reads

        def stamped(*args: Any) -> web.BaseRequest:
            request = make(*args)
            if reads:
                request[HEAD_READ] = reads.popleft()
            return request

        self._request_factory = stamped

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        if guard.open >= guard.limits.max_connections:
            guard.refused += 1
            transport.write(_BUSY)  # type: ignore[attr-defined]  # a stream server's: an asyncio.Transport
            transport.close()
            return
        guard.open += 1
        self._admitted = True
        self._sock = tcpinfo.descriptor(transport.get_extra_info("socket"))
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        super().data_received(data)
        count = self._request_count
        if count != self._heads:  # the head (or several pipelined ones) is complete
            now -= tcpinfo.waited_fd_s(self._sock)
            self._head_reads.extend(itertools.repeat(now, count - self._heads))
            self._heads = count
            self._disarm()
        elif self._head_timer is None and not self._request_in_progress:
            self._arm()  # first bytes of the next head on a kept-alive connection

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        if self._admitted:
            self._admitted = False
            self._guard.open -= 1
            super().connection_lost(exc)

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        """A client's malformed bytes are its problem: one DEBUG line, not an ERROR traceback
        per request (log flooding), also when aiohttp drains a body that does not decode after the
        handler answered; anything else (a handler's bug) keeps aiohttp's ERROR."""
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError | RequestPayloadError):
            self._guard.malformed += 1
            log.debug("malformed request: %s", exc)
            return
        super().log_exception(*args, **kwargs)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A body coding the parser cannot decode (br or zstd without their libraries) is the
        same OpenAI-shaped 415 as any other unsupported coding, not aiohttp's plain-text 400."""
        if isinstance(exc, ContentEncodingError) and request.writer.output_size == 0:
            self.log_exception("unsupported content coding", exc_info=exc)
            # the parser failed before the request existed: its placeholder has no headers, the
            # coding is in aiohttp's message ("... brotli (br) ...")
            named = re.search(r"\((\w+)\)", str(exc))
            resp = unsupported_encoding(named.group(1) if named else "unknown").response()
            resp.force_close()
            return resp
        return super().handle_error(request, status, exc, message)

    def _arm(self) -> None:
        self._head_timer = self._loop.call_later(self._guard.limits.header_timeout_s, self._expire, self._heads)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expire(self, heads: int) -> None:
        self._head_timer = None
        if self._request_count == heads and not self._request_in_progress:
            self._guard.timed_out += 1
            if self.transport is not None:
                self.transport.close()


@dataclass
class Served:
    """A running server: where it listens and how to stop it."""

    runner: web.AppRunner
    server: asyncio.Server
    host: str
    port: int
    guard: Guard

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        self.server.close()
        await self.runner.cleanup()


class BindError(UserError):
    """A server could not listen where it was told to; the message says where and why, and
    ``errno`` keeps the cause's (EADDRINUSE, ...)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def bind_problem(host: str, port: int, exc: OSError) -> str:
    """One line for a failed listen on ``host:port``: what every server command prints."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return f"cannot listen on {shown}: cannot resolve host {host!r} ({exc.strerror or exc})"
    if not 0 <= port <= 65535:
        return f"cannot listen on {shown}: port must be 0..65535"
    hint = {errno.EADDRINUSE: " (another process listens there; pick another port, or 0 for a free one)",
            errno.EACCES: " (ports below 1024 need privileges)" if 0 < port < 1024 else "",
            errno.EADDRNOTAVAIL: " (not an address of this machine)"}.get(exc.errno or 0, "")
    # asyncio re-raises with its own long strerror; the errno's text is the short one
    reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
    return f"cannot listen on {shown}: {reason}{hint}"


async def serve(app: web.Application, host: str, port: int, limits: Limits = DEFAULT_LIMITS, *,
                reuse_port: bool = False, handler_cancellation: bool = True,
                on_listening: Callable[[int], None] | None = None,
                front: Front | None = None) -> Served:
    """Listen on ``host:port`` (0 = a free port) with the slow-client bounds of ``limits``.
    ``front``: a protocol factory put before aiohttp's (given aiohttp's factory and the
    connection accounting), which serves what it can and hands each other connection over
    (the gateway's fast path, docs/gateway.md#the-fast-path)."""
    runner = web.AppRunner(app, handler_cancellation=handler_cancellation, access_log=None)
    await runner.setup()
    server = runner.server
    assert server is not None
    guard = Guard(limits)
    loop = asyncio.get_running_loop()
    tcpinfo.prime()  # once per process: what the kernel's receive times count in

    def factory() -> GuardedHandler:
        return GuardedHandler(server, guard=guard, loop=loop, keepalive_timeout=limits.keepalive_timeout_s,
                               lingering_time=LINGER_S, access_log=None)

    make: Callable[[], asyncio.BaseProtocol] = factory if front is None else front(factory, guard)
    try:
        srv = await loop.create_server(make, host, port, reuse_port=reuse_port or None, backlog=1024)
    except OSError as exc:  # in use, unresolvable, not ours, permission denied: one line, not a traceback
        await runner.cleanup()
        raise BindError(bind_problem(host, port, exc), exc.errno) from None
    except BaseException:
        await runner.cleanup()
        raise
    sock = srv.sockets[0]
    bound = sock.getsockname()[1]
    if on_listening is not None:
        on_listening(bound)
    return Served(runner, srv, host, bound, guard)


async def serve_exporter(registry: Any, host: str, port: int, limits: Limits,
                         run: Callable[[asyncio.Event], Awaitable[None]], *, banner: Callable[[str], str],
                         healthz: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None) -> None:
    """A collector's process (``llmsla gpu``, ``llmsla engines``): ``registry`` on ``/metrics`` and
    a liveness ``/healthz`` (default: ok and the pid, without rendering the metrics) on
    ``host:port``; ``run(stop)`` until SIGTERM or SIGINT sets ``stop``, then the server stops.
    ``banner(url)`` is printed once listening."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def alive(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "ok", "pid": os.getpid()})

    app = web.Application()
    add_metrics(app, registry)
    app.router.add_get("/healthz", healthz or alive)
    served = await serve(app, host, port, limits)
    print(banner(served.url), flush=True)
    try:
        await run(stop)
    finally:
        await served.stop()


class BackgroundServer:
    """Serves apps from an event loop on a daemon thread, for synchronous programs (the fleet
    simulator, the forecaster's loop) that still expose ``/metrics`` or a control API the one
    way every llmsla server does. ``with BackgroundServer() as bg: bg.serve(app, host, port)``."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._served: list[Served] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="llmsla-http", daemon=True)
        self._thread.start()

    def serve(self, app: web.Application, host: str, port: int, limits: Limits = DEFAULT_LIMITS) -> Served:
        served = asyncio.run_coroutine_threadsafe(serve(app, host, port, limits), self._loop).result(30)
        self._served.append(served)
        return served

    def close(self) -> None:
        async def stop_all() -> None:
            for s in self._served:
                await s.stop()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop_all(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
        self._loop.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
