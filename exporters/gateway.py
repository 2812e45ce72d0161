"""The instrumented OpenAI-compatible reverse proxy (``llmsla gateway``).

It sits in front of vLLM-compatible replicas and measures what the user feels (queue time, TTFT,
inter-token gaps, E2E, tokens, outcome). Every request that passed validation ends in exactly one
``RequestEvent``, recorded in a ``finally`` so cancellation and upstream failures cannot lose it;
response bytes are forwarded as they arrive, never re-encoded.
See docs/gateway.md#outcomes and docs/gateway.md#the-hot-path-why-it-is-built-this-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from prometheus_client import CollectorRegistry

from llmsla import names
from llmsla.config import Config, check_key
from llmsla.control.plane import ControlPlane
from llmsla.control.replica import LastReplicaError
from llmsla.control.rollout import OUTSIDE, Assignment, Rollout
from llmsla.control.router import NoReplicaAvailable, Replica
from llmsla.events import RequestEvent
from llmsla.exporters.clients import ClientIdentity
from llmsla.exporters.exchange import (
    AiohttpExchange,
    ClientGone,
    Exchange,
    error_body,
    json_headers,
)
from llmsla.exporters.fastpath import FastFront
from llmsla.exporters.gateway_telemetry import RequestTelemetry
from llmsla.exporters.openai import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    ParsedRequest,
    UsageStripper,
    parse_request,
    prompt_estimate,
    storable_label,
    unit_key,
    wants_usage,
    with_usage,
)
from llmsla.exporters.recorder import StreamTimer
from llmsla.exporters.recording import Recorder
from llmsla.exporters.saturation import SaturationMonitor
from llmsla.exporters.tenants import Tenancy, TenantResolver
from llmsla.exporters.upstream import ConnectFailed, UpstreamPool, UpstreamResponse
from llmsla.httpkit import (
    ApiError,
    Guard,
    GuardedHandler,
    Limits,
    Served,
    add_metrics,
    add_request_id,
    error_response,
    json_errors,
)
from llmsla.httpkit import serve as serve_http
from llmsla.seams import ReplicaRef
from llmsla.temperature import Schedule

log = logging.getLogger(__name__)
#: replicas one request may try when a connection is refused (nothing sent, so safe to retry)
MAX_CONNECT_TRIES = 3

#: ``error.type`` of errors the gateway itself answers (vs. the client's invalid request).
GATEWAY_ERROR = "gateway_error"
#: Request headers passed to the upstream besides the body's content type and ``traceparent``.
FORWARD_HEADERS = ("Authorization", "tracestate", "X-Request-Id", "Accept")
REPLICA_HEADER = "X-Llmsla-Replica"
#: ``Retry-After`` of a shed request: the receiver steps shedding about once a minute, so a
#: client retrying much sooner would be shed again
SHED_RETRY_AFTER_S = 30
_HEX = frozenset("0123456789abcdef")
#: Trace/span ids need uniqueness, not secrecy (OTel's SDK uses the same generator); the module
#: generator is reseeded in forked children, and unlike ``secrets`` it costs no syscall.
_rand = random.getrandbits


def check_arm_pools(rollout: Rollout, pool: str, pools: list[str], where: str = "configuration") -> None:
    """Every arm of the experiment on ``pool`` must send its units to a pool this gateway has
    (the rule is :func:`llmsla.config.check_arm_pools`, which ``config check`` runs too)."""
    from llmsla.config import check_arm_pools as check

    check(rollout.experiments, pool, pools, where)


# -- the proxy ----------------------------------------------------------------------------------
class Gateway:
    """The aiohttp application and its per-request logic; one instance per process."""

    def __init__(self, cfg: Config, *, plane: ControlPlane, recorder: Recorder,
                 registry: CollectorRegistry | None = None,
                 background: Sequence[Callable[[asyncio.Event], Awaitable[None]]] = ()) -> None:
        """``plane``: the router it picks replicas from, the pools' distillation controls and
        the A/B rollout it applies (and the prober it runs); ``recorder``: where every finished
        request goes (metrics, spool, spans); ``registry``: what its /metrics shows (None: the
        process's default, or the multi-process merge); ``background``: loops run while it
        serves, each until its event is set (the engine signals feed of
        ``gateway.engine_signals``). ``llmsla.app.wiring.gateway`` builds them from the
        configuration."""
        g = cfg.gateway
        self.background = list(background)
        self._background_stop = asyncio.Event()
        self._background_tasks: list[asyncio.Task[None]] = []
        self.cfg = cfg
        self.pool = g.pool
        self.registry = registry
        self.plane = plane
        self.router = plane.router
        # the pool's student share and temperature schedule, set through the control API (or its
        # Redis stream with several gateways) and applied to every request here
        self.distill = plane.distill
        # A/B arms of the experiment on this pool: label, strategy (pool, route policy, student
        # share, schedule); weight/coverage changes ride the router's shared stream like distill's
        self.rollout = plane.rollout
        # the share of each request class this pool refuses (load shedding), set through the
        # control API while a more protected class burns its error budget
        self.shed = plane.shed
        self.shed_retry_after_s = SHED_RETRY_AFTER_S
        # the router's pools, and with discovery the configured ones its replicas will join
        pools = list(dict.fromkeys([*self.router.pools(), *self.distill.pools()]))
        check_arm_pools(self.rollout, self.pool, pools, cfg.source or "configuration")
        self.prober = plane.prober
        self.membership = plane.membership
        # schedule header texts by schedule object: the pool's (changed by the control plane) and
        # each arm's; the identity check makes a reused id() harmless
        self._schedule_cache: dict[int, tuple[Schedule, str]] = {}
        self.recorder = recorder
        self.metrics = recorder.metrics
        self.telemetry = recorder.telemetry
        self.timeout_s = g.request_timeout_s
        self.max_in_flight = g.max_in_flight
        self.max_body = g.max_body_bytes
        self.limits = Limits.from_config(cfg)
        self.body_timeout_s = self.limits.body_timeout_s
        self.max_prompt_chars = g.max_prompt_chars
        self.max_concurrency = g.max_concurrency
        self.in_flight = 0
        # the per-client bound (gateway.client_share of max_in_flight): slots held per client
        # key, checked before the body is read; a key leaves the dict when it reaches zero
        for k in ("client_share", "trusted_proxies", "client_header"):  # a Config built in code
            check_key(cfg, "gateway." + k)
        self.client_share = g.client_share
        self.client_cap = max(1, int(g.client_share * g.max_in_flight)) if g.client_share < 1 else 0
        self.clients = ClientIdentity(g.trusted_proxies, g.client_header)
        # each request's tenant and class (labels of its series and its event), from an API key or
        # a trusted proxy's header, before the body is read; bounded by the configuration
        for k in ("header", "api_keys", "api_keys_file", "declared", "classes", "class_header", "default_class"):
            check_key(cfg, "tenants." + k)
        self.tenants = TenantResolver(cfg, self.clients)
        self.client_slots: dict[str, int] = {}
        self._proxy_warned: set[str] = set()
        self._slots: asyncio.Semaphore | None = None
        self.session: ClientSession | None = None  # prober and /v1/models (off the hot path)
        self.upstream: UpstreamPool | None = None  # the proxied requests
        self._in_flight_gauge = self.metrics.in_flight_child(self.pool)
        self._models_cache: tuple[float, dict[str, Any]] | None = None
        #: models a replica listed in /v1/models or answered for: a failure naming one counts
        #: under its name before any success (other names fold into ``other`` until one succeeds)
        self.served_models: set[str] = set()
        self._models_task: asyncio.Task[None] | None = None
        self.request_usage = g.request_usage
        self.record_errors = 0
        self._record_error_logged = 0.0

    # -- lifecycle -------------------------------------------------------------------------------
    def app(self) -> web.Application:
        # OpenAI-shaped errors on every path (unknown ones too) and X-Request-Id on every response
        app = web.Application(client_max_size=self.max_body, middlewares=[json_errors])
        app.router.add_post(COMPLETIONS, self.handle_completion)
        app.router.add_post(CHAT_COMPLETIONS, self.handle_completion)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/v1/models/{model:.+}", self.handle_model)
        app.router.add_get("/healthz", self.handle_health)
        add_metrics(app, self.registry)
        add_request_id(app)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self.session = ClientSession(
            connector=TCPConnector(limit=0, keepalive_timeout=30.0),
            timeout=ClientTimeout(total=None, sock_connect=10.0),
        )
        self.upstream = UpstreamPool(keepalive_s=30.0, connect_timeout_s=10.0)
        if self.membership is not None:  # the first answer (and its probes) before serving
            await self.membership.sync_once(self.session)
            self.membership.start(self.session)
        self.prober.start(self.session)
        self._models_task = asyncio.create_task(self._learn_models(), name="llmsla-gateway-models")
        self._background_stop.clear()
        self._background_tasks = [asyncio.create_task(self._run_background(run), name="llmsla-gateway-background")
                                  for run in self.background]

    async def _run_background(self, run: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        try:
            await run(self._background_stop)
        except Exception:  # noqa: BLE001 - logged: the gateway serves on without it
            log.exception("gateway background loop failed")

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._models_task is not None:
            self._models_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._models_task
        self._background_stop.set()
        await asyncio.gather(*self._background_tasks, return_exceptions=True)
        if self.membership is not None:
            await self.membership.stop()
        await self.prober.stop()
        if self.upstream is not None:
            await self.upstream.close()
        if self.session is not None:
            await self.session.close()
        await asyncio.to_thread(self.recorder.shutdown)  # last spans and metric points out

    def _first_token(self, rid: str, timer: StreamTimer, prompt_tokens: int, ahead: float) -> None:
        """The first token came back: the router learns the replica's prefill speed from it."""
        try:
            self.router.first_token(rid, ((timer.first_token or 0.0) - (timer.dispatch or 0.0)) * 1000.0,
                                    prompt_tokens=prompt_tokens, ahead_tokens=ahead)
        except Exception:  # the router must never cost us the stream
            log.exception("router.first_token failed")

    def _cadence(self, rid: str, gaps: list[float], told: int) -> int:
        """Tell the router the tokens this stream returned since ``told`` of its inter-token gaps
        (ms) were told, so LADR reads the replica's decode speed as it streams; returns the count
        told in all. Once per piece that holds tokens."""
        n = len(gaps)
        if n > told:
            try:
                self.router.tokens(rid, n - told, math.fsum(gaps[told:]) / 1000.0)
            except Exception:  # the router must never cost us the stream
                log.exception("router.tokens failed")
        return n

    def _refused(self, rid: str, exc: ConnectFailed, prompt_tokens: int | None = None) -> None:
        """A replica took no connection (killed, gone, not yet listening): the request goes to
        another one, and this one is down for the router until its next healthy probe
        (``control.probe``), unless it is the pool's last eligible replica."""
        try:
            self.router.end(rid, 0.0, ok=False, prompt_tokens=prompt_tokens)
            self.router.set_down(rid, True)
            log.warning("replica %s took no connection (%s): down until a healthy probe; request retried", rid, exc)
        except (LookupError, LastReplicaError):
            pass

    # -- simple endpoints ------------------------------------------------------------------------
    async def handle_health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "pid": os.getpid(), "in_flight": self.in_flight,
                                  "replicas": [r.id for r in self.router.replicas()]})

    async def _models(self) -> dict[str, Any] | None:
        """The union of the replicas' ``/v1/models`` (cached 5 s); None when none answered."""
        now = time.monotonic()
        if self._models_cache and now - self._models_cache[0] < 5.0:
            return self._models_cache[1]
        assert self.session is not None
        session = self.session

        async def one(rep: Replica) -> list[dict[str, Any]]:
            try:
                async with asyncio.timeout(5.0), session.get(rep.url + "/v1/models") as r:
                    if r.status != 200:
                        return []
                    data = await r.json(content_type=None)
                    return [m for m in data.get("data", []) if isinstance(m, dict)]
            except (ClientError, OSError, TimeoutError, ValueError, AttributeError):
                return []

        results = await asyncio.gather(*(one(r) for r in self.router.replicas()))
        seen: dict[str, dict[str, Any]] = {}
        for models in results:
            for m in models:
                seen.setdefault(str(m.get("id")), m)
        if not seen:
            return None
        self.served_models.update(seen)
        body = {"object": "list", "data": list(seen.values())}
        self._models_cache = (now, body)
        return body

    async def _learn_models(self, every_s: float = 30.0) -> None:
        """Keeps :attr:`served_models` fresh (replicas come and go), off the request path."""
        while True:
            try:
                await self._models()
            except Exception:  # never let the refresher die; the next round retries
                log.exception("refreshing the served models failed")
            await asyncio.sleep(every_s)

    async def _answered_models(self) -> dict[str, Any]:
        """:meth:`_models`, or a 502 (the app's ``json_errors`` answers it) when none answered."""
        body = await self._models()
        if body is None:
            raise ApiError(502, "no upstream replica answered /v1/models", code="upstream_unavailable",
                           type_=GATEWAY_ERROR)
        return body

    async def handle_models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: the union of the replicas' lists."""
        return web.json_response(await self._answered_models())

    async def handle_model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}``: the model object a replica lists, or OpenAI's 404."""
        body = await self._answered_models()
        name = request.match_info["model"]
        found = next((m for m in body["data"] if m.get("id") == name), None)
        if found is None:
            return error_response(404, f"The model '{name}' does not exist", code="model_not_found", param="model",
                                  type_="invalid_request_error")
        return web.json_response(found)

    # -- completions -----------------------------------------------------------------------------
    def _schedule_header(self, schedule: Schedule) -> str:
        cached = self._schedule_cache.get(id(schedule))
        if cached is None or cached[0] is not schedule:
            if len(self._schedule_cache) > 64:  # old pool schedules: let them go
                self._schedule_cache.clear()
            cached = self._schedule_cache[id(schedule)] = (schedule, json.dumps(schedule.to_dict(), separators=(",", ":")))
        return cached[1]

    async def _error(self, ex: Exchange, status: int, message: str, *, code: str, type_: str = GATEWAY_ERROR,
                     param: str | None = None, headers: Mapping[str, str] | None = None, close: bool = False) -> None:
        """An OpenAI-shaped error answer (``httpkit.error_response``'s bytes) on either server."""
        await ex.respond(status, json_headers(headers), error_body(message, code=code, param=param, type_=type_),
                         close=close)

    async def _bad(self, ex: Exchange, exc: ApiError) -> None:
        self.metrics.bad_request(exc.code)
        await self._error(ex, exc.status, exc.message, code=exc.code, param=exc.param, type_=exc.type,
                          headers=exc.headers)

    async def _over_share(self, client: str, ex: Exchange) -> None:
        """429 for a client that already holds its share of the in-flight slots (body unread)."""
        self.metrics.bad_request(names.REASON_CLIENT_OVER_SHARE)
        if (client == ex.remote and ex.headers.get("X-Forwarded-For")
                and client not in self._proxy_warned and len(self._proxy_warned) < 64):
            # most likely an ingress or load balancer not listed as trusted: say so once per peer
            self._proxy_warned.add(client)
            log.warning("%s forwards requests for other clients (X-Forwarded-For) but is not in "
                        "gateway.trusted_proxies, so all of them share one client's limit of %d in flight",
                        client, self.client_cap)
        shown = client if len(client) <= 80 else client[:77] + "..."
        msg = (f"client {shown!r} already has {self.client_cap} requests in flight, its limit "
               f"(gateway.client_share = {self.client_share:g} of gateway.max_in_flight = {self.max_in_flight}); "
               "retry when one finishes. Behind a proxy or load balancer all its clients share its address: "
               "list it in gateway.trusted_proxies (and set gateway.client_header if it names clients "
               "otherwise than X-Forwarded-For)")
        # its body is not read: do not keep the connection for another request
        await self._error(ex, 429, msg, code=names.REASON_CLIENT_OVER_SHARE, headers={"Retry-After": "1"}, close=True)

    def _shed_ready(self) -> bool:
        """Apply shedding changes other gateways made (the router applies the shared stream on
        its next pick, which a fully shed pool never makes); True when anything is shed."""
        shared = self.router.shared
        if shared is not None and shared.inbox:
            self.router.apply_shared_ops()
        return self.shed.active

    async def _shed(self, ex: Exchange, cls: str) -> None:
        """429 for a request whose class is shed in this pool (body unread, no RequestEvent)."""
        self.metrics.shed(self.pool, cls)
        share = self.shed.share(self.pool, cls)
        msg = (f"requests of class {cls!r} are being shed in pool {self.pool!r} ({share:.0%} of them) to protect "
               "the service level of more protected classes; retry later")
        # its body is not read: do not keep the connection for another request
        await self._error(ex, 429, msg, code=names.REASON_SHED_BY_SLO,
                          headers={"Retry-After": str(self.shed_retry_after_s)}, close=True)

    async def handle_completion(self, request: web.Request) -> web.StreamResponse:
        """The completion endpoints on aiohttp's server (the fast path calls :meth:`complete`)."""
        ex = AiohttpExchange.of(request, time.perf_counter())
        await self.complete(ex)
        assert ex.response is not None
        return ex.response

    async def complete(self, ex: Exchange) -> None:
        """One completion request, on either server: tenancy, shedding, the per-client bound,
        the in-flight bound, then :meth:`_proxy`; exactly one answer written to ``ex``."""
        # the clock starts when the request's first byte was read, not when this handler got to
        # run: a saturated gateway's own queueing is in the TTFT and E2E it reports (and its queue time)
        arrival = ex.arrival
        headers = ex.headers
        # each request's tenant and class, before the body is read (headers only)
        who = self.tenants.resolve(ex.remote, headers)
        # load shedding of the request's class in this pool (control API, set by the alert
        # receiver while a more protected class burns): refused before the body is read
        if self._shed_ready() and self.shed.sheds(self.pool, who.class_):
            return await self._shed(ex, who.class_)
        # the per-client bound, before the body is read: a client trickling bodies holds at most
        # client_cap slots, the rest are refused at once
        client: str | None = None
        if self.client_cap:
            client = self.clients.key(ex.remote, headers)
            held = self.client_slots.get(client, 0)
            if held >= self.client_cap:
                return await self._over_share(client, ex)
            self.client_slots[client] = held + 1
        # a request holds its in-flight slot from its first body byte: a client trickling its
        # body costs a slot like any other (bounded by http.body_timeout_s)
        if who.folded_tenant:
            self.metrics.folded(names.L_TENANT)
        if who.folded_class:
            self.metrics.folded(names.L_CLASS)
        self.in_flight += 1
        self._in_flight_gauge.inc()
        tel: RequestTelemetry | None = None
        sent: int | None = None  # the status the client got (None: it left first)
        try:
            try:
                raw = await ex.read_body(max_bytes=self.max_body, timeout_s=self.body_timeout_s)
                req = parse_request(raw, ex.path, max_prompt_chars=self.max_prompt_chars)
            except ApiError as exc:
                return await self._bad(ex, exc)
            tel = self.recorder.begin(headers, ex.method, ex.path, req, arrival)
            trace_id = tel.trace_id
            ex.set_request_id(trace_id)  # X-Request-Id: the trace id, to find the request's spans
            key = unit_key(req.body, headers, trace_id)
            a = self.rollout.assign(self.pool, key)
            timer = StreamTimer(arrival, streaming=req.stream)
            if self.in_flight > self.max_in_flight:
                self._record(timer, tel, req, who, a.label, names.NO_REPLICA, names.STATUS_REJECTED, pool=self._pool_of(a))
                await self._error(ex, 429, f"gateway is at its limit of {self.max_in_flight} requests in flight; "
                                  "retry later", code="overloaded",
                                  headers={"Retry-After": "1", **self._arm_headers(a)})
            else:
                await self._proxy(ex, raw, req, timer, tel, who, a, key)
            sent = ex.status
        finally:
            if client is not None:
                held = self.client_slots[client] - 1
                if held:
                    self.client_slots[client] = held
                else:
                    del self.client_slots[client]
            self.in_flight -= 1
            self._in_flight_gauge.dec()
            if tel is not None:  # the SERVER span ends with the status the client got (none: it left)
                self.recorder.finish(tel, sent)

    def _pool_of(self, a: Assignment) -> str:
        """The pool serving an assignment: its arm's strategy pool, else this gateway's."""
        s = a.strategy
        return s.pool if s is not None and s.pool is not None else self.pool

    @staticmethod
    def _arm_headers(a: Assignment) -> dict[str, str]:
        if a is OUTSIDE:
            return {names.ARM_HEADER: names.DEFAULT_ARM}
        h = {names.ARM_HEADER: a.label}
        if a.version:
            h[names.ARM_VERSION_HEADER] = a.version
        return h

    async def _proxy(self, ex: Exchange, raw: bytes, req: ParsedRequest, timer: StreamTimer,
                     tel: RequestTelemetry, who: Tenancy, a: Assignment, key: str) -> None:
        traceparent = tel.traceparent  # the gateway's SERVER span, returned to the client
        status = names.STATUS_ERROR
        rep: ReplicaRef | None = None
        up: UpstreamResponse | None = None
        writing = False  # True while awaiting a write to the client: its failure means "client gone"
        told_all = False  # the stream's [DONE] was written: a client leaving after it got its answer
        ahead: float | None = None  # prompt tokens waiting on the replica at dispatch; None once told
        # the token gaps told to the router (-1: it does not read them: LADR's ECT or cadence off)
        told = 0 if self.router.reads_tokens else -1
        gaps = timer.gaps_ms
        arm = a.label
        strategy = a.strategy
        pool = self._pool_of(a)
        arm_headers = self._arm_headers(a)
        in_headers = ex.headers
        headers = {"Content-Type": "application/json", "traceparent": traceparent}
        for h in FORWARD_HEADERS:
            v = in_headers.get(h)
            if v is not None:
                headers[h] = v
        # the arm's temperature schedule, else the control plane's for the pool; applied by the replica
        schedule = strategy.schedule if strategy is not None and strategy.schedule is not None else None
        if schedule is None:
            schedule = self.distill.schedule_in_force(pool)
        if schedule is not None:
            headers[names.SCHEDULE_HEADER] = self._schedule_header(schedule)
        # the replica's usage report: asked for when the client streams without asking, and then
        # taken out of what the client receives (OpenAI sends it only when asked)
        upstream_body, stripper = raw, None
        if req.stream and self.request_usage and not wants_usage(req.body):
            asked = with_usage(raw, req.body)
            if asked is not None:
                upstream_body, stripper = asked, UsageStripper()
        share = strategy.student_share_pct if strategy is not None else None
        policy = strategy.route_policy if strategy is not None else None
        # the prompt's size as the body says it (~4 characters a token): the router weighs it
        # at the pick and learns the replica's prefill speed from it at the end (same value)
        prompt_tokens = prompt_estimate(req.prompt_chars)
        try:
            async with asyncio.timeout(self.timeout_s):
                assert self._slots is not None and self.upstream is not None
                async with self._slots:
                    try:
                        # the student share (the arm's, else the pool's), deterministic per unit
                        # (a session keeps its side); the arm's route policy, else the router's
                        rep = self.distill.pick(self.router, pool, key, share_pct=share, policy=policy,
                                                prompt_tokens=prompt_tokens)
                    except NoReplicaAvailable as exc:
                        return await self._error(ex, 503, f"no replica available in pool {pool!r}: {exc}",
                                                 code="no_replica", headers=arm_headers)
                    refused: list[str] = []  # replicas that took no connection: nothing was sent
                    while True:
                        ahead = self.router.begin(rep.id, prompt_tokens)
                        timer.dispatch = time.perf_counter()
                        # the hop's CLIENT span (when traced): the replica's spans are its children
                        headers["traceparent"] = self.recorder.hop(tel, rep.url, req, in_headers, timer.dispatch)
                        out_headers = {"traceparent": traceparent, REPLICA_HEADER: rep.id, **arm_headers}
                        try:
                            up = await self.upstream.request(rep.url, "POST", ex.path, headers, upstream_body)
                            break
                        except ConnectFailed as exc:
                            refused.append(rep.id)
                            if len(refused) >= MAX_CONNECT_TRIES:
                                raise
                            try:
                                nxt = self.distill.pick(self.router, pool, key, share_pct=share, policy=policy,
                                                        exclude=refused, prompt_tokens=prompt_tokens)
                            except NoReplicaAvailable:
                                raise exc from None  # no other replica: this one's failure is the answer
                            self._refused(rep.id, exc, prompt_tokens)
                            rep = nxt
                    if up.status >= 400:
                        body = await up.read()
                        if up.status < 500:
                            status = names.STATUS_REJECTED
                            return await ex.respond(up.status, {
                                **out_headers, "Content-Type": up.headers.get("content-type", "application/json")}, body)
                        return await self._error(ex, 502, f"upstream {rep.id} answered {up.status}: "
                                                 f"{body[:200].decode('utf-8', 'replace')}", code="upstream_error",
                                                 headers=out_headers)
                    if not req.stream:
                        body = await up.read()
                        now = time.perf_counter()
                        timer.feed(body, now)
                        timer.finish_body(now)
                        writing = True  # send it here, so E2E ends at the last byte written
                        await ex.respond(up.status, {
                            **out_headers, "Content-Type": up.headers.get("content-type", "application/json")}, body,
                            flush=True)
                        status = names.STATUS_OK
                        return None
                    out_headers["Content-Type"] = up.headers.get("content-type", "text/event-stream")
                    out_headers["Cache-Control"] = "no-cache"
                    await ex.start(up.status, out_headers)
                    # write-through: each upstream piece is written as it arrives (the server sends
                    # the headers with the first one and waits only when its buffer is high); the
                    # last piece goes out with the end of the stream in one send, not two
                    feed, write, clock = timer.feed, ex.write, time.perf_counter
                    push = ex.pusher(up.pause_reading, up.resume_reading)
                    if push is not None:  # relayed from the upstream's read callback: no task step per piece
                        strip = None if stripper is None else stripper.feed

                        def piece(data: bytes, end: bool) -> None:
                            # the client gets the piece first, then the gateway accounts for it
                            # (stamped on arrival): its TTFT does not wait on the bookkeeping
                            nonlocal ahead, told_all, told
                            now = clock()
                            out = data if strip is None or not data else strip(data)
                            if end and stripper is not None:
                                out += stripper.flush()
                            push(out, end)
                            if data:
                                feed(data, now)  # the timer sees the usage the client will not
                                if ahead is not None and timer.first_token is not None:
                                    self._first_token(rep.id, timer, prompt_tokens, ahead)
                                    ahead = None
                                if told >= 0:
                                    told = self._cadence(rep.id, gaps, told)
                            told_all = timer.ended

                        try:
                            await up.relay(piece)
                        except ClientGone:
                            writing = True  # the client left: cancelled, as a failed write below
                            raise
                        status = names.STATUS_OK
                        return None
                    last = b""
                    if stripper is None:
                        async for data in up.iter_chunks():
                            feed(data, clock())
                            if ahead is not None and timer.first_token is not None:
                                self._first_token(rep.id, timer, prompt_tokens, ahead)
                                ahead = None
                            if told >= 0:
                                told = self._cadence(rep.id, gaps, told)
                            if up.complete:  # the generator ends at its next step
                                last = data
                                continue
                            writing = True
                            await write(data)
                            writing = False
                            told_all = timer.ended
                    else:
                        strip = stripper.feed
                        async for data in up.iter_chunks():
                            feed(data, clock())  # the timer sees the usage the client will not
                            if ahead is not None and timer.first_token is not None:
                                self._first_token(rep.id, timer, prompt_tokens, ahead)
                                ahead = None
                            if told >= 0:
                                told = self._cadence(rep.id, gaps, told)
                            out = strip(data)
                            if up.complete:
                                last = out
                                continue
                            if out:
                                writing = True
                                await write(out)
                                writing = False
                                told_all = timer.ended
                        last += stripper.flush()
                    writing = True
                    await ex.end(last)
                    status = names.STATUS_OK
                    return None
        except asyncio.CancelledError:  # the client left (or the gateway stops)
            status = names.STATUS_OK if told_all else names.STATUS_CANCELLED
            raise
        except (ClientError, OSError, RuntimeError) as exc:  # TimeoutError (an OSError): the deadline
            if writing and isinstance(exc, ConnectionError | RuntimeError):
                # a client that had [DONE] and hung up before the body's end got its answer
                status = names.STATUS_OK if told_all else names.STATUS_CANCELLED
                return None
            if told_all:  # the replica dropped or hung after its [DONE] reached the client: answered
                status = names.STATUS_OK
                with contextlib.suppress(ConnectionError, RuntimeError, OSError):
                    await ex.end()
                return None
            if isinstance(exc, TimeoutError):
                status = names.STATUS_TIMEOUT
                msg = f"upstream did not finish within request_timeout_s={self.timeout_s:g} s"
                return await self._fail(ex, 504, msg, "upstream_timeout", arm_headers)
            status = names.STATUS_ERROR
            where = rep.id if rep else "upstream"
            return await self._fail(ex, 502, f"upstream {where} failed: {type(exc).__name__}: {exc}",
                                    "upstream_error", arm_headers)
        except Exception as exc:  # a bug here must still answer (never a bare 500) and record
            status = names.STATUS_ERROR
            log.exception("gateway failure on %s", tel.trace_id)
            return await self._fail(ex, 502, f"gateway failed: {type(exc).__name__}", "gateway_error", arm_headers)
        finally:
            end = time.perf_counter()
            if up is not None:
                up.close()  # back to the pool if read to the end, else dropped (upstream aborted)
            if rep is not None:
                dispatch = timer.dispatch or end
                ttft = None if timer.first_token is None else (timer.first_token - dispatch) * 1000.0
                try:
                    # a client's bad request (upstream 4xx -> rejected) says nothing bad about the
                    # replica: only errors and timeouts are charged as failures
                    # output tokens (usage, else counted): LADR's completion-time estimate learns from them
                    self.router.end(rep.id, (end - dispatch) * 1000.0,
                                    ok=status not in (names.STATUS_ERROR, names.STATUS_TIMEOUT), ttft_ms=ttft,
                                    output_tokens=timer.tokens(0)[1] if status == names.STATUS_OK else None,
                                    prompt_tokens=prompt_tokens if ahead is not None else None)
                except Exception:  # the router must never cost us the event
                    log.exception("router.end failed")
            self._record(timer, tel, req, who, arm, rep.id if rep else names.NO_REPLICA, status, end=end,
                         upstream_url=rep.url if rep else None, pool=pool)

    async def _fail(self, ex: Exchange, http_status: int, message: str, code: str,
                    headers: dict[str, str] | None = None) -> None:
        """An error response, or an SSE error event when the stream has already begun."""
        if not ex.prepared:
            return await self._error(ex, http_status, message, code=code, headers=headers)
        err = {"error": {"message": message, "type": GATEWAY_ERROR, "param": None, "code": code}}
        with contextlib.suppress(ConnectionError, RuntimeError, OSError):
            await ex.write(b"event: error\ndata: " + json.dumps(err).encode() + b"\n\n")
            await ex.end()
        return None

    def _record(self, timer: StreamTimer, tel: RequestTelemetry, req: ParsedRequest, who: Tenancy, arm: str, replica: str,
                status: str, *, end: float | None = None, upstream_url: str | None = None,
                pool: str | None = None) -> None:
        end = time.perf_counter() if end is None else end
        policy = req.policy
        if timer.ext and timer.ext.get("policy"):
            policy = storable_label(timer.ext["policy"])
        valid: RequestEvent | None = None  # the event the metrics saw, for the span and OTLP
        if status == names.STATUS_OK:
            self.served_models.add(req.model)
        # a model a replica serves counts under its own name from its first request, failed or not
        admit = status == names.STATUS_OK or req.model in self.served_models
        try:
            ev = timer.event(end=end, ts_ms=time.time_ns() // 1_000_000, trace_id=tel.trace_id, model=req.model,
                             pool=pool or self.pool, replica=replica, arm=arm, policy=policy, status=status,
                             prompt_estimate=prompt_estimate(req.prompt_chars), tenant=who.tenant, class_=who.class_)
            ev.validate()
            valid = ev
            self.recorder.record(ev, itl_gaps_ms=timer.gaps_ms, validate=False,
                                 first_token=timer.first_token is not None, admit=admit)
        except Exception as exc:  # spool full, disk error: keep serving, but loudly (not per request)
            self.record_errors += 1
            now = time.monotonic()
            if self.record_errors == 1:
                log.exception("could not record request %s", tel.trace_id)
                self._record_error_logged = now
            elif now - self._record_error_logged >= 60.0:
                log.error("could not record %d requests so far; latest: %s: %s", self.record_errors,
                          type(exc).__name__, exc)
                self._record_error_logged = now
        self.recorder.end(tel, valid, timer, upstream_url, admit=admit)


# -- running it ---------------------------------------------------------------------------------
@dataclass
class RunningGateway:
    gateway: Gateway
    served: Served
    saturation: SaturationMonitor | None = None
    #: what stops with it, in order, after the listener (the spool and the control plane its
    #: builder opened for it)
    closers: list[Callable[[], None]] = field(default_factory=list)
    #: the fast path's protocol factory (None with ``gateway.fast_path = false``)
    fast: FastFront | None = None

    @property
    def host(self) -> str:
        return self.served.host

    @property
    def port(self) -> int:
        return self.served.port

    @property
    def url(self) -> str:
        return self.served.url

    async def stop(self) -> None:
        if self.saturation is not None:
            await self.saturation.stop()
        await self.served.stop()
        for close in self.closers:
            close()


async def start(gateway: Gateway, host: str | None = None, port: int | None = None, *,
                reuse_port: bool = False, closers: Sequence[Callable[[], None]] = ()) -> RunningGateway:
    """Serve ``gateway`` on ``host:port`` (port 0 = a free one; None: ``gateway.host/port``).
    ``closers`` run when it stops (they also run if it cannot start)."""
    cfg = gateway.cfg
    # handler_cancellation: a client that disconnects cancels its handler, which records
    # ``cancelled`` and aborts the upstream request instead of generating for nobody.
    fronts: list[FastFront] = []

    def front(fallback: Callable[[], GuardedHandler], guard: Guard) -> FastFront:
        # the completion endpoints on the fast path; everything else on aiohttp's protocol
        fronts.append(FastFront(gateway.complete, fallback, guard, gateway.limits, gateway.max_body))
        return fronts[-1]

    try:
        served = await serve_http(gateway.app(), cfg.gateway.host if host is None else host,
                                  cfg.gateway.port if port is None else port, gateway.limits, reuse_port=reuse_port,
                                  front=front if cfg.gateway.fast_path else None)
    except BaseException:
        for close in closers:
            close()
        raise
    monitor = SaturationMonitor(gateway.registry, list(served.server.sockets))
    monitor.start()
    return RunningGateway(gateway, served, monitor, list(closers), fronts[0] if fronts else None)
