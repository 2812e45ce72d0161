"""The two structures that make a pick cheap: LADR's Fenwick-tree sampler and the
least-outstanding index. Pure data structures over :class:`ReplicaState`; the policies decide
what goes in them."""

from __future__ import annotations

import math
from collections.abc import Callable

from llmsla.control.replica import ReplicaState


class LadrSampler:
    """LADR sampler of one group: sampling weights in a Fenwick tree, kept live by begin/end.

    Weight of member i: ``max(base[i] * decay[i] ** queue_i * exp(tok[i] * W_i), fl)`` where ``base[i] ~ rep.weight *
    exp(sharpness * alpha / latency_i)`` (scaled so the best member weighs 1 at the build, and
    ``fl = floor``) and ``decay[i] = exp(-sharpness * beta / Q)`` (times the expected completion
    time's growth per queued request when LADR's ``ect`` term is on) are frozen at the refresh
    (the latency EMA and the queue scale Q change only then, or at a rebuild), and ``queue_i`` is
    the live outstanding count plus what other gateways/reports add; ``W_i`` the prompt tokens
    routed to it that await their first token and ``tok[i] <= 0`` the ECT term's cost of one
    (0 without prompt sizes). ``begin``/``first_token``/``end`` change one
    member's weight in O(log n); a pick is one Fenwick descent, O(log n).

    With ``prefill`` (each member's prefill seconds per prompt token, in the score's units) a
    pick of a prompt of ``p`` tokens multiplies member i's weight by ``exp(-prefill[i] * (p -
    prompt_mean))`` - a long prompt goes where prefill is fast - without touching the tree: a
    few Fenwick draws are resampled in proportion to that factor (:meth:`sample_prompt`).
    """

    __slots__ = ("states", "base", "w", "tree", "total", "decay", "fl", "top", "low", "stale",
                 "prefill", "prompt_mean", "pf_lo", "pf_hi", "tok")

    #: Fenwick draws a prompt-aware pick resamples from (bounds a pick's cost).
    TRIES = 2

    def __init__(self, states: list[ReplicaState], base: list[float], decay: list[float], fl: float,
                 prefill: list[float] | None = None, prompt_mean: float = 0.0,
                 tok_slopes: list[float] | None = None) -> None:
        self.states = states
        self.tok = tok_slopes if tok_slopes and any(tok_slopes) else None
        self.prefill = prefill
        self.prompt_mean = prompt_mean
        self.pf_lo = min(prefill) if prefill else 0.0
        self.pf_hi = max(prefill) if prefill else 0.0
        self.base = base
        self.decay = decay
        self.fl = fl
        n = len(states)
        self.w = [max(self._weight(i, st), fl) for i, st in enumerate(states)]
        tree = [0.0] * (n + 1)
        for i, x in enumerate(self.w, 1):  # O(n) Fenwick build
            tree[i] += x
            j = i + (i & -i)
            if j <= n:
                tree[j] += tree[i]
        self.tree = tree
        self.total = sum(self.w)
        # queues grew a lot since the build (a burst): the floor and the queue scale are out of
        # date - every weight would sink to the floor and LADR would turn uniform. Rebuild.
        self.low = 0.25 * self.total
        self.stale = False
        top = 1
        while top * 2 <= n:
            top *= 2
        self.top = top

    def _weight(self, i: int, st: ReplicaState) -> float:
        w = self.base[i] * self.decay[i] ** (st.outstanding + st.extra_q)
        tok = self.tok
        if tok is not None and st.wait_tok > 0:
            w *= math.exp(max(tok[i] * st.wait_tok, -700.0))
        return w

    def update(self, i: int, st: ReplicaState) -> None:
        """Member ``i`` (0-based) changed its outstanding count or its waiting prompt tokens."""
        new = self._weight(i, st)
        if new < self.fl:
            new = self.fl
        delta = new - self.w[i]
        if delta == 0.0:
            return
        self.w[i] = new
        self.total += delta
        if self.total < self.low:
            self.stale = True
        tree, n = self.tree, len(self.w)
        j = i + 1
        while j <= n:
            tree[j] += delta
            j += j & -j

    def sample(self, u: float) -> ReplicaState:
        """The member whose cumulative weight interval holds ``u * total``."""
        x = u * self.total  # the descent of _index, inlined: this is every LADR pick
        tree, n = self.tree, len(self.w)
        pos = 0
        step = self.top
        while step:
            nxt = pos + step
            if nxt <= n and tree[nxt] <= x:
                pos = nxt
                x -= tree[nxt]
            step >>= 1
        return self.states[pos if pos < n else n - 1]  # float rounding may walk past the end

    def _index(self, u: float) -> int:
        """The index :meth:`sample` returns the member of."""
        x = u * self.total
        tree, n = self.tree, len(self.w)
        pos = 0
        step = self.top
        while step:
            nxt = pos + step
            if nxt <= n and tree[nxt] <= x:
                pos = nxt
                x -= tree[nxt]
            step >>= 1
        return pos if pos < n else n - 1  # float rounding may walk past the end

    def sample_prompt(self, u: float, prompt: float, rnd: Callable[[], float]) -> ReplicaState:
        """A member drawn with weights scaled by its prefill cost of a ``prompt``-token request
        (see the class docstring): ``TRIES`` Fenwick draws (``u`` the first, ``rnd`` the
        others), then one of them in proportion to its prefill factor (sampling-importance-
        resampling: O(TRIES log n) whatever the prompt; exact as TRIES grows, and a long prompt
        lands on the fast-prefill members among the draws)."""
        pf = self.prefill
        d = prompt - self.prompt_mean
        if pf is None or abs(d) * (self.pf_hi - self.pf_lo) < 0.05:  # the prompt changes < 5 %
            return self.sample(u)
        shift = self.pf_lo if d > 0 else self.pf_hi  # factors exp(-x), x >= 0: no overflow
        idx = [self._index(u)] + [self._index(rnd()) for _ in range(self.TRIES - 1)]
        fac = [math.exp(-(pf[i] - shift) * d) for i in idx]
        x = rnd() * sum(fac)
        for i, f in zip(idx, fac, strict=True):
            x -= f
            if x < 0:
                return self.states[i]
        return self.states[idx[-1]]  # float rounding, or every factor 0: the last draw


class LoadLevels:
    """Replicas of one pool bucketed by outstanding count, so least-outstanding is O(1) typically.

    ``levels[k]`` is an insertion-ordered dict of the replicas with k requests in flight;
    ``begin``/``end`` move a replica one level up/down (to the end of that dict), so among equally
    loaded replicas the one that has been there longest is picked first - ties spread without
    any per-pick rotation. ``low`` is a lower bound of the lowest non-empty level.
    """

    __slots__ = ("levels", "low")

    def __init__(self) -> None:
        self.levels: list[dict[ReplicaState, None]] = [{}]
        self.low = 0

    def add(self, st: ReplicaState) -> None:
        while len(self.levels) <= st.outstanding:
            self.levels.append({})
        self.levels[st.outstanding][st] = None
        self.low = min(self.low, st.outstanding)

    def remove(self, st: ReplicaState) -> None:
        self.levels[st.outstanding].pop(st, None)

    def up(self, st: ReplicaState) -> None:
        lv = self.levels
        o = st.outstanding
        del lv[o][st]
        o += 1
        if o == len(lv):
            lv.append({})
        lv[o][st] = None
        st.outstanding = o

    def down(self, st: ReplicaState) -> None:
        lv = self.levels
        o = st.outstanding
        del lv[o][st]
        o -= 1
        lv[o][st] = None
        st.outstanding = o
        if o < self.low:
            self.low = o
