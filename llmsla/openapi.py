"""OpenAPI pieces every llmsla server's document shares: the error body the HTTP kit answers
with and the paths every server has (audit, liveness, metrics, the document itself)."""

from __future__ import annotations

from typing import Any

#: A response whose body is the kit's error (``llmsla.httpkit.error_response``).
ERROR_RESPONSE: dict[str, Any] = {"description": "the reason", "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/Error"}}}}


def error_schema(openapi: str) -> dict[str, Any]:
    """The OpenAI error shape, ``{"error": {message, type, param, code}}`` (``param`` nullable,
    spelled as the document's OpenAPI version wants)."""
    param: dict[str, Any] = {"type": ["string", "null"]} if openapi.startswith("3.1") else {"type": "string", "nullable": True}
    return {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "code"],
        "description": "the OpenAI error shape, as every llmsla server answers",
        "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "param": param,
                       "code": {"type": "string"}}}}}


def _json(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {"type": "object"}}}}


def common_paths(*, audit: str, openapi: str) -> dict[str, Any]:
    """``/v1/audit``, ``/healthz``, ``/metrics`` and ``/openapi.json`` as every server serves them."""
    return {
        "/v1/audit": {"get": {
            "summary": audit,
            "parameters": [{"name": "n", "in": "query", "required": False,
                            "schema": {"type": "integer", "minimum": 1, "maximum": 10000}}],
            "responses": {"200": _json("records"), "400": ERROR_RESPONSE}}},
        "/healthz": {"get": {"summary": "liveness", "responses": {"200": _json("ok")}}},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {
            "description": "text exposition", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/openapi.json": {"get": {"summary": "this document", "responses": {"200": _json(f"OpenAPI {openapi}")}}},
    }
