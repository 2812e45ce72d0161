"""What the router learns about each replica's speed from the requests it sees, for LADR's
expected-completion-time (ECT) term: no engine internals, no oracle knowledge.

A continuously batched replica makes one token per running sequence per iteration, and an
iteration costs about ``b0 + b2 * batch``: a request's decode time is its output length times
an inter-token time that grows with the load. The router cannot see the batch, but it knows its
own outstanding count ``q`` on the replica, so per replica it learns

* ``tpot_per_load`` (seconds per output token per unit of load): an EWMA of
  ``(latency - ttft) / (output - 1) / (q + n0)`` over completions, ``n0`` the load-independent
  share of an iteration (``b0 / b2`` is 8-24 on the simulator's catalogue; 16 by default);
* ``ttft_s``: an EWMA of the time to first token (prefill plus any wait for a batch slot);

and per pool the recent mean output length. The expected completion time of a request sent to
replica i now is then ``ttft_i + out * tpot_per_load_i * (q_i + 1 + n0)``, linear in the live
queue, so LADR's Fenwick sampler keeps it live in O(log n) per begin/end.

Bounded and reset-safe: O(1) memory per replica; an observation that is not finite, negative or
has no tokens is ignored; each one moves the estimate by at most a factor ``CLIP`` (one outlier
cannot wreck it, a replica that really changed speed - restarted on other hardware, throttled -
is followed within about 130 completions), and the estimate stays in ``[MIN_TPOT, MAX_TPOT]``. See
docs/control.md#expected-completion-time-learnt-replica-speed.
"""

from __future__ import annotations

import math

#: Weight of a new observation in the per-replica EWMAs (about the last 50 completions: a slower memory
#: keeps noise in the latencies of identical replicas from steering the traffic).
GAIN = 0.02
#: One observation moves an estimate by at most this factor (outliers, restarts).
CLIP = 4.0
#: Bounds of the per-token, per-load time (seconds): 10 ns .. 10 s.
MIN_TPOT, MAX_TPOT = 1e-8, 10.0
#: Bounds of the TTFT estimate (seconds).
MAX_TTFT_S = 3600.0


def _clipped_ewma(old: float | None, x: float, gain: float, clip: float) -> float:
    if old is None or old <= 0:
        return x if old is None else old + gain * (x - old)
    x = min(max(x, old / clip), old * clip)
    return old + gain * (x - old)


class ServiceEstimate:
    """One replica's learnt speed (see the module docstring)."""

    __slots__ = ("tpot_per_load", "ttft_s", "n")

    def __init__(self) -> None:
        self.tpot_per_load: float | None = None
        self.ttft_s: float | None = None
        self.n = 0  # observations taken

    def observe(self, latency_s: float, ttft_s: float | None, output_tokens: int, load: float, n0: float) -> bool:
        """A completed request: end-to-end ``latency_s``, ``ttft_s`` (None: unknown), its
        ``output_tokens``, the replica's outstanding count ``load`` when it ended (itself
        included). False when the observation was unusable and ignored."""
        if not (math.isfinite(latency_s) and latency_s >= 0 and math.isfinite(load) and load >= 0):
            return False
        if ttft_s is not None and not (math.isfinite(ttft_s) and 0 <= ttft_s <= latency_s):
            ttft_s = None
        used = False
        if ttft_s is not None:
            self.ttft_s = min(MAX_TTFT_S, _clipped_ewma(self.ttft_s, ttft_s / max(1.0, load), GAIN, CLIP))
            used = True
        if output_tokens >= 2 and ttft_s is not None:
            tpot = (latency_s - ttft_s) / (output_tokens - 1) / (load + n0)
            if tpot > 0:
                tpot = min(MAX_TPOT, max(MIN_TPOT, tpot))
                self.tpot_per_load = _clipped_ewma(self.tpot_per_load, tpot, GAIN, CLIP)
                used = True
        self.n += used
        return used

    def reset(self) -> None:
        """Forget what was learnt (a replica replaced behind the same id)."""
        self.tpot_per_load = self.ttft_s = None
        self.n = 0


class OutputLength:
    """A pool's recent mean output length (tokens): what a new request is expected to produce."""

    __slots__ = ("mean",)

    #: Weight of a new completion: outputs vary a lot, so a longer memory (~100 completions).
    GAIN = 0.01

    def __init__(self) -> None:
        self.mean: float | None = None

    def observe(self, output_tokens: int) -> None:
        if output_tokens < 1:
            return
        x = float(output_tokens)
        self.mean = x if self.mean is None else self.mean + self.GAIN * (x - self.mean)
