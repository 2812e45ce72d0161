"""The normalised record of one scrape (:class:`EngineSnapshot`) and the per-replica state that
turns cumulative counters into increases without ever going negative (:class:`ReplicaState`).

An adapter (``vllm.py``, ``sglang.py``, ``trtllm.py``, ``triton.py``) fills an
:class:`EngineSnapshot` from one exposition; a field the engine does not expose stays None
(never 0). :meth:`ReplicaState.update` compares it with the replica's previous snapshot: a counter
or histogram count that went down means the engine restarted, so the new value *is* the increase
since the restart (the rule Prometheus's ``rate()`` applies), and ``counter_reset`` is set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from llmsla.events import EngineSample

from .parse import Histogram, Reuse

HISTOGRAMS = ("ttft", "itl", "e2e", "queue")
#: The EngineSample fields :meth:`EngineSnapshot.to_event` fills with contract-checked values
#: (:meth:`Histogram.wire`): ``validate(checked=...)`` need not check them again.
CHECKED_FIELDS = frozenset(HISTOGRAMS)


@dataclass(frozen=True)
class EngineSnapshot:
    """One replica's engine state at ``ts`` (epoch seconds), as the engine reports it."""

    replica: str
    pool: str
    engine: str
    ts: float
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None  # 0..1
    kv_blocks_total: int | None = None
    kv_block_size: int | None = None  # tokens per block
    kv_capacity_tokens: int | None = None
    preemptions_total: float | None = None  # counter
    prefix_cache_hits_total: float | None = None  # counter
    prefix_cache_queries_total: float | None = None  # counter
    #: from the counters' increase since the previous snapshot (ReplicaState.update) where the
    #: engine has counters; the adapter sets the engine's gauge here where it has only a gauge
    prefix_cache_hit_rate: float | None = None
    lora_adapters: tuple[str, ...] | None = None
    histograms: dict[str, Histogram | None] = field(default_factory=dict)  # ttft, itl, e2e, queue
    counter_reset: bool = False

    def with_(self, **changes: Any) -> EngineSnapshot:
        """``dataclasses.replace(self, **changes)`` for the scraper's every scrape: the fields
        copied with ``changes`` set, without running ``__init__`` again (a snapshot has no
        ``__post_init__`` to run), about 6x cheaper. The ``histograms`` dict is shared, as
        ``replace`` shares it."""
        unknown = changes.keys() - _SNAPSHOT_FIELDS
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        new = object.__new__(type(self))
        values = new.__dict__
        values.update(self.__dict__)
        values.update(changes)
        return new

    @property
    def ts_ms(self) -> int:
        """The sample's time as its event carries it (epoch ms)."""
        return int(self.ts * 1000)

    def to_event(self) -> EngineSample:
        def clip01(v: float | None) -> float | None:
            return None if v is None else min(1.0, max(0.0, v))

        def nonneg(v: float | None) -> float | None:
            return None if v is None else max(0.0, v)

        # each histogram's wire form was checked by the contract when first built (parse.py), or
        # is checked here: validate(checked=CHECKED_FIELDS) then skips them
        h = {name: (hist.wire(name) if (hist := self.histograms.get(name)) else None) for name in HISTOGRAMS}
        return EngineSample(
            ts_ms=self.ts_ms, replica=self.replica, pool=self.pool, engine=self.engine,
            waiting=nonneg(self.waiting), running=nonneg(self.running), kv_usage=clip01(self.kv_usage),
            kv_blocks_total=self.kv_blocks_total, kv_block_size=self.kv_block_size,
            kv_capacity_tokens=self.kv_capacity_tokens, preemptions_total=nonneg(self.preemptions_total),
            prefix_cache_hits_total=nonneg(self.prefix_cache_hits_total),
            prefix_cache_queries_total=nonneg(self.prefix_cache_queries_total),
            prefix_cache_hit_rate=clip01(self.prefix_cache_hit_rate),
            lora_adapters=None if self.lora_adapters is None else list(self.lora_adapters),
            counter_reset=int(self.counter_reset), ttft=h["ttft"], itl=h["itl"], e2e=h["e2e"], queue=h["queue"],
        )


_SNAPSHOT_FIELDS = frozenset(f.name for f in fields(EngineSnapshot))

#: Whether the histogram fields close EngineSample's field list (so :func:`sample_line` can
#: append their kept JSON to the rest's); else it writes ``to_json()`` itself.
_HISTS_LAST = tuple(f.name for f in EngineSample.FIELDS[-len(HISTOGRAMS):]) == HISTOGRAMS
_HEAD_COUNT = len(EngineSample.FIELDS) - len(HISTOGRAMS)


def sample_line(event: EngineSample, snap: EngineSnapshot) -> str:
    """``event.to_json()`` (``event`` is ``snap.to_event()``), with each histogram's JSON the
    one kept on its :class:`Histogram`: an idle replica's four histograms are not serialised
    again every second. The same text, byte for byte (tests/engines/test_reuse.py)."""
    if not _HISTS_LAST:
        return event.to_json()
    parts = [event.json_opening(_HEAD_COUNT)]
    for name in HISTOGRAMS:
        hist = snap.histograms.get(name)
        parts.append(f',"{name}":{hist.wire_json(name) if hist else "null"}')
    parts.append("}")
    return "".join(parts)


def as_int(value: float | None) -> int | None:
    """A gauge that counts things (blocks, tokens) as an int; None stays None."""
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return int(round(value))


def increase(prev: float | None, cur: float | None) -> tuple[float | None, bool]:
    """(increase of a counter from ``prev`` to ``cur``, whether it was reset). A decrease is a
    restart: the counter started again from 0, so ``cur`` is the increase. Never negative."""
    if cur is None:
        return None, False
    if prev is None:
        return None, False
    if cur < prev:
        return cur, True
    return cur - prev, False


@dataclass
class ReplicaState:
    """What the scraper keeps per replica between scrapes."""

    previous: EngineSnapshot | None = None
    #: preemptions counted since this process started, across engine restarts (re-exported as a
    #: counter that never goes down)
    preemptions: float = 0.0
    #: the last scrape's runs of kept lines and histograms, to skip re-reading unchanged ones
    reuse: Reuse = field(default_factory=Reuse)
    #: the last body read (its bytes) and the runs of kept lines its record was read from
    #: (``parse.kept_runs``: all that the adapters read of a body), its Content-Type, what it was
    #: read as (engine, replica, pool) and the adapter's snapshot of it. An idle replica's engine
    #: families are the same scrape after scrape while the rest of its body moves (the server's
    #: CPU seconds, memory, GC counts), or its whole body is the same (an engine without process
    #: collectors): it is then not parsed or adapted again (:meth:`adapted_again`)
    raw: bytes | None = None
    kept: tuple[str, ...] | None = None
    content_type: str | None = None
    read_as: tuple[str, str, str] | None = None
    adapted: EngineSnapshot | None = None
    #: the last scrape's kept families were the previous one's (an idle replica): the next body
    #: is first compared with the last one byte-wise (``parse.same_kept``), which a replica whose
    #: families move every scrape is spared
    repeats: bool = False

    def adapted_again(self, kept: tuple[str, ...] | None, content_type: str | None, read_as: tuple[str, str, str],
                      ts: float) -> EngineSnapshot | None:
        """The adapter's snapshot of the previous scrape at ``ts`` when ``kept`` are that scrape's
        runs, byte for byte, read the same way; None otherwise (parse and adapt it)."""
        if (self.adapted is None or kept is None or kept != self.kept or content_type != self.content_type
                or read_as != self.read_as):
            return None
        return self.adapted.with_(ts=ts)

    def keep_adapted(self, raw: bytes, kept: tuple[str, ...] | None, content_type: str | None,
                     read_as: tuple[str, str, str], snap: EngineSnapshot) -> None:
        """Remember a scrape's body and snapshot; ``kept`` None (read by prometheus-client, not
        from its runs alone) is never reused."""
        self.raw, self.kept, self.content_type, self.read_as, self.adapted = raw, kept, content_type, read_as, snap
        self.repeats = False

    def update(self, snap: EngineSnapshot) -> tuple[EngineSnapshot, float]:
        """``snap`` with the hit rate from counter increases and ``counter_reset`` set, and the
        preemptions since the previous snapshot (0 on the first).

        The hit rate is hits / queries over the interval since the previous snapshot; on the
        first snapshot and over an interval without queries it stays what the adapter set (the
        engine's own gauge where it has one, else None)."""
        prev = self.previous
        reset = False
        preempted = 0.0
        rate = snap.prefix_cache_hit_rate
        if prev is not None:
            inc, r = increase(prev.preemptions_total, snap.preemptions_total)
            reset |= r
            preempted = inc or 0.0
            hits, r1 = increase(prev.prefix_cache_hits_total, snap.prefix_cache_hits_total)
            queries, r2 = increase(prev.prefix_cache_queries_total, snap.prefix_cache_queries_total)
            reset |= r1 or r2
            if r1 != r2 and hits is not None and queries is not None:  # one reset seen: both restart
                hits, queries = snap.prefix_cache_hits_total, snap.prefix_cache_queries_total
            if hits is not None and queries is not None and queries > 0:
                rate = min(1.0, max(0.0, hits / queries))
            for name in HISTOGRAMS:
                a, b = prev.histograms.get(name), snap.histograms.get(name)
                if a is not None and b is not None and b.count < a.count:
                    reset = True
        self.preemptions += preempted
        out = snap.with_(prefix_cache_hit_rate=rate, counter_reset=reset)
        self.previous = out
        return out, preempted
