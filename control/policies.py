"""The policy table: how each router policy picks among the eligible replicas of a group.

A :class:`Group` is the non-drained, weight > 0 replicas of one (pool, role), cached by the
router until membership or an operator setting changes. Each pick function returns a
:class:`ReplicaState`, or None when no replica qualifies (the router raises
``NoReplicaAvailable`` with the reason). The LADR sampler is built by ``llmsla.control.ladr``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection

from llmsla.control.replica import ReplicaState
from llmsla.control.sampler import LadrSampler, LoadLevels


class Group:
    """Eligible replicas of one (pool, role) and what the policies cache about them."""

    __slots__ = ("states", "uniform", "rr", "ladr")

    def __init__(self, states: list[ReplicaState], rr: int) -> None:
        self.states = states
        self.uniform = len({s.rep.weight for s in states}) <= 1  # no division needed in LO
        self.rr = rr
        self.ladr: LadrSampler | None = None


def round_robin(g: Group, exclude: Collection[str]) -> ReplicaState | None:
    """The next replica in rotation (weights only exclude: weight 0)."""
    lst, n = g.states, len(g.states)
    i = g.rr
    for k in range(n):
        st = lst[(i + k) % n]
        if not exclude or st.rep.id not in exclude:
            g.rr = (i + k + 1) % n
            return st
    return None


def least_outstanding(g: Group, levels: LoadLevels, role: str | None,
                      exclude: Collection[str]) -> ReplicaState | None:
    """Fewest in flight, divided by the weight; ties go to the replica longest at that load."""
    lst, n = g.states, len(g.states)
    if n == 0:
        return None
    if g.uniform:  # the common case: walk the pool's outstanding levels from the lowest
        lv = levels.levels
        i = levels.low
        while not lv[i]:  # tighten the lower bound past empty levels
            i += 1
        levels.low = i
        for k in range(i, len(lv)):
            for st in lv[k]:
                if (not st.drained and not st.down and not st.pending and not st.leaving and st.rep.weight > 0
                        and (role is None or st.rep.role == role)
                        and (not exclude or st.rep.id not in exclude)):
                    return st
        return None
    # weighted: scan outstanding / weight from a rotating start so ties spread
    start = g.rr % n
    g.rr = start + 1
    best: ReplicaState | None = None
    best_load = math.inf
    for part in (lst[start:], lst[:start]):
        for st in part:
            load = st.outstanding / st.rep.weight
            if load < best_load and (not exclude or st.rep.id not in exclude):
                best, best_load = st, load
    return best


def p2c(g: Group, exclude: Collection[str], rnd: Callable[[], float]) -> ReplicaState | None:
    """Power of two choices: two distinct random replicas, fewer ``(outstanding + 1) / weight``
    wins (random on ties)."""
    lst = g.states
    if exclude:
        lst = [s for s in lst if s.rep.id not in exclude]
    n = len(lst)
    if n == 0:
        return None
    if n == 1:
        return lst[0]
    i = int(rnd() * n)
    j = int(rnd() * (n - 1))
    if j >= i:
        j += 1
    a, b = lst[i], lst[j]
    la = (a.outstanding + 1) / a.rep.weight
    lb = (b.outstanding + 1) / b.rep.weight
    if la < lb or (la == lb and rnd() < 0.5):
        return a
    return b


def ladr(lad: LadrSampler, u: float, exclude: Collection[str], rnd: Callable[[], float],
         prompt: float | None = None) -> ReplicaState | None:
    """The LADR sampler's member at ``u`` (a uniform draw), weighed by its prefill cost of a
    ``prompt``-token request when the sampler knows the replicas' prefill speeds; None if it has
    no fresh member or every member is excluded (the router then falls back to least
    outstanding)."""
    if not lad.states:
        return None
    st = lad.sample(u) if prompt is None else lad.sample_prompt(u, prompt, rnd)
    if exclude and st.rep.id in exclude:  # rare (gateway retries): sample the rest directly
        rest = [(x, w) for x, w in zip(lad.states, lad.w, strict=True) if x.rep.id not in exclude]
        if not rest:
            return None
        x = rnd() * sum(w for _, w in rest)
        st = rest[-1][0]  # float rounding may leave x >= 0 after the last member
        for cand, w in rest:
            x -= w
            if x < 0:
                return cand
    return st
