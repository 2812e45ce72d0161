"""OpenAPI 3.1 document of the receiver, served at ``/openapi.json`` and committed as
``deploy/openapi/receiver.json`` (a test keeps the two equal; ``python -m llmsla.alerting.openapi
[--check]`` rewrites or checks the file, :mod:`llmsla.generated`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmsla import generated
from llmsla.alerting import webhook
from llmsla.openapi import ERROR_RESPONSE, common_paths, error_schema

COMMITTED = Path("deploy/openapi/receiver.json")
#: UTF-8 label names, as Alertmanager's default mode and Prometheus 3 send them
_LABEL_NAME = {"type": "string", "minLength": 1, "maxLength": webhook.MAX_LABEL_VALUE}
_DATE = "(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
_ZONE = "(\\.[0-9]{1,9})?(Z|[+-](0[0-9]|1[0-3]):[0-5][0-9])$"
#: RFC 3339 as Alertmanager writes it (a pattern rather than format: date-time, so generated
#: examples stay inside what the receiver accepts: a start in year 2000 or later)
_TIME = {"type": "string", "pattern": "^[0-9]{4}-" + _DATE + _ZONE}
_START = {"type": "string", "pattern": "^2[0-9]{3}-" + _DATE + _ZONE}


def _map(max_value: int) -> dict[str, Any]:
    return {"type": "object", "maxProperties": webhook.MAX_LABELS, "propertyNames": _LABEL_NAME,
            "additionalProperties": {"type": "string", "maxLength": max_value}}


_STR_MAP = _map(webhook.MAX_LABEL_VALUE)
_ERROR = ERROR_RESPONSE


def document() -> dict[str, Any]:
    alert = {
        "type": "object",
        "required": ["status", "labels", "startsAt"],
        "properties": {
            "status": {"type": "string", "enum": list(webhook.STATUSES)},
            "labels": {**_STR_MAP, "required": ["alertname"],
                       "properties": {"alertname": {"type": "string", "minLength": 1, "maxLength": webhook.MAX_LABEL_VALUE}},
                       "description": "alertname, severity, slo, model, pool, replica, scope, source (docs/alerting.md)"},
            "annotations": {**_map(webhook.MAX_ANNOTATION_VALUE), "description": "informational; cut, never refused"},
            "startsAt": _START,
            "endsAt": _TIME,
            "generatorURL": {"type": "string", "description": f"informational; cut to {webhook.MAX_URL} characters"},
            "fingerprint": {"type": "string", "pattern": "^[0-9a-zA-Z_-]{1,64}$"},
        },
    }
    notification = {
        "type": "object",
        "required": ["version", "groupKey", "status", "alerts"],
        "description": "Alertmanager webhook v4; fields not listed are ignored. An alert the receiver cannot "
                       "use is audited as `invalid` and skipped; the others are acted on (200).",
        "properties": {
            "version": {"type": "string", "enum": [webhook.VERSION]},
            "groupKey": {"type": "string"},
            "truncatedAlerts": {"type": "integer", "minimum": 0},
            "status": {"type": "string", "enum": list(webhook.STATUSES)},
            "receiver": {"type": "string", "maxLength": 4096},
            "groupLabels": _STR_MAP,
            "commonLabels": _STR_MAP,
            "commonAnnotations": _map(webhook.MAX_ANNOTATION_VALUE),
            "externalURL": {"type": "string", "maxLength": 4096},
            "alerts": {"type": "array", "minItems": 1, "description": "any number within receiver.max_body_bytes",
                       "items": {"$ref": "#/components/schemas/Alert"}},
        },
    }
    outcome = {"type": "object", "properties": {
        "fingerprint": {"type": "string"}, "alertname": {"type": "string"}, "status": {"type": "string"},
        "decision": {"type": "string", "enum": ["act", "joined", "duplicate", "stale", "resolved",
                                                "resolved_partial", "no_rule", "unroutable", "deferred", "invalid"]},
        "reason": {"type": "string"}, "target": {"type": "string"},
        "actions": {"type": "array", "items": {"type": "object"}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "llmsla alert receiver", "version": "1",
                 "description": "Alertmanager webhook v4 in; router and distillation actions out through the "
                                "control API. Writes need `Authorization: Bearer <receiver.token>`."},
        "paths": {
            "/v1/alerts": {"post": {
                "summary": "Receive a webhook v4 notification (Alertmanager or the forecaster)",
                "security": [{"bearer": []}],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Notification"}}}},
                "responses": {
                    "200": {"description": "recorded; one outcome per alert", "content": {"application/json": {
                        "schema": {"type": "object", "required": ["alerts", "results"], "properties": {
                            "alerts": {"type": "integer"},
                            "skipped": {"type": "integer", "description": "alerts audited as invalid"},
                            "truncated": {"type": "integer", "description": "truncatedAlerts of the notification"},
                            "results": {"type": "array", "items": {"$ref": "#/components/schemas/Outcome"}}}}}}},
                    "400": _ERROR, "401": _ERROR, "413": _ERROR,
                    "503": {**_ERROR, "description": "no token configured, or the store is down (Alertmanager retries)"},
                }}},
            "/v1/state": {"get": {"summary": "per-target receiver state", "responses": {"200": {
                "description": "targets", "content": {"application/json": {"schema": {"type": "object"}}}}}}},
            **common_paths(audit="recent audit rows written by this process", openapi="3.1"),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Alert": alert, "Notification": notification, "Outcome": outcome,
                        "Error": error_schema("3.1")},
        },
    }


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


GENERATOR = generated.Generator(
    "openapi-receiver", "python -m llmsla.alerting.openapi", COMMITTED, lambda cfg, root: {root: render()},
    lambda root: ["-m", "llmsla.alerting.openapi", str(root), "--check"])


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(generated.module_main(GENERATOR))
