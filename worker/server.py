"""The reference worker's HTTP side: an OpenAI-compatible token-streaming server (aiohttp).

Why it exists: every test and demo of llmsla should see real inference — a real queue, real
continuous batching and real per-token timing — rather than ``sleep``. The model and the batching
live in :mod:`llmsla.worker.engine`; this module validates requests (4xx with a reason, never a
500 for client mistakes), streams tokens as SSE and adds the worker timing extension
(``"llmsla": {...}``, see docs/worker.md) that the gateway's tests compare against.

In-process use: ``async with serve(cfg, host, port) as w`` or ``WorkerThread(cfg).start()``.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from llmsla import config, names
from llmsla.config import Config
from llmsla.exporters import genai
from llmsla.exporters.policy_tracing import PolicyTracer
from llmsla.exporters.vllm_metrics import VllmMetrics
from llmsla.httpkit import (
    ApiError,
    Limits,
    Served,
    add_metrics,
    add_request_id,
    error_response,
    json_errors,
    parse_json_object,
    read_body,
)
from llmsla.httpkit import serve as serve_http
from llmsla.temperature import (
    TEMPERATURE_POLICIES,
    PolicyParams,
    Schedule,
    make_policy,
    policy_params,
    validate_schedule,
)
from llmsla.worker import model as lm
from llmsla.worker.engine import ABORT, Engine, GenRequest, WorkerMetrics, kv_budget
from llmsla.worker.fault import ADMIN_HOST, FaultControl, admin_app

log = logging.getLogger(__name__)

MAX_STOP = 4


MAX_BODY_BYTES = 4 << 20


def _bad(message: str, *, param: str | None = None, status: int = 400, code: str = "invalid_request") -> ApiError:
    """A client error in the OpenAI shape, naming ``param``."""
    return ApiError(status, message, code=code, param=param)


@dataclass
class Parsed:
    """A validated generation request."""

    chat: bool
    tokens: list[int]
    max_tokens: int
    temperature: float
    seed: int | None
    stop: tuple[bytes, ...]
    stream: bool
    policy: str
    ignore_eos: bool = False
    include_usage: bool = False  # stream_options.include_usage: a final usage chunk


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not (lo <= v <= hi):
        raise _bad(f"'{key}' must be a number between {lo:g} and {hi:g}, got {v!r}", param=key)
    return float(v)


def _int(body: dict, key: str, default: int | None, lo: int) -> int | None:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(f"'{key}' must be an integer, got {v!r}", param=key)
    if v < lo:
        raise _bad(f"'{key}' must be >= {lo}, got {v}", param=key)
    return v


def chat_prompt(messages: Any) -> str:
    """A plain chat template: one ``role: content`` line per message, then ``assistant: ``."""
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty list", param="messages")
    lines = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object", param="messages")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant", "tool", "developer"):
            raise _bad(f"messages[{i}].role must be system, user, assistant, tool or developer, got {role!r}", param="messages")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string, got {type(content).__name__}", param="messages")
        lines.append(f"{role}: {content}\n")
    return "".join(lines) + "assistant: "


def parse_request(body: Any, *, chat: bool, cfg: Config) -> Parsed:
    """Validate an OpenAI completions/chat body; ApiError (400/404) names the field."""
    w = cfg.worker
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    model = body.get("model")
    if model is None or model == "":
        raise _bad("missing field 'model'", param="model")
    if not isinstance(model, str):
        raise _bad("'model' must be a string", param="model")
    if model != w.model:
        raise _bad(f"model '{model}' not found; this worker serves '{w.model}'", param="model", status=404, code="model_not_found")
    if chat:
        tokens = lm.encode(chat_prompt(body.get("messages")))
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            tokens = lm.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            bad = [t for t in prompt if not 0 <= t < lm.VOCAB]
            if bad:
                raise _bad(f"token id {bad[0]} outside the vocabulary 0..{lm.VOCAB - 1}", param="prompt")
            tokens = list(prompt)
        elif prompt is None:
            raise _bad("missing field 'prompt'", param="prompt")
        else:
            raise _bad("'prompt' must be a string, a list with one string, or a list of token ids", param="prompt")
    if len(tokens) > w.max_prompt_tokens:
        raise _bad(f"prompt is {len(tokens)} tokens, more than max_prompt_tokens={w.max_prompt_tokens}", param="prompt")
    key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _int(body, key, min(16, w.max_tokens) if not chat else w.max_tokens, 1)
    assert max_tokens is not None
    if max_tokens > w.max_tokens:  # OpenAI refuses rather than silently cap
        raise _bad(f"'{key}' is too large: {max_tokens}. This model supports at most {w.max_tokens} "
                   f"completion tokens, whereas you provided {max_tokens}.", param=key, code="invalid_value")
    n = _int(body, "n", 1, 1)
    if n != 1:
        raise _bad("only n=1 is supported", param="n")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    seed = _int(body, "seed", None, 0)
    stop_raw = body.get("stop")
    if stop_raw is None:
        stops: list[str] = []
    elif isinstance(stop_raw, str):
        stops = [stop_raw]
    elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
        stops = stop_raw
    else:
        raise _bad("'stop' must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise _bad(f"'stop' takes at most {MAX_STOP} non-empty strings", param="stop")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be true or false", param="stream")
    include_usage = _stream_options(body.get("stream_options"), stream)
    policy = body.get("llmsla_policy", w.temperature_policy)
    if policy not in TEMPERATURE_POLICIES:
        raise _bad(f"'llmsla_policy' must be one of {', '.join(TEMPERATURE_POLICIES)}, got {policy!r}", param="llmsla_policy")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad("'ignore_eos' must be true or false", param="ignore_eos")
    return Parsed(chat, tokens, max_tokens, temperature, seed,
                  tuple(s.encode() for s in stops), stream, policy, ignore_eos, include_usage)


def _stream_options(value: Any, stream: bool) -> bool:
    """``stream_options.include_usage`` as OpenAI reads it: an object, only with ``stream``."""
    if value is None:
        return False
    if not stream:
        raise _bad("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    if not isinstance(value, dict):
        raise _bad("'stream_options' must be an object", param="stream_options")
    include = value.get("include_usage", False)
    if include is None:
        include = False
    if not isinstance(include, bool):
        raise _bad("'stream_options.include_usage' must be true or false", param="stream_options.include_usage")
    return include


def pool_schedule(headers: Mapping[str, str]) -> Schedule | None:
    """The temperature schedule the gateway sent for the request's pool (``names.SCHEDULE_HEADER``),
    or None; a malformed one is the caller's 400, naming the header."""
    raw = headers.get(names.SCHEDULE_HEADER)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ValueError("expected a JSON object {name, params}")
        return validate_schedule(value.get("name"), value.get("params"))
    except ValueError as exc:
        raise _bad(f"{names.SCHEDULE_HEADER}: {exc}", param=names.SCHEDULE_HEADER) from None


class Worker:
    """The aiohttp application around one :class:`Engine`."""

    def __init__(self, cfg: Config, engine: Engine, tracer: PolicyTracer, registry: CollectorRegistry,
                 metrics: WorkerMetrics) -> None:
        self.cfg, self.engine, self.tracer, self.registry, self.metrics = cfg, engine, tracer, registry, metrics
        self.fault = FaultControl(engine, registry, cfg.worker.model)
        self.limits = Limits.from_config(cfg)
        self.created = int(time.time())
        self.address: tuple[str, int] | None = None  # (host, port) once listening: server.address/port

    def app(self) -> web.Application:
        # OpenAI-shaped errors on every path (unknown ones too) and X-Request-Id on every response
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[json_errors])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.model)
        app.router.add_get("/healthz", self.healthz)
        add_metrics(app, self.registry)
        add_request_id(app)
        return app

    def _model_object(self) -> dict[str, Any]:
        return {"id": self.cfg.worker.model, "object": "model", "created": self.created, "owned_by": "llmsla"}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_object()]})

    async def model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}``: the model object, or OpenAI's 404 ``model_not_found``."""
        name = request.match_info["model"]
        if name != self.cfg.worker.model:
            raise _bad(f"The model '{name}' does not exist", param="model", status=404, code="model_not_found")
        return web.json_response(self._model_object())

    async def healthz(self, request: web.Request) -> web.Response:
        if self.engine.down:  # an injected crash (worker/fault.py): the gateway's prober sees it
            return web.json_response({"status": "down", "model": self.cfg.worker.model}, status=503)
        return web.json_response({"status": "ok", "model": self.cfg.worker.model, **self.engine.stats()})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _params(self, p: Parsed) -> PolicyParams:
        w = self.cfg.worker
        return PolicyParams(t_min=min(w.temperature_min, p.temperature), t_max=p.temperature, horizon=p.max_tokens,
                            decay=min(max(w.policy_decay, 1e-9), 1.0), entropy_target=w.entropy_target,
                            entropy_band=w.entropy_band, entropy_gain=w.entropy_gain)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        received = time.monotonic()
        try:
            raw = await read_body(request, max_bytes=MAX_BODY_BYTES, timeout_s=self.limits.body_timeout_s)
            p = parse_request(parse_json_object(raw), chat=chat, cfg=self.cfg)
            schedule = pool_schedule(request.headers)
        except ApiError as exc:
            return exc.response()
        if schedule is not None:  # the pool's schedule, set by the control plane, wins
            p.policy = schedule.name
            policy = make_policy(schedule.name, policy_params(schedule))
        else:
            policy = make_policy(p.policy, self._params(p))
        loop = asyncio.get_running_loop()
        op = genai.CHAT if chat else genai.TEXT_COMPLETION
        span = self.tracer.request_span(request.headers, self._span_attributes(op, p), operation=op,
                                        model=self.cfg.worker.model)
        req = GenRequest(tokens=p.tokens, max_tokens=p.max_tokens, policy=policy,
                         loop=loop, out=asyncio.Queue(), seed=p.seed, stop=p.stop, span=span, ignore_eos=p.ignore_eos,
                         zone=self.cfg.worker.pool, received=received)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        finished = False
        try:
            try:
                self.engine.submit(req)
            except RuntimeError as exc:  # stopping: tell the client to retry elsewhere
                finished = True
                return error_response(503, str(exc), code="unavailable", type_="server_error")
            if p.stream:
                resp = await self._stream(request, req, p, rid)
            else:
                resp = await self._collect(request, req, p, rid)
            finished = True
            return resp
        finally:
            if not finished:
                self.engine.cancel(req)
                span.set_attributes({names.OTEL_ATTR_STATUS: names.STATUS_CANCELLED,
                                     genai.ERROR_TYPE: names.STATUS_CANCELLED})
            span.end()

    def _span_attributes(self, op: str, p: Parsed) -> dict[str, Any]:
        """The request side of the GenAI server span, as this worker applies it."""
        model = self.cfg.worker.model
        attrs: dict[str, Any] = {
            genai.OPERATION_NAME: op, genai.PROVIDER_NAME: names.GENAI_PROVIDER, genai.REQUEST_MODEL: model,
            genai.REQUEST_TEMPERATURE: p.temperature, genai.REQUEST_MAX_TOKENS: p.max_tokens,
            names.OTEL_ATTR_POLICY: p.policy,
        }
        if p.stream:  # the conventions: set if and only if the request streams
            attrs[genai.REQUEST_STREAM] = True
        if p.seed is not None:
            attrs[genai.REQUEST_SEED] = p.seed
        if self.address is not None:
            attrs[genai.SERVER_ADDRESS], attrs[genai.SERVER_PORT] = self.address
        return attrs

    def _end_span(self, req: GenRequest, rid: str, timing: dict[str, Any], finish: str | None) -> None:
        """The response side of the request span: the same values the client gets in ``usage``
        and the timing extension (``timing``), so a trace and a response can be compared."""
        span = req.span
        if span is None or not span.is_recording():
            return
        attrs: dict[str, Any] = {
            genai.RESPONSE_MODEL: self.cfg.worker.model, genai.RESPONSE_ID: rid,
            genai.USAGE_INPUT_TOKENS: timing["prompt_tokens"], genai.USAGE_OUTPUT_TOKENS: timing["output_tokens"],
            names.OTEL_ATTR_POLICY: timing["policy"], names.OTEL_ATTR_QUEUE_MS: timing["worker_queue_ms"],
            names.OTEL_ATTR_STATUS: names.STATUS_OK if finish != "error" else names.STATUS_ERROR,
        }
        if timing["worker_ttft_ms"] is not None:
            attrs[names.OTEL_ATTR_TTFT_MS] = timing["worker_ttft_ms"]
        if finish == "error":
            attrs[genai.ERROR_TYPE] = names.STATUS_ERROR
            span.set_status(StatusCode.ERROR)
        elif finish is not None:
            attrs[genai.RESPONSE_FINISH_REASONS] = (finish,)
        span.set_attributes(attrs)

    def _timing(self, req: GenRequest, first_at: float | None, n_out: int) -> dict[str, Any]:
        admitted = req.admitted if req.admitted is not None else time.monotonic()
        return {
            "worker_ttft_ms": None if first_at is None else (first_at - req.received) * 1000.0,
            "worker_queue_ms": max(0.0, admitted - req.received) * 1000.0,
            "prompt_tokens": len(req.tokens),
            "output_tokens": n_out,
            "policy": req.policy.name,
        }

    def _usage(self, req: GenRequest, n_out: int) -> dict[str, int]:
        return {"prompt_tokens": len(req.tokens), "completion_tokens": n_out, "total_tokens": len(req.tokens) + n_out}

    async def _collect(self, request: web.Request, req: GenRequest, p: Parsed, rid: str) -> web.Response:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        parts: list[str] = []
        first_at = None
        n_out = 0
        while True:
            item = await req.out.get()
            if item[0] == "token":
                if first_at is None:
                    first_at = time.monotonic()
                    self.metrics.first_token.observe(first_at - req.received)
                n_out += 1
                parts.append(decoder.decode(bytes((item[1],))))
            elif item[0] == "done":
                finish = item[1]
                break
            else:
                self._end_span(req, rid, self._timing(req, first_at, n_out), "error")
                if len(item) > 2 and item[2] == ABORT:
                    _cut(request)
                return web.json_response({"error": {"message": item[1], "type": "server_error", "param": None, "code": None}}, status=503)
        parts.append(decoder.decode(b"", final=True))
        text = "".join(parts)
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if p.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        timing = self._timing(req, first_at, n_out)
        self._end_span(req, rid, timing, finish)
        return web.json_response({
            "id": rid, "object": "chat.completion" if p.chat else "text_completion", "created": int(time.time()),
            "model": self.cfg.worker.model, "choices": [choice], "usage": self._usage(req, n_out),
            "llmsla": timing,
        })

    async def _stream(self, request: web.Request, req: GenRequest, p: Parsed, rid: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        created = int(time.time())
        model = self.cfg.worker.model
        obj = "chat.completion.chunk" if p.chat else "text_completion"
        first_at = None
        n_out = 0
        finish = None
        while finish is None:
            items = [await req.out.get()]
            while not req.out.empty():  # coalesce what is already there into one write
                items.append(req.out.get_nowait())
            buf = []
            for item in items:
                if item[0] == "token":
                    text = decoder.decode(bytes((item[1],)))
                    if p.chat:
                        delta = {"role": "assistant", "content": text} if n_out == 0 else {"content": text}
                        choice = {"index": 0, "delta": delta, "finish_reason": None}
                    else:
                        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
                    n_out += 1
                    buf.append(_sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}))
                elif item[0] == "done":
                    finish = item[1]
                    break
                else:
                    if len(item) > 2 and item[2] == ABORT:  # crashed: the stream just stops
                        self._end_span(req, rid, self._timing(req, first_at, n_out), "error")
                        _cut(request)
                        return resp
                    buf.append(_sse({"error": {"message": item[1], "type": "server_error", "param": None,
                                                 "code": "generation_failed"}}))
                    finish = "error"
                    break
            if buf:
                if first_at is None and n_out:
                    first_at = time.monotonic()
                    self.metrics.first_token.observe(first_at - req.received)
                await resp.write(b"".join(buf))
        timing = self._timing(req, first_at, n_out)
        self._end_span(req, rid, timing, finish)
        if finish != "error":
            tail = decoder.decode(b"", final=True)
            if p.chat:
                choice = {"index": 0, "delta": {"content": tail} if tail else {}, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": tail, "logprobs": None, "finish_reason": finish}
            await resp.write(_sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
                                   "llmsla": timing}))
            if p.include_usage:  # OpenAI's shape: a last chunk with empty choices, only when asked
                await resp.write(_sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                                       "usage": self._usage(req, n_out)}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _cut(request: web.Request) -> None:
    """Drop the connection without ending the response, as a crashed process would."""
    if request.transport is not None:
        request.transport.abort()


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class RunningWorker:
    """What :func:`serve` yields."""

    url: str
    host: str
    port: int
    engine: Engine
    registry: CollectorRegistry
    policy_tracer: PolicyTracer
    worker: Worker
    admin_url: str | None = None  # the fault-injection endpoint's base URL (worker.admin_port)


def build(cfg: Config, *, registry: CollectorRegistry | None = None) -> Worker:
    """Model, engine, tracer and metrics for ``cfg`` (blocking: builds/trains the model)."""
    import torch

    config.check_worker_kv(cfg)  # before the model is built: a budget that cannot run a request
    torch.set_num_threads(cfg.worker.threads)
    registry = registry if registry is not None else CollectorRegistry()
    # the policy spool first: a spool that cannot take writes stops the worker before the model
    tracer = PolicyTracer(cfg, registry=registry, service_name=f"{cfg.otel.service_name}-worker")
    model = lm.build_model(cfg.worker.seed, train_steps=cfg.worker.train_steps,
                           spec=lm.ModelSpec(max_ctx=config.worker_context_tokens(cfg)))
    metrics = WorkerMetrics(registry, cfg.worker.model)
    blocks = kv_budget(cfg.worker.max_batch, model.spec.max_ctx, cfg.worker.kv_blocks)
    vllm = VllmMetrics(registry).engine(cfg.worker.model, num_blocks=blocks)
    engine = Engine(model, max_batch=cfg.worker.max_batch, tracer=tracer, metrics=metrics, threads=cfg.worker.threads,
                    kv_blocks=blocks, vllm=vllm)
    return Worker(cfg, engine, tracer, registry, metrics)


@contextlib.asynccontextmanager
async def serve(cfg: Config, host: str | None = None, port: int | None = None, *,
                registry: CollectorRegistry | None = None) -> AsyncIterator[RunningWorker]:
    """Run a worker in this event loop until the block exits; ``port=0`` picks a free port.

    Yields a :class:`RunningWorker` (``.url`` is the base URL without ``/v1``). On exit the HTTP
    server stops, the engine thread stops and pending decision spans are flushed to the spool.
    """
    host = cfg.worker.host if host is None else host
    port = cfg.worker.port if port is None else port
    worker = await asyncio.to_thread(build, cfg, registry=registry)
    worker.engine.start()
    served: Served | None = None
    admin: Served | None = None
    limits = Limits.from_config(cfg)
    try:
        served = await serve_http(worker.app(), host, port, limits)
        worker.address = (host, served.port)
        if cfg.worker.admin_port:  # loopback only, whatever the serving address
            admin = await serve_http(admin_app(worker.fault, token=cfg.worker.admin_token, limits=limits),
                                     ADMIN_HOST, cfg.worker.admin_port, limits)
        yield RunningWorker(served.url, host, served.port, worker.engine, worker.registry, worker.tracer, worker,
                            admin.url if admin is not None else None)
    finally:
        if admin is not None:
            await admin.stop()
        if served is not None:
            await served.stop()
        await asyncio.to_thread(worker.engine.stop)
        await asyncio.to_thread(worker.tracer.shutdown)


class WorkerThread:
    """A worker on its own event loop in a daemon thread, for synchronous tests and benches."""

    def __init__(self, cfg: Config, host: str = "127.0.0.1", port: int = 0) -> None:
        self.cfg, self.host, self.port = cfg, host, port
        self.url = ""
        self.running: RunningWorker | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_ev: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 120.0) -> str:
        self._thread = threading.Thread(target=self._main, name="llmsla-worker", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"worker did not start within {timeout_s} s")
        if self._error is not None:
            raise RuntimeError(f"worker failed to start: {self._error}") from self._error
        return self.url

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop_ev = asyncio.Event()
            async with serve(self.cfg, self.host, self.port) as w:
                self.running, self.url = w, w.url
                self._ready.set()
                await self._stop_ev.wait()

        try:
            asyncio.run(run())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._loop is not None and self._stop_ev is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop_ev.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def __enter__(self) -> WorkerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: keys of the worker timing extension (``"llmsla": {...}``) that the gateway reads
TIMING_KEYS = ("worker_ttft_ms", "worker_queue_ms", "prompt_tokens", "output_tokens")
