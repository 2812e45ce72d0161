"""Alertmanager webhook v4: parse and validate one notification, whoever sent it.

Two levels, because Alertmanager never retries a 4xx: a bad envelope is a :class:`WebhookError`
(400), a bad alert is a :class:`Skipped` entry and the rest of the notification is acted on.
Strict on what the receiver relies on, lenient on what it does not use, and every reason names
the field so the sender's log says what to fix.
See docs/alerting.md#the-webhook-contract-and-the-label-set-for-every-sender-the-forecaster-included.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from llmsla import names
from llmsla.httpkit import loads_json

VERSION = "4"
FIRING = "firing"
RESOLVED = "resolved"
STATUSES = (FIRING, RESOLVED)
#: an alert with more labels, or a longer label name or value, is skipped (its identity would not
#: fit an audit row); annotations and generatorURL are only informational and are truncated
MAX_LABELS = 256
MAX_LABEL_VALUE = 4096
MAX_ANNOTATION_VALUE = 16384
MAX_URL = 4096
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
class Skipped:
    """An alert the receiver cannot act on: audited with its reason, never a rejected group."""

    index: int
    reason: str
    alertname: str = ""
    fingerprint: str = ""
    status: str = ""
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Notification:
    version: str
    group_key: str
    status: str
    receiver: str
    alerts: list[Alert] = field(default_factory=list)
    truncated: int = 0
    skipped: list[Skipped] = field(default_factory=list)


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


def printable(v: Any, max_len: int = 256) -> str:
    """Any value as storable text of at most ``max_len`` characters (NUL and lone surrogates
    replaced): what an audit row may quote of an alert it could not use."""
    s = v if isinstance(v, str) else _show(v)
    s = s.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")
    return s if len(s) <= max_len else s[: max_len - 3] + "..."


def _clip(v: Any, max_len: int) -> str:
    """Informational text: kept if it is a string, cut to ``max_len``, made storable."""
    return printable(v, max_len) if isinstance(v, str) else ""


def _text(v: Any, where: str, *, max_len: int = 4096, default: str = "") -> str:
    if v is None:
        return default
    if not isinstance(v, str):
        raise WebhookError(f"{where}: expected a string, got {_show(v)}")
    if len(v) > max_len or not storable(v):
        raise WebhookError(f"{where}: longer than {max_len} characters, or contains NUL or a lone surrogate")
    return v


def _labels(v: Any, where: str) -> dict[str, str]:
    """An alert's labels: its identity and what the policy matches, so every entry must be usable."""
    if not isinstance(v, dict):
        raise WebhookError(f"{where}: expected an object of strings, got {type(v).__name__}")
    if len(v) > MAX_LABELS:
        raise WebhookError(f"{where}: {len(v)} entries, at most {MAX_LABELS}")
    for k, val in v.items():
        # UTF-8 names (Alertmanager's default mode): any non-empty string PostgreSQL can store
        if not k or len(k) > MAX_LABEL_VALUE or not storable(k):
            raise WebhookError(f"{where}: {_show(k)} is not a usable label name (empty, longer than "
                               f"{MAX_LABEL_VALUE} characters, or contains NUL or a lone surrogate)")
        if not isinstance(val, str):
            raise WebhookError(f"{where}.{k}: expected a string, got {_show(val)}")
        if len(val) > MAX_LABEL_VALUE or not storable(val):
            raise WebhookError(f"{where}.{k}: longer than {MAX_LABEL_VALUE} characters, or contains NUL or "
                               "a lone surrogate")
    return v


def _annotations(v: Any) -> dict[str, str]:
    """Informational: string entries kept (cut to ``MAX_ANNOTATION_VALUE``), anything else dropped."""
    if not isinstance(v, dict):
        return {}
    return {printable(k, MAX_LABEL_VALUE): _clip(val, MAX_ANNOTATION_VALUE)
            for k, val in v.items() if isinstance(val, str)}


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
    labels = _labels(v["labels"], f"{where}.labels")
    if not labels.get(names.L_ALERTNAME):
        raise WebhookError(f"{where}.labels.alertname: missing or empty")
    annotations = _annotations(v.get("annotations"))
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
    gen = _clip(v.get("generatorURL"), MAX_URL)
    return Alert(status, dict(labels), dict(annotations), starts, ends, fp, gen)


def parse(raw: bytes) -> Notification:
    """Bytes of a POST body -> :class:`Notification`, or :class:`WebhookError` with the reason."""
    if not raw:
        raise WebhookError("empty body: expected an Alertmanager webhook v4 JSON object")
    try:
        body = loads_json(raw, text=False)  # bad strings are audited alert by alert
    except ValueError as exc:
        raise WebhookError(str(exc)) from None
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
    gk = printable(gk, 4096)
    status = body.get("status")
    if status not in STATUSES:
        raise WebhookError(f"status: expected 'firing' or 'resolved', got {_show(status)}")
    receiver = _clip(body.get("receiver"), 4096)
    # groupLabels, commonLabels, commonAnnotations, externalURL: not used, never a reason to refuse
    trunc = body.get("truncatedAlerts", 0)
    if isinstance(trunc, float) and trunc.is_integer():
        trunc = int(trunc)  # JSON has one number type: 3.0 is the integer 3
    if isinstance(trunc, bool) or not isinstance(trunc, int) or trunc < 0:
        raise WebhookError(f"truncatedAlerts: expected an integer >= 0, got {_show(trunc)}")
    alerts = body.get("alerts")
    if not isinstance(alerts, list):
        raise WebhookError(f"alerts: expected a list, got {_show(alerts)}")
    if not alerts:
        raise WebhookError("alerts: empty; a notification carries at least one alert")
    parsed: list[Alert] = []
    skipped: list[Skipped] = []
    for i, a in enumerate(alerts):
        try:
            parsed.append(_alert(a, f"alerts[{i}]"))
        except WebhookError as exc:
            skipped.append(_skipped(i, a, exc.reason))
    return Notification(VERSION, gk, status, receiver, parsed, trunc, skipped)


def _skipped(i: int, a: Any, reason: str) -> Skipped:
    """What can be quoted of an unusable alert, every string storable and short."""
    if not isinstance(a, dict):
        return Skipped(i, printable(reason, 1024))
    raw = a.get("labels")
    labels = ({printable(k, 128): printable(v) for k, v in list(raw.items())[:64]}
              if isinstance(raw, dict) else {})
    fp, status = a.get("fingerprint"), a.get("status")
    return Skipped(i, printable(reason, 1024), labels.get(names.L_ALERTNAME, ""),
                   printable(fp, 64) if isinstance(fp, str) else "",
                   status if isinstance(status, str) and status in STATUSES else "", labels)
