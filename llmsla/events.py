"""The data contracts: ``RequestEvent``, ``PolicyEvent``, ``GpuSample`` and ``EngineSample``.

One JSON object per line, versioned by ``v``; times are epoch milliseconds (``ts_ms``), durations
milliseconds. Each event class declares its fields once in ``FIELDS``; validation, the JSON
Schemas in ``deploy/schemas/`` and the streaming job's source schema are all derived from that, so
producers in other languages and our own readers agree by construction.

A bad record raises :class:`EventError`, which names the field and the reason.
"""

from __future__ import annotations

import functools
import json
import keyword
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any, ClassVar

from llmsla import names

SCHEMA_VERSION = 1


def shown_name(name: str, limit: int = 64) -> str:
    """A name taken from the input, safe to put in a message, a log line or the store: JSON
    escapes for anything but printable ASCII (a NUL or lone surrogate in an unknown field's name
    must not poison the dead-letter reason), cut to ``limit`` characters."""
    text = name if name.isascii() and name.isprintable() else json.dumps(name)[1:-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EventError(ValueError):
    """A record that does not satisfy its contract; ``field`` and ``reason`` say why."""

    def __init__(self, kind: str, field: str, reason: str) -> None:
        self.kind, self.field, self.reason = kind, field, reason
        super().__init__(f"{kind}.{field}: {reason}")


@dataclass(frozen=True, slots=True)
class Field:
    """One field of an event: its JSON type and the constraints validation enforces."""

    name: str
    type: str  # "int" | "number" | "string" | "itl" | "hist" | "strings"
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    enum: tuple[str, ...] | None = None
    nullable: bool = False
    #: The value of the field when a line leaves it out or holds null: a field added to a
    #: contract after producers of its version existed, so their lines still parse (and mean
    #: what they meant). Such a field is optional and nullable on the wire, never None in Python.
    default: str | None = None

    @property
    def attr(self) -> str:
        """The event's attribute of this field: its name, with ``_`` after a Python keyword
        (``class`` is ``class_``)."""
        return _attr_of(self.name)

    @property
    def optional(self) -> bool:
        """A line may leave the field out (or hold null)."""
        return self.nullable or self.default is not None


@functools.cache
def _attr_of(name: str) -> str:
    """:attr:`Field.attr`, computed once per name: validation asks it for every field of every
    event a producer writes (the gateway: one per request)."""
    return name + "_" if keyword.iskeyword(name) else name


_INT_MAX = 2**63 - 1

#: Longest string a field may hold, in Unicode code points (Python's ``len``; the stream job
#: counts code points too, not UTF-16 units, so both sides agree on emoji and other astral text).
MAX_STRING_CHARS = 256


def string_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored and rendered everywhere an event goes, else None.

    One definition for the gateway, the spool writer, ``spool check`` and the stream job: no NUL
    (PostgreSQL text cannot hold U+0000) and no lone surrogate (U+D800..U+DFFF is not Unicode
    text: UTF-8 - the spool, the store, the Prometheus exposition - cannot encode it)."""
    if value.isascii():  # the common case, one C-level scan
        return "contains NUL (U+0000), which the store cannot hold" if "\x00" in value else None
    if "\x00" in value:
        return "contains NUL (U+0000), which the store cannot hold"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate U+{ord(value[exc.start]):04X} at character {exc.start}, which is not Unicode text"
    return None


def _check_number(kind: str, f: Field, value: Any, *, integer: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventError(kind, f.name, f"expected {'integer' if integer else 'number'}, got {type(value).__name__}")
    if integer and not isinstance(value, int):
        if not (math.isfinite(value) and value == int(value)):
            raise EventError(kind, f.name, f"expected integer, got {value!r}")
        value = int(value)
    if not integer:
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an int beyond the float range: JSON gives no limit on digits
            raise EventError(kind, f.name, "not finite: beyond the 64-bit float range") from None
        if not finite:
            raise EventError(kind, f.name, f"not finite: {value!r}")
    if f.minimum is not None and value < f.minimum:
        raise EventError(kind, f.name, f"must be >= {f.minimum:g}, got {value!r}")
    if f.maximum is not None and value > f.maximum:
        raise EventError(kind, f.name, f"must be <= {f.maximum:g}, got {value!r}")
    if integer and abs(value) > _INT_MAX:
        raise EventError(kind, f.name, "integer out of 64-bit range")
    return value


def _check_string(kind: str, f: Field, value: Any) -> str:
    if not isinstance(value, str):
        raise EventError(kind, f.name, f"expected string, got {type(value).__name__}")
    if not value:
        raise EventError(kind, f.name, "must not be empty")
    if len(value) > MAX_STRING_CHARS:
        raise EventError(kind, f.name, f"longer than {MAX_STRING_CHARS} characters")
    problem = string_problem(value)
    if problem is not None:
        raise EventError(kind, f.name, problem)
    if f.enum is not None and value not in f.enum:
        raise EventError(kind, f.name, f"must be one of {', '.join(f.enum)}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ItlSummary:
    """Inter-token latency of one request as a summary, so windows can pool mean and variance
    exactly (sum of n*mean and n*(std^2+mean^2)) without shipping every gap."""

    n: int
    mean: float
    std: float
    max: float

    @classmethod
    def from_gaps(cls, gaps_ms: list[float]) -> ItlSummary:
        """Summarise raw gaps (ms); an empty list (0 or 1 output token) gives n=0."""
        n = len(gaps_ms)
        if n == 0:
            return cls(0, 0.0, 0.0, 0.0)
        mean = math.fsum(gaps_ms) / n
        var = math.fsum((g - mean) ** 2 for g in gaps_ms) / n
        return cls(n, mean, math.sqrt(var), max(gaps_ms))

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "std": self.std, "max": self.max}


#: The members of an ``itl`` field (the stream job reads them as columns itl_<name>).
ITL_FIELDS = (
    Field("n", "int", "number of inter-token gaps", minimum=0),
    Field("mean", "number", "mean gap, ms", minimum=0),
    Field("std", "number", "population standard deviation of the gaps, ms", minimum=0),
    Field("max", "number", "largest gap, ms", minimum=0),
)


_ITL_CHECKS = tuple(Field(f"itl_ms.{f.name}", f.type, f.doc, minimum=0) for f in ITL_FIELDS)


def _parse_itl(kind: str, value: Any) -> ItlSummary:
    if isinstance(value, list):
        for i, g in enumerate(value):
            _check_number(kind, Field(f"itl_ms[{i}]", "number", "", minimum=0), g, integer=False)
        return ItlSummary.from_gaps([float(g) for g in value])
    if isinstance(value, ItlSummary):
        value = value.to_dict()
    if not isinstance(value, dict):
        raise EventError(kind, "itl_ms", f"expected object or list, got {type(value).__name__}")
    out: dict[str, Any] = {}
    for f, check in zip(ITL_FIELDS, _ITL_CHECKS, strict=True):
        if f.name not in value:
            raise EventError(kind, check.name, "missing")
        out[f.name] = _check_number(kind, check, value[f.name], integer=f.type == "int")
    extra = set(value) - {f.name for f in ITL_FIELDS}
    if extra:
        raise EventError(kind, f"itl_ms.{shown_name(sorted(extra)[0])}", "unknown field")
    s = ItlSummary(**out)
    if s.n and s.max < s.mean:
        raise EventError(kind, "itl_ms.max", "smaller than mean")
    return s


#: Most bucket bounds a ``hist`` field may carry, and most items of a ``strings`` field.
MAX_BUCKETS = 64
MAX_LIST_ITEMS = 64
HIST_KEYS = ("le", "counts", "sum", "count")


@functools.lru_cache(maxsize=256)
def _member(name: str, type_: str, minimum: float | None) -> Field:
    """The Field a member of a composite field is checked as (made once per name)."""
    return Field(name, type_, "", minimum=minimum)


_FLOAT = frozenset({float})
_INT = frozenset({int})


def _all_finite(values: list[float]) -> bool:
    """Whether every float of ``values`` is finite (one NaN or infinity makes their sum not)."""
    try:
        return math.isfinite(math.fsum(values))
    except (OverflowError, ValueError):  # a sum past the float range; or -inf and +inf together
        return all(math.isfinite(v) for v in values)


def _parse_hist(kind: str, f: Field, value: Any) -> dict[str, Any]:
    """A cumulative histogram as an engine exposes it: finite upper bounds ``le`` (strictly
    increasing, the +Inf bucket left out: it is ``count``), cumulative ``counts`` per bound
    (non-decreasing, at most ``count``), ``sum`` and ``count``."""
    name = f.name
    if not isinstance(value, dict):
        raise EventError(kind, name, f"expected object, got {type(value).__name__}")
    missing = [k for k in HIST_KEYS if k not in value]
    if missing:
        raise EventError(kind, f"{name}.{missing[0]}", "missing")
    extra = set(value) - set(HIST_KEYS)
    if extra:
        raise EventError(kind, f"{name}.{shown_name(sorted(extra)[0])}", "unknown field")
    le, counts = value["le"], value["counts"]
    for key, items in (("le", le), ("counts", counts)):
        if not isinstance(items, list):
            raise EventError(kind, f"{name}.{key}", f"expected array, got {type(items).__name__}")
        if len(items) > MAX_BUCKETS:
            raise EventError(kind, f"{name}.{key}", f"more than {MAX_BUCKETS} buckets")
    if len(le) != len(counts):
        raise EventError(kind, f"{name}.counts", f"{len(counts)} counts for {len(le)} bounds")
    # the common case (plain finite floats, small non-negative ints, in order) in C-level passes
    # over the lists, without a Field per item: a scraper checks every engine histogram of every
    # replica every second; anything else takes the item-by-item path, which names the culprit
    if set(map(type, le)) <= _FLOAT and _all_finite(le):
        bounds = list(le)
    else:
        bounds = [float(b) if type(b) is float and math.isfinite(b) else
                  float(_check_number(kind, Field(f"{name}.le[{i}]", "number", ""), b, integer=False))
                  for i, b in enumerate(le)]
    if set(map(type, counts)) <= _INT and (not counts or (min(counts) >= 0 and max(counts) <= _INT_MAX)):
        cum = list(counts)
    else:
        cum = [c if type(c) is int and 0 <= c <= _INT_MAX else
               int(_check_number(kind, Field(f"{name}.counts[{i}]", "int", "", minimum=0), c, integer=True))
               for i, c in enumerate(counts)]
    if not (cum == sorted(cum) and bounds == sorted(bounds) and len(set(bounds)) == len(bounds)):
        for i in range(1, len(bounds)):
            if bounds[i] <= bounds[i - 1]:
                raise EventError(kind, f"{name}.le[{i}]", "bounds must increase strictly")
            if cum[i] < cum[i - 1]:
                raise EventError(kind, f"{name}.counts[{i}]", "cumulative counts must not decrease")
    total = int(_check_number(kind, _member(f"{name}.count", "int", 0), value["count"], integer=True))
    if cum and cum[-1] > total:
        raise EventError(kind, f"{name}.count", "smaller than the last bucket")
    hsum = float(_check_number(kind, _member(f"{name}.sum", "number", None), value["sum"], integer=False))
    return {"le": bounds, "counts": cum, "sum": hsum, "count": total}


def _parse_strings(kind: str, f: Field, value: Any) -> list[str]:
    if not isinstance(value, list | tuple):
        raise EventError(kind, f.name, f"expected array, got {type(value).__name__}")
    if len(value) > MAX_LIST_ITEMS:
        raise EventError(kind, f.name, f"more than {MAX_LIST_ITEMS} items")
    return [_check_string(kind, Field(f"{f.name}[{i}]", "string", ""), v) for i, v in enumerate(value)]


def _check_value(kind: str, f: Field, raw: Any) -> Any:
    """One field's value, checked against its declaration; returns the normalised value."""
    if raw is None:
        if not f.optional:
            raise EventError(kind, f.name, "must not be null")
        return f.default
    if f.type == "int":
        return _check_number(kind, f, raw, integer=True)
    if f.type == "number":
        return float(_check_number(kind, f, raw, integer=False))
    if f.type == "string":
        return _check_string(kind, f, raw)
    if f.type == "itl":
        return _parse_itl(kind, raw)
    if f.type == "hist":
        return _parse_hist(kind, f, raw)
    if f.type == "strings":
        return _parse_strings(kind, f, raw)
    raise AssertionError(f.type)  # pragma: no cover - a programming error in FIELDS


_INF = math.inf


def _plainly_valid(f: Field, i: int, env: dict[str, Any]) -> str | None:
    """A Python expression over ``v`` that is true only for a value :func:`_check_value` accepts
    as it is (the common, plain case: a str, an int, a float in range), or None where the field
    has no such shortcut. Bounds go into ``env`` as names, never as source text."""
    lo = f"_lo{i}"
    hi = f"_hi{i}"
    env[lo] = -_INF if f.minimum is None else f.minimum
    env[hi] = _INF if f.maximum is None else f.maximum
    if f.type == "int":
        return f"(type(v) is int and {lo} <= v <= {hi} and -_INT_MAX <= v <= _INT_MAX)"
    if f.type == "number":  # a finite float: NaN fails every comparison, the open ends drop the infinities
        return f"(type(v) is float and {lo} <= v <= {hi} and -_INF < v < _INF)"
    if f.type == "string":
        enum = ""
        if f.enum is not None:
            env[f"_enum{i}"] = frozenset(f.enum)
            enum = f" and v in _enum{i}"
        return f"(type(v) is str and 0 < len(v) <= MAX_STRING_CHARS and v.isascii() and '\\x00' not in v{enum})"
    if f.type == "itl":  # the summary the producers build (ItlSummary.from_gaps)
        return ("(type(v) is ItlSummary and type(v.n) is int and 0 <= v.n <= _INT_MAX"
                " and type(v.mean) is float and 0.0 <= v.mean < _INF and type(v.std) is float and 0.0 <= v.std < _INF"
                " and type(v.max) is float and 0.0 <= v.max < _INF and not (v.n and v.max < v.mean))")
    return None


#: :func:`_validator`'s functions, one per event class and set of fields it skips, with the
#: declarations each was made from
_VALIDATORS: dict[tuple[type, frozenset[str]], tuple[tuple[Field, ...], Callable[[Any], None]]] = {}


def _validator(cls: type[_Event], checked: frozenset[str] = frozenset()) -> Callable[[Any], None]:
    """``cls``'s field checks but those of the fields named in ``checked`` as one function, made
    once per event class and ``checked`` (again if its ``FIELDS`` are replaced): each field's
    plain case is tested inline and anything else goes to :func:`_check_value`, which accepts
    or refuses it exactly as before (so the rules, their order and their messages stay in one
    place). The gateway validates one event per request, the engine scraper one per scrape:
    through the generic checks field by field that is about a tenth of the gateway's CPU per
    request; inline, a sixth of that."""
    env: dict[str, Any] = {"_check_value": _check_value, "_INT_MAX": _INT_MAX, "_INF": _INF,
                           "MAX_STRING_CHARS": MAX_STRING_CHARS, "ItlSummary": ItlSummary, "_KIND": cls.KIND}
    lines = ["def validate(event):"]
    for i, f in enumerate(cls.FIELDS):
        if f.name in checked:
            continue
        env[f"_f{i}"] = f
        lines.append(f"    v = event.{f.attr}")
        plain = _plainly_valid(f, i, env)
        fallback = f"_check_value(_KIND, _f{i}, v)"
        if plain is None:
            lines.append(f"    {fallback}")
            continue
        if f.optional:
            plain = f"(v is None or {plain})"
        lines.append(f"    if not {plain}:")
        lines.append(f"        {fallback}")
    lines.append("    return None")
    exec("\n".join(lines), env)  # noqa: S102 - source built above from the field declarations only
    check: Callable[[Any], None] = env["validate"]
    _VALIDATORS[(cls, checked)] = (cls.FIELDS, check)
    return check


#: the text ``json.dumps`` gives a value, with the separators and NaN rule of every event line
_dump = functools.partial(json.dumps, separators=(",", ":"), allow_nan=False)


def _plain_json(f: Field) -> tuple[str, str] | None:
    """(a condition on ``v``, the JSON text of ``v`` under it) for a field's plain case, the text
    being what ``json.dumps`` writes for such a value: an exact int (``int.__format__`` is its
    repr), a finite exact float (its repr), a str (json's own ASCII escaper); None where the
    field has no shortcut. Anything else is left to :data:`_dump`."""
    if f.type == "int":
        return "type(v) is int", "{v}"
    if f.type == "number":
        return "type(v) is float and -_INF < v < _INF", "{v!r}"
    if f.type == "string":
        return "type(v) is str", "{_esc(v)}"
    if f.type == "itl":
        return ("type(v) is ItlSummary and type(v.n) is int and type(v.mean) is float and -_INF < v.mean < _INF"
                " and type(v.std) is float and -_INF < v.std < _INF and type(v.max) is float and -_INF < v.max < _INF",
                '{{"n":{v.n},"mean":{v.mean!r},"std":{v.std!r},"max":{v.max!r}}}')
    return None


#: :func:`_encoder`'s functions, by event class and number of fields, with the declarations
#: each was made from
_ENCODERS: dict[tuple[type, int], tuple[tuple[Field, ...], Callable[[Any], str]]] = {}


def _encoder(cls: type[_Event], count: int) -> Callable[[Any], str]:
    """The spool line of an event of ``cls`` as one function made from its first ``count``
    fields: ``{"v":1,`` and those fields, closed with ``}`` when they are all of them (else left
    open for the caller to append the rest). The text is :meth:`_Event.to_dict` through
    ``json.dumps``, byte for byte: each field's plain value is written inline, any other value
    (None, a subclass, a list, a histogram) by ``json.dumps`` alone, so a NaN still raises
    ValueError. One line per request at the gateway: a third of the generic path's cost."""
    fields = cls.FIELDS[:count]
    env: dict[str, Any] = {"_dump": _dump, "_esc": encode_basestring_ascii, "_INF": _INF,
                           "ItlSummary": ItlSummary}
    lines = ["def to_json(event):"]
    parts = [f'{{{{"v":{SCHEMA_VERSION}']
    for i, f in enumerate(fields):
        lines.append(f"    v = event.{f.attr}")
        to_dict = "v.to_dict()" if f.type == "itl" else "v"  # what to_dict puts in the line
        plain = _plain_json(f)
        if plain is None:
            lines.append(f"    s{i} = _dump({to_dict})")
        else:
            cond, text = plain
            lines.append(f"    s{i} = f{text!r} if {cond} else _dump({to_dict})")
        key = json.dumps(f.name).replace("{", "{{").replace("}", "}}")  # literal text of the f-string
        parts.append(f",{key}:{{s{i}}}")
    if count == len(cls.FIELDS):
        parts.append("}}")
    lines.append(f"    return f{''.join(parts)!r}")
    exec("\n".join(lines), env)  # noqa: S102 - source built above from the field declarations only
    encode: Callable[[Any], str] = env["to_json"]
    _ENCODERS[(cls, count)] = (cls.FIELDS, encode)
    return encode


class _DuplicateName(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook: a repeated name is an error (Python would keep the last silently)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _DuplicateName(name)
            seen.add(name)
    return out


class _Event:
    """Shared parse/validate/serialise logic; subclasses declare KIND and FIELDS."""

    KIND: ClassVar[str]
    FIELDS: ClassVar[tuple[Field, ...]]

    @classmethod
    def from_dict(cls, data: Any) -> Any:
        kind = cls.KIND
        if not isinstance(data, dict):
            raise EventError(kind, "<record>", f"expected a JSON object, got {type(data).__name__}")
        v = data.get("v", SCHEMA_VERSION)
        if isinstance(v, bool) or v != SCHEMA_VERSION:  # true == 1 in Python, not in the JSON Schema
            raise EventError(kind, "v", f"unsupported schema version {v!r} (this reader knows {SCHEMA_VERSION})")
        values: dict[str, Any] = {}
        for f in cls.FIELDS:
            if f.name not in data:
                if f.optional:
                    values[f.attr] = f.default
                    continue
                raise EventError(kind, f.name, "missing")
            values[f.attr] = _check_value(kind, f, data[f.name])
        unknown = set(data) - {f.name for f in cls.FIELDS} - {"v"}
        if unknown:
            raise EventError(kind, shown_name(sorted(unknown)[0]), "unknown field")
        event = cls(**values)
        event._check_relations()
        return event

    @classmethod
    def from_json(cls, line: str | bytes) -> Any:
        """Parse one wire/spool line. Stricter than :meth:`from_dict` where the wire is stricter
        than the Python API, so ``spool check``, the stream job and the JSON Schema agree on every
        line: UTF-8 without a byte-order mark, each name once, ``itl_ms`` as its summary object."""
        kind = cls.KIND
        if isinstance(line, bytes | bytearray):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise EventError(kind, "<record>", f"not valid UTF-8 at byte {exc.start}") from None
        if line.startswith("\ufeff"):
            raise EventError(kind, "<record>", "not valid JSON: starts with a byte-order mark (U+FEFF)")
        try:
            data = json.loads(line, object_pairs_hook=_unique_names)
        except _DuplicateName as dup:
            raise EventError(kind, shown_name(dup.name), "duplicate field (each JSON name must appear once)") from None
        except (ValueError, RecursionError) as exc:
            raise EventError(kind, "<record>", f"not valid JSON: {exc}") from None
        if isinstance(data, dict) and isinstance(data.get("itl_ms"), list):
            raise EventError(kind, "itl_ms", "expected the summary object {n, mean, std, max}, got a list of gaps")
        return cls.from_dict(data)

    def validate(self, *, checked: Collection[str] = frozenset()) -> Any:
        """Check a directly constructed event in place (producers call this before writing);
        the same rules as :meth:`from_dict`, without a round trip through a dict. ``checked``
        names fields whose values the producer already ran through :meth:`check_field` (a
        scraper checks an engine histogram once, not at every sample that carries it again)."""
        if type(checked) is not frozenset:  # a set or a list of names: the cache keys on a frozenset
            checked = frozenset(checked)
        made = _VALIDATORS.get((type(self), checked))
        check = made[1] if made is not None and made[0] is self.FIELDS else _validator(type(self), checked)
        check(self)
        self._check_relations()
        return self

    @classmethod
    def check_field(cls, name: str, value: Any) -> Any:
        """``value`` checked by the rules of field ``name`` (what :meth:`validate` applies to
        it), normalised; :class:`EventError` if it breaks them."""
        for f in cls.FIELDS:
            if f.name == name:
                return _check_value(cls.KIND, f, value)
        raise KeyError(name)

    def _check_relations(self) -> None:
        """Cross-field rules; overridden where a contract has them."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": SCHEMA_VERSION}
        for f in self.FIELDS:
            value = getattr(self, f.attr)
            out[f.name] = value.to_dict() if f.type == "itl" else value
        return out

    def to_json(self) -> str:
        """The event's spool line: ``json.dumps(self.to_dict())``, compact, NaN refused."""
        return self.json_opening(len(self.FIELDS))

    def json_opening(self, count: int) -> str:
        """The spool line's text up to and including the first ``count`` fields, closed when
        that is all of them (:func:`_encoder`): a writer that keeps some fields' JSON appends
        the rest itself."""
        made = _ENCODERS.get((type(self), count))
        encode = made[1] if made is not None and made[0] is self.FIELDS else _encoder(type(self), count)
        return encode(self)


@dataclass(frozen=True, slots=True)
class RequestEvent(_Event):
    """One request as the gateway (or the fleet simulator) saw it, written when it ends.

    ``ts_ms`` is the time the request finished, so windows count a request where Prometheus's
    counters count it; its arrival time is ``ts_ms - e2e_ms``. ``ttft_ms`` is null when no token
    was produced (errors, rejections)."""

    ts_ms: int
    trace_id: str
    model: str
    pool: str
    replica: str
    arm: str
    policy: str
    prompt_tokens: int
    output_tokens: int
    queue_ms: float
    ttft_ms: float | None
    itl_ms: ItlSummary
    e2e_ms: float
    status: str
    tenant: str = names.DEFAULT_TENANT
    class_: str = names.DEFAULT_CLASS

    KIND: ClassVar[str] = "RequestEvent"
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("ts_ms", "int", "epoch ms when the request finished", minimum=0),
        Field("trace_id", "string", "W3C trace id (32 hex chars) of the request"),
        Field("model", "string", "model name as requested; 'other' when the gateway's label guard folds it (metrics.label_top_n, metrics.allowed_models)"),
        Field("pool", "string", "replica pool that served it"),
        Field("replica", "string", "replica that served it"),
        Field("arm", "string", "A/B arm the request was bucketed into"),
        Field("policy", "string", "temperature policy / schedule in force"),
        Field("prompt_tokens", "int", "prompt tokens", minimum=0),
        Field("output_tokens", "int", "generated tokens", minimum=0),
        Field("queue_ms", "number", "time queued in the gateway before dispatch, ms", minimum=0),
        Field("ttft_ms", "number", "time to first token from arrival, ms; null if none", minimum=0, nullable=True),
        Field("itl_ms", "itl", "inter-token latency summary {n, mean, std, max} in ms (a list of gaps is accepted and summarised)"),
        Field("e2e_ms", "number", "arrival to last byte, ms", minimum=0),
        Field("status", "string", "outcome", enum=names.STATUSES),
        Field("tenant", "string", "tenant the request was for: a declared tenant (tenants.declared), 'other' "
              "(undeclared or unidentified while tenants are on) or 'default' (tenants off; also a line without it)",
              default=names.DEFAULT_TENANT),
        Field("class", "string", "request class (tenants.classes, e.g. interactive, batch, sheddable); "
              f"'{names.DEFAULT_CLASS}' for a line without it", default=names.DEFAULT_CLASS),
    )

    def __post_init__(self) -> None:
        if isinstance(self.itl_ms, list | dict):
            object.__setattr__(self, "itl_ms", _parse_itl(self.KIND, self.itl_ms))
        # None is the wire's "not given" (a line written before tenants): the documented default
        if self.tenant is None:
            object.__setattr__(self, "tenant", names.DEFAULT_TENANT)
        if self.class_ is None:
            object.__setattr__(self, "class_", names.DEFAULT_CLASS)

    def _check_relations(self) -> None:
        if self.ttft_ms is not None and self.ttft_ms > self.e2e_ms:
            raise EventError(self.KIND, "ttft_ms", f"TTFT {self.ttft_ms} ms exceeds E2E {self.e2e_ms} ms")
        if self.queue_ms > self.e2e_ms:
            raise EventError(self.KIND, "queue_ms", f"queue {self.queue_ms} ms exceeds E2E {self.e2e_ms} ms")
        if self.status == names.STATUS_OK and self.ttft_ms is None and self.output_tokens > 0:
            raise EventError(self.KIND, "ttft_ms", "missing for an ok request with output tokens")


#: Known ``PolicyEvent.action`` values: what the policy did to the temperature.
POLICY_ACTIONS: tuple[str, ...] = ("hold", "raise", "lower", "set")


@dataclass(frozen=True, slots=True)
class PolicyEvent(_Event):
    """One temperature-policy decision (one ``temperature_policy.decide`` span)."""

    ts_ms: int
    trace_id: str
    span_id: str
    policy_id: str
    zone: str
    step: int
    temperature: float
    action: str
    trigger: str
    duration_ms: float

    KIND: ClassVar[str] = "PolicyEvent"
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("ts_ms", "int", "epoch ms of the decision (span start)", minimum=0),
        Field("trace_id", "string", "trace id of the request the decision belongs to"),
        Field("span_id", "string", "span id of the decision span (16 hex chars)"),
        Field("policy_id", "string", "policy instance, e.g. 'cosine' or 'entropy-adaptive'"),
        Field("zone", "string", "serving zone/pool the policy runs in"),
        Field("step", "int", "decode step the decision applies to", minimum=0),
        Field("temperature", "number", "temperature chosen", minimum=0, maximum=100),
        Field("action", "string", "what the policy did", enum=POLICY_ACTIONS),
        Field("trigger", "string", "why: 'schedule', 'entropy_low', 'entropy_high', 'control', ..."),
        Field("duration_ms", "number", "time spent deciding, ms", minimum=0),
    )


@dataclass(frozen=True, slots=True)
class GpuSample(_Event):
    """One NVML sample of one GPU."""

    ts_ms: int
    node: str
    gpu: int
    uuid: str
    mem_used_bytes: int
    mem_total_bytes: int
    util: float
    temp_c: float
    power_w: float

    KIND: ClassVar[str] = "GpuSample"
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("ts_ms", "int", "epoch ms of the sample", minimum=0),
        Field("node", "string", "host name"),
        Field("gpu", "int", "GPU index on the node", minimum=0),
        Field("uuid", "string", "GPU UUID"),
        Field("mem_used_bytes", "int", "device memory used, bytes", minimum=0),
        Field("mem_total_bytes", "int", "device memory total, bytes", minimum=0),
        Field("util", "number", "utilisation ratio 0..1", minimum=0, maximum=1),
        Field("temp_c", "number", "temperature, Celsius", minimum=-50, maximum=200),
        Field("power_w", "number", "power draw, watts", minimum=0),
    )

    def _check_relations(self) -> None:
        if self.mem_used_bytes > self.mem_total_bytes:
            raise EventError(self.KIND, "mem_used_bytes", "exceeds mem_total_bytes")


@dataclass(frozen=True, slots=True)
class EngineSample(_Event):
    """One scrape of one inference engine replica's /metrics, normalised across engines.

    Every value is what the engine itself reports (docs/engines.md names the source metric per
    engine); a field the engine does not expose is null, never 0. Counters and histograms are the
    engine's cumulative values as scraped (summed over the engine's data-parallel ranks);
    ``counter_reset`` is 1 when one of them went down since the replica's previous sample (the
    engine restarted), so a reader takes this sample's values, not a difference, as the increase.
    Histogram bounds are in seconds whatever unit the engine uses."""

    ts_ms: int
    replica: str
    pool: str
    engine: str
    waiting: float | None
    running: float | None
    kv_usage: float | None
    kv_blocks_total: int | None
    kv_block_size: int | None
    kv_capacity_tokens: int | None
    preemptions_total: float | None
    prefix_cache_hits_total: float | None
    prefix_cache_queries_total: float | None
    prefix_cache_hit_rate: float | None
    lora_adapters: list[str] | None
    counter_reset: int
    ttft: dict[str, Any] | None
    itl: dict[str, Any] | None
    e2e: dict[str, Any] | None
    queue: dict[str, Any] | None

    KIND: ClassVar[str] = "EngineSample"
    FIELDS: ClassVar[tuple[Field, ...]] = (
        Field("ts_ms", "int", "epoch ms of the scrape", minimum=0),
        Field("replica", "string", "replica id (the gateway's: r0, r1, ... in gateway.upstreams order, or the URL's host:port)"),
        Field("pool", "string", "pool of the replica"),
        Field("engine", "string", "engine type the metrics were read as", enum=names.ENGINES),
        Field("waiting", "number", "requests waiting in the engine's queue; null if not exposed", minimum=0, nullable=True),
        Field("running", "number", "requests in the engine's running batch; null if not exposed", minimum=0, nullable=True),
        Field("kv_usage", "number", "KV cache usage 0..1 (mean over data-parallel ranks); null if not exposed", minimum=0, maximum=1, nullable=True),
        Field("kv_blocks_total", "int", "KV cache blocks in total (summed over ranks); null if not exposed", minimum=0, nullable=True),
        Field("kv_block_size", "int", "tokens per KV cache block; null if not exposed", minimum=0, nullable=True),
        Field("kv_capacity_tokens", "int", "KV cache capacity in tokens (blocks x block size, or the engine's own token count); null if unknown", minimum=0, nullable=True),
        Field("preemptions_total", "number", "cumulative preemptions (SGLang: retractions) as the engine counts them; null if not exposed", minimum=0, nullable=True),
        Field("prefix_cache_hits_total", "number", "cumulative prefix-cache hits (tokens or blocks, the engine's unit); null if no counter", minimum=0, nullable=True),
        Field("prefix_cache_queries_total", "number", "cumulative prefix-cache queries in the same unit; null if no counter", minimum=0, nullable=True),
        Field("prefix_cache_hit_rate", "number", "prefix-cache hit rate 0..1: from the counters' increase since the previous sample where the engine has counters, else its gauge; null if neither", minimum=0, maximum=1, nullable=True),
        Field("lora_adapters", "strings", "LoRA adapters the engine reports running or waiting; null if the engine does not name them", nullable=True),
        Field("counter_reset", "int", "1 if a counter or histogram went down since the previous sample (engine restart), else 0", minimum=0, maximum=1),
        Field("ttft", "hist", "engine's time-to-first-token histogram {le, counts, sum, count}, seconds; null if not exposed", nullable=True),
        Field("itl", "hist", "engine's inter-token latency (time per output token) histogram, seconds; null if not exposed", nullable=True),
        Field("e2e", "hist", "engine's end-to-end request latency histogram, seconds; null if not exposed", nullable=True),
        Field("queue", "hist", "engine's queue-time histogram, seconds; null if not exposed", nullable=True),
    )


#: The request-path kinds (``names.SPOOL_KINDS``), which the forecaster windows in memory too.
EVENT_TYPES: dict[str, type[_Event]] = {
    names.SPOOL_REQUESTS: RequestEvent,
    names.SPOOL_POLICY: PolicyEvent,
    names.SPOOL_GPU: GpuSample,
}
#: Every kind a spool holds (``names.SPOOL_ALL_KINDS``): the spool writer and reader, ``spool
#: check``, the JSON Schemas and the stream job (its columns derive from these) cover these.
ALL_EVENT_TYPES: dict[str, type[_Event]] = {**EVENT_TYPES, names.SPOOL_ENGINE: EngineSample}


def json_schema(cls: type[_Event]) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) for producers in other languages; derived from ``FIELDS``."""
    props: dict[str, Any] = {"v": {"const": SCHEMA_VERSION, "description": "schema version"}}
    for f in cls.FIELDS:
        if f.type == "hist":
            prop: dict[str, Any] = {
                "type": "object",
                "additionalProperties": False,
                "required": list(HIST_KEYS),
                "properties": {
                    "le": {"type": "array", "items": {"type": "number"}, "maxItems": MAX_BUCKETS,
                           "description": "finite bucket upper bounds, strictly increasing (+Inf is count)"},
                    "counts": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": MAX_BUCKETS,
                               "description": "cumulative count per bound"},
                    "sum": {"type": "number", "description": "sum of the observations"},
                    "count": {"type": "integer", "minimum": 0, "description": "number of observations"},
                },
            }
            if f.nullable:
                prop = {"oneOf": [prop, {"type": "null"}]}
        elif f.type == "strings":
            prop = {"type": ["array", "null"] if f.nullable else "array", "maxItems": MAX_LIST_ITEMS,
                    "items": {"type": "string", "minLength": 1, "maxLength": 256}}
        elif f.type == "itl":
            prop = {
                "type": "object",
                "additionalProperties": False,
                "required": [g.name for g in ITL_FIELDS],
                "properties": {
                    g.name: {"type": "integer" if g.type == "int" else "number", "minimum": 0, "description": g.doc}
                    for g in ITL_FIELDS
                },
            }
        else:
            prop = {"type": {"int": "integer", "number": "number", "string": "string"}[f.type]}
            if f.type == "string":
                prop.update(minLength=1, maxLength=256)
            if f.minimum is not None:
                prop["minimum"] = f.minimum
            if f.maximum is not None:
                prop["maximum"] = f.maximum
            if f.enum is not None:
                prop["enum"] = list(f.enum)
            if f.optional:
                prop["type"] = [prop["type"], "null"]
            if f.default is not None:
                prop["default"] = f.default
        prop["description"] = f.doc
        props[f.name] = prop
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://llmsla.dev/schemas/{cls.KIND}.v{SCHEMA_VERSION}.json",
        "title": cls.KIND,
        "description": (cls.__doc__ or "").strip().splitlines()[0],
        "type": "object",
        "additionalProperties": False,
        "required": [f.name for f in cls.FIELDS if not f.optional],
        "properties": props,
    }


def render_schemas() -> dict[str, str]:
    """File name -> JSON text of every schema, as written to ``deploy/schemas/``."""
    return {
        f"{cls.KIND}.v{SCHEMA_VERSION}.json": json.dumps(json_schema(cls), indent=2, sort_keys=False) + "\n"
        for cls in ALL_EVENT_TYPES.values()
    }
