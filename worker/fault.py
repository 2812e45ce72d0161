"""Fault injection on a real worker: the simulator's faults (fleet/faults.py) on real inference.

``llmsla demo --real`` and the tests need a replica that degrades at a known time on a real
engine behind the real gateway, so the gateway measures the fault as it would a real one. Two
knobs, ``slowdown`` and ``down``; a ramp is a sequence of settings sent by whoever drives it. The
endpoint listens on 127.0.0.1 only and every write needs the admin token, like the control API.
See docs/worker.md#fault-injection-workeradmin_port-post-adminfault.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

from llmsla import names
from llmsla.httpkit import (
    DEFAULT_LIMITS,
    ApiError,
    Limits,
    check_bearer,
    json_errors,
    parse_json_object,
    read_body,
)
from llmsla.worker.engine import MAX_SLOWDOWN, Engine

log = logging.getLogger(__name__)

PATH = "/admin/fault"
#: The admin listener's only address: fault injection is never reachable from another host.
ADMIN_HOST = "127.0.0.1"
MAX_BODY_BYTES = 4096
DOWN_REASON = "replica down (injected fault)"
_FIELDS = ("slowdown", "down")


class FaultControl:
    """The engine's injected fault and its two gauges (in the worker's registry)."""

    def __init__(self, engine: Engine, registry: CollectorRegistry, model: str) -> None:
        self.engine = engine
        lab = [names.L_MODEL]
        self._slow = Gauge(names.WORKER_FAULT_SLOWDOWN, "Injected slowdown factor of every iteration (1 = none)",
                           lab, registry=registry).labels(model)
        self._down = Gauge(names.WORKER_FAULT_DOWN, "1 while an injected crash holds the worker down",
                           lab, registry=registry).labels(model)
        self._slow.set(1.0)
        self._down.set(0)

    def state(self) -> dict[str, Any]:
        return {"slowdown": self.engine.slowdown, "down": self.engine.down}

    def apply(self, *, slowdown: float | None = None, down: bool | None = None) -> dict[str, Any]:
        if slowdown is not None:
            self.engine.set_slowdown(slowdown)
            self._slow.set(slowdown)
        if down is not None and down != self.engine.down:
            self.engine.set_down(DOWN_REASON if down else None)
            self._down.set(1 if down else 0)
            log.warning("injected fault: worker %s", "down" if down else "up again")
        return self.state()


def parse_fault(body: dict[str, Any]) -> dict[str, Any]:
    """``{"slowdown": number in [1, MAX_SLOWDOWN], "down": bool}``, at least one; ApiError 400
    naming the field otherwise."""
    unknown = sorted(set(body) - set(_FIELDS))
    if unknown:
        raise ApiError(400, f"unknown field(s) {unknown}; allowed: {list(_FIELDS)}", code="invalid_request",
                       param=unknown[0])
    if not body:
        raise ApiError(400, "give 'slowdown' (a factor >= 1) and/or 'down' (true/false)", code="invalid_request")
    out: dict[str, Any] = {}
    if "slowdown" in body:
        v = body["slowdown"]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or not 1.0 <= v <= MAX_SLOWDOWN:
            raise ApiError(400, f"slowdown: expected a number in [1, {MAX_SLOWDOWN:g}], got {v!r}",
                           code="invalid_value", param="slowdown")
        out["slowdown"] = float(v)
    if "down" in body:
        if not isinstance(body["down"], bool):
            raise ApiError(400, f"down: expected true or false, got {body['down']!r}", code="invalid_value",
                           param="down")
        out["down"] = body["down"]
    return out


def admin_app(fault: FaultControl, *, token: str, limits: Limits = DEFAULT_LIMITS) -> web.Application:
    """``GET``/``POST /admin/fault`` (writes need the bearer ``token``)."""

    async def get(request: web.Request) -> web.Response:
        return web.json_response(fault.state())

    async def post(request: web.Request) -> web.Response:
        check_bearer(request, token, setting="worker.admin_token")
        raw = await read_body(request, max_bytes=MAX_BODY_BYTES, timeout_s=limits.body_timeout_s)
        change = parse_fault(parse_json_object(raw))
        return web.json_response({"ok": True, "fault": fault.apply(**change)})

    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[json_errors])
    app.router.add_get(PATH, get)
    app.router.add_post(PATH, post)
    return app
