"""The gateway's per-piece SSE readers against an event-by-event JSON reference.

``StreamTimer`` counts and stamps tokens and ``UsageStripper`` drops the usage the gateway asked
for, each with shortcuts for the pieces upstreams usually send (one event per piece; whole events
without usage passed as they are). Whatever the cut of a stream into pieces, both must give what
decoding each event on its own gives.
"""

from __future__ import annotations

import json
import random

from llmsla.exporters.openai import UsageStripper
from llmsla.exporters.recorder import StreamTimer, _token_count


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _stream(rng: random.Random) -> tuple[list[dict], list[bytes]]:
    """A stream's chunks and its events: role chunk, tokens (some empty, some with text that
    looks like keys), a finish chunk, maybe usage on a chunk with choices, the usage chunk."""
    chunks: list[dict] = [{"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    for _ in range(rng.randrange(0, 12)):
        text = rng.choice(["a", "", " the", '"usage": {', "[DONE]", 'x "text": "', "\\", "é"])
        key = rng.choice(["delta", "text"])
        choice = {"index": 0, "delta": {"content": text}} if key == "delta" else {"index": 0, "text": text}
        chunks.append({"id": "c1", "choices": [choice, dict(choice, index=1)] if rng.random() < 0.2 else [choice]})
    last: dict = {"id": "c1", "choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}]}
    if rng.random() < 0.3:
        last["usage"] = {"prompt_tokens": 3, "completion_tokens": len(chunks)}
    chunks.append(last)
    chunks.append({"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(chunks)}})
    events = [_sse(c) for c in chunks] + [b"data: [DONE]\n\n"]
    return chunks, events


def _pieces(rng: random.Random, events: list[bytes]) -> list[bytes]:
    """The stream cut anywhere, or along event ends in groups (several events per read)."""
    raw = b"".join(events)
    if rng.random() < 0.5:
        cuts = sorted(rng.sample(range(1, len(raw)), k=min(len(raw) - 1, rng.randrange(0, 8))))
        return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    out, i = [], 0
    while i < len(events):
        k = rng.randrange(1, 5)
        out.append(b"".join(events[i:i + k]))
        i += k
    return out


def _stripped(chunks: list[dict]) -> bytes:
    """The reference: each event decoded; the usage chunk dropped, usage taken off the others."""
    out = []
    for c in chunks:
        if "usage" in c and not c["choices"]:
            continue
        out.append(_sse({k: v for k, v in c.items() if k != "usage"}))
    return b"".join(out) + b"data: [DONE]\n\n"


def test_timer_and_stripper_agree_with_the_reference_on_any_cut() -> None:
    rng = random.Random(37)
    for _ in range(400):
        chunks, events = _stream(rng)
        pieces = _pieces(rng, events)
        timer, stripper = StreamTimer(0.0, streaming=True), UsageStripper()
        stamps_of_tokens: list[float] = []
        sent = b""
        for i, piece in enumerate(pieces):
            now = 1.0 + i
            before = timer.chunks_with_tokens
            timer.feed(piece, now)
            stamps_of_tokens += [now] * (timer.chunks_with_tokens - before)
            sent += stripper.feed(piece)
        sent += stripper.flush()
        tokens = [bool(_token_count(c)) for c in chunks]
        assert timer.chunks_with_tokens == sum(tokens), pieces
        assert timer.ended
        assert timer.usage == chunks[-1]["usage"]
        assert timer.finish_reasons == ["stop"]
        # the stamps: the first token's read, then one gap per later token, from the reads' times
        if stamps_of_tokens:
            assert timer.first_token == stamps_of_tokens[0]
            want = [(b - a) * 1000.0 for a, b in zip(stamps_of_tokens, stamps_of_tokens[1:], strict=False)]
            assert timer.gaps_ms == want
        assert sent == _stripped(chunks), (pieces, sent)


def test_stripper_passes_pieces_without_usage_unchanged_and_the_same_object() -> None:
    s = UsageStripper()
    piece = _sse({"choices": [{"delta": {"content": "a"}}]}) * 3
    assert s.feed(piece) is piece
    # a read that ends mid-event is held to the event's end, then given whole
    assert s.feed(b"data: {\"choices\":[]") == b""
    assert s.feed(b",\"usage\":{\"prompt_tokens\":1}}\n\n") == b""
    assert s.feed(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
