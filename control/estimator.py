"""What the router learns about each replica's speed from the requests it sees, for LADR's
expected-completion-time (ECT) term: no engine internals, no oracle knowledge.

A continuously batched replica makes one token per running sequence per iteration, and an
iteration costs about ``b0 + b1 * prefill_tokens + b2 * batch``: a request's decode time is its
output length times an inter-token time that grows with the load, its TTFT the prefill of the
prompt tokens ahead of it and its own. The router cannot see the batch, but it knows its own
outstanding count ``q`` on the replica and the prompt size of each request it routes (the
request body), so per replica it learns, per token:

* ``tpot_per_load`` (seconds per output token per unit of load): ``(latency - ttft) / (output -
  1) / (q + n0)``, ``n0`` the load-independent share of an iteration (``b0 / b2`` is 8-24 on the
  simulator's catalogue; 16 by default);
* ``prefill_per_token`` (seconds per prompt token): ``ttft / (ahead + prompt)``, ``ahead`` the
  prompt tokens of the requests routed to the replica before it that had no first token yet when
  it was dispatched - a long prompt does not make its replica look slow;
* ``ttft_s`` (TTFT per unit of load), used when the caller knows no prompt sizes;

and per pool the recent mean output and prompt lengths. ``tpot_per_load`` is also read from the
tokens of streams still in flight, which the gateway relays one by one: the mean inter-token gap
of those returned since the last reading per unit of load (:meth:`ServiceEstimate.observe_cadence`,
control/ladr.py ``cadence``). A completion says how fast the replica was over a request's whole
life, seconds ago; its streams' tokens say how fast it is now, so a replica slowed 3x is seen
within seconds, not after the requests it is slowing have finished. The expected completion
time of a request of ``p`` prompt tokens sent to replica i now is then ``prefill_i * (W_i + p) + out *
tpot_per_load_i * (q_i + 1 + n0)``, ``W_i`` the prompt tokens waiting for their first token
there: linear in the live queue and waiting tokens, so LADR's Fenwick sampler keeps it live in
O(log n) per begin/first token/end (control/ladr.py).

Robust and bounded: O(1) memory per replica; an observation that is not finite, negative or has
no tokens is ignored; each one moves an estimate by at most a factor ``CLIP`` (one outlier
cannot wreck it), and estimates stay in their bounds. A replica's first decode estimate rests on
``FIRST_TOKENS`` tokens, pooled, not on its first request (one short request that stalled behind
a long prefill would starve it). The gain is ``GAIN`` (about the last 50
completions: noise in identical replicas' latencies must not steer traffic) until ``RUN``
residuals in a row fall beyond ``MARGIN`` on the same side of the estimate - the replica
changed speed (throttled, restarted on other hardware) - and then ``FAST_GAIN`` until the
estimate is within ``MARGIN``: a 3x slowdown is within 2x of the estimate after about 10
completions instead of 20, one stuck request moves nothing. See
docs/control.md#expected-completion-time-learnt-replica-speed.
"""

from __future__ import annotations

import math

#: Weight of a new observation in the per-replica EWMAs while nothing changes.
GAIN = 0.02
#: Weight of a new observation while the residuals are persistently one-sided (a speed change).
FAST_GAIN = 0.15
#: Residuals in a row beyond ``MARGIN`` on one side of the estimate that mean a change.
RUN = 8
#: A residual counts towards a run only when the observation is this factor off the estimate:
#: queueing makes small residuals come in runs on a steady replica, a real change is large.
#: (6 and 1.5 fired on replicas slowed 3x for ~20 s at a time and made their estimates swing:
#: bench/routing.py's variance sweep, P99 TTFT 1.9x the oracle's instead of 1.4x; 8 and 2 never
#: fire on the training scenarios.)
MARGIN = 2.0
#: One observation moves an estimate by at most this factor (outliers, restarts).
CLIP = 4.0
#: Decode tokens a replica's first decode-speed estimate rests on: until then its completions and
#: readings are pooled (time over tokens x load), and the router scores it as the pool's mean.
#: A first request of a few tokens that waited out another's long prefill says that the replica
#: is many times slower than it is; taken whole, the replica was then sent too little to correct
#: it. The evidence a reading of the tokens streaming back needs (control/ladr.py).
FIRST_TOKENS = 64
#: Bounds of the per-token, per-load decode time (seconds): 10 ns .. 10 s.
MIN_TPOT, MAX_TPOT = 1e-8, 10.0
#: Bounds of the per-prompt-token prefill time (seconds): 1 ns .. 1 s.
MIN_PREFILL, MAX_PREFILL = 1e-9, 1.0
#: Bounds of the TTFT estimate (seconds).
MAX_TTFT_S = 3600.0


def _clipped_ewma(old: float | None, x: float, gain: float, clip: float) -> float:
    if old is None or old <= 0:
        return x if old is None else old + gain * (x - old)
    x = min(max(x, old / clip), old * clip)
    return old + gain * (x - old)


def _tpot(decode_s: float, units: float) -> float:
    """Decode seconds over tokens x load, within the estimate's bounds."""
    return min(MAX_TPOT, max(MIN_TPOT, decode_s / units))


def _run(run: int, old: float | None, x: float) -> int:
    """The signed count of residuals in a row beyond ``MARGIN`` above (+) or below (-) the
    estimate (0 after one within it: the fast gain closes the gap to ``MARGIN``, the slow one
    the rest - holding the fast gain longer made the estimates of replicas whose speed
    changes every ~20 s noisier, bench/routing.py's variance sweep)."""
    if old is None:
        return 0
    if x > old * MARGIN:
        return run + 1 if run > 0 else 1
    if x * MARGIN < old:
        return run - 1 if run < 0 else -1
    return 0


def _gain(run: int) -> float:
    return FAST_GAIN if abs(run) >= RUN else GAIN


class ServiceEstimate:
    """One replica's learnt speed (see the module docstring)."""

    __slots__ = ("tpot_per_load", "prefill_per_token", "ttft_s", "n", "run_tpot", "run_prefill", "cadence_n",
                 "first")

    def __init__(self) -> None:
        self.tpot_per_load: float | None = None
        self.prefill_per_token: float | None = None
        self.ttft_s: float | None = None
        self.n = 0  # completions taken
        self.cadence_n = 0  # readings of the tokens streaming back taken (observe_cadence)
        self.run_tpot = 0  # change detectors: signed runs of one-sided residuals
        self.run_prefill = 0
        #: (decode seconds, tokens x load, tokens) pooled before the first estimate (FIRST_TOKENS)
        self.first: tuple[float, float, float] | None = None

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
            decode, units = latency_s - ttft_s, (output_tokens - 1) * (load + n0)
            if decode > 0 and units > 0:
                old = self.tpot_per_load
                if old is None:
                    self._pool(decode, units, output_tokens - 1)
                else:
                    tpot = _tpot(decode, units)
                    self.run_tpot = _run(self.run_tpot, old, tpot)
                    self.tpot_per_load = _clipped_ewma(old, tpot, _gain(self.run_tpot), CLIP)
                used = True
        self.n += used
        return used

    def observe_cadence(self, gap_s: float, units: float, tokens: float, gain: float) -> bool:
        """A reading of the tokens of streams in flight (control/ladr.py ``cadence``): ``tokens``
        came back ``gap_s`` seconds of inter-token gaps in all, ``units`` their tokens x load.
        Taken with ``gain``; False when unusable."""
        if not (math.isfinite(gap_s) and math.isfinite(units) and gap_s > 0 and units > 0
                and math.isfinite(tokens) and tokens > 0 and 0 < gain <= 1):
            return False
        if self.tpot_per_load is None:
            self._pool(gap_s, units, tokens)
        else:
            x = _tpot(gap_s, units)
            self.tpot_per_load = _clipped_ewma(self.tpot_per_load, x, gain, CLIP)
        self.cadence_n += 1
        return True

    def _pool(self, decode_s: float, units: float, tokens: float) -> None:
        """Pool decode time before the first estimate; set it once ``FIRST_TOKENS`` came."""
        t, u, n = self.first or (0.0, 0.0, 0.0)
        t, u, n = t + decode_s, u + units, n + tokens
        if n >= FIRST_TOKENS:
            self.tpot_per_load, self.first = _tpot(t, u), None
        else:
            self.first = (t, u, n)

    def observe_prefill(self, ttft_s: float, tokens: float) -> bool:
        """A first token ``ttft_s`` after dispatch, behind ``tokens`` prompt tokens (those ahead
        of the request on the replica when it was dispatched, and its own). False when unusable."""
        if not (isinstance(ttft_s, int | float) and isinstance(tokens, int | float) and math.isfinite(ttft_s)
                and math.isfinite(tokens) and ttft_s >= 0 and tokens >= 1):
            return False
        x = min(MAX_PREFILL, max(MIN_PREFILL, ttft_s / tokens))
        old = self.prefill_per_token
        self.run_prefill = _run(self.run_prefill, old, x)
        self.prefill_per_token = _clipped_ewma(old, x, _gain(self.run_prefill), CLIP)
        return True

    def reset(self) -> None:
        """Forget what was learnt (a replica replaced behind the same id)."""
        self.tpot_per_load = self.prefill_per_token = self.ttft_s = None
        self.n = self.run_tpot = self.run_prefill = self.cadence_n = 0
        self.first = None


class MeanLength:
    """A pool's recent mean request length in tokens (output: what a new request is expected to
    produce; prompt: the size of the prompts ahead of a new one)."""

    __slots__ = ("mean",)

    #: Weight of a new request: lengths vary a lot, so a longer memory (~100 requests).
    GAIN = 0.01

    def __init__(self) -> None:
        self.mean: float | None = None

    def observe(self, tokens: float) -> None:
        if not (isinstance(tokens, int | float) and math.isfinite(tokens) and tokens >= 1):
            return
        x = float(tokens)
        self.mean = x if self.mean is None else self.mean + self.GAIN * (x - self.mean)


#: The name the output-length tracker had first (tests and callers that import it).
OutputLength = MeanLength
