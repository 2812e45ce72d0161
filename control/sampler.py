"""The two structures that make a pick cheap: LADR's Fenwick-tree sampler and the
least-outstanding index. Pure data structures over :class:`ReplicaState`; the policies decide
what goes in them."""

from __future__ import annotations

from llmsla.control.replica import ReplicaState


class LadrSampler:
    """LADR sampler of one group: sampling weights in a Fenwick tree, kept live by begin/end.

    Weight of member i: ``max(base[i] * decay[i] ** queue_i, fl)`` where ``base[i] ~ rep.weight *
    exp(sharpness * alpha / latency_i)`` (scaled so the best member weighs 1 at the build, and
    ``fl = floor``) and ``decay[i] = exp(-sharpness * beta / Q)`` (times the expected completion
    time's growth per queued request when LADR's ``ect`` term is on) are frozen at the refresh
    (the latency EMA and the queue scale Q change only then, or at a rebuild), and ``queue_i`` is
    the live outstanding count plus what other gateways/reports add. ``begin``/``end`` change one
    member's weight in O(log n); a pick is one Fenwick descent, O(log n).
    """

    __slots__ = ("states", "base", "w", "tree", "total", "decay", "fl", "top", "low", "stale")

    def __init__(self, states: list[ReplicaState], base: list[float], decay: list[float], fl: float) -> None:
        self.states = states
        self.base = base
        self.decay = decay
        self.fl = fl
        n = len(states)
        self.w = [max(b * d ** (st.outstanding + st.extra_q), fl) for b, d, st in zip(base, decay, states, strict=True)]
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

    def update(self, i: int, st: ReplicaState) -> None:
        """Member ``i`` (0-based) changed its outstanding count."""
        new = self.base[i] * self.decay[i] ** (st.outstanding + st.extra_q)
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
        return self.states[pos if pos < n else n - 1]  # float rounding may walk past the end


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
