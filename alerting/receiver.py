"""``llmsla receiver``'s HTTP app: webhook v4 in, the engine decides, the reconciler follows up.

``POST /v1/alerts`` answers 200 once every alert of the notification is recorded, decided and its
immediate actions attempted (the body lists the outcome per alert). An alert it cannot use is
audited as ``invalid`` and skipped; the rest of the notification is acted on and the answer is
still 200 (Alertmanager never retries a 4xx: one odd alert must not lose its group). Control API failures are
*not* an HTTP error: the receiver owns the retry (the reconciler retries with backoff and each
attempt is audited), so Alertmanager re-sending the whole group would add nothing. The one case
that answers 503 is a store that cannot record the alert: then the idempotency key is not claimed
and Alertmanager's retry is exactly what must happen. Bad input is a 4xx with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import time
from dataclasses import asdict
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from llmsla import names
from llmsla.alerting import openapi, webhook
from llmsla.alerting.engine import Engine
from llmsla.alerting.journal import JournalUnavailable
from llmsla.httpkit import (
    DEFAULT_LIMITS,
    ApiError,
    Limits,
    add_metrics,
    check_bearer,
    error_response,
    json_errors,
    read_body,
)

log = logging.getLogger(__name__)
_ENGINE = web.AppKey("engine", Engine)
_CONF = web.AppKey("conf", dict)


class ReceiverMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.alerts = Counter(names.RECEIVER_ALERTS, "Alerts received, by status and decision.",
                              ("status", "decision"), registry=self.registry)
        self.actions = Counter(names.ALERT_ACTIONS, "Control API actions taken by the receiver, by outcome.",
                               (names.L_ACTION, "outcome"), registry=self.registry)
        self.latency = Histogram(names.RECEIVER_ACTION_SECONDS, "Control API call time of receiver actions.",
                                 (names.L_ACTION,), registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.truncated = Counter(names.RECEIVER_TRUNCATED,
                                 "Alerts Alertmanager left out of notifications (truncatedAlerts, max_alerts).",
                                 registry=self.registry)
        self.rejected = Counter("llmsla_receiver_rejected", "Webhook posts refused before any alert was read.",
                                (names.L_STATUS,), registry=self.registry)

    def alert(self, status: str, decision: str) -> None:
        self.alerts.labels(status, decision).inc()

    def action(self, action: str, outcome: str, seconds: float) -> None:
        self.actions.labels(action, outcome).inc()
        self.latency.labels(action).observe(seconds)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=lambda o: o.isoformat() if isinstance(o, dt.datetime) else str(o))


async def _alerts(request: web.Request) -> web.Response:
    t0 = time.perf_counter()
    conf = request.app[_CONF]
    engine = request.app[_ENGINE]
    try:
        check_bearer(request, conf["token"], setting="receiver.token")
        raw = await read_body(request, max_bytes=conf["max_body"], timeout_s=conf["limits"].body_timeout_s)
        try:
            note = webhook.parse(raw)
        except webhook.WebhookError as exc:
            raise ApiError(exc.status, exc.reason, code="invalid_webhook") from None
    except ApiError as exc:
        engine.metrics.rejected.labels(str(exc.status)).inc()
        return exc.response()
    if note.truncated:
        log.warning("receiver: group %s: Alertmanager truncated %d alerts (max_alerts); raise max_alerts or "
                    "receiver.max_body_bytes", note.group_key, note.truncated)
    if note.skipped:
        log.warning("receiver: group %s: %d of %d alerts skipped as unusable, e.g. %s", note.group_key,
                    len(note.skipped), len(note.skipped) + len(note.alerts), note.skipped[0].reason)
    try:
        outcomes = await engine.handle(note, t0)
    except JournalUnavailable as exc:
        log.warning("receiver: %s; answering 503 so the sender retries", exc)
        return error_response(503, f"{exc}; nothing was recorded, retry later", code="store_unavailable",
                              type_="server_error", headers={"Retry-After": "5"})
    return web.json_response({"alerts": len(outcomes), "skipped": len(note.skipped), "truncated": note.truncated,
                              "results": [asdict(o) for o in outcomes]}, dumps=_dumps)


async def _state(request: web.Request) -> web.Response:
    engine = request.app[_ENGINE]
    try:
        states = await engine.journal.states()
    except JournalUnavailable as exc:
        return error_response(503, str(exc), code="store_unavailable", type_="server_error")
    return web.json_response({"targets": states, "durable": engine.journal.durable,
                              "policy": engine.policy.source}, dumps=_dumps)


async def _audit(request: web.Request) -> web.Response:
    try:
        n = int(request.query.get("n", "100"))
        if not 1 <= n <= 10_000:
            raise ValueError
    except ValueError:
        return error_response(400, "n: expected an integer in [1, 10000]", code="invalid_request", param="n")
    rows = list(request.app[_ENGINE].journal.recent)[-n:]
    return web.json_response({"rows": rows}, dumps=_dumps)


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi.document())


def make_app(engine: Engine, *, token: str, max_body: int = 16 << 20, tick_s: float | None = 1.0,
             prune_after_s: float = 30 * 86400.0, limits: Limits = DEFAULT_LIMITS) -> web.Application:
    """The receiver app; with ``tick_s`` it also runs the reconciler while it is up."""
    if engine.metrics is None:
        engine.metrics = ReceiverMetrics()
    # aiohttp's own limit sits above ours so the handler can answer 413 with a reason
    app = web.Application(client_max_size=max_body + 1, middlewares=[json_errors])
    app[_ENGINE] = engine
    app[_CONF] = {"token": token, "max_body": max_body, "limits": limits}
    app.router.add_post("/v1/alerts", _alerts)
    app.router.add_get("/v1/state", _state)
    app.router.add_get("/v1/audit", _audit)
    app.router.add_get("/healthz", _healthz)
    add_metrics(app, engine.metrics.registry)
    app.router.add_get("/openapi.json", _openapi)
    if tick_s:
        async def reconciler(app: web.Application) -> Any:
            task = asyncio.create_task(_reconcile(engine, tick_s, prune_after_s))
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        app.cleanup_ctx.append(reconciler)
    return app


async def _reconcile(engine: Engine, tick_s: float, prune_after_s: float) -> None:
    last_prune = 0.0
    while True:
        try:
            await engine.tick()
            if time.monotonic() - last_prune > 3600:
                await engine.journal.prune(prune_after_s)
                last_prune = time.monotonic()
        except JournalUnavailable as exc:
            log.warning("receiver reconciler: %s", exc)
        except Exception:  # noqa: BLE001 - the reconciler must survive anything and retry
            log.exception("receiver reconciler: unexpected error")
        await asyncio.sleep(tick_s)
