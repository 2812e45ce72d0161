"""The fast sample reader gives exactly what prometheus-client's parsers give on every engine's
exposition in both formats, and hands every shape it does not accept back to them (so a bad
body is still refused, and an unusual but valid one is still read)."""

from __future__ import annotations

import pytest

from llmsla.engines.adapt import READS, snapshot
from llmsla.engines.parse import OPENMETRICS_TYPE, ParseError, _parse, fast_samples, parse, select

from . import expositions as ex

OM = f"{OPENMETRICS_TYPE}; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"
BODIES = {"vllm": ex.vllm(), "sglang": ex.sglang(), "trtllm": ex.trtllm()}


@pytest.mark.parametrize("engine", sorted(BODIES))
@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
def test_same_samples_as_prometheus_client(engine: str, fmt: str) -> None:
    body = getattr(BODIES[engine], fmt)
    ctype = OM if fmt == "openmetrics" else TEXT
    fast = fast_samples(body, fmt == "openmetrics", READS)
    slow = _parse(select(body, READS), ctype)
    assert fast is not None  # the plain shape: read without prometheus-client
    assert dict(fast.samples) == dict(slow.samples)
    assert snapshot(fast, engine, replica="r0", pool="p", ts=1.0) == snapshot(slow, engine, replica="r0", pool="p",
                                                                                ts=1.0)


def test_triton_text() -> None:
    fast = fast_samples(ex.TRITON, False, READS)
    assert fast is not None and dict(fast.samples) == dict(_parse(select(ex.TRITON, READS), TEXT).samples)


@pytest.mark.parametrize("body", [
    'vllm:num_requests_waiting{model_name="a\\"b",engine="0"} 1\n',  # an escaped quote
    'vllm:num_requests_waiting{model_name="a",engine="0"} 1 # {trace_id="x"} 1\n',  # an exemplar
    'vllm:num_requests_waiting{model_name="a" engine="0"} 1\n',  # no comma
    'vllm:num_requests_waiting{model_name="a",engine="0"} one\n',  # not a number
])
def test_other_shapes_go_to_prometheus_client(body: str) -> None:
    assert fast_samples(body, False, READS) is None


def test_truncated_openmetrics_is_still_refused() -> None:
    body = BODIES["vllm"].openmetrics
    cut = body[: body.index("# EOF")]
    assert fast_samples(cut, True, READS) is None
    with pytest.raises(ParseError):
        parse(cut, OM, READS)
    assert parse(body, OM, READS).samples  # the whole one is read


def test_garbage_is_still_refused() -> None:
    with pytest.raises(ParseError):
        parse("<html><body>oops</body></html>", "text/html", READS)
