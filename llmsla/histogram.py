"""Mergeable latency histograms on the one fixed log-spaced layout of ``names.HIST_*``.

A fixed layout makes counts add, so any roll-up is the exact sum of its 5 s windows and its
quantiles stay within ``HIST_REL_ERROR`` whatever the range; percentiles of windows cannot be
merged. The quantile definition must stay identical to the SQL function
``llmsla_hist_quantile`` (the migration renders it from :data:`VALUES`).
See docs/store.md#tables-llmslastoremigrations0001_coresql-names-in-llmslanamespy.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from llmsla import names

BOUNDS: tuple[float, ...] = names.HIST_BOUNDS_MS
VALUES: tuple[float, ...] = names.HIST_VALUES_MS
#: Number of buckets: underflow, N log buckets, overflow.
SIZE = len(VALUES)
_BOUNDS = np.asarray(BOUNDS)
_VALUES = np.asarray(VALUES)


class HistError(ValueError):
    """A histogram literal or array that does not fit the layout."""


def bucket_index(value_ms: float) -> int:
    """The bucket of one value: the ``i`` with ``BOUNDS[i-1] < value <= BOUNDS[i]``."""
    return bisect.bisect_left(BOUNDS, value_ms)


def bucket_indices(values_ms: np.ndarray | Sequence[float]) -> np.ndarray:
    """Vectorised :func:`bucket_index` (same ties: a value equal to a bound is in the lower bucket)."""
    return np.searchsorted(_BOUNDS, np.asarray(values_ms, dtype=float), side="left")


def rank(q: float, n: int) -> int:
    """1-based rank of the ``q`` quantile among ``n`` values (SQL computes it the same way)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    return max(1, math.ceil(q * n))


@dataclass(frozen=True)
class Hist:
    """Counts of buckets ``lo .. lo + len(counts) - 1``; empty when ``counts`` is empty."""

    lo: int
    counts: tuple[int, ...]

    @property
    def n(self) -> int:
        return sum(self.counts)

    @classmethod
    def of(cls, values_ms: Iterable[float]) -> Hist:
        idx = bucket_indices(np.fromiter(values_ms, dtype=float))
        if idx.size == 0:
            return EMPTY
        lo, hi = int(idx.min()), int(idx.max())
        return cls(lo, tuple(int(c) for c in np.bincount(idx - lo, minlength=hi - lo + 1)))

    @classmethod
    def from_array(cls, lower: int | None, counts: Sequence[int] | None) -> Hist:
        """From a stored array: its lower bound (``array_lower``) and its elements."""
        if counts is None or lower is None or len(counts) == 0:
            return EMPTY
        if lower < 0 or lower + len(counts) > SIZE:
            raise HistError(f"histogram buckets {lower}..{lower + len(counts) - 1} outside 0..{SIZE - 1}")
        if any(c is None or c < 0 for c in counts):
            raise HistError("histogram counts must be non-negative integers")
        return cls(int(lower), tuple(int(c) for c in counts))

    @classmethod
    def parse(cls, text: str | None) -> Hist:
        """From PostgreSQL's text form: ``[lo:hi]={...}`` (or ``{...}`` for lower bound 1)."""
        if text is None or text == "{}":
            return EMPTY
        lower = 1
        body = text
        if text.startswith("["):
            dims, sep, body = text.partition("]=")
            a, _, b = dims[1:].partition(":")
            try:
                lower, upper = int(a), int(b)
            except ValueError:
                raise HistError(f"bad histogram literal {text[:40]!r}") from None
        if not (body.startswith("{") and body.endswith("}")):
            raise HistError(f"bad histogram literal {text[:40]!r}")
        try:
            counts = [int(x) for x in body[1:-1].split(",")]
        except ValueError:
            raise HistError(f"bad histogram literal {text[:40]!r}") from None
        if text.startswith("[") and upper - lower + 1 != len(counts):
            raise HistError(f"histogram literal {text[:40]!r}: bounds do not match the counts")
        return cls.from_array(lower, counts)

    def literal(self) -> str | None:
        """PostgreSQL array text (COPY or a query parameter), None when empty."""
        if not self.counts:
            return None
        return f"[{self.lo}:{self.lo + len(self.counts) - 1}]={{{','.join(map(str, self.counts))}}}"

    def dense(self) -> np.ndarray:
        out = np.zeros(SIZE, dtype=np.int64)
        out[self.lo:self.lo + len(self.counts)] = self.counts
        return out

    def __add__(self, other: Hist) -> Hist:
        return merge((self, other))

    def quantile(self, q: float) -> float | None:
        return quantile(self.dense(), q)


EMPTY = Hist(0, ())


def merge(hists: Iterable[Hist]) -> Hist:
    """The sum of histograms (what the SQL aggregate ``llmsla_hist_sum`` computes)."""
    total = np.zeros(SIZE, dtype=np.int64)
    for h in hists:
        if h.counts:
            total[h.lo:h.lo + len(h.counts)] += h.counts
    return from_dense(total)


def from_dense(counts: np.ndarray) -> Hist:
    nz = np.flatnonzero(counts)
    if nz.size == 0:
        return EMPTY
    lo, hi = int(nz[0]), int(nz[-1])
    return Hist(lo, tuple(int(c) for c in counts[lo:hi + 1]))


def quantile(dense: np.ndarray, q: float) -> float | None:
    """Quantile ``q`` of one dense count vector (length :data:`SIZE`); None when empty."""
    n = int(dense.sum())
    if n == 0:
        return None
    k = rank(q, n)
    return VALUES[int(np.searchsorted(np.cumsum(dense), k, side="left"))]


def quantiles(matrix: np.ndarray, q: float, lo: int = 0) -> np.ndarray:
    """Quantile ``q`` of each row of a count matrix over buckets ``lo .. lo + width - 1`` (the
    whole layout by default); NaN for an empty row.

    The A/B report's bootstrap computes thousands of these at once."""
    m = np.asarray(matrix)
    cum = np.cumsum(m, axis=-1)
    n = cum[..., -1]
    k = np.maximum(1, np.ceil(q * n))
    idx = (cum < k[..., None]).sum(axis=-1)
    out = _VALUES[np.minimum(lo + idx, SIZE - 1)]
    return np.where(n > 0, out, np.nan)


def max_relative_error() -> float:
    """Worst relative error of a bucket's value against any value it holds (the layout's promise)."""
    return max((b - a) / (b + a) for a, b in zip(BOUNDS, BOUNDS[1:], strict=False))
