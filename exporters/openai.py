"""The OpenAI request shape, as far as llmsla relies on it: the gateway and the ASGI middleware
both validate a completion request here before anything is recorded.

Only the parts the measurement needs are checked (model, stream, the prompt's size, the policy
hint); the rest is the upstream's business. The model name reaches metric labels, the spool and
the store, so it must be a storable string (``llmsla.events.string_problem``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmsla import names
from llmsla.events import MAX_STRING_CHARS, string_problem
from llmsla.httpkit import ApiError, parse_json_object

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"


def _content_chars(content: Any, where: str) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):  # multimodal parts: count the text ones
        total = 0
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"])
        return total
    raise ApiError(400, f"{where}: expected a string or a list of parts", code="invalid_field", param=where)


@dataclass(slots=True)
class ParsedRequest:
    body: dict[str, Any]
    model: str
    stream: bool
    prompt_chars: int
    policy: str


def parse_request(raw: bytes, path: str, *, max_prompt_chars: int) -> ParsedRequest:
    """Validate the parts the gateway relies on; the rest is the upstream's business."""
    body = parse_json_object(raw, what="request body")
    model = body.get("model")
    if model is None:
        raise ApiError(400, "missing required field 'model'", code="missing_model", param="model")
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_STRING_CHARS:
        raise ApiError(400, f"'model' must be a non-empty string of at most {MAX_STRING_CHARS} characters", code="invalid_model", param="model")
    problem = string_problem(model)
    if problem is not None:  # it would reach metric labels, the spool and the store
        raise ApiError(400, f"'model' {problem}", code="invalid_model", param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false", code="invalid_field", param="stream")
    if path == CHAT_COMPLETIONS:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list", code="missing_messages", param="messages")
        chars = 0
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                raise ApiError(400, f"messages[{i}] must be an object", code="invalid_field", param=f"messages[{i}]")
            chars += _content_chars(msg.get("content"), f"messages[{i}].content")
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise ApiError(400, "missing required field 'prompt'", code="missing_prompt", param="prompt")
        if isinstance(prompt, str):
            chars = len(prompt)
        elif isinstance(prompt, list):  # batch of strings or token ids
            chars = sum(len(p) if isinstance(p, str | list) else 1 for p in prompt)
        else:
            raise ApiError(400, "'prompt' must be a string or a list", code="invalid_field", param="prompt")
    if chars > max_prompt_chars:
        raise ApiError(400, f"prompt has {chars} characters, more than the gateway limit of {max_prompt_chars}",
                       code="prompt_too_long", param="prompt")
    policy = storable_label(body.get("llmsla_policy"))
    return ParsedRequest(body, model, stream, chars, policy)


def storable_label(value: Any, limit: int = 64) -> str:
    """A client- or upstream-chosen policy name as it may be recorded: a short storable string,
    else the default (a hint, so normalised rather than refused)."""
    if not isinstance(value, str) or not value or len(value) > limit or string_problem(value) is not None:
        return names.DEFAULT_POLICY
    return value


def prompt_estimate(chars: int) -> int:
    """Prompt tokens when the upstream reports no ``usage``: ~4 characters per token."""
    return (chars + 3) // 4


def unit_key(body: dict[str, Any], headers: Mapping[str, str], trace_id: str) -> str:
    """The unit a request belongs to, for the student split (and A/B buckets): the body's OpenAI
    ``user``, else the ``names.UNIT_HEADER`` session header, else the request's own trace id."""
    user = body.get("user")
    if isinstance(user, str) and user:
        return user
    # aiohttp's headers are case-insensitive; an ASGI scope's are a plain dict of lower-case names
    return headers.get(names.UNIT_HEADER) or headers.get(_UNIT_HEADER_LOWER) or trace_id


_UNIT_HEADER_LOWER = names.UNIT_HEADER.lower()


def wants_usage(body: Mapping[str, Any]) -> bool:
    """The client asked for a streamed ``usage`` chunk (``stream_options.include_usage``)."""
    opts = body.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


_ASK_USAGE = b'{"stream_options":{"include_usage":true},'


def with_usage(raw: bytes, body: dict[str, Any]) -> bytes | None:
    """The request bytes asking the upstream for the usage chunk, or None when it cannot be
    added (the client sent a ``stream_options`` that is not an object: the replica answers
    that). Without ``stream_options`` (the usual case) the key is put in front of the client's
    own bytes rather than re-encoding a body that may hold a long prompt."""
    opts = body.get("stream_options")
    if opts is None and "stream_options" not in body:
        start = raw.find(b"{")  # a JSON object (parse_request checked), with at least "model"
        return raw[:start] + _ASK_USAGE + raw[start + 1:]
    if opts is not None and not isinstance(opts, dict):
        return None
    return json.dumps({**body, "stream_options": {**(opts or {}), "include_usage": True}},
                      separators=(",", ":")).encode()


class UsageStripper:
    """Removes the usage the gateway asked for from a stream the client did not ask it for.

    OpenAI sends it as a last chunk with empty ``choices``; that event is dropped whole. An
    upstream that puts ``usage`` on a chunk with choices gets that one event re-encoded without
    the key. Every other byte passes unchanged: a piece made of whole events without ``"usage"``
    is returned as is (the per-token case, no copy); anything else is buffered to event ends.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        if not self._buf and data.endswith(b"\n\n") and b'"usage"' not in data:
            return data
        buf = self._buf + data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return b""
        done, self._buf = buf[: end + 2], buf[end + 2:]
        if b'"usage"' not in done:
            return done
        return b"".join(self._event(ev + b"\n\n") for ev in done[:-2].split(b"\n\n"))

    def flush(self) -> bytes:
        """What is left at the end of the stream (an unterminated last event), unchanged."""
        rest, self._buf = self._buf, b""
        return rest

    @staticmethod
    def _event(ev: bytes) -> bytes:
        if b'"usage"' not in ev:
            return ev
        lines = ev.split(b"\n")
        data = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
        if len(data) != 1:
            return ev
        try:
            obj = json.loads(lines[data[0]][5:])
        except ValueError:
            return ev
        if not isinstance(obj, dict) or "usage" not in obj:
            return ev
        if not obj.get("choices"):
            return b""  # the usage chunk itself
        del obj["usage"]
        lines[data[0]] = b"data: " + json.dumps(obj, separators=(",", ":")).encode()
        return b"\n".join(lines)
