"""Alertmanager webhook v4: parse and validate one notification, whoever sent it.

Alertmanager and the forecaster post the same shape. Validation is strict on what the receiver
relies on (types, required fields, label names, RFC 3339 times, sizes) and lenient on fields it
does not use: an Alertmanager upgrade that adds a field must not turn every notification into a
400. Every problem is a :class:`WebhookError` whose reason names the field (``alerts[3].startsAt``),
so the sender's log says what to fix.

Idempotency key of an alert: ``(fingerprint, status, startsAt)``. Alertmanager keeps ``startsAt``
for the alert's whole life and re-sends it every ``repeat_interval`` and from every HA peer, so
repeats share the key; a new episode of the same alert has a new ``startsAt``. A sender without
fingerprints gets one computed from the sorted labels (SHA-256, 16 hex digits).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from llmsla import names

VERSION = "4"
FIRING = "firing"
RESOLVED = "resolved"
STATUSES = (FIRING, RESOLVED)
MAX_ALERTS = 1000
MAX_LABELS = 64
MAX_LABEL_VALUE = 1024
MAX_ANNOTATION_VALUE = 16384
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
_FINGERPRINT = re.compile(r"^[0-9a-zA-Z_-]{1,64}$")
ZERO_TIME = dt.datetime(1, 1, 1, tzinfo=dt.UTC)


class WebhookError(ValueError):
    """A notification the receiver cannot use; ``status`` is the HTTP answer (400, 413, 422)."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Alert:
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: dt.datetime
    ends_at: dt.datetime
    fingerprint: str
    generator_url: str = ""

    @property
    def name(self) -> str:
        return self.labels[names.L_ALERTNAME]

    @property
    def starts_iso(self) -> str:
        return iso(self.starts_at)

    @property
    def dedupe_key(self) -> str:
        return f"{self.fingerprint}:{self.status}:{self.starts_iso}"


@dataclass(frozen=True)
class Notification:
    version: str
    group_key: str
    status: str
    receiver: str
    alerts: list[Alert] = field(default_factory=list)
    truncated: int = 0


def iso(t: dt.datetime) -> str:
    """UTC, microseconds: one spelling per instant (the idempotency key compares strings)."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(v: Any, where: str, *, required: bool) -> dt.datetime:
    if v is None or v == "":
        if required:
            raise WebhookError(f"{where}: missing (RFC 3339 time expected)")
        return ZERO_TIME
    if not isinstance(v, str) or not _RFC3339.match(v):
        raise WebhookError(f"{where}: expected an RFC 3339 time like 2024-05-01T12:00:00Z, got {_show(v)}")
    frac = re.search(r"\.(\d+)", v)
    if frac and len(frac.group(1)) > 6:  # Go sends nanoseconds; Python keeps microseconds
        v = v.replace(frac.group(0), "." + frac.group(1)[:6])
    try:
        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        t.astimezone(dt.UTC)
    except (ValueError, OverflowError) as exc:
        raise WebhookError(f"{where}: not a valid time ({exc}): {_show(v)}") from None
    return t


def _show(v: Any) -> str:
    s = json.dumps(v, ensure_ascii=True, default=str)
    return s if len(s) <= 80 else s[:77] + "..."


def storable(v: str) -> bool:
    """No NUL and no lone surrogate: PostgreSQL text (and UTF-8) can hold it."""
    if "\x00" in v:
        return False
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text(v: Any, where: str, *, max_len: int = 4096, default: str = "") -> str:
    if v is None:
        return default
    if not isinstance(v, str):
        raise WebhookError(f"{where}: expected a string, got {_show(v)}")
    if len(v) > max_len or not storable(v):
        raise WebhookError(f"{where}: longer than {max_len} characters, or contains NUL or a lone surrogate")
    return v


def _str_map(v: Any, where: str, *, max_value: int, required: bool = False) -> dict[str, str]:
    if v is None and not required:
        return {}
    if not isinstance(v, dict):
        raise WebhookError(f"{where}: expected an object of strings, got {type(v).__name__}")
    if len(v) > MAX_LABELS:
        raise WebhookError(f"{where}: {len(v)} entries, at most {MAX_LABELS}")
    for k, val in v.items():
        if not _LABEL_NAME.match(k):
            raise WebhookError(f"{where}: {_show(k)} is not a valid label name")
        if not isinstance(val, str):
            raise WebhookError(f"{where}.{k}: expected a string, got {_show(val)}")
        if len(val) > max_value or not storable(val):
            raise WebhookError(f"{where}.{k}: longer than {max_value} characters, or contains NUL or a lone surrogate")
    return v


def fingerprint_of(labels: dict[str, str]) -> str:
    raw = json.dumps(sorted(labels.items()), separators=(",", ":")).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def _alert(v: Any, where: str) -> Alert:
    if not isinstance(v, dict):
        raise WebhookError(f"{where}: expected an object, got {type(v).__name__}")
    status = v.get("status")
    if status not in STATUSES:
        raise WebhookError(f"{where}.status: expected 'firing' or 'resolved', got {_show(status)}")
    if "labels" not in v:
        raise WebhookError(f"{where}.labels: missing")
    labels = _str_map(v["labels"], f"{where}.labels", max_value=MAX_LABEL_VALUE, required=True)
    if not labels.get(names.L_ALERTNAME):
        raise WebhookError(f"{where}.labels.alertname: missing or empty")
    annotations = _str_map(v.get("annotations"), f"{where}.annotations", max_value=MAX_ANNOTATION_VALUE)
    starts = _time(v.get("startsAt"), f"{where}.startsAt", required=True)
    if starts == ZERO_TIME or starts.astimezone(dt.UTC).year < 2000:
        raise WebhookError(f"{where}.startsAt: {_show(v.get('startsAt'))} is not a real start time")
    ends = _time(v.get("endsAt"), f"{where}.endsAt", required=False)
    if status == RESOLVED and ends != ZERO_TIME and ends < starts:
        raise WebhookError(f"{where}.endsAt: before startsAt")
    fp = v.get("fingerprint")
    if fp is None or fp == "":
        fp = fingerprint_of(labels)
    elif not isinstance(fp, str) or not _FINGERPRINT.match(fp):
        raise WebhookError(f"{where}.fingerprint: expected 1-64 letters/digits, got {_show(fp)}")
    gen = _text(v.get("generatorURL"), f"{where}.generatorURL")
    return Alert(status, dict(labels), dict(annotations), starts, ends, fp, gen)


def parse(raw: bytes) -> Notification:
    """Bytes of a POST body -> :class:`Notification`, or :class:`WebhookError` with the reason."""
    if not raw:
        raise WebhookError("empty body: expected an Alertmanager webhook v4 JSON object")
    try:
        body = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise WebhookError(f"body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except ValueError as exc:
        raise WebhookError(f"body is not valid JSON: {exc}") from None
    return parse_obj(body)


def parse_obj(body: Any) -> Notification:
    if not isinstance(body, dict):
        raise WebhookError(f"body must be a JSON object, got {type(body).__name__}")
    version = body.get("version")
    if version != VERSION:
        raise WebhookError(f"version: expected \"4\" (Alertmanager webhook v4), got {_show(version)}")
    gk = body.get("groupKey")
    if not isinstance(gk, str):
        raise WebhookError(f"groupKey: expected a string, got {_show(gk)}")
    gk = _text(gk, "groupKey")
    status = body.get("status")
    if status not in STATUSES:
        raise WebhookError(f"status: expected 'firing' or 'resolved', got {_show(status)}")
    receiver = _text(body.get("receiver"), "receiver")
    for k in ("groupLabels", "commonLabels"):
        _str_map(body.get(k), k, max_value=MAX_LABEL_VALUE)
    _str_map(body.get("commonAnnotations"), "commonAnnotations", max_value=MAX_ANNOTATION_VALUE)
    trunc = body.get("truncatedAlerts", 0)
    if isinstance(trunc, float) and trunc.is_integer():
        trunc = int(trunc)  # JSON has one number type: 3.0 is the integer 3
    if isinstance(trunc, bool) or not isinstance(trunc, int) or trunc < 0:
        raise WebhookError(f"truncatedAlerts: expected an integer >= 0, got {_show(trunc)}")
    _text(body.get("externalURL"), "externalURL")
    alerts = body.get("alerts")
    if not isinstance(alerts, list):
        raise WebhookError(f"alerts: expected a list, got {_show(alerts)}")
    if not alerts:
        raise WebhookError("alerts: empty; a notification carries at least one alert")
    if len(alerts) > MAX_ALERTS:
        raise WebhookError(f"alerts: {len(alerts)} alerts, at most {MAX_ALERTS} per notification "
                           "(set max_alerts in the webhook config)", 413)
    parsed = [_alert(a, f"alerts[{i}]") for i, a in enumerate(alerts)]
    return Notification(VERSION, gk, status, receiver, parsed, trunc)
