"""The ``oracle`` routing policy: the simulator's bound on what a router can do.

It reads what no gateway can: every replica's true state at this instant (its batch, waiting
queue, requests still on the wire to it, KV cache, current slowdown) and this request's true
prompt and output lengths, and sends the request where it would finish first if nothing else
arrived: a dry run of the replica's own scheduler (``fleet/replica.py``: FCFS admission under
the batch, prefill-budget and KV limits; decode iterations at ``b0 + b2 * batch`` times the
slowdown) from now until this request's last token. Greedy (it does not weigh the delay it
adds to requests that come later) and without preemption in the dry run, so it is a strong
bound, not a proven optimum. See docs/fleet.md#the-oracle.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from llmsla.fleet.replica import ReplicaSim, Req


def completion_s(rep: ReplicaSim, prompt: int, output: int, now: float, transit: Iterable[Req] = ()) -> float:
    """Seconds from ``now`` until a request of ``prompt``/``output`` tokens delivered to ``rep``
    now would finish (``math.inf`` when the replica is down or it could never fit)."""
    if not rep.up:
        return math.inf
    spec, slow = rep.spec, rep.slow
    cap = rep.kv_cap
    if prompt + 1 > cap:
        return math.inf
    t = now
    kv = rep.kv_used
    tok = 0  # tokens every running sequence has made since the dry run began
    fin: list[tuple[int, int, int]] = []  # (tok at which it finishes, seq, kv it holds then)
    running = [r for r in rep.running if not r.dead]
    done = 0
    if rep.busy and rep.d > 0:  # the segment in progress ends at its next iteration boundary
        done = 1 if rep.prefill else min(rep.k, max(1, math.ceil((now - rep.t0) / rep.d - 1e-9)))
        t = rep.t0 + done * rep.d
        kv += done * len(running)
    for i, r in enumerate(running):
        rem = r.output - r.gen - done
        if rem > 0:
            fin.append((rem, i, r.kv + done + rem))
        else:
            kv -= r.kv + done
    heapq.heapify(fin)
    waiting = [(r.prompt + r.gen, r.output - r.gen) for r in rep.waiting if not r.dead]
    waiting += [(r.prompt, r.output) for r in transit if not r.dead]
    me = len(waiting)
    waiting.append((prompt, output))
    wi, seq = 0, len(running)
    mine: int | None = None  # tok at which this request finishes once admitted
    b0, b1, b2, budget, max_batch = spec.b0_s, spec.b1_s, spec.b2_s, spec.max_prefill_tokens, spec.max_batch
    while True:
        n_dec = len(fin)
        free = cap - kv - n_dec
        ptok = 0
        while wi < len(waiting) and len(fin) < max_batch:
            need, rem = waiting[wi]
            if need + 1 > free or (ptok and ptok + need > budget):
                break
            free -= need + 1
            ptok += need
            kv += need
            seq += 1
            heapq.heappush(fin, (tok + rem, seq, need + rem))
            if wi == me:
                mine = tok + rem
            wi += 1
        n = len(fin)
        if n == 0:  # nothing runs and the head cannot be admitted: it never fits
            return math.inf
        if ptok:
            k, d = 1, (b0 + b1 * ptok + b2 * n_dec) * slow
        else:
            k = fin[0][0] - tok
            if mine is not None:
                k = min(k, mine - tok)
            k = max(1, min(k, (cap - kv) // n)) if cap - kv >= n else 1
            d = (b0 + b2 * n) * slow
        t += k * d
        tok += k
        kv += k * n
        if mine is not None and tok >= mine:
            return t - now
        while fin and fin[0][0] <= tok:
            kv -= heapq.heappop(fin)[2]


def pick(reps: Iterable[ReplicaSim], prompt: int, output: int, now: float,
         transit: dict[str, list[Req]]) -> ReplicaSim | None:
    """The replica among ``reps`` where the request finishes first (ties: the first listed)."""
    best, best_t = None, math.inf
    for rep in reps:
        c = completion_s(rep, prompt, output, now, transit.get(rep.id, ()))
        if c < best_t or best is None:
            best, best_t = rep, c
    return best
