"""The request decode and the trace context read every request: their short cuts must answer
exactly what the general code answers (``json.loads`` with the hooks, OpenTelemetry's
propagator) on every input, hostile ones included."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import trace as otel_trace

from llmsla import httpkit

BODIES: list[bytes] = [
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 16}',
    b'{"a": 9223372036854775807}', b'{"a": 9223372036854775808}', b'{"a": -9223372036854775809}',
    b'{"a": NaN}', b'{"a": -Infinity}', b'{"a": 1e400}', b'{"a": 1.5, "b": [1, 2, {"c": null}]}',
    b'{"a": "\\ud800"}', b'{"a": "\\ud83d\\ude00"}', '{"a": "é\u2028"}'.encode(),
    b'\xef\xbb\xbf{"bom": 1}', '{"wide": 1}'.encode("utf-16"), '{"wide": 1}'.encode("utf-32-le"),
    b'{"a": "\xff"}', b"{", b"[]", b"", b"   ", b'"text"', b"1 2", b"[" * 100_000, b'{"a": 1}   ',
    b'{"a": 1, "a": 2}',
]


def reference(raw: bytes | bytearray) -> tuple[bool, object]:
    """(True, value) as ``json.loads`` with the hooks reads ``raw``, or (False, the reason
    :func:`httpkit.loads_json` gives for its error)."""
    try:
        return True, json.loads(raw, parse_int=httpkit._bounded_int, parse_constant=httpkit._no_constant)
    except UnicodeDecodeError as exc:
        return False, f"body is not UTF-8: {exc.reason} at byte {exc.start}"
    except ValueError as exc:
        return False, f"body is not valid JSON: {exc}"
    except RecursionError:
        return False, "body is not valid JSON: nested too deeply"


@pytest.mark.parametrize("raw", BODIES, ids=range(len(BODIES)))
def test_loads_json_answers_what_json_loads_answers(raw: bytes) -> None:
    for given in (raw, bytearray(raw)):
        ok, want = reference(given)
        try:
            got = httpkit.loads_json(given, text=False)
        except ValueError as exc:
            assert (ok, want) == (False, str(exc))
        else:
            assert (ok, want) == (True, got)


def propagated(headers: object) -> otel_trace.SpanContext:
    return otel_trace.get_current_span(httpkit._PROPAGATOR.extract(headers)).get_span_context()


@pytest.mark.parametrize("headers", [
    {}, {"Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    {"traceparent": ""}, {"traceparent": "garbage"}, {"x-request-id": "a"},
    {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    CIMultiDictProxy(CIMultiDict({"TRACEPARENT": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})),
    CIMultiDictProxy(CIMultiDict({"Accept": "*/*"})),
], ids=range(8))
def test_incoming_span_is_what_the_propagator_reads(headers: object) -> None:
    assert httpkit.incoming_span(headers) == propagated(headers)  # type: ignore[arg-type]
