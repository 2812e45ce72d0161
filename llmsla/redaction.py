"""One redaction for every string that may carry a credential: DSNs, Redis/OTLP/upstream URLs,
tokens. Messages, log lines and ``llmsla config show`` all go through it.

It never parses strictly, it finds and masks: a DSN with a ``%`` that is not an escape or a space
in its password is exactly the one a driver refuses, and its error message then echoes the
password. So there are two tools: :func:`redact` masks the secrets inside one credential string,
and :func:`scrub` masks the secrets of known credentials wherever they appear in other text (a
driver's error message, a log record; :class:`ScrubFilter` does it for logging).
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Iterable

MASK = "***"
#: Shorter secrets are not scrubbed from free text: masking every "ab" would garble messages.
MIN_SCRUB_CHARS = 4

_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_KV = re.compile(r"(\b(?:password|passwd|pwd|sslpassword)\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)", re.IGNORECASE)
_QUERY = re.compile(
    r"([?&;](?:password|passwd|pwd|sslpassword|token|secret|api[_-]?key|access[_-]?token|auth)=)([^&#\s]*)",
    re.IGNORECASE,
)


def _authority_starts(value: str) -> list[int]:
    """Where the authority of each ``scheme://`` in ``value`` begins (just after ``://``).

    A scan for ``://``, then back over the scheme characters before it: linear in the length of
    ``value``. The regex it replaces (``[A-Za-z][A-Za-z0-9+.-]*://``) retried its greedy run at
    every letter, quadratic in a long run of letters: a 100,000-character value took 14 s to load.
    A scheme is a letter then letters, digits, ``+``, ``.`` or ``-``; as with the regex, it starts
    at the first letter of the run of scheme characters before ``://``."""
    starts: list[int] = []
    pos = value.find("://")
    while pos >= 0:
        i = pos
        while i > 0 and value[i - 1] in _SCHEME_CHARS:
            i -= 1
        if any(c.isascii() and c.isalpha() for c in value[i:pos]):
            starts.append(pos + 3)
        pos = value.find("://", pos + 3)
    return starts


def _userinfo_secrets(value: str) -> list[tuple[int, int]]:
    """Spans of URL passwords: after ``scheme://user:`` up to the last ``@`` before the next
    URL (a password may hold ``/``, ``@`` or spaces when it is not percent-encoded)."""
    spans: list[tuple[int, int]] = []
    starts = _authority_starts(value)
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(value)
        segment = value[start:end]
        at = segment.rfind("@")
        if at < 0:
            continue
        colon = segment.find(":", 0, at)
        if colon >= 0 and colon + 1 < at:
            spans.append((start + colon + 1, start + at))
    return spans


def _spans(value: str) -> list[tuple[int, int]]:
    spans = _userinfo_secrets(value)
    for m in _KV.finditer(value):
        spans.append(m.span(2))
    for m in _QUERY.finditer(value):
        if m.end(2) > m.start(2):
            spans.append(m.span(2))
    return sorted(spans)


def redact(value: str) -> str:
    """``value`` with every password of a URL (``scheme://user:password@host``), of a key=value
    DSN (``password=...``) and every secret-looking query parameter replaced by ``***``."""
    out, pos = [], 0
    for start, end in _spans(value):
        if start < pos:
            continue
        out += [value[pos:start], MASK]
        pos = end
    out.append(value[pos:])
    return "".join(out)


def secrets_of(value: str) -> set[str]:
    """The secrets :func:`redact` masks in ``value``, as written and percent-decoded (a driver
    may echo either), quotes stripped; for :func:`scrub`."""
    found: set[str] = set()
    for start, end in _spans(value):
        raw = value[start:end].strip("'")
        for s in (raw, urllib.parse.unquote(raw), urllib.parse.unquote_plus(raw)):
            if len(s) >= MIN_SCRUB_CHARS:
                found.add(s)
    return found


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` (longest first) replaced by ``***``; a secret shorter
    than :data:`MIN_SCRUB_CHARS` is left alone (masking a one-character token would turn every
    occurrence of that character into ``***``; tokens shorter than 16 are refused at load)."""
    for s in sorted(secrets, key=len, reverse=True):
        if len(s) >= MIN_SCRUB_CHARS and s in text:
            text = text.replace(s, MASK)
    return text


class ScrubFilter(logging.Filter):
    """Masks known secrets (tokens, DSN passwords) in every record that passes through a handler,
    so no log line carries them whatever the code that logged it formatted."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = {s for s in secrets if len(s) >= MIN_SCRUB_CHARS}

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        clean = scrub(message, self.secrets)
        if record.exc_info and record.exc_text is None:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        return True
