"""A replica's /metrics body -> an :class:`Exposition` the adapters read by sample name.

Both formats are read with prometheus-client's own parsers, picked by the Content-Type;
OpenMetrics is strict so a truncated body is an error. The families an adapter reads are first
cut out of the body (:func:`select`), and their sample lines are read by :func:`fast_samples`,
which accepts only the plain shape ``name{k="v",...} value [timestamp]`` and hands anything
else (escapes, quoted names, exemplars, a missing ``# EOF``) to prometheus-client: at 256
replicas a second its parser alone would cost more than a core (bench/engines.py). Adapters
look samples up by *sample* name, so how a parser groups families does not matter. Several
label sets of one name are aggregated per replica (sums, averages for ratios); NaN counts as
absent, never 0. See docs/engines.md#what-it-reads-from-each-engine.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from llmsla import names
from llmsla.events import EngineSample, EventError

OPENMETRICS_TYPE = "application/openmetrics-text"

#: Metric-name prefix of each engine, for ``auto`` detection (docs/engines.md).
PREFIXES: dict[str, str] = {
    names.ENGINE_VLLM: "vllm:",
    names.ENGINE_SGLANG: "sglang:",
    names.ENGINE_TRTLLM: "trtllm_",
    names.ENGINE_TRITON: "nv_trt_llm_",
}

Labels = Mapping[str, str]
LabelFilter = Callable[[Labels], bool]


class ParseError(ValueError):
    """The body is not a metrics exposition (HTML, truncated, garbage)."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: finite bounds (seconds), cumulative counts per bound, sum, count
    (the +Inf bucket). The shape of ``EngineSample``'s histogram fields."""

    le: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int
    #: :meth:`wire`'s answer and its JSON, once computed (a histogram is immutable)
    _wire: dict[str, Any] | None = field(default=None, init=False, compare=False, repr=False)
    _json: str | None = field(default=None, init=False, compare=False, repr=False)

    def to_dict(self) -> dict[str, object]:
        return {"le": list(self.le), "counts": list(self.counts), "sum": self.sum, "count": self.count}

    def wire(self, name: str = "ttft") -> dict[str, Any]:
        """The ``EngineSample`` histogram field of this histogram, checked by the contract's own
        rule once (:class:`~llmsla.events.EventError` if it breaks it) and then kept: an idle
        replica's unchanged histogram is the same object scrape after scrape, and is not checked
        again. ``name``: the field, for the error's message. The dict is shared: read it, never
        change it."""
        wire = self._wire
        if wire is None:
            wire = EngineSample.check_field(name, self.to_dict())
            object.__setattr__(self, "_wire", wire)
        return wire

    def wire_json(self, name: str = "ttft") -> str:
        """:meth:`wire` as the spool line writes it (compact JSON), kept like it. The text
        ``json.dumps`` gives, byte for byte, put together from the checked values (plain floats
        and ints) with the bounds' JSON shared: a replica's bounds are the same every scrape,
        and a busy replica's four histograms are new every second."""
        text = self._json
        if text is None:
            w = self.wire(name)
            le = tuple(w["le"])
            bounds = _bounds_json(le) if 0.0 not in le else _bounds_json.__wrapped__(le)
            counts = ",".join(map(int.__repr__, w["counts"]))
            total, count = float.__repr__(w["sum"]), int.__repr__(w["count"])
            text = f'{{"le":{bounds},"counts":[{counts}],"sum":{total},"count":{count}}}'
            object.__setattr__(self, "_json", text)
        return text

    def scaled(self, factor: float) -> Histogram:
        """Bounds and sum times ``factor`` (Triton's milliseconds -> seconds)."""
        return Histogram(tuple(b * factor for b in self.le), self.counts, self.sum * factor, self.count)


@functools.lru_cache(maxsize=256)
def _bounds_json(le: tuple[float, ...]) -> str:
    """A histogram's checked bounds as JSON (a fleet exposes a handful of bucket layouts). Not
    for bounds with a zero: 0.0 and -0.0 are one key, but two spellings."""
    return json.dumps(list(le), separators=(",", ":"), allow_nan=False)


Rows = list[tuple[dict[str, str], float]]


@dataclass
class Exposition:
    """Samples by name: each a list of (labels, value), in exposition order. The row lists may
    be shared with a replica's earlier scrapes (:class:`Reuse`): read them, never change them."""

    samples: dict[str, Rows] = field(default_factory=lambda: defaultdict(list))
    #: the replica's histogram memo when read with one (:func:`fast_samples`)
    reuse: Reuse | None = None
    #: the runs of kept lines it was read from (:func:`kept_runs`) when the fast reader read it
    #: all; None when prometheus-client did: its samples are then not a function of them alone
    kept: tuple[str, ...] | None = None

    def names(self) -> Iterable[str]:
        return self.samples.keys()

    def series(self, name: str, where: LabelFilter | None = None) -> list[tuple[dict[str, str], float]]:
        rows = self.samples.get(name, [])
        return list(rows) if where is None else [r for r in rows if where(r[0])]

    def _finite(self, name: str, where: LabelFilter | None) -> list[float]:
        return [v for _, v in self._rows(name, where) if math.isfinite(v)]

    def _sum(self, name: str, where: LabelFilter | None) -> tuple[float, int] | None:
        """(sum, count) of the finite values; None when there is none, or when the sum is past
        the float range (a replica exposing garbage: that field, not its sample)."""
        vals = self._finite(name, where)
        if not vals:
            return None
        try:
            return math.fsum(vals), len(vals)
        except OverflowError:
            return None

    def total(self, name: str, where: LabelFilter | None = None) -> float | None:
        """Sum over the label sets (finite values only); None as :meth:`_sum` says."""
        got = self._sum(name, where)
        return None if got is None else got[0]

    def mean(self, name: str, where: LabelFilter | None = None) -> float | None:
        """Mean over the label sets (a ratio per data-parallel rank); None as :meth:`_sum` says."""
        got = self._sum(name, where)
        return None if got is None else got[0] / got[1]

    def first(self, name: str, where: LabelFilter | None = None) -> float | None:
        """The first finite value (a per-replica constant such as a block size)."""
        vals = self._finite(name, where)
        return vals[0] if vals else None

    def histogram(self, base: str, where: LabelFilter | None = None) -> Histogram | None:
        """``base``'s buckets summed over label sets whose bounds agree with the first set's; None
        when absent, when a value is not finite or when a set's buckets are not cumulative.

        Read with a :class:`Reuse` and unfiltered, a histogram whose bucket, sum and count rows
        are the very lists of the replica's previous scrape (their text did not change) is the
        previous scrape's :class:`Histogram` object, not built again."""
        reuse = self.reuse
        if reuse is None or where is not None:
            return self._histogram(base, where)
        samples = self.samples
        rows = (samples.get(f"{base}_bucket"), samples.get(f"{base}_sum"), samples.get(f"{base}_count"))
        last = reuse.hists.get(base)
        if last is not None and last[0] is rows[0] and last[1] is rows[1] and last[2] is rows[2]:
            return last[3]
        hist = self._histogram(base, None)
        reuse.hists[base] = (*rows, hist)
        return hist

    def _histogram(self, base: str, where: LabelFilter | None) -> Histogram | None:
        rows = self._rows(f"{base}_bucket", where)
        if not rows:
            return None
        labs, vals = zip(*rows, strict=True)
        plan = _plan(labs)
        if plan is not None:  # one label set, its buckets in order: the values are the counts
            layout, key = plan
            hsums = [v for lab, v in self._rows(f"{base}_sum", where) if _key(lab) == key]
            if not hsums:
                return None
            return _checked(layout, list(vals), hsums[-1])
        groups: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
        known = _BOUNDS
        for labels, value in rows:  # the hot loop of a scrape: kept to the bone
            le = labels.get("le")
            if le is None:
                continue
            bound = known.get(le)
            if bound is None:
                try:
                    bound = float(le)
                except ValueError:
                    return None
                if len(known) < 4096:
                    known[le] = bound
            key = labels.group if type(labels) is _Labels else _group(labels)
            g = groups.get(key)
            if g is None:
                g = groups[key] = {}
            g[bound] = value
        if not groups:
            return None
        sums = {_key(lab): v for lab, v in self._rows(f"{base}_sum", where)}
        counts = {_key(lab): v for lab, v in self._rows(f"{base}_count", where)}
        bounds: tuple[float, ...] | None = None
        acc: list[float] = []
        total_sum = total_count = 0.0
        for key, buckets in groups.items():
            inf = buckets.pop(math.inf, None)
            if inf is None:
                inf = counts.get(key)
            finite = tuple(sorted([b for b in buckets if b == b and b != -math.inf]))
            if bounds is None:
                bounds = finite
            elif finite != bounds:
                continue  # a label set with other bounds cannot be added bucket by bucket
            cum = [buckets[b] for b in finite]
            hsum = sums.get(key)
            if inf is None or hsum is None:
                return None
            cum.append(inf)
            if not _cumulative(cum, hsum):
                return None
            cum.pop()
            acc = [a + c for a, c in zip(acc, cum, strict=True)] if acc else cum
            total_count += inf
            total_sum += hsum
        assert bounds is not None
        return _built(Histogram(bounds, tuple(map(round, acc)), total_sum, round(total_count)))

    def _rows(self, name: str, where: LabelFilter | None) -> list[tuple[dict[str, str], float]]:
        """Like :meth:`series`, without the copy when nothing is filtered (read-only use)."""
        rows = self.samples.get(name)
        if rows is None:
            return []
        return rows if where is None else [r for r in rows if where(r[0])]


#: ``le`` label value -> its float, shared: a fleet repeats a handful of bucket bounds.
_BOUNDS: dict[str, float] = {}
#: A histogram's bucket label sets (their ids) -> (those label sets, (finite bounds, label set but
#: le)) when they are one label set's buckets in increasing order ending with +Inf, else None
#: for the plan: the layout of an engine's histogram is the same scrape after scrape, and across a
#: fleet. Each entry holds its label sets, so while it lives no other object can take their ids:
#: the same ids are the same objects (the readers share them between scrapes).
_PLANS: dict[tuple[int, ...], tuple[tuple[_Labels, ...], tuple[tuple[float, ...], tuple[tuple[str, str], ...]] | None]] = {}


def _plan(labs: tuple[Mapping[str, str], ...]) -> tuple[tuple[float, ...], tuple[tuple[str, str], ...]] | None:
    """The simple layout of the bucket label sets ``labs`` (see ``_PLANS``), None for any other."""
    ids = tuple(map(id, labs))
    hit = _PLANS.get(ids)
    if hit is not None:
        return hit[1]
    if any(type(lab) is not _Labels for lab in labs):
        return None
    shared = cast(tuple[_Labels, ...], labs)
    plan: tuple[tuple[float, ...], tuple[tuple[str, str], ...]] | None = None
    key = shared[0].group
    les = [lab.get("le") for lab in shared]
    if len(shared) > 1 and les[-1] == "+Inf" and all(lab.group == key for lab in shared):
        try:
            bounds = tuple(float(le) for le in les[:-1])  # type: ignore[arg-type]  # None: TypeError
        except (TypeError, ValueError):
            bounds = ()
        if len(bounds) == len(shared) - 1 and all(math.isfinite(b) for b in bounds) and all(
                a < b for a, b in zip(bounds, bounds[1:], strict=False)):
            plan = (bounds, key)
    if len(_PLANS) >= 4096:
        _PLANS.clear()
    _PLANS[ids] = (shared, plan)
    return plan


def _cumulative(cum: list[float], hsum: float) -> bool:
    """Whether a histogram's cumulative bucket values and its sum are all finite and the values
    never decrease. One NaN or infinity makes the exact sum not finite; fsum raises on -inf with
    +inf and on a finite sum past the float range, and either is a histogram to refuse."""
    try:
        ok = math.isfinite(math.fsum(cum) + hsum)
    except (OverflowError, ValueError):
        return False
    return ok and cum == sorted(cum)


def _checked(bounds: tuple[float, ...], cum: list[float], hsum: float) -> Histogram | None:
    """One label set's histogram from its cumulative values (+Inf last) and sum; None when one
    is not finite or they decrease."""
    if not _cumulative(cum, hsum):
        return None
    return _built(Histogram(bounds, tuple(map(round, cum[:-1])), 0.0 + hsum, round(cum[-1])))


def _built(hist: Histogram) -> Histogram | None:
    """``hist`` once the contract's own check of the EngineSample histogram field passed, else
    None: here the engine's numbers become a contract field (a histogram it refuses is absent)."""
    try:
        hist.wire()
    except EventError:
        return None
    return hist


def _key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A label set's histogram grouping key: its sorted labels but ``le`` (precomputed on the
    label sets the readers build)."""
    return labels.group if type(labels) is _Labels else _group(labels)


def is_openmetrics(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == OPENMETRICS_TYPE


def _wanted(line: str, keep: tuple[str, ...]) -> bool:
    if line.startswith("#"):
        if line.startswith("# EOF"):
            return True
        parts = line.split(" ", 3)
        return len(parts) >= 3 and parts[2].startswith(keep)  # HELP / TYPE / UNIT of a kept family
    return line.startswith(keep)


def select(body: str, keep: tuple[str, ...]) -> str:
    """The lines of ``body`` that belong to families whose names start with one of ``keep`` (and
    ``# EOF``). The parsers cost ~50 us a line; an engine's /metrics is mostly families no
    adapter reads (process, Python, HTTP, token-count histograms), so this comes first."""
    return "\n".join(line for line in body.splitlines() if _wanted(line, keep)) + "\n"


_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\]*)",?')


def _trie(words: list[str]) -> str:
    """A regex alternation of ``words`` factored by common prefix (a word that is a prefix of
    another ends the branch: what follows is read as the rest of the name). The regex engine
    tries alternatives one by one; factored, a line of another family is refused at its first
    differing character instead of once per kept prefix."""
    if "" in words:
        return ""
    heads: dict[str, list[str]] = {}
    for w in words:
        heads.setdefault(w[0], []).append(w[1:])
    alts = [re.escape(c) + _trie(rest) for c, rest in sorted(heads.items())]
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


@functools.lru_cache(maxsize=16)
def _lines_of(keep: tuple[str, ...]) -> re.Pattern[str]:
    """The sample lines of the families starting with one of ``keep``, found and split by the
    regex engine (one scan of the body in C instead of Python work per line). A kept line of
    the plain shape yields (name, labels, value, ""); any other kept line yields its family's
    prefix in the last group, which sends the body to prometheus-client."""
    kept = _trie(sorted(set(keep)))
    # a leading literal newline (the body is given one) lets the engine jump from line to line
    return re.compile("\n(?:(" + kept + r"[a-zA-Z0-9_:]*)(?:\{([^{}\\#\n]*)\})? ([^ \n\r]+)"
                      r"(?: -?[0-9.eE+]+)?(?=\n)|(" + kept + ")[^\n]*)")


class _Labels(dict[str, str]):
    """A parsed label set with its histogram grouping key (the sorted labels but ``le``)
    computed once: :func:`_labels` shares it between scrapes, so :meth:`Exposition.histogram`
    need not sort the labels of every bucket line of every scrape again, and ``_PLANS`` knows
    a histogram's layout by its label sets' identities."""

    __slots__ = ("group",)
    group: tuple[tuple[str, str], ...]


@functools.lru_cache(maxsize=8192)
def _labels(raw: str) -> _Labels | None:
    """``k="v",...`` as a dict (shared between calls: read-only), None if not the plain shape.
    Cached: the label sets of a fleet's replicas repeat (one model, the same bucket bounds)."""
    labels = _Labels()
    end = 0
    for lm in _LABEL.finditer(raw):
        if lm.start() != end:
            return None
        labels[lm.group(1)] = lm.group(2)
        end = lm.end()
    if end != len(raw):
        return None
    labels.group = _group(labels)
    return labels


def _group(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "le"))


_NO_LABELS = _Labels()
_NO_LABELS.group = ()


class Reuse:
    """What one replica's previous scrape read, so that an unchanged part is not read again:
    each run of kept lines (a family's samples: the formats keep a family's lines together)
    by its exact text -> its samples, and each histogram with the row lists it was built from.
    An idle replica's histogram families are byte-identical scrape after scrape; theirs are then
    the same row lists, so :meth:`Exposition.histogram` returns the same object. Only the last
    scrape's runs are kept (about the kept text's size per replica)."""

    __slots__ = ("runs", "hists")

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Rows]] = {}
        self.hists: dict[str, tuple[Rows | None, Rows | None, Rows | None, Histogram | None]] = {}


@functools.lru_cache(maxsize=16)
def _runs_of(keep: tuple[str, ...]) -> re.Pattern[str]:
    """Runs of consecutive lines of the families starting with one of ``keep``, each found whole
    by the regex engine: a ``# HELP`` / ``# TYPE`` line or another family's line ends a run."""
    kept = _trie(sorted(set(keep)))
    return re.compile("\n(" + kept + "[^\n]*(?:\n" + kept + "[^\n]*)*)")


#: A sample line's text before its value (``name{k="v",...}``) -> its name and labels, for the
#: lines that were read in full once and had no timestamp: a fleet's replicas repeat them.
_HEADS: dict[str, tuple[str, _Labels]] = {}


def _read_line(line: str, lines: re.Pattern[str]) -> tuple[str, _Labels, str] | None:
    """(name, labels, value text) of a line of the plain shape, else None; remembers its head."""
    found = lines.findall("\n" + line + "\n")
    if len(found) != 1:
        return None
    name, raw, value, bad = found[0]
    labels = _labels(raw) if raw else _NO_LABELS
    if bad or labels is None:
        return None
    if line.endswith(" " + value):  # no timestamp: the same head with another value is this line's shape
        if len(_HEADS) >= 16384:
            _HEADS.clear()
        _HEADS[line[:-len(value) - 1]] = (name, labels)
    return name, labels, value


def _read_run(run: str, lines: re.Pattern[str]) -> dict[str, Rows] | None:
    """The samples of one run by name; None when a line is not of the plain shape.

    A line whose head (the text before its last space) was read in full before is the same
    name and labels with a new value: one split and a float. Any other line is read in full by
    ``lines`` (the strict shape), which also learns its head."""
    if "\r" in run:  # the strict shape refuses a CR: read every line in full
        heads: dict[str, tuple[str, _Labels]] = {}
    else:
        heads = _HEADS
    frag: dict[str, Rows] = {}
    for line in run.split("\n"):
        head, _, value = line.rpartition(" ")
        known = heads.get(head)
        if known is None:
            full = _read_line(line, lines)
            if full is None:
                return None
            name, labels, value = full
        else:
            name, labels = known
        try:
            v = float(value)
        except ValueError:
            return None
        rows = frag.get(name)
        if rows is None:
            rows = frag[name] = []
        rows.append((labels, v))
    return frag


def kept_runs(body: str, openmetrics: bool, keep: tuple[str, ...]) -> tuple[str, ...] | None:
    """The runs of sample lines of the families of ``body`` starting with one of ``keep``, in
    order: all that :func:`fast_samples` reads of it, so two bodies with the same runs read the
    same. None where it would not read the body: OpenMetrics cut before ``# EOF`` (the strict
    parser refuses it), an empty prefix (the full parser reads everything)."""
    if openmetrics and not body.rstrip().endswith("# EOF"):
        return None
    if not all(keep):
        return None
    return tuple(_runs_of(keep).findall("\n" + body + "\n"))


#: How close :func:`_common_prefix` and :func:`_common_suffix` get to the first differing byte:
#: a few lines more to scan cost less than the halving steps it would take to reach it.
_SLACK = 256


def _common_prefix(a: bytes, b: bytes, limit: int) -> int:
    """A number of leading bytes ``a`` and ``b`` share (at most ``limit``, and at most
    :data:`_SLACK` short of all they share): halving the span in doubt, each step one C-level
    comparison (no Python per byte; about ``limit`` bytes compared in all)."""
    lo, hi = 0, limit  # a[:lo] == b[:lo]; all they share is in [lo, hi]
    while hi - lo > _SLACK:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: bytes, b: bytes, limit: int) -> int:
    """A number of trailing bytes ``a`` and ``b`` share, as :func:`_common_prefix`."""
    la, lb = len(a), len(b)
    lo, hi = 0, limit
    while hi - lo > _SLACK:
        mid = (lo + hi + 1) // 2
        if a.endswith(b[lb - mid:lb - lo], 0, la - lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


def same_kept(old: bytes, new: bytes, openmetrics: bool, keep: tuple[str, ...]) -> bool:
    """Whether ``new`` has exactly the sample lines of the families starting with one of
    ``keep`` that ``old`` has, in the same order: True only when the bytes that differ between
    the two lie in whole lines of other families or comments (an idle engine's body: its server's
    CPU seconds and memory moved, nothing of the engine's). Found without reading the body: where
    the two stop agreeing from the front and from the back, then a scan of those lines only. An
    OpenMetrics ``new`` cut before ``# EOF``, or changed lines that are not UTF-8, give False."""
    if old == new:
        return True
    if openmetrics and not new.rstrip().endswith(b"# EOF"):
        return False
    shorter = min(len(old), len(new))
    head = _common_prefix(old, new, shorter)
    tail = _common_suffix(old, new, shorter - head)
    # the changed lines, whole: from the start of the line the shared prefix ends in, to the end
    # of the line the shared suffix begins in (the same lines of both: the suffix is shared)
    start = new.rfind(b"\n", 0, head) + 1
    into = new.find(b"\n", len(new) - tail) - (len(new) - tail) if tail else -1
    runs = _runs_of(keep)
    for body in (old, new):
        end = len(body) if into < 0 else len(body) - tail + into
        changed = body[start:end]
        try:
            text = changed.decode("utf-8")
        except UnicodeDecodeError:
            return False
        if runs.search("\n" + text + "\n") is not None:
            return False
    return True


def fast_samples(body: str, openmetrics: bool, keep: tuple[str, ...], reuse: Reuse | None = None,
                 runs: tuple[str, ...] | None = None) -> Exposition | None:
    """The samples of the families of ``body`` starting with one of ``keep`` when each of their
    lines has the plain shape; None for anything else, which the caller then gives to
    prometheus-client. OpenMetrics must end with ``# EOF`` (a truncated body goes to the strict
    parser, which refuses it). The label dicts and row lists are shared: read them, never change
    them. With ``reuse`` (the replica's), a run whose text equals one of its previous scrape's
    is not read again: its samples are the previous ones. ``runs``: :func:`kept_runs` of
    ``body``, when the caller has them."""
    if runs is None:
        runs = kept_runs(body, openmetrics, keep)
        if runs is None:
            return None
    out = Exposition(reuse=reuse, kept=runs)
    samples = out.samples
    last = reuse.runs if reuse is not None else {}
    read: dict[str, dict[str, Rows]] = {}
    lines = _lines_of(keep)
    for run in runs:
        frag = last.get(run) or read.get(run)
        if frag is None:
            frag = _read_run(run, lines)
            if frag is None:
                return None
        read[run] = frag
        for name, rows in frag.items():
            have = samples.get(name)
            samples[name] = rows if have is None else have + rows  # a new list: rows are shared
    if reuse is not None:
        reuse.runs = read
    return out


def _parse(body: str, content_type: str | None) -> Exposition:
    if is_openmetrics(content_type):
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    out = Exposition()
    try:
        for family in text_string_to_metric_families(body):
            for s in family.samples:
                labels = _Labels(s.labels)
                labels.group = _group(labels)
                out.samples[s.name].append((labels, float(s.value)))
    except Exception as exc:  # the parsers raise ValueError, IndexError, KeyError on garbage
        raise ParseError(f"not a {'OpenMetrics' if is_openmetrics(content_type) else 'Prometheus text'} "
                         f"exposition: {type(exc).__name__}: {str(exc)[:200]}") from None
    return out


def parse(body: str, content_type: str | None = None, keep: tuple[str, ...] | None = None,
          reuse: Reuse | None = None, runs: tuple[str, ...] | None = None) -> Exposition:
    """Parse ``body`` with the parser its Content-Type names; :class:`ParseError` if it is not
    an exposition in that format, or holds no sample at all. With ``keep``, only the families
    whose names start with one of those prefixes are parsed (:func:`select`); when none is
    there, the whole body is parsed, to tell garbage from an exposition of something else.
    ``reuse``: the replica's memory of its previous scrape (:class:`Reuse`); ``runs``: the
    body's :func:`kept_runs` of ``keep``, when the caller has them."""
    out = Exposition()
    if keep:
        fast = fast_samples(body, is_openmetrics(content_type), keep, reuse, runs)
        out = fast if fast is not None else _parse(select(body, keep), content_type)
    if not out.samples:
        out = _parse(body, content_type)
    if not out.samples:
        raise ParseError("no samples")
    return out


def detect(expo: Exposition) -> str | None:
    """The engine whose prefix most sample names carry; None when no known prefix occurs.
    Triton's ``nv_trt_llm_`` is checked apart from trtllm-serve's ``trtllm_`` (no overlap)."""
    counts = dict.fromkeys(PREFIXES, 0)
    for name in expo.names():
        for engine, prefix in PREFIXES.items():
            if name.startswith(prefix):
                counts[engine] += 1
    best = max(counts, key=lambda e: counts[e])
    return best if counts[best] else None
