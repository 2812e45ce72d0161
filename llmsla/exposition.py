"""The Prometheus text exposition every llmsla process serves on ``/metrics``.

Core, not exporters, because every component exposes metrics through
:func:`llmsla.httpkit.add_metrics`. Outside multi-process mode :func:`render_fast` renders
prometheus-client's objects from their internals with cached prefixes, many times faster than
``generate_latest``; it reads private fields, so the dependency is pinned and a test fails
loudly the day its output stops matching ``generate_latest``.
See docs/gateway.md#metrics-exportersmetricspy.
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Iterable
from typing import Any

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.utils import floatToGoString

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_dir() -> str | None:
    """The prometheus_client multiprocess directory, if this process runs in that mode."""
    return os.environ.get(MULTIPROC_ENV) or None



def exposition(registry: CollectorRegistry | None = None) -> tuple[bytes, str]:
    """``(body, content_type)`` for ``/metrics``: the multi-process merge when in that mode,
    else :func:`render_fast` (same samples as ``generate_latest`` minus ``_created``)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    mp = multiprocess_dir()
    if mp:
        from prometheus_client import multiprocess

        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg, path=mp)
        return generate_latest(reg), CONTENT_TYPE_LATEST
    return render_fast(DEFAULT_REGISTRY if registry is None else registry), CONTENT_TYPE_LATEST


# -- fast text exposition ----------------------------------------------------------------------
# ``generate_latest`` builds a Sample namedtuple, a labels dict, a sorted label list and an
# escaped label string for every line, every scrape: 2,000 label sets of our request metrics
# are ~240k lines and ~1.8 s. The series' label strings never change, so :func:`render_fast`
# caches, per child, the finished line prefixes (``name{labels} ``) and formats only the values.
# It emits the Prometheus text format 0.0.4 with the same families, order and samples as
# ``generate_latest`` except the ``_created`` series: in the text format they are plain gauges
# that no PromQL function or Grafana panel uses (``rate``/``increase`` handle resets on their
# own), and they are one extra series per counter and histogram child. Collectors it does not
# know (process/GC collectors, custom ones, set_function gauges, multi-process values) are
# rendered by ``generate_latest`` itself, one collector at a time. A test parses both outputs
# and compares every sample.
_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_KIND_OF: dict[type, str] = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}
_INF = float("inf")
#: parent metric -> {label values: cached prefixes}; weak, so a dropped registry frees it.
_prefix_cache: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], Any]] = weakref.WeakKeyDictionary()


def _fmt(v: float) -> str:
    """``floatToGoString`` with the common case (a float below 1e6) done by ``repr``."""
    if v.__class__ is float and -_INF < v < 1e6:
        return repr(v)
    return floatToGoString(v)


def _esc(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _label_str(pairs: Iterable[tuple[str, str]]) -> str:
    """``{a="x",b="y"}`` sorted by label name, as ``generate_latest`` writes it."""
    items = sorted(pairs)
    return "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in items) + "}" if items else ""


class _One:
    """One collector as a registry-like object for ``generate_latest``'s fallback path, minus
    its ``_created`` samples (dropped everywhere, for one consistent exposition)."""

    __slots__ = ("c",)

    def __init__(self, c: Any) -> None:
        self.c = c

    def collect(self) -> Any:
        for m in self.c.collect():
            created = m.name + "_created"
            m.samples = [s for s in m.samples if s.name != created]
            yield m


def _plain_value(v: Any) -> bool:
    return type(v).__name__ == "MutexValue" and hasattr(v, "_value")


def _fast_kind(c: Any) -> str | None:
    """'counter' / 'gauge' / 'histogram' when ``c`` can be rendered from its internals."""
    kind = _KIND_OF.get(type(c))
    if kind is None or not _LEGACY_NAME.match(c._name) or c._labelvalues:
        return None
    if not all(_LEGACY_NAME.match(n) for n in c._labelnames):
        return None
    return kind


def _child_ok(kind: str, ch: Any) -> bool:
    if kind == "histogram":
        return (_plain_value(ch._sum) and all(_plain_value(b) for b in ch._buckets)
                and len(ch._buckets) == len(ch._upper_bounds))
    if kind == "gauge" and "_child_samples" in ch.__dict__:  # set_function
        return False
    return _plain_value(ch._value)


def _prefixes(kind: str, parent: Any, lv: tuple[str, ...], ch: Any) -> Any:
    name = parent._name
    pairs = list(zip(parent._labelnames, lv, strict=True))
    if kind == "histogram":
        buckets = tuple(f"{name}_bucket{_label_str([*pairs, ('le', floatToGoString(b))])} "
                        for b in ch._upper_bounds)
        lbl = _label_str(pairs)
        return buckets, f"{name}_count{lbl} ", f"{name}_sum{lbl} " if ch._upper_bounds[0] >= 0 else None
    suffix = "_total" if kind == "counter" else ""
    return f"{name}{suffix}{_label_str(pairs)} "


def _render_family(kind: str, c: Any, out: list[str]) -> bool:
    """Append one family's lines; False (nothing appended) when a child is not renderable."""
    if c._is_parent():
        with c._lock:
            children = list(c._metrics.items())
    else:
        children = [((), c)]
    if not all(_child_ok(kind, ch) for _, ch in children):
        return False
    cache = _prefix_cache.get(c)
    if cache is None:
        cache = _prefix_cache[c] = {}
    if len(cache) > 2 * len(children) + 64:  # children were removed: drop their prefixes
        cache.clear()
    mname = c._name + "_total" if kind == "counter" else c._name
    doc = c._documentation.replace("\\", r"\\").replace("\n", r"\n")
    out.append(f"# HELP {mname} {doc}\n# TYPE {mname} {kind}")
    app = out.append
    fmt = _fmt
    # bucket counts repeat a lot (most buckets of most series hold the same few counts):
    # memoising their text saves a float repr per line
    memo: dict[float, str] = {}
    for lv, ch in children:
        pre = cache.get(lv)
        if pre is None:
            pre = cache[lv] = _prefixes(kind, c, lv, ch)
        if kind == "histogram":
            buckets, count_pre, sum_pre = pre
            acc = 0.0
            for bpre, b in zip(buckets, ch._buckets, strict=True):
                acc += b._value
                t = memo.get(acc)
                if t is None:
                    t = memo[acc] = fmt(acc)
                app(bpre + t)
            app(f"{count_pre}{fmt(acc)}")
            if sum_pre is not None:
                app(f"{sum_pre}{fmt(ch._sum._value)}")
        else:
            app(f"{pre}{fmt(ch._value._value)}")
    return True


def render_fast(registry: CollectorRegistry) -> bytes:
    """The text exposition of ``registry``, fast for prometheus-client's own Counter, Gauge and
    Histogram objects (see the block comment above); no ``_created`` series."""
    from prometheus_client import generate_latest

    to_names = getattr(registry, "_collector_to_names", None)
    lock = getattr(registry, "_lock", None)
    if to_names is None or lock is None or getattr(registry, "_target_info", None):
        return generate_latest(registry)
    with lock:
        collectors = list(to_names)
    out: list[str] = []  # lines without their newline: one join adds them all
    for c in collectors:
        kind = _fast_kind(c)
        if kind is None or not _render_family(kind, c, out):
            text = generate_latest(_One(c)).decode("utf-8")
            if text:
                out.append(text[:-1])
    if not out:
        return b""
    out.append("")
    return "\n".join(out).encode("utf-8")
