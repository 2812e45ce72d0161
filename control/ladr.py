"""LADR (latency-aware dynamic routing): its parameters, how a refresh turns request
latencies and queues into scores, and how a group's sampler is built from them.

Functions over :class:`~llmsla.control.replica.ReplicaState` lists, so the router keeps only
the bookkeeping (membership, operator actions, the request lifecycle); see the router's module
docstring for the definition and docs/control.md for why it is built this way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from llmsla import names
from llmsla.control.estimator import FIRST_TOKENS
from llmsla.control.replica import EngineSignal, ReplicaState
from llmsla.control.sampler import LadrSampler
from llmsla.control.scorers import engine_terms

POLICIES: tuple[str, ...] = names.ROUTE_POLICIES

#: Tunables accepted by ``Router(**params)`` and :meth:`Router.set_params`, with defaults.
DEFAULT_PARAMS: dict[str, float] = {
    "alpha": 1.0,  # weight of 1 / latency (latency relative to the pool's fastest replica)
    "beta": 1.0,  # weight of the queue (live outstanding relative to the pool's mean)
    "sharpness": 8.0,  # sampling weight = exp(sharpness * score): 0 = uniform, large = greedy
    "systematic": 1.0,  # 1: low-discrepancy (golden-ratio) sampling sequence, 0: i.i.d. uniform
    "theta": 0.7,  # EMA memory of the latency: L = theta * L_prev + (1 - theta) * window mean
    "refresh_s": 0.2,  # score refresh cadence
    "ttl_s": 1.0,  # stats older than this drop a replica from LADR's choice
    "floor": 0.01,  # negative/low scores are clamped to floor * best score
    "error_penalty_ms": 10_000.0,  # latency charged for a failed request (fast failures are not fast)
    # engine signals (Router.update_engine; 0 = ignored): llm-d's queue and KV-cache scorers
    # both 0 by default: on bench/routing.py's training scenarios every weight tried made P99
    # worse or no better (docs/control.md#engine-signals); they pay where other gateways' load
    # is invisible to this router's own outstanding counts
    "engine_queue": 0.0,  # weight of the queue scorer (waiting queue, min-max over the group)
    "engine_kv": 0.0,  # weight of the KV-cache scorer (1 - KV usage)
    "engine_ttl_s": 3.0,  # engine data older than this is ignored (3 scrapes at the default 1 s)
    # expected completion time (control/estimator.py): learnt per-replica speed x live queue
    # x the pool's recent output length, relative to the best replica's; 0 = off
    "ect": 0.0,  # weight of -ECT / best ECT in the score
    "ect_n0": 16.0,  # load-independent share of a decode iteration, in sequences (b0 / b2)
    "ect_ttft": 0.0,  # extra weight of the expected TTFT (learnt prefill speed x prompt tokens ahead)
    # the decode speed read from the tokens of streams in flight (Router.tokens, ``cadence``):
    # the gain of a reading in the replica's estimate (0 = completions alone teach it), and the
    # tokens a reading needs; chosen on bench/routing.py's training scenarios (0.05-0.4, 32-128)
    "ect_cadence": 0.1,
    "ect_cadence_tokens": float(FIRST_TOKENS),
}



def check_params(params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "policy":
            if value not in POLICIES:
                raise ValueError(f"policy: must be one of {', '.join(POLICIES)}, got {value!r}")
            out[key] = value
            continue
        if key not in DEFAULT_PARAMS:
            raise ValueError(f"unknown router parameter {key!r} (known: policy, {', '.join(DEFAULT_PARAMS)})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{key}: expected a finite number, got {value!r}")
        value = float(value)
        if key == "theta" and not 0.0 <= value < 1.0:
            raise ValueError(f"theta: must be in [0, 1), got {value}")
        if key == "floor" and not 0.0 < value <= 1.0:
            raise ValueError(f"floor: must be in (0, 1], got {value}")
        if key in ("refresh_s", "ttl_s", "engine_ttl_s") and value <= 0:
            raise ValueError(f"{key}: must be > 0, got {value}")
        if key == "systematic" and value not in (0.0, 1.0):
            raise ValueError(f"systematic: must be 0 or 1, got {value}")
        if key in ("alpha", "beta", "sharpness", "error_penalty_ms", "engine_queue", "engine_kv", "ect", "ect_n0",
                   "ect_ttft", "ect_cadence_tokens") and value < 0:
            raise ValueError(f"{key}: must be >= 0, got {value}")
        if key == "ect_cadence" and not 0.0 <= value <= 1.0:
            raise ValueError(f"{key}: must be in [0, 1], got {value}")
        out[key] = value
    return out




def ect_terms(fresh: list[ReplicaState], out_tokens: float | None, n0: float, prompt_mean: float | None = None,
              w_ect: float = 1.0, w_ttft: float = 0.0,
              engines: list[EngineSignal | None] | None = None) -> list[tuple[float, float, float]] | None:
    """Each replica's cost of a new request of the pool's mean prompt size as ``(a, b, c)``:
    ``a + b * queue + c * waiting_prompt_tokens``, ``c`` also the cost of each prompt token more
    than ``prompt_mean`` (its prefill speed). The cost is ``w_ect`` times the expected completion
    time plus ``w_ttft`` times the expected TTFT, divided by the best replica's expected
    completion time now (1 = as good as the best). Without prompt sizes (no ``prompt_mean``, or no replica's
    prefill speed learnt yet) the TTFT is the learnt TTFT per unit of load, ``c`` is 0 and
    ``w_ttft`` unused. Before the first completion the cost is the expected TTFT alone (first
    tokens come seconds earlier: a slow replica is not sent a third of the first seconds'
    traffic); None before anything was measured. An unmeasured replica gets the measured ones'
    mean (control/estimator.py). ``engines``: each replica's engine report moved to now
    (:func:`engine_now`): on a replica whose batch is full each waiting request costs a slot's
    turn more (:func:`slot_turn`)."""
    views = [(s.svc.tpot_per_load, s.svc.prefill_per_token) for s in fresh]
    tp = [v[0] for v in views if v[0] is not None]
    pf = [v[1] for v in views if v[1] is not None] if prompt_mean else []
    if not tp or not out_tokens:  # no completion yet: the first tokens' prefill speed alone
        tp, out_tokens = [0.0], 0.0
        if not pf:
            return None
    tp_mean = sum(tp) / len(tp)
    bs = [out_tokens * (tp_mean if v[0] is None else v[0]) for v in views]
    queues = [s.outstanding + s.extra_q for s in fresh]
    if pf and prompt_mean:  # TTFT = prefill speed x (prompt tokens waiting + this prompt)
        pf_mean = sum(pf) / len(pf)
        cs = [pf_mean if v[1] is None else v[1] for v in views]
        abc = [(c * prompt_mean + b * (1.0 + n0), b, c) for b, c in zip(bs, cs, strict=True)]
    else:  # TTFT per unit of load: grows with the queue
        tt = [s.svc.ttft_s for s in fresh if s.svc.ttft_s is not None]
        tt_mean = sum(tt) / len(tt) if tt else 0.0
        ts = [tt_mean if s.svc.ttft_s is None else s.svc.ttft_s for s in fresh]
        w_ttft = 0.0
        abc = [(t + b * (1.0 + n0), b + t, 0.0) for b, t in zip(bs, ts, strict=True)]
    if engines is not None:  # a full batch: each request waiting there waits a slot's turn
        for i, (s, en) in enumerate(zip(fresh, engines, strict=True)):
            turn = slot_turn(s, en, abc[i][1], n0)
            if turn and en is not None:
                a, b, c = abc[i]
                abc[i] = (a + turn * (en.waiting - queues[i]), b + turn, c)
    ref = max(1e-9, min(a + b * q + c * s.wait_tok for (a, b, c), q, s in zip(abc, queues, fresh, strict=True)))
    e = w_ect / ref
    if w_ttft > 0 and prompt_mean:  # the TTFT counted again, w_ttft times: c * (W + prompt)
        return [((a + w_ttft * c * prompt_mean) * e, b * e, c * (1.0 + w_ttft) * e) for a, b, c in abc]
    return [(a * e, b * e, c * e) for a, b, c in abc]


def engine_now(s: ReplicaState) -> EngineSignal | None:
    """The replica's last engine report (None when not fresh) moved to now by this router's own
    requests since (``moved``: sent there minus come back). Between scrapes each refresh then
    sees the queues and KV the picks since built, not the scrape's, which would send every pick
    to the replica the scrape found emptiest until the next one. A request sent is counted as
    waiting only where the engine had requests waiting (else it had a batch slot for it); one
    that came back frees a place in the queue; each holds the running requests' mean KV share.
    The running batch moves by the rest: a request sent that does not wait runs, one that came
    back leaves the batch unless a waiting one takes its slot."""
    e = s.engine
    if e is None or not s.engine_fresh:
        return None
    moved = s.outstanding - s.engine_out
    if not moved:
        return e
    waiting = max(0.0, e.waiting + moved) if moved < 0 or e.waiting > 0 else e.waiting
    running = max(0.0, e.running + moved - (waiting - e.waiting))
    kv = min(1.0, max(0.0, e.kv_usage + moved * e.kv_usage / e.running)) if e.running > 0 else e.kv_usage
    return EngineSignal(waiting, running, kv, e.at)


#: KV-cache usage at which a replica with requests waiting counts as full (:func:`batch_full`):
#: a cache this full holds back the next prompt whatever the batch size (on the routing bench's
#: long-context scenario the replicas that have requests waiting read 0.99, on chat 0.04).
KV_FULL = 0.95


def batch_full(s: ReplicaState) -> bool:
    """Whether the replica's last engine report says its batch is full: requests waiting while
    it runs as many as it ever reported (its batch limit), or while its KV cache is all but
    full (:data:`KV_FULL`; a KV-bound batch runs a few fewer than its peak from one report to
    the next). A request waiting beside a batch with room waits one scheduler step, not a slot.
    An engine that reports no running count (0) is never full."""
    e = s.engine
    if e is None or e.waiting <= 0 or e.running < 1.0:
        return False
    return e.running >= s.engine_peak or e.kv_usage >= KV_FULL


def slot_turn(s: ReplicaState, now: EngineSignal | None, b: float, n0: float) -> float:
    """Seconds each request waiting on ``s`` waits for a batch slot: 0 unless its batch is full
    (:func:`batch_full`); then a running request finishes, and frees a slot, every
    ``b * (running + n0) / running`` seconds (``b``: a request's decode time per unit of load,
    ``b * (running + n0)`` its time at that batch). In the ECT's own seconds: no weight to tune.
    :func:`ect_terms` charges it per request waiting there, the engine's ``now.waiting`` and
    each one sent since, so it stays live between refreshes like the queue term."""
    if now is None or now.waiting <= 0 or not batch_full(s):
        return 0.0
    run = max(now.running, 1.0)
    return b * (run + n0) / run


def build_sampler(lst: list[ReplicaState], p: dict[str, float], out_tokens: float | None = None,
                  prompt_mean: float | None = None) -> LadrSampler:
    """The sampler over the group's fresh replicas (see :class:`LadrSampler`); ``out_tokens``
    and ``prompt_mean``: the pool's recent mean output and prompt lengths, for the ECT term."""
    fresh = [s for s in lst if s.fresh]
    if not fresh:
        return LadrSampler([], [], [], 0.0)
    alpha, beta, k = p["alpha"], p["beta"], p["sharpness"]
    measured = [s.lat_ema for s in fresh if s.lat_ema is not None]
    ref = min(measured) if measured else 1.0
    # an unmeasured replica (new, or only probed) is scored like the average measured one
    unknown = sum(ref / x for x in measured) / len(measured) if measured else 1.0
    q_scale = max(1.0, sum(s.outstanding + s.extra_q for s in fresh) / len(fresh))  # live
    # log of weight * exp(sharpness * score), shifted so the best replica now has weight 1:
    # no overflow/underflow whatever alpha, beta and sharpness an operator sets
    per_q = -k * beta / q_scale
    now = [engine_now(s) for s in fresh]
    eng = engine_terms(now, p["engine_queue"], p["engine_kv"])
    log_base = []
    for s, e in zip(fresh, eng, strict=True):
        inv = unknown if s.lat_ema is None else ref / max(s.lat_ema, 1e-9)  # 1 / latency, <= 1
        log_base.append(math.log(s.rep.weight) + k * alpha * inv + k * e)  # + 0.0 without engine data
    slopes = [per_q] * len(fresh)
    tok_slopes = [0.0] * len(fresh)
    ect = p["ect"]
    terms = ect_terms(fresh, out_tokens, p["ect_n0"], prompt_mean, ect, p["ect_ttft"], now) if ect > 0 else None
    prefill: list[float] | None = None
    if terms is not None:  # - k * (a + b * queue + c * waiting tokens): a constant and two slopes
        for i, (a, b, c) in enumerate(terms):
            log_base[i] -= k * a
            slopes[i] = per_q - k * b
            tok_slopes[i] = -k * c
        if max(tok_slopes) > min(tok_slopes):  # prefill speeds differ: a pick's own prompt matters
            prefill = [-x for x in tok_slopes]
    live = [lb + sl * (s.outstanding + s.extra_q) + ts * s.wait_tok
            for lb, sl, ts, s in zip(log_base, slopes, tok_slopes, fresh, strict=True)]
    shift = max(live)
    # a replica whose queue is far behind the best has a base far above it (its queue's decay
    # brings it back down): capped, so the float holds it; it then weighs less than its score
    # says, never more (it is that far behind only at extreme sharpness, ect or queues)
    base = [math.exp(min(max(lb - shift, -700.0), 700.0)) for lb in log_base]
    lad = LadrSampler(fresh, base, [math.exp(max(sl, -700.0)) for sl in slopes], p["floor"],
                      prefill=prefill, prompt_mean=prompt_mean or 0.0, tok_slopes=tok_slopes)
    for i, s in enumerate(fresh):
        s.slots.append((lad, i))
    return lad



def cadence(st: ReplicaState, p: dict[str, float]) -> None:
    """Read the replica's decode speed from the tokens its streams returned since the last
    reading (:meth:`Router.tokens`), once ``ect_cadence_tokens`` came back: their mean
    inter-token gap per unit of load (the load as each came back, plus ``ect_n0``), taken into
    the replica's estimate with gain ``ect_cadence``. A replica slowed now shows in its next
    tokens, not in its next completions seconds later."""
    n = st.tok_n
    if n < p["ect_cadence_tokens"] or n <= 0:
        return
    st.svc.observe_cadence(st.tok_gap_s, st.tok_load + n * p["ect_n0"], n, p["ect_cadence"])
    st.tok_n, st.tok_gap_s, st.tok_load = 0, 0.0, 0.0


def roll_window(states: Iterable[ReplicaState]) -> None:
    """Close the latency window of every replica: its mean becomes ``avg_ms`` (held when the
    window was empty), and the samplers built from the old EMA are forgotten."""
    for st in states:
        st.slots = []
        if st.lat_n:
            st.avg_ms = st.lat_sum / st.lat_n
            st.win_n = st.lat_n
            st.lat_sum = 0.0
            st.lat_n = 0
        else:
            st.win_n = 0


def local_stats(st: ReplicaState, now: float) -> dict[str, Any]:
    """What this router publishes about a replica to the other gateways."""
    return {
        "avg_ms": st.avg_ms,
        "n": st.win_n,
        "outstanding": st.outstanding,
        "score": st.score,  # for operators reading Redis; each router computes its own
        "age_s": max(0.0, now - st.last_seen),
    }


def update_states(states: dict[str, ReplicaState], p: dict[str, float], now: float,
                  remote: dict[str, list[dict[str, Any]]]) -> float:
    """Merge each replica's window with what other gateways reported (``remote``), update its
    queue, freshness and latency EMA; returns when the next refresh is due (a fresh replica
    turning stale must be noticed)."""
    theta, ttl, eng_ttl = p["theta"], p["ttl_s"], p["engine_ttl_s"]
    expiry = now + p["refresh_s"]
    for rid, st in states.items():
        avg_ms, last_seen, queue = st.avg_ms, st.last_seen, float(st.outstanding)
        st.engine_fresh = st.engine is not None and now - st.engine.at <= eng_ttl
        new_data = st.win_n > 0
        entries = remote.get(rid)
        if entries:
            # latency: sample-weighted mean over fresh observations only (a held average
            # from long ago must not dilute what another gateway measured just now)
            local_fresh = now - st.last_seen <= ttl
            wsum = float(st.win_n) if st.win_n else float(avg_ms is not None and local_fresh)
            lsum = (avg_ms or 0.0) * wsum
            rq = 0.0
            for e in entries:  # entries of live writers only (shared_state filters)
                rq += float(e.get("outstanding", 0))
                age = float(e.get("age_s", math.inf))
                if e.get("avg_ms") is not None and age <= ttl:
                    w = float(e.get("n", 0)) or 1.0
                    lsum += float(e["avg_ms"]) * w
                    wsum += w
                    new_data = new_data or bool(e.get("n"))
                last_seen = max(last_seen, now - age)
            queue += rq
            if wsum > 0:
                avg_ms = lsum / wsum
        if st.reported_queue is not None and now - st.reported_at <= ttl:
            queue = max(queue, float(st.reported_queue))
        st.queue = queue
        st.extra_q = queue - st.outstanding  # added to the live count at pick time
        st.avg_eff = avg_ms
        st.fresh = now - last_seen <= ttl
        if st.fresh and not st.drained:
            expiry = min(expiry, last_seen + ttl + 1e-9)
        if avg_ms is None:
            continue  # not measured yet: sampled at the pool average (see build_sampler)
        if st.lat_ema is None:
            st.lat_ema = avg_ms  # the first measured window initialises the EMA
        elif new_data:  # an empty window holds the EMA (nothing new was learnt)
            st.lat_ema = theta * st.lat_ema + (1.0 - theta) * avg_ms
    return expiry


def score_pools(pools: Iterable[list[ReplicaState]], p: dict[str, float]) -> None:
    """Scores at the queue of this refresh, for the snapshot, the gauge and other gateways
    (picks use the live queue through the samplers, see :func:`build_sampler`)."""
    alpha, beta = p["alpha"], p["beta"]
    for lst in pools:
        live = [s for s in lst if s.fresh and not s.drained]
        measured = [s.lat_ema for s in live if s.lat_ema is not None]
        if not measured:
            measured = [s.lat_ema for s in lst if s.lat_ema is not None]
        if not measured:
            continue
        ref = min(measured)
        q_scale = max(1.0, sum(s.queue for s in live) / len(live)) if live else 1.0
        eng = engine_terms([engine_now(s) for s in lst], p["engine_queue"], p["engine_kv"])
        for st, e in zip(lst, eng, strict=True):
            if st.lat_ema is None:
                continue
            st.raw = ref / max(st.lat_ema, 1e-9)  # 1 / relative latency
            st.score = alpha * st.raw - beta * st.queue / q_scale + e
            st.score_child.set(st.score)
