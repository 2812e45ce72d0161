"""Replica selection for the gateway and the fleet simulator: one interface, four policies.

Policies (``control.route_policy``):

* ``round_robin`` - rotate over the eligible replicas of the pool (weights only exclude: weight 0).
* ``least_outstanding`` - fewest in-flight requests, divided by the weight (ties: the replica
  that has been at that load longest).
* ``p2c`` - power of two choices: two distinct random replicas, the one with fewer
  outstanding/weight wins.
* ``ladr`` - latency-aware dynamic routing. Per replica
  ``score = alpha / latency - beta * queue`` in commensurable, dimensionless units:
  ``latency`` is the replica's EMA latency divided by the fastest fresh replica's of the pool
  (1 = as fast as the best, 3 = three times slower), ``queue`` is its *live* outstanding count
  at pick time divided by the pool's mean outstanding when the sampler was built (each refresh,
  and again when a burst has grown the queues a lot; 1 = a fair share; floored at 1 request). The latency EMA (``L = theta * L_prev + (1 - theta) * window mean``,
  theta = 0.7) is refreshed every ``refresh_s`` (200 ms, lazily on the first pick after it is
  due, by the injected clock) from the end-to-end latency of the requests that finished in the
  window (TTFT alone misses slow decode). A replica is drawn with probability proportional to
  ``weight * exp(sharpness * score)`` - weighted random sampling by score that is defined for
  negative scores and invariant to a common shift, so a loaded pool where every score is <= 0
  still prefers the better replicas instead of collapsing to uniform - clamped from below to
  ``floor`` (1 %) of the best replica's weight at the sampler's build: never always the top one, so
  a recovering replica keeps being measured. Sampling uses a Fenwick tree per (pool, role)
  updated by ``begin``/``end`` (O(log n)), so the queue term is live without herding.
  Replicas whose last stats (a completed request, an ``observe`` report, or another gateway's
  report) are older than ``ttl_s`` (1 s) are left out; if every eligible replica is stale, LADR
  falls back to least-outstanding among the non-drained ones (the traffic itself then refreshes
  their stats). New replicas start fresh for one TTL and are scored like the pool's average
  measured replica until measured.

Drained replicas are never picked by any policy, and :meth:`Router.drain` refuses to drain the
last non-drained replica of a pool. ``shared`` (see :mod:`llmsla.control.shared_state`) is any
object with ``publish(stats)``, ``latest()``, ``healthy``, ``describe()``, ``broadcast(op)`` and an
``inbox`` deque of operator actions from other gateways. The router is not thread-safe: one event loop (gateway) or
one simulation owns it; the optional Redis syncer thread only swaps whole dict references.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from llmsla import names
from llmsla.control.metrics import RouterMetrics

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # step of the systematic sampling sequence
POLICIES: tuple[str, ...] = names.ROUTE_POLICIES
ROLES: tuple[str, ...] = ("teacher", "student", "")

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
}


class NoReplicaAvailable(RuntimeError):
    """No replica of the pool (and role) can take the request: empty, all drained, or excluded."""


class UnknownReplica(LookupError):
    """A replica id the router does not know."""

    def __str__(self) -> str:  # LookupError would quote the message
        return str(self.args[0]) if self.args else "unknown replica"


class LastReplicaError(RuntimeError):
    """Draining this replica would leave its pool with no healthy (non-drained) replica."""


@dataclass
class Replica:
    id: str  # unique within the router, e.g. "r0"
    pool: str  # pool name (names.DEFAULT_POOL if single pool)
    url: str = ""  # base URL for the real gateway; "" in simulation
    role: str = ""  # "teacher" | "student" | ""
    weight: float = 1.0


class _State:
    """Mutable per-replica bookkeeping (slots: touched on every begin/end)."""

    __slots__ = (
        "rep", "outstanding", "drained", "last_seen", "lat_sum", "lat_n", "avg_ms", "win_n",
        "reported_queue", "reported_at", "queue", "raw", "score", "picks", "errors", "fresh",
        "pick_child", "avg_eff", "score_child", "levels", "lat_ema", "extra_q", "slots",
    )

    def __init__(self, rep: Replica, now: float) -> None:
        self.rep = rep
        self.outstanding = 0
        self.drained = False
        self.last_seen = now  # a new replica gets one TTL of grace
        self.lat_sum = 0.0
        self.lat_n = 0
        self.avg_ms: float | None = None
        self.win_n = 0
        self.reported_queue: int | None = None
        self.reported_at = -math.inf
        self.queue = 0.0
        self.raw: float | None = None
        self.score: float | None = None
        self.picks = 0
        self.errors = 0
        self.fresh = True
        self.pick_child: Any = None
        self.score_child: Any = None
        self.levels: _Levels | None = None  # the pool's least-outstanding index
        self.avg_eff: float | None = None  # avg latency merged with other gateways' reports
        self.lat_ema: float | None = None  # EMA of avg_eff (ms), refreshed every refresh_s
        self.extra_q = 0.0  # queue seen beyond our own outstanding (other gateways, reports)
        self.slots: list[tuple[_Ladr, int]] = []  # LADR samplers this replica is in, and where


class _Group:
    """Eligible replicas of one (pool, role) and what the policies cache about them."""

    __slots__ = ("states", "uniform", "rr", "ladr")

    def __init__(self, states: list[_State], rr: int) -> None:
        self.states = states
        self.uniform = len({s.rep.weight for s in states}) <= 1  # no division needed in LO
        self.rr = rr
        self.ladr: _Ladr | None = None


class _Ladr:
    """LADR sampler of one group: sampling weights in a Fenwick tree, kept live by begin/end.

    Weight of member i: ``max(base[i] * decay ** queue_i, fl)`` where ``base[i] ~ rep.weight *
    exp(sharpness * alpha / latency_i)`` (scaled so the best member weighs 1 at the build, and
    ``fl = floor``) and ``decay = exp(-sharpness * beta / Q)`` are frozen at the refresh (the
    latency EMA and the queue scale Q change only then, or at a rebuild), and ``queue_i`` is
    the live outstanding count plus what other gateways/reports add. ``begin``/``end`` change one
    member's weight in O(log n); a pick is one Fenwick descent, O(log n).
    """

    __slots__ = ("states", "base", "w", "tree", "total", "decay", "fl", "top", "low", "stale")

    def __init__(self, states: list[_State], base: list[float], decay: float, fl: float) -> None:
        self.states = states
        self.base = base
        self.decay = decay
        self.fl = fl
        n = len(states)
        self.w = [max(b * decay ** (st.outstanding + st.extra_q), fl) for b, st in zip(base, states, strict=True)]
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

    def update(self, i: int, st: _State) -> None:
        """Member ``i`` (0-based) changed its outstanding count."""
        new = self.base[i] * self.decay ** (st.outstanding + st.extra_q)
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

    def sample(self, u: float) -> _State:
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


class _Levels:
    """Replicas of one pool bucketed by outstanding count, so least-outstanding is O(1) typically.

    ``levels[k]`` is an insertion-ordered dict of the replicas with k requests in flight;
    ``begin``/``end`` move a replica one level up/down (to the end of that dict), so among equally
    loaded replicas the one that has been there longest is picked first - ties spread without
    any per-pick rotation. ``low`` is a lower bound of the lowest non-empty level.
    """

    __slots__ = ("levels", "low")

    def __init__(self) -> None:
        self.levels: list[dict[_State, None]] = [{}]
        self.low = 0

    def add(self, st: _State) -> None:
        while len(self.levels) <= st.outstanding:
            self.levels.append({})
        self.levels[st.outstanding][st] = None
        self.low = min(self.low, st.outstanding)

    def remove(self, st: _State) -> None:
        self.levels[st.outstanding].pop(st, None)

    def up(self, st: _State) -> None:
        lv = self.levels
        o = st.outstanding
        del lv[o][st]
        o += 1
        if o == len(lv):
            lv.append({})
        lv[o][st] = None
        st.outstanding = o

    def down(self, st: _State) -> None:
        lv = self.levels
        o = st.outstanding
        del lv[o][st]
        o -= 1
        lv[o][st] = None
        st.outstanding = o
        if o < self.low:
            self.low = o


def _check_params(params: dict[str, Any]) -> dict[str, Any]:
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
        if key in ("refresh_s", "ttl_s") and value <= 0:
            raise ValueError(f"{key}: must be > 0, got {value}")
        if key == "systematic" and value not in (0.0, 1.0):
            raise ValueError(f"systematic: must be 0 or 1, got {value}")
        if key in ("alpha", "beta", "sharpness", "error_penalty_ms") and value < 0:
            raise ValueError(f"{key}: must be >= 0, got {value}")
        out[key] = value
    return out


class Router:
    """Pick a replica per request; see the module docstring for the policies."""

    def __init__(
        self,
        replicas: Iterable[Replica],
        policy: str = "round_robin",
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        shared: Any = None,
        registry: CollectorRegistry | None = None,
        **params: Any,
    ) -> None:
        self._clock = clock
        self._rng = rng or random.Random()
        self._random = self._rng.random
        self._u0 = self._random()  # random start of the systematic sampling sequences
        self._useq: dict[tuple[str, str | None], float] = {}
        self.shared = shared
        self.metrics = RouterMetrics(registry)
        self.params: dict[str, float] = dict(DEFAULT_PARAMS)
        self.params.update(_check_params(params))
        self.policy = _check_params({"policy": policy})["policy"]
        self._states: dict[str, _State] = {}
        self._pools: dict[str, list[_State]] = {}
        self._levels: dict[str, _Levels] = {}
        self._cache: dict[tuple[str, str | None], _Group] = {}
        self._rr: dict[tuple[str, str | None], int] = {}
        self._next_refresh = -math.inf
        self.refreshes = 0
        self.fallbacks = 0
        self._replaying = False
        #: handlers of shared ops other components add (DistillControls registers "distill")
        self.op_handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        self.shared_ops_applied = 0
        self.shared_ops_skipped = 0
        for rep in replicas:
            self.add_replica(rep)

    # -- membership ------------------------------------------------------------------------------
    def add_replica(self, rep: Replica) -> None:
        """Add a replica at run time (fresh for one TTL, score unknown until it is measured)."""
        if rep.id in self._states:
            raise ValueError(f"replica {rep.id!r} already exists")
        if rep.role not in ROLES:
            raise ValueError(f"replica {rep.id!r}: role must be one of {ROLES}, got {rep.role!r}")
        _check_weight(rep.weight)
        st = _State(rep, self._clock())
        labels = (rep.pool, rep.id)
        st.pick_child = self.metrics.picks.labels(*labels)
        st.score_child = self.metrics.score.labels(*labels)
        self.metrics.weight.labels(*labels).set(rep.weight)
        self.metrics.drained.labels(*labels).set(0)
        self._states[rep.id] = st
        self._pools.setdefault(rep.pool, []).append(st)
        st.levels = self._levels.setdefault(rep.pool, _Levels())
        st.levels.add(st)
        self._invalidate()

    def remove_replica(self, replica_id: str) -> Replica:
        st = self._state(replica_id)
        del self._states[replica_id]
        self._pools[st.rep.pool].remove(st)
        st.levels.remove(st)  # type: ignore[union-attr]
        if not self._pools[st.rep.pool]:
            del self._pools[st.rep.pool]
            del self._levels[st.rep.pool]
        for g in (self.metrics.picks, self.metrics.weight, self.metrics.drained, self.metrics.score):
            with contextlib.suppress(KeyError):
                g.remove(st.rep.pool, st.rep.id)
        self._invalidate()
        return st.rep

    def replicas(self, pool: str | None = None) -> list[Replica]:
        if pool is None:
            return [st.rep for st in self._states.values()]
        return [st.rep for st in self._pools.get(pool, ())]

    def replica(self, replica_id: str) -> Replica:
        """The replica with this id (UnknownReplica if none)."""
        return self._state(replica_id).rep

    def pools(self) -> list[str]:
        return list(self._pools)

    def is_drained(self, replica_id: str) -> bool:
        return self._state(replica_id).drained

    def _state(self, replica_id: str) -> _State:
        try:
            return self._states[replica_id]
        except KeyError:
            raise UnknownReplica(f"unknown replica {replica_id!r}") from None

    def _invalidate(self) -> None:
        self._cache.clear()
        for st in self._states.values():  # the samplers they were in are gone
            st.slots = []

    # -- operator controls -----------------------------------------------------------------------
    def set_weight(self, replica_id: str, weight: float) -> None:
        """Weight multiplies the LADR score and divides outstanding for LO/P2C; 0 = never picked."""
        _check_weight(weight)
        st = self._state(replica_id)
        st.rep.weight = float(weight)
        self.metrics.weight.labels(st.rep.pool, st.rep.id).set(weight)
        self._invalidate()
        self._broadcast({"op": "set_weight", "replica": replica_id, "weight": float(weight)})

    def drain(self, replica_id: str) -> None:
        st = self._state(replica_id)
        if st.drained:
            self._broadcast({"op": "drain", "replica": replica_id})  # others may disagree
            return
        healthy = [s for s in self._pools[st.rep.pool] if not s.drained]
        if healthy == [st]:
            raise LastReplicaError(
                f"refusing to drain {replica_id!r}: it is the last healthy (non-drained) replica "
                f"of pool {st.rep.pool!r}; undrain or add another replica first"
            )
        st.drained = True
        self.metrics.drained.labels(st.rep.pool, st.rep.id).set(1)
        self._invalidate()
        self._broadcast({"op": "drain", "replica": replica_id})

    def undrain(self, replica_id: str) -> None:
        st = self._state(replica_id)
        self._broadcast({"op": "undrain", "replica": replica_id})
        if not st.drained:
            return
        st.drained = False
        st.last_seen = max(st.last_seen, self._clock())  # back in service: one TTL of grace
        self._next_refresh = -math.inf
        self.metrics.drained.labels(st.rep.pool, st.rep.id).set(0)
        self._invalidate()

    def set_params(self, **params: Any) -> None:
        """Change alpha, beta, theta, refresh_s, ttl_s, floor, error_penalty_ms or policy at run time."""
        checked = _check_params(params)
        policy = checked.pop("policy", None)
        self.params.update(checked)
        if policy is not None:
            self.policy = policy
        self._next_refresh = -math.inf  # new parameters apply to the next pick
        self._invalidate()
        self._broadcast({"op": "set_params", "params": dict(params)})

    # -- operator actions shared with other gateways (Redis stream, see shared_state) -------------
    def _broadcast(self, op: dict[str, Any]) -> None:
        if self.shared is not None and not self._replaying:
            self.shared.broadcast(op)

    def apply_shared_ops(self) -> int:
        """Apply operator actions read from the shared stream, in stream order (own ones too).

        Every router replays the same ordered log of absolute settings, so all gateways converge
        on the same weights/drains/params whichever gateway's control API took the action. An op
        naming a replica this router does not have, or one that would drain its last healthy
        replica, is skipped here (counted in ``snapshot()['shared_ops_skipped']``).
        """
        inbox = self.shared.inbox
        n = 0
        self._replaying = True
        try:
            while inbox:
                op = inbox.popleft()
                try:
                    kind = op["op"]
                    if kind == "set_weight":
                        self.set_weight(op["replica"], op["weight"])
                    elif kind == "drain":
                        self.drain(op["replica"])
                    elif kind == "undrain":
                        self.undrain(op["replica"])
                    elif kind == "set_params":
                        self.set_params(**op["params"])
                    elif kind in self.op_handlers:
                        self.op_handlers[kind](op)
                    else:
                        raise ValueError(f"unknown op {kind!r}")
                    n += 1
                except (LookupError, LastReplicaError, ValueError, TypeError):
                    self.shared_ops_skipped += 1
        finally:
            self._replaying = False
        self.shared_ops_applied += n
        return n

    # -- request lifecycle -----------------------------------------------------------------------
    def begin(self, replica_id: str) -> None:
        """The request was dispatched to ``replica_id``."""
        st = self._state(replica_id)
        st.levels.up(st)  # type: ignore[union-attr]
        for lad, i in st.slots:  # LADR's queue term is live: no herding within a refresh window
            lad.update(i, st)

    def end(self, replica_id: str, latency_ms: float, *, ok: bool = True, ttft_ms: float | None = None) -> None:
        """The request finished: outstanding -= 1 and its latency feeds the replica's stats."""
        st = self._states.get(replica_id)
        if st is None:  # removed while in flight
            return
        if st.outstanding > 0:
            st.levels.down(st)  # type: ignore[union-attr]
            for lad, i in st.slots:
                lad.update(i, st)
        # end-to-end, not TTFT: a replica that starts fast but decodes slowly (long context, a
        # bigger model, a throttled GPU) must look slow; ttft_ms is kept for the snapshot only
        lat = latency_ms
        if not ok:
            st.errors += 1
            lat = max(lat, self.params["error_penalty_ms"])
        if lat >= 0 and math.isfinite(lat):
            st.lat_sum += lat
            st.lat_n += 1
        st.last_seen = self._clock()
        if not st.fresh:  # back from stale: let the next pick include it again
            self._next_refresh = -math.inf

    def observe(self, replica_id: str, *, latency_ms: float | None = None,
                queue_length: int | None = None) -> None:
        """Stats reported from outside the request path (health probe, worker queue gauge).

        Keeps an idle replica fresh so LADR does not drop it for lack of traffic.
        """
        st = self._state(replica_id)
        now = self._clock()
        if latency_ms is not None and latency_ms >= 0 and math.isfinite(latency_ms):
            st.lat_sum += latency_ms
            st.lat_n += 1
        if queue_length is not None:
            st.reported_queue = max(0, int(queue_length))
            st.reported_at = now
        st.last_seen = now
        if not st.fresh:
            self._next_refresh = -math.inf

    def outstanding(self, replica_id: str) -> int:
        return self._state(replica_id).outstanding

    # -- picking ---------------------------------------------------------------------------------
    def pick(self, pool: str, *, role: str | None = None, exclude: Collection[str] = ()) -> Replica:
        """The replica for the next request of ``pool`` (optionally only replicas of ``role``)."""
        shared = self.shared
        if shared is not None and shared.inbox:  # operator actions taken on another gateway
            self.apply_shared_ops()
        policy = self.policy
        if policy == "ladr":
            now = self._clock()
            if now >= self._next_refresh:
                self.refresh(now)
            st = self._pick_ladr(pool, role, exclude)
        elif policy == "round_robin":
            st = self._pick_rr(pool, role, exclude)
        elif policy == "p2c":
            st = self._pick_p2c(pool, role, exclude)
        else:
            st = self._pick_lo(pool, role, exclude)
        st.picks += 1
        st.pick_child.inc()
        return st.rep

    def _group(self, pool: str, role: str | None) -> _Group:
        """Non-drained, weight > 0 replicas of the pool/role (cached until something changes)."""
        g = self._cache.get((pool, role))
        if g is None:
            lst = [
                s for s in self._pools.get(pool, ())
                if not s.drained and s.rep.weight > 0 and (role is None or s.rep.role == role)
            ]
            g = self._cache[(pool, role)] = _Group(lst, self._rr.get((pool, role), 0))
        return g

    def _none(self, pool: str, role: str | None, exclude: Collection[str]) -> NoReplicaAvailable:
        what = f"pool {pool!r}" + (f" role {role!r}" if role is not None else "")
        if pool not in self._pools:
            return NoReplicaAvailable(f"{what}: no such pool (known: {', '.join(self._pools) or 'none'})")
        return NoReplicaAvailable(
            f"{what}: no replica available (all drained, weight 0, or excluded: {sorted(exclude)})"
        )

    def _pick_rr(self, pool: str, role: str | None, exclude: Collection[str]) -> _State:
        g = self._group(pool, role)
        lst, n = g.states, len(g.states)
        i = g.rr
        for k in range(n):
            st = lst[(i + k) % n]
            if not exclude or st.rep.id not in exclude:
                g.rr = (i + k + 1) % n
                self._rr[(pool, role)] = g.rr  # survives cache invalidation
                return st
        raise self._none(pool, role, exclude)

    def _pick_lo(self, pool: str, role: str | None, exclude: Collection[str]) -> _State:
        g = self._group(pool, role)
        lst, n = g.states, len(g.states)
        if n == 0:
            raise self._none(pool, role, exclude)
        if g.uniform:  # the common case: walk the pool's outstanding levels from the lowest
            levels = self._levels[pool]
            lv = levels.levels
            i = levels.low
            while not lv[i]:  # tighten the lower bound past empty levels
                i += 1
            levels.low = i
            for k in range(i, len(lv)):
                for st in lv[k]:
                    if (not st.drained and st.rep.weight > 0 and (role is None or st.rep.role == role)
                            and (not exclude or st.rep.id not in exclude)):
                        return st
            raise self._none(pool, role, exclude)
        # weighted: scan outstanding / weight from a rotating start so ties spread
        start = g.rr % n
        g.rr = start + 1
        best: _State | None = None
        best_load = math.inf
        for part in (lst[start:], lst[:start]):
            for st in part:
                load = st.outstanding / st.rep.weight
                if load < best_load and (not exclude or st.rep.id not in exclude):
                    best, best_load = st, load
        if best is None:
            raise self._none(pool, role, exclude)
        return best

    def _pick_p2c(self, pool: str, role: str | None, exclude: Collection[str]) -> _State:
        lst = self._group(pool, role).states
        if exclude:
            lst = [s for s in lst if s.rep.id not in exclude]
        n = len(lst)
        if n == 0:
            raise self._none(pool, role, exclude)
        if n == 1:
            return lst[0]
        rnd = self._random
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

    def _pick_ladr(self, pool: str, role: str | None, exclude: Collection[str]) -> _State:
        g = self._group(pool, role)
        lad = g.ladr
        if lad is None or lad.stale:
            if lad is not None:
                for x in lad.states:
                    x.slots = [sl for sl in x.slots if sl[0] is not lad]
            lad = g.ladr = self._ladr_table(g.states)
        if not lad.states:  # every eligible replica is stale: least outstanding, documented fallback
            return self._pick_lo(pool, role, exclude)
        if self.params["systematic"]:  # golden-ratio sequence from a random start, per group
            key = (pool, role)
            u = self._useq[key] = (self._useq.get(key, self._u0) + _GOLDEN) % 1.0
        else:
            u = self._random()
        st = lad.sample(u)
        if exclude and st.rep.id in exclude:  # rare (gateway retries): sample the rest directly
            rest = [(x, w) for x, w in zip(lad.states, lad.w, strict=True) if x.rep.id not in exclude]
            if not rest:
                return self._pick_lo(pool, role, exclude)
            x = self._random() * sum(w for _, w in rest)
            st = rest[-1][0]  # float rounding may leave x >= 0 after the last member
            for cand, w in rest:
                x -= w
                if x < 0:
                    st = cand
                    break
        return st

    def _ladr_table(self, lst: list[_State]) -> _Ladr:
        """The sampler over the group's fresh replicas (see :class:`_Ladr` and the module doc)."""
        fresh = [s for s in lst if s.fresh]
        if not fresh:
            return _Ladr([], [], 1.0, 0.0)
        p = self.params
        alpha, beta, k = p["alpha"], p["beta"], p["sharpness"]
        measured = [s.lat_ema for s in fresh if s.lat_ema is not None]
        ref = min(measured) if measured else 1.0
        # an unmeasured replica (new, or only probed) is scored like the average measured one
        unknown = sum(ref / x for x in measured) / len(measured) if measured else 1.0
        q_scale = max(1.0, sum(s.outstanding + s.extra_q for s in fresh) / len(fresh))  # live
        # log of weight * exp(sharpness * score), shifted so the best replica now has weight 1:
        # no overflow/underflow whatever alpha, beta and sharpness an operator sets
        per_q = -k * beta / q_scale
        log_base = []
        for s in fresh:
            inv = unknown if s.lat_ema is None else ref / max(s.lat_ema, 1e-9)  # 1 / latency, <= 1
            log_base.append(math.log(s.rep.weight) + k * alpha * inv)
        shift = max(lb + per_q * (s.outstanding + s.extra_q) for lb, s in zip(log_base, fresh, strict=True))
        base = [math.exp(max(lb - shift, -700.0)) for lb in log_base]
        lad = _Ladr(fresh, base, math.exp(per_q), self.params["floor"])
        for i, s in enumerate(fresh):
            s.slots.append((lad, i))
        return lad

    # -- scores ----------------------------------------------------------------------------------
    def refresh(self, now: float | None = None) -> None:
        """Recompute LADR scores and freshness (called lazily by ``pick``; public for tests)."""
        now = self._clock() if now is None else now
        p = self.params
        theta, ttl = p["theta"], p["ttl_s"]
        self.refreshes += 1
        for st in self._states.values():
            st.slots = []  # the samplers are rebuilt from the new EMA on the next pick
            if st.lat_n:
                st.avg_ms = st.lat_sum / st.lat_n
                st.win_n = st.lat_n
                st.lat_sum = 0.0
                st.lat_n = 0
            else:
                st.win_n = 0
        remote: dict[str, list[dict[str, Any]]] = {}
        shared = self.shared
        if shared is not None:
            shared.publish({rid: self._local_stats(st, now) for rid, st in self._states.items()})
            if shared.healthy:
                remote = shared.latest()
            else:
                self.fallbacks += 1
                self.metrics.fallback.inc()
        expiry = now + p["refresh_s"]
        for rid, st in self._states.items():
            avg_ms, last_seen, queue = st.avg_ms, st.last_seen, float(st.outstanding)
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
                continue  # not measured yet: sampled at the pool average (see _ladr_table)
            if st.lat_ema is None:
                st.lat_ema = avg_ms  # the first measured window initialises the EMA
            elif new_data:  # an empty window holds the EMA (nothing new was learnt)
                st.lat_ema = theta * st.lat_ema + (1.0 - theta) * avg_ms
        self._score_pools()
        self._next_refresh = expiry
        for g in self._cache.values():  # membership did not change: only the LADR tables
            g.ladr = None

    def _score_pools(self) -> None:
        """Scores at the queue of this refresh, for the snapshot, the gauge and other gateways
        (picks use the live queue through the samplers, see :meth:`_ladr_table`)."""
        alpha, beta = self.params["alpha"], self.params["beta"]
        for lst in self._pools.values():
            live = [s for s in lst if s.fresh and not s.drained]
            measured = [s.lat_ema for s in live if s.lat_ema is not None]
            if not measured:
                measured = [s.lat_ema for s in lst if s.lat_ema is not None]
            if not measured:
                continue
            ref = min(measured)
            q_scale = max(1.0, sum(s.queue for s in live) / len(live)) if live else 1.0
            for st in lst:
                if st.lat_ema is None:
                    continue
                st.raw = ref / max(st.lat_ema, 1e-9)  # 1 / relative latency
                st.score = alpha * st.raw - beta * st.queue / q_scale
                st.score_child.set(st.score)

    def _local_stats(self, st: _State, now: float) -> dict[str, Any]:
        return {
            "avg_ms": st.avg_ms,
            "n": st.win_n,
            "outstanding": st.outstanding,
            "score": st.score,  # for operators reading Redis; each router computes its own
            "age_s": max(0.0, now - st.last_seen),
        }

    # -- introspection ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """JSON-able state for the control API and tests (refreshes the scores first if due)."""
        if self.shared is not None and self.shared.inbox:
            self.apply_shared_ops()
        now = self._clock()
        if now >= self._next_refresh:
            self.refresh(now)
        pools: dict[str, list[dict[str, Any]]] = {}
        for pool, lst in self._pools.items():
            pools[pool] = [
                {
                    **asdict(st.rep),
                    "drained": st.drained,
                    "outstanding": st.outstanding,
                    "queue": st.queue,
                    "avg_latency_ms": st.avg_eff,
                    "local_avg_latency_ms": st.avg_ms,
                    "latency_ema_ms": st.lat_ema,
                    "score": st.score,
                    "fresh": st.fresh,
                    "stats_age_s": max(0.0, now - st.last_seen),
                    "picks": st.picks,
                    "errors": st.errors,
                }
                for st in lst
            ]
        out: dict[str, Any] = {
            "policy": self.policy,
            "params": dict(self.params),
            "pools": pools,
            "refreshes": self.refreshes,
            "fallbacks": self.fallbacks,
            "shared_ops_applied": self.shared_ops_applied,
            "shared_ops_skipped": self.shared_ops_skipped,
        }
        if self.shared is not None:
            out["shared"] = self.shared.describe()
        return out


def _check_weight(weight: Any) -> None:
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight < 0:
        raise ValueError(f"weight: must be a finite number >= 0, got {weight!r}")


def from_config(cfg: Any, replicas: Iterable[Replica], *, clock: Callable[[], float] = time.monotonic,
                rng: random.Random | None = None, registry: CollectorRegistry | None = None,
                shared: Any = "auto") -> Router:
    """A router with the policy and LADR parameters of ``cfg.control``.

    ``shared="auto"`` starts the Redis shared state when ``control.redis_url`` is set (the caller
    closes it with ``router.shared.close()``); pass ``None`` to stay in process.
    """
    c = cfg.control
    try:
        params = _check_params({"alpha": c.ladr_alpha, "beta": c.ladr_beta, "theta": c.ladr_theta,
                                "refresh_s": c.ladr_refresh_s, "ttl_s": c.ladr_ttl_s,
                                "sharpness": c.ladr_sharpness})
    except ValueError as exc:
        from llmsla.config import ConfigError

        raise ConfigError(f"{cfg.source or 'configuration'}: control.ladr_{exc}") from None
    if shared == "auto":
        from llmsla.control.shared_state import from_config as shared_from_config

        shared = shared_from_config(cfg, ttl_s=c.ladr_ttl_s, interval_s=c.ladr_refresh_s)
    return Router(replicas, c.route_policy, clock=clock, rng=rng, shared=shared, registry=registry, **params)
