"""One request and its response, whichever server read it: the seam between the gateway's
completion logic and the two servers it runs on (aiohttp's, and the fast path of
``exporters/fastpath.py``).

The gateway's handler (tenancy, shedding, the per-client bound, routing, the proxied stream, the
record) is written once against :class:`Exchange`; each server supplies the request's head, its
body and a way to write the answer. See docs/gateway.md#the-fast-path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from llmsla.httpkit import HEAD_READ, REQUEST_ID, read_body

JSON = "application/json; charset=utf-8"


def error_body(message: str, *, code: str, param: str | None = None, type_: str = "invalid_request_error") -> bytes:
    """The OpenAI error shape's bytes (what ``httpkit.error_response`` sends)."""
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


#: ``Exchange.pusher``'s writer: (data, last) -> None, synchronous
Push = Callable[[bytes, bool], None]


class ClientGone(ConnectionResetError):
    """A write found the client gone (it disconnected, or its connection was closed)."""


class Exchange(Protocol):
    """A request being served: its head, its body on demand, and its answer.

    ``respond`` sends a whole answer (``flush``: now, so a failure to write raises here;
    otherwise the server may send it when the handler returns); ``start``/``write``/``end``
    stream one. A write to a client that left raises ``ConnectionError``."""

    method: str
    path: str
    remote: str | None
    headers: Mapping[str, str]
    #: ``time.perf_counter()`` when the request's first byte was read: the start of its clock
    arrival: float

    def set_request_id(self, rid: str) -> None: ...
    async def read_body(self, *, max_bytes: int, timeout_s: float) -> bytes: ...
    @property
    def prepared(self) -> bool: ...
    @property
    def status(self) -> int | None: ...
    async def respond(self, status: int, headers: Mapping[str, str], body: bytes, *, flush: bool = False,
                      close: bool = False) -> None: ...
    async def start(self, status: int, headers: Mapping[str, str]) -> None: ...
    async def write(self, data: bytes) -> None: ...
    async def end(self, last: bytes = b"") -> None: ...
    def pusher(self, pause: Callable[[], None], resume: Callable[[], None]) -> Push | None:
        """After :meth:`start`: a synchronous writer of the stream's pieces, ``last`` ending
        it, raising :class:`ClientGone`; it calls ``pause`` when the client's buffer is high and
        ``resume`` when it drained (the caller pauses its source). None: use :meth:`write`."""
        ...


class AiohttpExchange:
    """:class:`Exchange` over an aiohttp request; :attr:`response` is what the handler returns."""

    def __init__(self, request: web.Request, arrival: float) -> None:
        self.request = request
        self.method = request.method
        self.path = request.path
        self.remote = request.remote
        self.headers: Mapping[str, str] = request.headers
        self.arrival = arrival
        self.response: web.StreamResponse | None = None

    @classmethod
    def of(cls, request: web.Request, now: float) -> AiohttpExchange:
        return cls(request, request.get(HEAD_READ) or now)

    def set_request_id(self, rid: str) -> None:
        self.request[REQUEST_ID] = rid

    async def read_body(self, *, max_bytes: int, timeout_s: float) -> bytes:
        return await read_body(self.request, max_bytes=max_bytes, timeout_s=timeout_s)

    @property
    def prepared(self) -> bool:
        return self.response is not None and self.response.prepared

    @property
    def status(self) -> int | None:
        return None if self.response is None else self.response.status

    async def respond(self, status: int, headers: Mapping[str, str], body: bytes, *, flush: bool = False,
                      close: bool = False) -> None:
        resp = self.response = web.Response(status=status, body=body, headers=headers)
        if close:
            resp.force_close()
        if flush:
            await resp.prepare(self.request)
            await resp.write_eof()

    async def start(self, status: int, headers: Mapping[str, str]) -> None:
        resp = self.response = web.StreamResponse(status=status, headers=headers)
        await resp.prepare(self.request)

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        await self.response.write(data)

    async def end(self, last: bytes = b"") -> None:
        assert self.response is not None
        await self.response.write_eof(last)

    def pusher(self, pause: Callable[[], None], resume: Callable[[], None]) -> Push | None:
        return None  # aiohttp's writes are coroutines


def json_headers(extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """An error answer's headers: the JSON content type plus ``extra``."""
    h = {"Content-Type": JSON}
    if extra:
        h.update(extra)
    return h
