"""Engine-signal scorers, as llm-d's scheduler defines them: each maps the replicas' engine
state to a score in [0, 1], higher is better, so scorers can be weighted and summed.

* queue scorer: the waiting queue, min-max normalised over the candidates,
  ``(max - waiting) / (max - min)`` (all equal: 1 for every one);
* KV-cache scorer: ``1 - kv_usage`` (free KV share: a replica near full KV preempts).

LADR adds ``engine_queue * queue_score + engine_kv * kv_score`` to its score
(``llmsla.control.ladr``); a replica without fresh engine data gets the mean of those with it,
so it is neither favoured nor shunned for being unscraped. See docs/control.md#engine-signals.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmsla.control.replica import EngineSignal


def queue_scores(signals: Sequence[EngineSignal]) -> list[float]:
    """llm-d's queue scorer over ``signals``: 1 for the shortest waiting queue, 0 for the longest."""
    if not signals:
        return []
    qs = [s.waiting for s in signals]
    lo, hi = min(qs), max(qs)
    if hi <= lo:
        return [1.0] * len(qs)
    return [(hi - q) / (hi - lo) for q in qs]


def kv_scores(signals: Sequence[EngineSignal]) -> list[float]:
    """llm-d's KV-cache utilisation scorer: the free share of each replica's KV cache."""
    return [1.0 - min(1.0, max(0.0, s.kv_usage)) for s in signals]


def engine_terms(signals: Sequence[EngineSignal | None], w_queue: float, w_kv: float) -> list[float]:
    """Each candidate's weighted engine score (``None`` = no fresh engine data: the mean of the
    others'); all zeros when no candidate has engine data or both weights are 0."""
    known = [s for s in signals if s is not None]
    if not known or (w_queue == 0 and w_kv == 0):
        return [0.0] * len(signals)
    q = queue_scores(known)
    kv = kv_scores(known)
    vals = [w_queue * a + w_kv * b for a, b in zip(q, kv, strict=True)]
    mean = sum(vals) / len(vals)
    it = iter(vals)
    return [mean if s is None else next(it) for s in signals]
