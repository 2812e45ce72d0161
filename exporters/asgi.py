"""The gateway's instrumentation as ASGI middleware, for apps that serve the OpenAI API themselves.

Wrap an existing ASGI app (a FastAPI/Starlette inference server, vLLM's own API server, ...) and
every ``POST /v1/completions`` / ``/v1/chat/completions`` produces the same ``RequestEvent`` and
the same metrics as the proxy: TTFT from the first token-carrying SSE chunk the app sends, gaps
between chunks, E2E to the last body byte, tokens from ``usage``, W3C trace id. Nothing is
re-encoded: the body is read once (bounded), replayed to the app, and the app's messages pass
through unchanged. Requests the middleware cannot parse are passed through untouched (the app owns
its error messages) and counted in ``llmsla_gateway_bad_requests_total``.

It emits through the gateway's :class:`~llmsla.exporters.recording.Recorder`, so the spans (an
HTTP SERVER span and, under it, a GenAI span of kind INTERNAL: the model is in process) and the
OTLP metrics are the gateway's too. There is no gateway queue in front of an in-process app, so
``queue_ms`` is the time spent reading the request body; ``replica`` is this process
(constructor argument). Docs: docs/gateway.md (ASGI middleware).
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import Any

from llmsla import names
from llmsla.config import Config, check_key
from llmsla.exporters.arms import ArmAssigner
from llmsla.exporters.clients import ClientIdentity
from llmsla.exporters.openai import CHAT_COMPLETIONS, COMPLETIONS, parse_request, prompt_estimate
from llmsla.exporters.recorder import StreamTimer
from llmsla.exporters.recording import Recorder
from llmsla.exporters.tenants import TenantResolver
from llmsla.httpkit import ApiError
from llmsla.spool import SpoolWriter

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Headers(Mapping[str, str]):
    """An ASGI request's headers (lower-cased names) looked up by any case of a name, as the
    gateway's are: the tenant resolver asks for ``Authorization`` and the configured header names."""

    def __init__(self, lowered: dict[str, str]) -> None:
        self._h = lowered

    def __getitem__(self, key: str) -> str:
        return self._h[key.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._h)

    def __len__(self) -> int:
        return len(self._h)


class InstrumentedASGI:
    """``app = InstrumentedASGI(app, recorder, cfg, replica="pod-3")``, or
    ``InstrumentedASGI.from_config(app, cfg, spool=writer, replica="pod-3")`` to build the
    recorder from ``cfg``."""

    def __init__(self, app: ASGIApp, recorder: Recorder | Config, cfg: Config | None = None, *,
                 replica: str = "local", pool: str | None = None, arm_assigner: ArmAssigner | None = None,
                 paths: tuple[str, ...] = (COMPLETIONS, CHAT_COMPLETIONS), **old: Any) -> None:
        """``recorder``: where each request's event, metrics and spans go; ``cfg``: the
        gateway's request bounds (``max_body_bytes``, ``max_prompt_chars``) and pool."""
        if isinstance(recorder, Config):  # the old spelling InstrumentedASGI(app, cfg, registry=, spool=)
            warnings.warn("InstrumentedASGI(app, cfg, registry=, spool=) is deprecated: pass a Recorder, or "
                          "use InstrumentedASGI.from_config(app, cfg, ...)", DeprecationWarning, stacklevel=2)
            cfg, recorder = recorder, Recorder.from_config(recorder, registry=old.pop("registry", None),
                                                           spool=old.pop("spool", None))
        if old:
            raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(old))}")
        if cfg is None:
            raise TypeError("InstrumentedASGI needs the configuration (cfg)")
        self.app = app
        self.recorder = recorder
        self.metrics = recorder.metrics
        self.replica = replica
        self.pool = pool or cfg.gateway.pool
        self.arms = arm_assigner or ArmAssigner()
        self.paths = frozenset(paths)
        self.max_body = cfg.gateway.max_body_bytes
        self.max_prompt_chars = cfg.gateway.max_prompt_chars
        self._in_flight = self.metrics.in_flight_child(self.pool)
        # each request's tenant and class, resolved as the gateway resolves them (the same
        # [tenants] keys and the same trusted-proxy rule for the tenant header)
        for k in ("trusted_proxies", "client_header"):
            check_key(cfg, "gateway." + k)
        for k in ("header", "api_keys", "api_keys_file", "declared", "classes", "class_header", "default_class"):
            check_key(cfg, "tenants." + k)
        self.tenants = TenantResolver(cfg, ClientIdentity(cfg.gateway.trusted_proxies, cfg.gateway.client_header))

    @classmethod
    def from_config(cls, app: ASGIApp, cfg: Config, *, registry: Any = None, spool: SpoolWriter | None = None,
                    **kw: Any) -> InstrumentedASGI:
        """The middleware with a recorder of ``cfg`` (metrics in ``registry``, events to
        ``spool``, spans and OTLP metrics as ``otel.*`` says); other keywords as the constructor."""
        return cls(app, Recorder.from_config(cfg, registry=registry, spool=spool), cfg, **kw)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        arrival = time.perf_counter()
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return  # gone before it finished sending the request: nothing was asked
            body = msg.get("body", b"")
            size += len(body)
            chunks.append(body)
            if size > self.max_body or not msg.get("more_body", False):
                break
        raw = b"".join(chunks)
        replay_done = False

        async def replay() -> Message:
            nonlocal replay_done
            if not replay_done:
                replay_done = True
                return {"type": "http.request", "body": raw, "more_body": False}
            msg = await receive()
            if msg["type"] == "http.disconnect":
                state["disconnected"] = True
            return msg

        # told_all: the stream's [DONE] was sent, so a client leaving after it got its answer
        state: dict[str, Any] = {"disconnected": False, "code": None, "complete": False, "told_all": False}
        if size > self.max_body:
            self.metrics.bad_request("body_too_large")
            await self.app(scope, replay, send)
            return
        try:
            req = parse_request(raw, scope["path"], max_prompt_chars=self.max_prompt_chars)
        except ApiError as exc:
            self.metrics.bad_request(exc.code)
            await self.app(scope, replay, send)
            return

        incoming = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        client = scope.get("client")
        who = self.tenants.resolve(client[0] if client else None, _Headers(incoming))
        if who.folded_tenant:
            self.metrics.folded(names.L_TENANT)
        if who.folded_class:
            self.metrics.folded(names.L_CLASS)
        rec = self.recorder
        tel = rec.begin(incoming, "POST", scope["path"], req, arrival)  # the SERVER span, when traced
        trace_id = tel.trace_id
        arm = self.arms.assign(trace_id=trace_id, body=req.body, headers={**incoming, "traceparent": tel.traceparent})
        timer = StreamTimer(arrival, streaming=req.stream)

        async def watch(message: Message) -> None:
            t = message["type"]
            if t == "http.response.start":
                state["code"] = int(message["status"])
                ctype = next((v for k, v in message.get("headers", []) if k.lower() == b"content-type"), b"")
                timer.streaming = ctype.startswith(b"text/event-stream")
            elif t == "http.response.body":
                body = message.get("body", b"")
                if body:
                    timer.feed(body, time.perf_counter())
                if not message.get("more_body", False):
                    await send(message)
                    now = time.perf_counter()
                    timer.finish_body(now)
                    state["complete"] = True
                    return
                await send(message)
                state["told_all"] = timer.ended
                return
            await send(message)

        status = names.STATUS_ERROR
        self._in_flight.inc()
        timer.dispatch = time.perf_counter()
        # the app's spans hang under the GenAI span (as a replica's under the gateway's hop)
        traceparent = rec.hop(tel, None, req, incoming, timer.dispatch)
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"traceparent"]
        headers.append((b"traceparent", traceparent.encode()))
        scope = {**scope, "headers": headers}
        try:
            await self.app(scope, replay, watch)
            code = state["code"] or 500
            if not state["complete"] and not state["told_all"]:
                status = names.STATUS_CANCELLED if state["disconnected"] else names.STATUS_ERROR
            elif code < 400:
                status = names.STATUS_OK
            elif code == 429 or code < 500:
                status = names.STATUS_REJECTED
            elif code == 504:
                status = names.STATUS_TIMEOUT
        except (asyncio.CancelledError, OSError):  # the client went away (OSError: writing to it)
            status = names.STATUS_OK if state["told_all"] else names.STATUS_CANCELLED
            raise
        finally:
            self._in_flight.dec()
            end = time.perf_counter()
            valid = None  # the event the metrics saw, for the spans and OTLP
            admit = status == names.STATUS_OK
            try:
                ev = timer.event(end=end, ts_ms=time.time_ns() // 1_000_000, trace_id=trace_id, model=req.model,
                                 pool=self.pool, replica=self.replica, arm=arm, policy=req.policy, status=status,
                                 prompt_estimate=prompt_estimate(req.prompt_chars), tenant=who.tenant, class_=who.class_)
                ev.validate()
                valid = ev
                rec.record(ev, itl_gaps_ms=timer.gaps_ms, validate=False, first_token=timer.first_token is not None,
                           admit=admit)
            except Exception:
                log.exception("could not record request %s", trace_id)
            rec.end(tel, valid, timer, None, admit=admit)
            rec.finish(tel, state["code"])
