"""Contracts: every class of bad record is rejected with the field and the reason; the JSON
Schemas agree with the Python validation (checked by an independent validator, jsonschema)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import jsonschema
import pytest

from llmsla import events, names
from llmsla.events import EventError, GpuSample, PolicyEvent, RequestEvent

ROOT = Path(__file__).resolve().parent.parent


def request(**over) -> dict:
    base = {
        "v": 1, "ts_ms": 1_700_000_000_000, "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "model": "llama-6b", "pool": "default", "replica": "r0", "arm": "default", "policy": "constant",
        "prompt_tokens": 12, "output_tokens": 5, "queue_ms": 1.5, "ttft_ms": 40.0,
        "itl_ms": {"n": 4, "mean": 20.0, "std": 2.0, "max": 24.0}, "e2e_ms": 120.0, "status": "ok",
        "tenant": "acme", "class": "batch",
    }
    base.update(over)
    return base


def policy(**over) -> dict:
    base = {
        "v": 1, "ts_ms": 1_700_000_000_000, "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": "b7ad6b7169203331", "policy_id": "cosine", "zone": "eu-1", "step": 3,
        "temperature": 0.7, "action": "lower", "trigger": "schedule", "duration_ms": 0.02,
    }
    base.update(over)
    return base


def gpu(**over) -> dict:
    base = {
        "v": 1, "ts_ms": 1_700_000_000_000, "node": "n1", "gpu": 0, "uuid": "GPU-1",
        "mem_used_bytes": 10, "mem_total_bytes": 100, "util": 0.5, "temp_c": 60.0, "power_w": 250.0,
    }
    base.update(over)
    return base


def test_round_trip_all_kinds() -> None:
    for cls, data in ((RequestEvent, request()), (PolicyEvent, policy()), (GpuSample, gpu())):
        event = cls.from_dict(data)
        again = cls.from_json(event.to_json())
        assert again == event
        assert json.loads(event.to_json()) == {**data, **({"itl_ms": data["itl_ms"]} if "itl_ms" in data else {})}


def test_itl_list_is_summarised_exactly() -> None:
    gaps = [10.0, 20.0, 30.0, 40.0]
    event = RequestEvent.from_dict(request(itl_ms=gaps))
    assert event.itl_ms.n == 4
    assert event.itl_ms.mean == 25.0
    assert math.isclose(event.itl_ms.std, math.sqrt(125.0))
    assert event.itl_ms.max == 40.0


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        ({k: v for k, v in request().items() if k != "model"}, "model", "missing"),
        (request(prompt_tokens="12"), "prompt_tokens", "expected integer"),
        (request(prompt_tokens=True), "prompt_tokens", "expected integer"),
        (request(prompt_tokens=1.5), "prompt_tokens", "expected integer"),
        (request(e2e_ms=float("nan")), "e2e_ms", "not finite"),
        (request(e2e_ms=float("inf")), "e2e_ms", "not finite"),
        (request(queue_ms=-1.0), "queue_ms", "must be >= 0"),
        (request(ttft_ms=200.0), "ttft_ms", "exceeds E2E"),
        (request(queue_ms=500.0), "queue_ms", "exceeds E2E"),
        (request(status="weird"), "status", "must be one of"),
        (request(model=""), "model", "must not be empty"),
        (request(model=None), "model", "must not be null"),
        (request(extra=1), "extra", "unknown field"),
        (request(v=2), "v", "unsupported schema version"),
        (request(itl_ms={"n": 1, "mean": 1.0, "std": 0.0}), "itl_ms.max", "missing"),
        (request(itl_ms=[1.0, -2.0]), "itl_ms[1]", "must be >= 0"),
        (request(itl_ms="fast"), "itl_ms", "expected object or list"),
        (policy(action="jump"), "action", "must be one of"),
        (policy(temperature=-0.1), "temperature", "must be >= 0"),
        (gpu(util=1.5), "util", "must be <= 1"),
        (gpu(mem_used_bytes=101), "mem_used_bytes", "exceeds mem_total_bytes"),
    ],
)
def test_bad_records_name_field_and_reason(data: dict, field: str, reason: str) -> None:
    cls = PolicyEvent if "span_id" in data else GpuSample if "uuid" in data else RequestEvent
    with pytest.raises(EventError) as err:
        cls.from_dict(data)
    assert err.value.field == field
    assert reason in err.value.reason


def test_not_json_and_not_object() -> None:
    with pytest.raises(EventError, match="not valid JSON"):
        RequestEvent.from_json("{broken")
    with pytest.raises(EventError, match="expected a JSON object"):
        RequestEvent.from_json("[1, 2]")
    with pytest.raises(EventError, match="not finite"):
        RequestEvent.from_json(json.dumps(request()).replace('"e2e_ms": 120.0', '"e2e_ms": NaN'))


def test_ttft_may_be_null_for_failures_only() -> None:
    failed = RequestEvent.from_dict(request(ttft_ms=None, status="error", output_tokens=0,
                                            itl_ms={"n": 0, "mean": 0, "std": 0, "max": 0}))
    assert failed.ttft_ms is None
    with pytest.raises(EventError, match="missing for an ok request"):
        RequestEvent.from_dict(request(ttft_ms=None))


def test_to_json_refuses_nan_from_direct_construction() -> None:
    event = RequestEvent.from_dict(request())
    broken = dataclasses.replace(event, e2e_ms=float("nan"))
    with pytest.raises(EventError, match="not finite"):
        broken.validate()


@pytest.mark.parametrize("kind", names.SPOOL_KINDS)
def test_schema_agrees_with_validator(kind: str) -> None:
    """jsonschema (independent) accepts what we accept and rejects type/range/enum violations."""
    cls = events.EVENT_TYPES[kind]
    schema = events.json_schema(cls)
    good = {names.SPOOL_REQUESTS: request, names.SPOOL_POLICY: policy, names.SPOOL_GPU: gpu}[kind]()
    jsonschema.validate(good, schema)
    cls.from_dict(good)
    for f in cls.FIELDS:
        bad = dict(good)
        bad[f.name] = "x" * 300 if f.type != "string" else 42
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(EventError):
            cls.from_dict(bad)


@pytest.mark.parametrize("value, reason", [
    ("x\x00y", "NUL"),
    ("\ud800", "lone surrogate U+D800"),
    ("ok\udfffok", "lone surrogate U+DFFF at character 2"),
])
def test_unstorable_strings_are_rejected_in_every_string_field(value: str, reason: str) -> None:
    for cls, base in ((RequestEvent, request()), (PolicyEvent, policy()), (GpuSample, gpu())):
        for f in cls.FIELDS:
            if f.type != "string" or f.enum:
                continue
            with pytest.raises(EventError, match=re.escape(reason)) as err:
                cls.from_dict({**base, f.name: value})
            assert err.value.field == f.name
            assert events.string_problem(value) is not None


def test_string_length_counts_code_points_not_utf16_units() -> None:
    emoji = "\U0001f600"  # one code point, two UTF-16 units, four UTF-8 bytes
    assert RequestEvent.from_dict(request(model=emoji * 256)).model == emoji * 256
    with pytest.raises(EventError, match="longer than 256"):
        RequestEvent.from_dict(request(model=emoji * 257))


def test_wire_lines_are_stricter_than_the_python_api() -> None:
    good = json.dumps(request())
    assert RequestEvent.from_json(good.encode()) == RequestEvent.from_json(good)
    cases = {
        "\ufeff" + good: ("<record>", "byte-order mark"),
        good.encode()[:-1] + b"\xff}": ("<record>", "not valid UTF-8 at byte"),
        good[:-1] + ', "model": "again"}': ("model", "duplicate field"),
        good.replace('"n": 4', '"n": 4, "n": 5'): ("n", "duplicate field"),
        json.dumps(request(itl_ms=[1.0, 2.0])): ("itl_ms", "list of gaps"),
        '{"model": "\\ud800"}': ("ts_ms", "missing"),  # surrogates decode, then the contract judges
    }
    for line, (field, reason) in cases.items():
        with pytest.raises(EventError, match=reason) as err:
            RequestEvent.from_json(line)
        assert err.value.field == field, line
    with pytest.raises(EventError, match="lone surrogate"):
        RequestEvent.from_json(json.dumps(request(model="\ud800")))
    # the Python API still summarises a list of gaps for producers
    assert RequestEvent.from_dict(request(itl_ms=[1.0, 3.0])).itl_ms.n == 2


def test_names_from_the_input_are_escaped_in_the_reason() -> None:
    for name in ("a\x00b", "\ud800", "x" * 500, "é\n"):
        for line in (json.dumps({**request(), name: 1}), json.dumps(request())[:-1] + f", {json.dumps(name)}: 1, {json.dumps(name)}: 2}}"):
            with pytest.raises(EventError) as err:
                RequestEvent.from_json(line)
            msg = str(err.value)
            assert events.string_problem(msg) is None and msg.isprintable() and len(msg) < 200, msg


def test_numbers_beyond_the_float_range_and_boolean_versions_are_rejected() -> None:
    """JSON puts no limit on digits: an integer beyond the float range in a number field is an
    EventError (it used to escape as OverflowError and crash `spool check` and the stream's sink);
    ``"v": true`` is not version 1 (Python's True == 1; the JSON Schema's const 1 rejects it)."""
    with pytest.raises(EventError, match="not finite: beyond the 64-bit float range") as err:
        RequestEvent.from_json(json.dumps(request(queue_ms=10**400)))
    assert err.value.field == "queue_ms"
    assert RequestEvent.from_json(json.dumps(request(e2e_ms=10**300))).e2e_ms == 1e300
    with pytest.raises(EventError, match="unsupported schema version True"):
        RequestEvent.from_json(json.dumps({**request(), "v": True}))
    assert RequestEvent.from_json(json.dumps({**request(), "v": 1.0})).model  # 1.0 is 1, as in the schema


@pytest.mark.parametrize("le", [[-math.inf, math.inf], [math.nan, 1.0], [0.1, math.inf], [1e308, 1.5e308]])
def test_engine_histogram_bounds_that_are_not_finite_are_a_schema_error(le: list[float]) -> None:
    """JSON as Python reads it accepts ``Infinity``; such a bound is the contract's error with its
    field (never another exception that would stop a reader), and finite bounds near the float
    limit stay valid."""
    hist = {"le": le, "counts": [0, 1], "sum": 1.0, "count": 1}
    if all(math.isfinite(b) for b in le):
        assert events.EngineSample.check_field("ttft", hist)["le"] == le
        return
    with pytest.raises(events.EventError, match=r"EngineSample\.ttft\.le\[\d\]"):
        events.EngineSample.check_field("ttft", hist)


def _generic_validate(event) -> None:
    """The field-by-field rules with no shortcut: what ``validate`` must agree with."""
    for f in event.FIELDS:
        events._check_value(event.KIND, f, getattr(event, f.attr))
    event._check_relations()


def _outcome(check, event) -> tuple:
    try:
        check(event)
    except EventError as exc:
        return ("EventError", exc.field, exc.reason)
    except Exception as exc:  # noqa: BLE001 - compared, not swallowed
        return (type(exc).__name__, str(exc))
    return ("ok",)


_HOSTILE = [None, True, False, 0, -1, 1, 7, 2**63 - 1, 2**63, -(2**63), 2**70, 0.0, -0.0, -1.0, 0.5, 1.0, 1.5, 99.5,
            100.0, 100.5, 1e308, math.nan, math.inf, -math.inf, -50.0, -50.5, 200.0, 200.5, "", "x", "ok", "lower",
            "bogus", "a" * 256, "a" * 257, "é" * 256, "é" * 257, "\x00", "a\x00", "\ud800", "\U0001f600",
            [], [1.0, 2.0], [-1.0], {}, {"n": 1}, events.ItlSummary(0, 0.0, 0.0, 0.0),
            events.ItlSummary(2, 3.0, 1.0, 4.0), events.ItlSummary(2, 3.0, 1.0, 2.0), events.ItlSummary(-1, 0.0, 0.0, 0.0),
            events.ItlSummary(1, math.nan, 0.0, 1.0), events.ItlSummary(1, 1, 0, 1), events.ItlSummary(1.0, 1.0, 0.0, 1.0),
            events.ItlSummary(True, 1.0, 0.0, 1.0), events.ItlSummary(2**63, 1.0, 0.0, 1.0),
            events.ItlSummary(1, 1.0, math.inf, 1.0)]


def _valid_events() -> list:
    from llmsla.events import EngineSample

    return [RequestEvent.from_dict(request()), RequestEvent.from_dict(request(ttft_ms=None, output_tokens=0)),
            PolicyEvent.from_dict(policy()), GpuSample.from_dict(gpu()),
            EngineSample(ts_ms=1, replica="r0", pool="default", engine=names.ENGINE_VLLM, waiting=1.0, running=2.0,
                         kv_usage=0.5, kv_blocks_total=None, kv_block_size=None, kv_capacity_tokens=None,
                         preemptions_total=3.0, prefix_cache_hits_total=None, prefix_cache_queries_total=None,
                         prefix_cache_hit_rate=None, lora_adapters=None, counter_reset=0, ttft=None, itl=None,
                         e2e=None, queue=None)]


def _each_field_set_to(base, values: list):
    """(field, value, a copy of ``base`` with that field set to that value, unchecked) for every
    field of ``base`` and every value."""
    for f in base.FIELDS:
        for value in values:
            event = dataclasses.replace(base)
            object.__setattr__(event, f.attr, value)
            yield f, value, event


@pytest.mark.parametrize("base", _valid_events(), ids=lambda e: e.KIND)
def test_validate_agrees_with_the_field_rules_on_every_hostile_value(base) -> None:
    """``validate`` tests each field's plain case inline and sends the rest to the field rules:
    on every field of every kind, with every value below, it accepts, or refuses with the same
    field and reason, exactly as the rules one by one do."""
    assert _outcome(lambda e: e.validate(), base) == ("ok",)
    tried = 0
    for f, value, event in _each_field_set_to(base, _HOSTILE):
        want = _outcome(_generic_validate, event)
        assert _outcome(lambda e: e.validate(), event) == want, (f.name, value)
        tried += want[0] == "EventError"
    assert tried > len(base.FIELDS) * 10  # the values above break every field many ways


class _Str(str):
    pass


class _Int(int):
    pass


class _Float(float):
    def __repr__(self) -> str:
        return "not what json writes"


_TO_ENCODE = [*_HOSTILE, 'say "hi"', "back\\slash", "tab\tnew\nline", "\x7f", "\x1f", "ünïcödé", "\u2028", "\ufeff",
              _Str("sub"), _Int(5), _Float(2.5), 1e16, 1e-7, 123456789.123456789, 5e-324, -1e308, 10**30,
              {"le": [0.1, 1.0], "counts": [1, 2], "sum": 0.5, "count": 3}, ["a", "b"], ("t",)]


def _reference_json(event) -> str:
    """What every event line was before its encoder was made from the declarations."""
    return json.dumps(event.to_dict(), separators=(",", ":"), allow_nan=False)


def _encoded(encode, event) -> tuple:
    try:
        return ("ok", encode(event))
    except Exception as exc:  # noqa: BLE001 - compared, not swallowed
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("base", _valid_events(), ids=lambda e: e.KIND)
def test_to_json_writes_what_json_dumps_writes_for_every_value(base) -> None:
    """The spool line is written inline from the declarations for plain values and by
    ``json.dumps`` for the rest: on every field of every kind, with every value above, it is
    the same text as ``json.dumps(to_dict())``, or the same error (a NaN, an object json cannot
    write); an opening (the first fields, for a writer that appends the rest) is that text's
    prefix up to a field's end."""
    assert base.to_json() == _reference_json(base)
    compared = 0
    for f, value, event in _each_field_set_to(base, _TO_ENCODE):
        want = _encoded(_reference_json, event)
        assert _encoded(lambda e: e.to_json(), event) == want, (f.name, value)
        if want[0] != "ok":
            continue
        compared += 1
        whole = json.loads(want[1])
        for count in (0, base.FIELDS.index(f) + 1, len(base.FIELDS)):
            opening = event.json_opening(count)
            assert want[1].startswith(opening)
            closed = opening if count == len(base.FIELDS) else opening + "}"
            assert list(json.loads(closed).items()) == list(whole.items())[:count + 1]  # "v" first
    assert compared > len(base.FIELDS) * 10


def test_a_changed_declaration_is_written_by_its_new_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder is made from ``FIELDS``: a contract whose declarations change (here their
    order) is written by the new ones, not by what was made before."""
    event = GpuSample.from_dict(gpu())
    event.to_json()
    monkeypatch.setattr(GpuSample, "FIELDS", tuple(reversed(GpuSample.FIELDS)))
    assert event.to_json() == _reference_json(event)
    assert list(json.loads(event.to_json()))[1] == GpuSample.FIELDS[0].name


def test_a_changed_declaration_is_validated_by_its_new_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inline checks are made from ``FIELDS``; a contract whose declarations change (a
    range narrowed) is checked by the new ones, not by what was made before."""
    event = PolicyEvent.from_dict(policy(temperature=1.5))
    event.validate()
    fields = tuple(dataclasses.replace(f, maximum=1.0) if f.name == "temperature" else f for f in PolicyEvent.FIELDS)
    monkeypatch.setattr(PolicyEvent, "FIELDS", fields)
    with pytest.raises(EventError, match=r"temperature: must be <= 1"):
        event.validate()
