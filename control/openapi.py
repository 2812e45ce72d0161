"""OpenAPI 3.0 document of the control API, served at ``/openapi.json`` and committed as
``deploy/openapi/control.json`` (a test keeps them equal; ``python -m llmsla.control.openapi
[--check]`` rewrites or checks the file, :mod:`llmsla.generated`). Written from the handlers in
``api.py``: bodies are closed objects (unknown fields are a 400 there), every write needs the
bearer token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmsla import generated
from llmsla.control.api import MAX_BODY_BYTES
from llmsla.control.router import DEFAULT_PARAMS, POLICIES
from llmsla.openapi import ERROR_RESPONSE, common_paths, error_schema

COMMITTED = Path("deploy/openapi/control.json")
_WHO = {"actor": {"type": "string"}, "reason": {"type": "string"}}
_ERROR = ERROR_RESPONSE
_OK = {"description": "applied (or clamped); the audit record", "content": {"application/json": {"schema": {
    "type": "object", "required": ["ok", "audit"], "properties": {"ok": {"type": "boolean"}, "audit": {"type": "object"}}}}}}


def _write(summary: str, body: dict[str, Any], *, required: list[str], param: str | tuple[str, ...] | None,
           optional_body: bool = False, codes: tuple[str, ...] = ("400", "401", "404", "413", "503")) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{"bearer": []}],
        "requestBody": {"required": not optional_body, "content": {"application/json": {"schema": {
            "type": "object", "additionalProperties": False, "required": required,
            "properties": {**body, **_WHO}}}}},
        "responses": {"200": _OK, **{c: _ERROR for c in codes}},
    }
    if param:
        op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                            for p in ((param,) if isinstance(param, str) else param)]
    return {"post": op}


def _shed() -> dict[str, Any]:
    """GET (open) and PUT (token) of a pool's load shedding: class -> share refused."""
    shares = {"type": "object", "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1}}
    required = ["pool", "classes", "order", "protected"]
    props: dict[str, Any] = {"pool": {"type": "string"}, "classes": shares,
                             "order": {"type": "array", "items": {"type": "string"}}, "protected": {"type": "string"}}
    view = {"type": "object", "required": required, "properties": props}
    put = _write("shed a share of the named classes' requests in the pool (429 shed_by_slo at the gateway); classes "
                 "not named keep theirs, 0 stops shedding a class; an unknown class is 400, the most protected "
                 "class (the first of tenants.classes) 409",
                 {"classes": shares}, required=["classes"], param="pool",
                 codes=("400", "401", "404", "409", "413", "503"))["post"]
    put["responses"]["200"] = {"description": "applied; the audit record and the pool's shedding", "content": {
        "application/json": {"schema": {"type": "object", "required": ["ok", "audit", *required],
                                        "properties": {"ok": {"type": "boolean"}, "audit": {"type": "object"},
                                                       **props}}}}}
    get = {"summary": "the pool's load shedding: each shed class's share, the class order, the protected class",
           "parameters": put["parameters"],
           "responses": {"200": {"description": "shedding", "content": {"application/json": {"schema": view}}},
                         "404": _ERROR}}
    return {"get": get, "put": put}


def document() -> dict[str, Any]:
    number = {"type": "number"}
    params = {"policy": {"type": "string", "enum": list(POLICIES)}, **{k: number for k in DEFAULT_PARAMS}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "llmsla control API", "version": "1",
                 "description": f"Router weights/drain/parameters, distillation controls, load shedding and A/B rollouts. Writes need "
                                f"`Authorization: Bearer <control.token>`; bodies over {MAX_BODY_BYTES} bytes are 413."},
        "paths": {
            "/v1/state": {"get": {"summary": "router snapshot and distillation state", "responses": {"200": {
                "description": "state", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["router", "distill", "experiments"],
                    "properties": {"router": {"type": "object"}, "distill": {"type": "object"},
                                   "shed": {"type": "object"}, "experiments": {"type": "object"}}}}}}}}},
            "/v1/experiments": {"get": {"summary": "A/B experiments with the weights and coverage in force",
                                        "responses": {"200": {"description": "experiments", "content": {
                                            "application/json": {"schema": {"type": "object", "required": ["experiments"],
                                                                            "properties": {"experiments": {"type": "object"}}}}}}}}},
            **common_paths(audit="last n audit records", openapi="3.0"),
            "/v1/replicas/{rid}/weight": _write("set a replica's weight (0 = soft drain)",
                                                {"weight": {"type": "number", "minimum": 0}}, required=["weight"],
                                                param="rid"),
            "/v1/replicas/{rid}/drain": _write("drain a replica (409 for the last healthy one of its pool)", {},
                                               required=[], param="rid", optional_body=True,
                                               codes=("400", "401", "404", "409", "413", "503")),
            "/v1/replicas/{rid}/undrain": _write("put a drained replica back", {}, required=[], param="rid",
                                                 optional_body=True),
            "/v1/router/params": _write("change the routing policy or LADR parameters at run time", params,
                                        required=[], param=None),
            "/v1/pools/{pool}/student_share": _write(
                "move the student share toward pct by at most control.max_share_step_pct",
                {"pct": {"type": "number", "minimum": 0, "maximum": 100}, "clamp": {"type": "boolean"}},
                required=["pct"], param="pool", codes=("400", "401", "404", "409", "413", "503")),
            "/v1/pools/{pool}/temperature_schedule": _write(
                "replace the temperature schedule (409 if a bound moves more than control.max_temperature_step)",
                {"name": {"type": "string"}, "params": {"type": "object"}}, required=["name"], param="pool",
                codes=("400", "401", "404", "409", "413", "503")),
            "/v1/pools/{pool}/shed": _shed(),
            "/v1/experiments/{key}/arms/{arm}/weight": _write(
                "an A/B arm's weight in force, 0 .. its configured weight (0 rolls the arm back; 409 above it)",
                {"weight": {"type": "number", "minimum": 0}}, required=["weight"], param=("key", "arm"),
                codes=("400", "401", "404", "409", "413", "503")),
            "/v1/experiments/{key}/coverage": _write(
                "ramp an A/B experiment: the share of units in it (units only join or leave, never change arm)",
                {"coverage": {"type": "number", "minimum": 0, "maximum": 1}}, required=["coverage"], param="key"),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": error_schema("3.0")},
        },
    }


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


GENERATOR = generated.Generator(
    "openapi-control", "python -m llmsla.control.openapi", COMMITTED, lambda cfg, root: {root: render()},
    lambda root: ["-m", "llmsla.control.openapi", str(root), "--check"])


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(generated.module_main(GENERATOR))
