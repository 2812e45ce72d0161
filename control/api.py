"""HTTP control API over the router and the distillation controls (aiohttp).

Reads are open (the server binds 127.0.0.1 by default); every write needs the bearer
``control.token``, and with no token configured writes are refused rather than left open. Every
write that reached the state (applied, clamped or refused) is audited with who and why, so an
automatic loop's actions can always be traced. See docs/control.md#control-api.
"""

from __future__ import annotations

import contextlib
import json
import math
from contextlib import AbstractContextManager
from typing import Any

from aiohttp import web

from llmsla.control.audit import OUTCOME_APPLIED, OUTCOME_REFUSED, AuditLog
from llmsla.control.distill import DistillControls, StepTooLarge, UnknownPool
from llmsla.control.rollout import Rollout, UnknownExperiment, WeightTooLarge
from llmsla.control.router import LastReplicaError, Router, UnknownReplica
from llmsla.control.shed import ProtectedClass, ShedControls
from llmsla.events import shown_name, string_problem
from llmsla.httpkit import (
    DEFAULT_LIMITS,
    ApiError,
    Limits,
    Served,
    add_metrics,
    check_bearer,
    error_response,
    json_errors,
    parse_json_object,
    read_body,
    serve,
)

MAX_BODY_BYTES = 64 * 1024
_ROUTER = web.AppKey("router", Router)
_DISTILL = web.AppKey("distill", DistillControls)
_AUDIT = web.AppKey("audit", AuditLog)
_ROLLOUT = web.AppKey("rollout", Rollout)
_SHED = web.AppKey("shed", ShedControls)
_TOKEN = web.AppKey("token", str)
_LIMITS = web.AppKey("limits", Limits)
_LOCK: web.AppKey[AbstractContextManager[Any]] = web.AppKey("lock")


def _bad(reason: str, status: int = 400, code: str = "invalid_request") -> ApiError:
    return ApiError(status, reason, code=code)


def _check_auth(request: web.Request) -> None:
    check_bearer(request, request.app[_TOKEN], setting="control.token")


async def _body(request: web.Request, allowed: set[str]) -> dict[str, Any]:
    raw = await read_body(request, max_bytes=MAX_BODY_BYTES, timeout_s=request.app[_LIMITS].body_timeout_s)
    body = parse_json_object(raw)
    unknown = sorted(set(body) - allowed - {"actor", "reason"})
    if unknown:
        raise _bad(f"unknown field(s) {[shown_name(u) for u in unknown]}; allowed: {sorted(allowed | {'actor', 'reason'})}")
    for k in ("actor", "reason"):
        if k in body and not isinstance(body[k], str):
            raise _bad(f"{k}: expected a string, got {type(body[k]).__name__}")
    # checked before the change is applied: the audit row must be writable, or nothing happens
    for k, v in (("actor", body.get("actor")), ("reason", body.get("reason")),
                 ("X-Actor", request.headers.get("X-Actor"))):
        if v and (problem := string_problem(v)) is not None:
            raise _bad(f"{k}: {problem}")
    return body


def _who(request: web.Request, body: dict[str, Any]) -> tuple[str, str]:
    actor = body.get("actor") or request.headers.get("X-Actor", "") or "api"
    return actor[:200], str(body.get("reason", ""))[:2000]


def _number(body: dict[str, Any], key: str) -> float:
    if key not in body:
        raise _bad(f"missing field {key!r}")
    v = body[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise _bad(f"{key}: expected a finite number, got {v!r}")
    return float(v)


def _write(handler: Any) -> Any:
    """Auth first, then map domain errors to status codes with a JSON reason."""

    async def wrapped(request: web.Request) -> web.Response:
        try:
            _check_auth(request)
            return await handler(request)
        except ApiError as exc:
            return exc.response()
        except (UnknownReplica, UnknownPool, UnknownExperiment) as exc:
            return error_response(404, str(exc), code="not_found")
        except (LastReplicaError, StepTooLarge, WeightTooLarge, ProtectedClass) as exc:
            return error_response(409, str(exc), code="conflict")
        except ValueError as exc:
            return error_response(400, str(exc), code="invalid_value")

    return wrapped


# -- handlers -------------------------------------------------------------------------------------
async def _state(request: web.Request) -> web.Response:
    with request.app[_LOCK]:
        state = {"router": request.app[_ROUTER].snapshot(), "distill": request.app[_DISTILL].snapshot(),
                 "shed": request.app[_SHED].snapshot()}
    state["experiments"] = request.app[_ROLLOUT].snapshot()  # the rollout has its own lock
    return web.json_response(state)


async def _experiments(request: web.Request) -> web.Response:
    return web.json_response({"experiments": request.app[_ROLLOUT].snapshot()})


async def _audit(request: web.Request) -> web.Response:
    try:
        n = int(request.query.get("n", "100"))
        if not 1 <= n <= 10_000:
            raise ValueError
    except ValueError:
        return error_response(400, "n: expected an integer in [1, 10000]", code="invalid_request", param="n")
    return web.json_response({"records": request.app[_AUDIT].recent(n)}, dumps=lambda o: json.dumps(o, default=str))


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _openapi(request: web.Request) -> web.Response:
    from llmsla.control.openapi import document  # imports this module: resolved at call time

    return web.json_response(document())


def _replica_record(request: web.Request, action: str, rid: str, before: Any, after: Any,
                    body: dict[str, Any], outcome: str = OUTCOME_APPLIED) -> dict[str, Any]:
    actor, reason = _who(request, body)
    return request.app[_AUDIT].record(actor=actor, action=action, target=rid, before=before, after=after,
                                      reason=reason, outcome=outcome)


@_write
async def _set_weight(request: web.Request) -> web.Response:
    router = request.app[_ROUTER]
    rid = request.match_info["rid"]
    body = await _body(request, {"weight"})
    weight = _number(body, "weight")
    with request.app[_LOCK]:
        before = router.replica(rid).weight
        try:
            router.set_weight(rid, weight)
        except LastReplicaError:  # refused like a drain of the last replica, and audited the same way
            _replica_record(request, "set_weight", rid, before, before, body, OUTCOME_REFUSED)
            raise
    rec = _replica_record(request, "set_weight", rid, before, weight, body)
    return web.json_response({"ok": True, "audit": rec})


def _drain_handler(drain: bool) -> Any:
    action = "drain" if drain else "undrain"

    @_write
    async def handler(request: web.Request) -> web.Response:
        router = request.app[_ROUTER]
        rid = request.match_info["rid"]
        body = await _body(request, set()) if request.can_read_body else {}
        with request.app[_LOCK]:
            before = router.is_drained(rid)
            try:
                router.drain(rid) if drain else router.undrain(rid)
            except LastReplicaError:
                _replica_record(request, action, rid, {"drained": before}, {"drained": before}, body, OUTCOME_REFUSED)
                raise
            after = router.is_drained(rid)
        rec = _replica_record(request, action, rid, {"drained": before}, {"drained": after}, body)
        return web.json_response({"ok": True, "audit": rec})

    return handler


@_write
async def _set_params(request: web.Request) -> web.Response:
    router = request.app[_ROUTER]
    body = await _body(request, {"policy", *router.params})
    params = {k: v for k, v in body.items() if k not in ("actor", "reason")}
    if not params:
        raise _bad(f"no parameters given; allowed: policy, {', '.join(router.params)}")
    with request.app[_LOCK]:
        before = {"policy": router.policy, **{k: router.params[k] for k in params if k != "policy"}}
        router.set_params(**params)  # ValueError -> 400 naming the parameter
        after = {"policy": router.policy, **{k: router.params[k] for k in params if k != "policy"}}
    actor, reason = _who(request, body)
    rec = request.app[_AUDIT].record(actor=actor, action="set_router_params", target="router",
                                     before=before, after=after, reason=reason)
    return web.json_response({"ok": True, "audit": rec})


@_write
async def _set_share(request: web.Request) -> web.Response:
    body = await _body(request, {"pct", "clamp"})
    pct = _number(body, "pct")
    clamp = body.get("clamp", True)
    if not isinstance(clamp, bool):
        raise _bad(f"clamp: expected true/false, got {clamp!r}")
    actor, reason = _who(request, body)
    with request.app[_LOCK]:
        rec = request.app[_DISTILL].set_student_share(request.match_info["pool"], pct, actor=actor,
                                                      reason=reason, clamp=clamp)
    return web.json_response({"ok": True, "audit": rec})


@_write
async def _set_schedule(request: web.Request) -> web.Response:
    body = await _body(request, {"name", "params"})
    if "name" not in body:
        raise _bad("missing field 'name'")
    actor, reason = _who(request, body)
    with request.app[_LOCK]:
        rec = request.app[_DISTILL].set_schedule(request.match_info["pool"], body["name"], body.get("params"),
                                                 actor=actor, reason=reason)
    return web.json_response({"ok": True, "audit": rec})


def _shed_view(shed: ShedControls, pool: str) -> dict[str, Any]:
    return {"pool": pool, "classes": dict(shed.snapshot()["pools"].get(pool, {})), "order": list(shed.classes),
            "protected": shed.protected}


async def _get_shed(request: web.Request) -> web.Response:
    shed = request.app[_SHED]
    pool = request.match_info["pool"]
    with request.app[_LOCK]:
        known = pool in shed.snapshot()["pools"] or pool in request.app[_DISTILL].pools()
        view = _shed_view(shed, pool)
    if not known:
        return error_response(404, f"unknown pool {pool!r}", code="not_found")
    return web.json_response(view)


@_write
async def _set_shed(request: web.Request) -> web.Response:
    body = await _body(request, {"classes"})
    if "classes" not in body:
        raise _bad("missing field 'classes' (an object of class -> share in [0, 1])")
    actor, reason = _who(request, body)
    shed = request.app[_SHED]
    pool = request.match_info["pool"]
    with request.app[_LOCK]:
        rec = shed.set_shares(pool, body["classes"], actor=actor, reason=reason)
        view = _shed_view(shed, pool)
    return web.json_response({"ok": True, "audit": rec, **view})


@_write
async def _set_arm_weight(request: web.Request) -> web.Response:
    body = await _body(request, {"weight"})
    weight = _number(body, "weight")
    actor, reason = _who(request, body)
    rec = request.app[_ROLLOUT].set_weight(request.match_info["key"], request.match_info["arm"], weight,
                                           actor=actor, reason=reason)
    return web.json_response({"ok": True, "audit": rec})


@_write
async def _set_coverage(request: web.Request) -> web.Response:
    body = await _body(request, {"coverage"})
    coverage = _number(body, "coverage")
    actor, reason = _who(request, body)
    rec = request.app[_ROLLOUT].set_coverage(request.match_info["key"], coverage, actor=actor, reason=reason)
    return web.json_response({"ok": True, "audit": rec})


def add_routes(app: web.Application, router: Router, distill: DistillControls, *, token: str,
               audit: AuditLog | None = None, limits: Limits = DEFAULT_LIMITS,
               rollout: Rollout | None = None, lock: AbstractContextManager[Any] | None = None,
               shed: ShedControls | None = None) -> web.Application:
    """Mount the control API on ``app`` (the gateway can host it next to its proxy routes).

    ``shed``: the load shedding the gateway applies (None: one of the default classes over the
    distillation controls' pools, riding the router's shared stream).

    ``lock``: held around every read and change of the router and the distillation controls,
    for an owner that runs them on another thread (the paced fleet simulator); the gateway owns
    them on this event loop and needs none. The rollout keeps its own lock."""
    app[_LIMITS] = limits
    app[_LOCK] = lock if lock is not None else contextlib.nullcontext()
    app[_ROUTER] = router
    app[_DISTILL] = distill
    app[_AUDIT] = audit or distill.audit
    app[_ROLLOUT] = rollout or Rollout({}, audit=app[_AUDIT])
    app[_SHED] = shed if shed is not None else ShedControls(pools=distill.pools(), audit=app[_AUDIT], router=router)
    app[_TOKEN] = token
    app.router.add_get("/v1/state", _state)
    app.router.add_get("/v1/experiments", _experiments)
    app.router.add_get("/v1/audit", _audit)
    add_metrics(app, router.metrics.registry, distill.metrics.registry, app[_SHED].metrics.registry)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/openapi.json", _openapi)
    app.router.add_post("/v1/replicas/{rid}/weight", _set_weight)
    app.router.add_post("/v1/replicas/{rid}/drain", _drain_handler(True))
    app.router.add_post("/v1/replicas/{rid}/undrain", _drain_handler(False))
    app.router.add_post("/v1/router/params", _set_params)
    app.router.add_post("/v1/pools/{pool}/student_share", _set_share)
    app.router.add_post("/v1/pools/{pool}/temperature_schedule", _set_schedule)
    app.router.add_get("/v1/pools/{pool}/shed", _get_shed)
    app.router.add_put("/v1/pools/{pool}/shed", _set_shed)
    app.router.add_post("/v1/experiments/{key}/arms/{arm}/weight", _set_arm_weight)
    app.router.add_post("/v1/experiments/{key}/coverage", _set_coverage)
    return app


def make_app(router: Router, distill: DistillControls, *, token: str, audit: AuditLog | None = None,
             limits: Limits = DEFAULT_LIMITS, rollout: Rollout | None = None,
             lock: AbstractContextManager[Any] | None = None, shed: ShedControls | None = None) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[json_errors])
    return add_routes(app, router, distill, token=token, audit=audit, limits=limits, rollout=rollout, lock=lock,
                      shed=shed)


async def start(app: web.Application, host: str = "127.0.0.1", port: int = 0, limits: Limits = DEFAULT_LIMITS) -> Served:
    """Serve ``app`` (``await served.stop()`` stops it; ``served.port`` is the bound port)."""
    return await serve(app, host, port, limits)
