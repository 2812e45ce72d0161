"""Replica selection for the gateway and the fleet simulator: one interface, four policies.

``round_robin``, ``least_outstanding``, ``p2c`` and ``ladr`` share the bookkeeping kept here
(membership, operator actions, the request lifecycle, shared ops, the snapshot); ``replica``,
``sampler``, ``ladr`` and ``policies`` hold the state, the Fenwick sampler, the scoring and each
pick. Drained replicas are never picked and the last one of a pool is never drained. The router
is not thread-safe by design: one event loop or one simulation owns it, and the Redis syncer
only swaps whole dict references. See docs/control.md#router.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict
from typing import Any

from prometheus_client import CollectorRegistry

from llmsla import extras
from llmsla.control import ladr, policies
from llmsla.control.estimator import MeanLength
from llmsla.control.ladr import DEFAULT_PARAMS, POLICIES, check_params
from llmsla.control.metrics import RouterMetrics
from llmsla.control.policies import Group
from llmsla.control.replica import (
    ROLES,
    EngineSignal,
    LastReplicaError,
    NoReplicaAvailable,
    Replica,
    ReplicaState,
    UnknownReplica,
    check_engine,
    check_weight,
)
from llmsla.control.sampler import LoadLevels
from llmsla.redaction import redact
from llmsla.seams import SharedState

__all__ = ["DEFAULT_PARAMS", "POLICIES", "ROLES", "LastReplicaError", "NoReplicaAvailable", "Replica", "Router",
           "UnknownReplica", "from_config", "params_from_config"]

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # step of the systematic sampling sequence


def _serves(st: ReplicaState) -> bool:
    """Eligible whatever its weight: not drained, not down, not joining, not leaving."""
    return not st.drained and not st.down and not st.pending and not st.leaving


class Router:
    """Pick a replica per request; see the module docstring for the policies."""

    def __init__(
        self,
        replicas: Iterable[Replica],
        policy: str = "round_robin",
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        shared: SharedState | None = None,
        registry: CollectorRegistry | None = None,
        **params: Any,
    ) -> None:
        self._clock = clock
        self._rng = rng or random.Random()
        self._random = self._rng.random
        self._u0 = self._random()  # random start of the systematic sampling sequences
        self._useq: dict[tuple[str, str | None], float] = {}
        self.shared = shared
        self.metrics = RouterMetrics.of(registry)
        self.params: dict[str, float] = dict(DEFAULT_PARAMS)
        self.params.update(check_params(params))
        self.policy = check_params({"policy": policy})["policy"]
        self._states: dict[str, ReplicaState] = {}
        self._pools: dict[str, list[ReplicaState]] = {}
        self._levels: dict[str, LoadLevels] = {}
        self._out: dict[str, MeanLength] = {}  # per pool: recent mean output length (ECT term)
        self._prompt: dict[str, MeanLength] = {}  # per pool: recent mean prompt length (ECT term)
        self._cache: dict[tuple[str, str | None], Group] = {}
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
    def add_replica(self, rep: Replica, *, pending: bool = False) -> None:
        """Add a replica at run time (fresh for one TTL, score unknown until it is measured).
        ``pending``: picked only once :meth:`mark_healthy` says it answered a health probe (a
        discovered replica; docs/gateway.md#discovery)."""
        if rep.id in self._states:
            raise ValueError(f"replica {rep.id!r} already exists")
        if rep.role not in ROLES:
            raise ValueError(f"replica {rep.id!r}: role must be one of {ROLES}, got {rep.role!r}")
        check_weight(rep.weight)
        st = ReplicaState(rep, self._clock())
        st.pending = pending
        labels = (rep.pool, rep.id)
        st.pick_child = self.metrics.picks.labels(*labels)
        st.score_child = self.metrics.score.labels(*labels)
        self.metrics.weight.labels(*labels).set(rep.weight)
        self.metrics.drained.labels(*labels).set(0)
        self._states[rep.id] = st
        self._pools.setdefault(rep.pool, []).append(st)
        st.levels = self._levels.setdefault(rep.pool, LoadLevels())
        st.levels.add(st)
        self._invalidate()

    def remove_replica(self, replica_id: str) -> Replica:
        st = self._state(replica_id)
        del self._states[replica_id]
        self._pools[st.rep.pool].remove(st)
        st.levels.remove(st)  # type: ignore[union-attr]  # set when the replica joined its pool
        if not self._pools[st.rep.pool]:
            del self._pools[st.rep.pool]
            del self._levels[st.rep.pool]
            self._out.pop(st.rep.pool, None)
            self._prompt.pop(st.rep.pool, None)
        for g in (self.metrics.picks, self.metrics.weight, self.metrics.drained, self.metrics.score):
            with contextlib.suppress(KeyError):
                g.remove(st.rep.pool, st.rep.id)
        self._invalidate()
        return st.rep

    def mark_healthy(self, replica_id: str) -> bool:
        """A health probe answered: a pending replica becomes eligible (one TTL of grace).
        True when this changed something."""
        st = self._state(replica_id)
        if not st.pending:
            return False
        st.pending = False
        st.last_seen = max(st.last_seen, self._clock())
        self._next_refresh = -math.inf
        self._invalidate()
        return True

    def retire(self, replica_id: str) -> bool:
        """The replica left the fleet (discovery no longer names it): it gets no new request,
        its in-flight requests finish, and it is removed when the last one ends (its gauges go
        with it: stale in Prometheus, not 0). True when it was removed at once (idle). Unlike
        :meth:`drain`, the pool's last replica may leave: the fleet, not an operator, decided."""
        st = self._state(replica_id)
        if st.outstanding == 0:
            self.remove_replica(replica_id)
            return True
        if not st.leaving:
            st.leaving = True
            self._invalidate()
        return False

    def rejoin(self, replica_id: str) -> None:
        """A leaving replica is named again before it drained: it keeps its state and serves on."""
        st = self._state(replica_id)
        if st.leaving:
            st.leaving = False
            self._invalidate()

    def is_leaving(self, replica_id: str) -> bool:
        return self._state(replica_id).leaving

    def is_down(self, replica_id: str) -> bool:
        """Marked down by a health check (:meth:`set_down`)."""
        return self._state(replica_id).down

    def is_pending(self, replica_id: str) -> bool:
        """Joined, not yet answered a health probe (takes no traffic)."""
        return self._state(replica_id).pending

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

    def _state(self, replica_id: str) -> ReplicaState:
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
        """Weight multiplies the LADR score and divides outstanding for LO/P2C; 0 = never picked,
        so 0 on the last replica that serves its pool is refused like draining it (the pool would
        answer 503)."""
        check_weight(weight)
        st = self._state(replica_id)
        if weight == 0:
            serving = [s for s in self._pools[st.rep.pool] if _serves(s) and s.rep.weight > 0]
            if serving == [st]:
                raise LastReplicaError(
                    f"refusing weight 0 for {replica_id!r}: it is the last serving (non-drained, weight > 0) "
                    f"replica of pool {st.rep.pool!r}; give another replica weight first")
        st.rep.weight = float(weight)
        self.metrics.weight.labels(st.rep.pool, st.rep.id).set(weight)
        self._invalidate()
        self._broadcast({"op": "set_weight", "replica": replica_id, "weight": float(weight)})

    def drain(self, replica_id: str) -> None:
        st = self._state(replica_id)
        if st.drained:
            self._broadcast({"op": "drain", "replica": replica_id})  # others may disagree
            return
        healthy = [s for s in self._pools[st.rep.pool] if _serves(s)]
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

    def set_down(self, replica_id: str, down: bool) -> None:
        """A health checker's verdict, kept apart from an operator's drain: a replica back up is
        eligible again only if no operator drained it meanwhile, and an operator's undrain of a
        dead replica does not route to it. Local to this router (each one checks health itself);
        refuses to take down the last eligible replica of a pool, like :meth:`drain`."""
        st = self._state(replica_id)
        if st.down == down:
            return
        if down:
            eligible = [s for s in self._pools[st.rep.pool] if _serves(s)]
            if eligible == [st]:
                raise LastReplicaError(
                    f"refusing to mark {replica_id!r} down: it is the last eligible replica of pool {st.rep.pool!r}")
        else:
            st.last_seen = max(st.last_seen, self._clock())  # back in service: one TTL of grace
            self._next_refresh = -math.inf
        st.down = down
        self._invalidate()

    def set_params(self, **params: Any) -> None:
        """Change alpha, beta, theta, refresh_s, ttl_s, floor, error_penalty_ms, the engine
        scorers' weights (engine_queue, engine_kv, engine_ttl_s) or policy at run time."""
        checked = check_params(params)
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
        if self.shared is None:
            return 0
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
    def begin(self, replica_id: str, prompt_tokens: int | None = None) -> float:
        """The request was dispatched to ``replica_id``; ``prompt_tokens``: its prompt size (as
        given to :meth:`pick`). Returns the prompt tokens routed there before it that await
        their first token: give it back to :meth:`first_token` (how LADR learns prefill speed)."""
        st = self._state(replica_id)
        st.levels.up(st)  # type: ignore[union-attr]  # set on joining a pool; per request: no check
        ahead = st.wait_tok
        prompt = _tokens(prompt_tokens)
        if prompt is not None:
            st.wait_tok = ahead + prompt
            pm = self._prompt.get(st.rep.pool)
            if pm is None:
                pm = self._prompt[st.rep.pool] = MeanLength()
            pm.observe(prompt)
        for lad, i in st.slots:  # LADR's queue term is live: no herding within a refresh window
            lad.update(i, st)
        return ahead

    def first_token(self, replica_id: str, ttft_ms: float, *, prompt_tokens: int | None = None,
                    ahead_tokens: float | None = None) -> None:
        """The request's first token came ``ttft_ms`` after its dispatch: its prompt no longer
        waits (``prompt_tokens`` as given to :meth:`begin`), and with ``ahead_tokens`` (what
        :meth:`begin` returned) the replica's prefill speed is learnt. Call it at most once per
        request; its :meth:`end` then carries no ``prompt_tokens``."""
        st = self._states.get(replica_id)
        if st is None:  # removed while in flight
            return
        prompt = _tokens(prompt_tokens)
        if prompt is None:
            return
        st.wait_tok = max(0.0, st.wait_tok - prompt)
        for lad, i in st.slots:
            lad.update(i, st)
        if (isinstance(ahead_tokens, int | float) and not isinstance(ahead_tokens, bool) and ahead_tokens >= 0
                and isinstance(ttft_ms, int | float) and not isinstance(ttft_ms, bool)):
            ttft_s, tokens = ttft_ms / 1000.0, ahead_tokens + prompt
            st.svc.observe_prefill(ttft_s, tokens)  # checks what it takes

    def end(self, replica_id: str, latency_ms: float, *, ok: bool = True, ttft_ms: float | None = None,
            output_tokens: int | None = None, prompt_tokens: int | None = None) -> None:
        """The request finished: outstanding -= 1 and its latency feeds the replica's stats.
        With ``output_tokens`` (and ``ttft_ms``) a successful request also teaches the replica's
        speed estimate and the pool's output length (LADR's ``ect`` term, control/estimator.py).
        ``prompt_tokens``: as given to :meth:`begin`, for a request whose :meth:`first_token` was
        not reported (an error, a non-streamed answer): its prompt stops counting as waiting."""
        st = self._states.get(replica_id)
        if st is None:  # removed while in flight
            return
        if ok and output_tokens is not None and not isinstance(output_tokens, bool) and output_tokens >= 1:
            load = float(max(st.outstanding, 1)) + st.extra_q  # load while it ran ~ the count as it ends
            st.svc.observe(latency_ms / 1000.0, None if ttft_ms is None else ttft_ms / 1000.0,
                           int(output_tokens), load, self.params["ect_n0"])
            out = self._out.get(st.rep.pool)
            if out is None:
                out = self._out[st.rep.pool] = MeanLength()
            out.observe(int(output_tokens))
        prompt = _tokens(prompt_tokens)
        if prompt is not None:  # no first token was reported for it: it waits no more
            st.wait_tok = max(0.0, st.wait_tok - prompt)
        if st.outstanding > 0:
            st.levels.down(st)  # type: ignore[union-attr]  # as in begin()
            if st.outstanding == 0:  # idle: nothing waits (heals a caller's missed first_token)
                st.wait_tok = 0.0
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
        if st.leaving and st.outstanding == 0:  # its last in-flight request: drained, forget it
            self.remove_replica(replica_id)

    @property
    def reads_tokens(self) -> bool:
        """Whether LADR reads the tokens of streams in flight (its ECT term and ``ect_cadence``
        on): only then need callers report them to :meth:`tokens`."""
        return self.params["ect"] > 0 and self.params["ect_cadence"] > 0

    def tokens(self, replica_id: str, n: int, gap_s: float) -> None:
        """``n`` tokens of streams past their first token came back from ``replica_id``, their
        inter-token gaps summing to ``gap_s``: the replica's decode speed now, read at each
        refresh (``ect_cadence``, control/ladr.py ``cadence``). The load they shared is the
        replica's outstanding requests, or, with fresh engine data, the engine's running batch
        (moved to now, ``ladr.engine_now``): requests waiting for a batch slot do not slow the
        decode, and counting them would make a saturated replica look faster than it is. A
        running batch under one (an engine that does not report it reads 0) is not a load
        tokens came back from: the outstanding count stays the load."""
        st = self._states.get(replica_id)
        if st is not None and n > 0 and gap_s >= 0:
            e = ladr.engine_now(st)
            st.tok_n += n
            st.tok_gap_s += gap_s
            st.tok_load += n * (e.running if e is not None and e.running >= 1 else st.outstanding + st.extra_q)

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

    def update_engine(self, replica_id: str, *, waiting: float, running: float, kv_usage: float,
                      at: float | None = None) -> None:
        """The replica's engine state from its own /metrics (a scrape): requests waiting and
        running, KV-cache usage in [0, 1], sampled at ``at`` (default now, router clock). LADR's
        engine scorers read it at the next refresh while it is at most ``engine_ttl_s`` old;
        other policies ignore it. A bad value raises ValueError and keeps the previous record.
        See docs/control.md#engine-signals."""
        st = self._state(replica_id)
        w, r, kv = check_engine(waiting, running, kv_usage)
        when = self._clock() if at is None else at
        if isinstance(when, bool) or not isinstance(when, int | float) or not math.isfinite(when):
            raise ValueError(f"engine at: must be a finite time, got {at!r}")
        st.engine = EngineSignal(w, r, kv, float(when))
        st.engine_out = st.outstanding
        st.engine_peak = max(st.engine_peak, r)

    def outstanding(self, replica_id: str) -> int:
        return self._state(replica_id).outstanding

    # -- picking ---------------------------------------------------------------------------------
    def pick(self, pool: str, *, role: str | None = None, exclude: Collection[str] = (),
             policy: str | None = None, prompt_tokens: int | None = None) -> Replica:
        """The replica for the next request of ``pool`` (optionally only replicas of ``role``).

        ``policy`` overrides the router's for this pick (an A/B arm's route policy): one router
        keeps one set of replica stats and outstanding counts whichever policy picks, so arms
        that share replicas see each other's load (separate routers per arm would not).
        ``prompt_tokens``: the request's prompt size as the gateway reads it from the body (LADR's
        ``ect`` term sends a long prompt where prefill is fast; pass the same value to
        :meth:`end`). None or a bad value: the pool's mean prompt is assumed."""
        shared = self.shared
        if shared is not None and shared.inbox:  # operator actions taken on another gateway
            self.apply_shared_ops()
        g = self._group(pool, role)
        policy = policy or self.policy
        if policy == "ladr":
            now = self._clock()
            if now >= self._next_refresh:
                self.refresh(now)
            st = self._pick_ladr(g, pool, role, exclude, None if prompt_tokens is None else _tokens(prompt_tokens))
        elif policy == "round_robin":
            st = policies.round_robin(g, exclude)
            self._rr[(pool, role)] = g.rr  # survives cache invalidation
        elif policy == "p2c":
            st = policies.p2c(g, exclude, self._random)
        else:
            st = self._pick_lo(g, pool, role, exclude)
        if st is None:
            raise self._none(pool, role, exclude)
        st.picks += 1
        st.pick_child.inc()
        return st.rep

    def eligible(self, pool: str, *, role: str | None = None) -> list[Replica]:
        """The replicas a pick of ``pool`` (and ``role``) chooses among: not drained, down,
        pending or leaving, weight > 0 (a simulator's own policy picks from these)."""
        return [st.rep for st in self._group(pool, role).states]

    def has_role(self, pool: str, role: str) -> bool:
        """True when the pool has an eligible replica of ``role`` (cheap: the cached group)."""
        return bool(self._group(pool, role).states)

    def _group(self, pool: str, role: str | None) -> Group:
        """Non-drained, up, weight > 0 replicas of the pool/role (cached until something changes)."""
        g = self._cache.get((pool, role))
        if g is None:
            lst = [
                s for s in self._pools.get(pool, ())
                if not s.drained and not s.down and not s.pending and not s.leaving and s.rep.weight > 0
                and (role is None or s.rep.role == role)
            ]
            g = self._cache[(pool, role)] = Group(lst, self._rr.get((pool, role), 0))
        return g

    def _none(self, pool: str, role: str | None, exclude: Collection[str]) -> NoReplicaAvailable:
        what = f"pool {pool!r}" + (f" role {role!r}" if role is not None else "")
        if pool not in self._pools:
            return NoReplicaAvailable(f"{what}: no such pool (known: {', '.join(self._pools) or 'none'})")
        return NoReplicaAvailable(
            f"{what}: no replica available (all drained, weight 0, or excluded: {sorted(exclude)})"
        )

    def _pick_lo(self, g: Group, pool: str, role: str | None, exclude: Collection[str]) -> ReplicaState | None:
        levels = self._levels.get(pool)
        return None if levels is None else policies.least_outstanding(g, levels, role, exclude)

    def _pick_ladr(self, g: Group, pool: str, role: str | None, exclude: Collection[str],
                   prompt: float | None = None) -> ReplicaState | None:
        lad = g.ladr
        if lad is None or lad.stale:
            if lad is not None:
                for x in lad.states:
                    x.slots = [sl for sl in x.slots if sl[0] is not lad]
            out, pm = self._out.get(pool), self._prompt.get(pool)
            lad = g.ladr = ladr.build_sampler(g.states, self.params, None if out is None else out.mean,
                                              None if pm is None else pm.mean)
        if self.params["systematic"]:  # golden-ratio sequence from a random start, per group
            key = (pool, role)
            u = self._useq[key] = (self._useq.get(key, self._u0) + _GOLDEN) % 1.0
        else:
            u = self._random()
        st = policies.ladr(lad, u, exclude, self._random, prompt)
        if st is None:  # no fresh replica, or all excluded: least outstanding, documented fallback
            return self._pick_lo(g, pool, role, exclude)
        return st

    # -- scores ----------------------------------------------------------------------------------
    def refresh(self, now: float | None = None) -> None:
        """Recompute LADR scores and freshness (called lazily by ``pick``; public for tests)."""
        now = self._clock() if now is None else now
        self.refreshes += 1
        ladr.roll_window(self._states.values())
        remote: dict[str, list[dict[str, Any]]] = {}
        shared = self.shared
        if shared is not None:
            shared.publish({rid: ladr.local_stats(st, now) for rid, st in self._states.items()})
            if shared.healthy:
                remote = shared.latest()
            else:
                self.fallbacks += 1
                self.metrics.fallback.inc()
        self._next_refresh = ladr.update_states(self._states, self.params, now, remote)
        if self.reads_tokens:
            for st in self._states.values():
                ladr.cadence(st, self.params)
        ladr.score_pools(self._pools.values(), self.params)
        for g in self._cache.values():  # membership did not change: only the LADR samplers
            g.ladr = None

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
                    "url": redact(st.rep.url),  # GET /v1/state needs no token: no password in it
                    "drained": st.drained,
                    "down": st.down,
                    "pending": st.pending,
                    "leaving": st.leaving,
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
                    "ect": {"tpot_per_load_s": st.svc.tpot_per_load, "ttft_s": st.svc.ttft_s,
                            "prefill_per_token_s": st.svc.prefill_per_token, "observations": st.svc.n,
                            "waiting_prompt_tokens": st.wait_tok, "cadence_readings": st.svc.cadence_n},
                    "engine": None if st.engine is None else {
                        "waiting": st.engine.waiting, "running": st.engine.running,
                        "kv_usage": st.engine.kv_usage, "age_s": max(0.0, now - st.engine.at),
                        "fresh": st.engine_fresh, "peak_running": st.engine_peak,
                        "batch_full": ladr.batch_full(st)},
                }
                for st in lst
            ]
        out: dict[str, Any] = {
            "policy": self.policy,
            "output_tokens_mean": {p: o.mean for p, o in self._out.items()},
            "prompt_tokens_mean": {p: o.mean for p, o in self._prompt.items()},
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



def _tokens(value: Any) -> float | None:
    """A caller's token count as a float, or None when it is missing or not a count >= 1."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 1:
        return None
    return float(value)


def params_from_config(cfg: Any) -> dict[str, float]:
    """The LADR parameters of ``cfg.control`` (``ladr_*``), checked; a bad one is a
    ``ConfigError`` naming the key."""
    c = cfg.control
    try:
        return check_params({"alpha": c.ladr_alpha, "beta": c.ladr_beta, "theta": c.ladr_theta,
                             "refresh_s": c.ladr_refresh_s, "ttl_s": c.ladr_ttl_s, "sharpness": c.ladr_sharpness,
                             "engine_queue": c.ladr_engine_queue, "engine_kv": c.ladr_engine_kv,
                             "ect": c.ladr_ect, "ect_cadence": c.ladr_ect_cadence})
    except ValueError as exc:
        from llmsla.config import ConfigError

        raise ConfigError(f"{cfg.source or 'configuration'}: control.ladr_{exc}") from None


def from_config(cfg: Any, replicas: Iterable[Replica], *, clock: Callable[[], float] = time.monotonic,
                rng: random.Random | None = None, registry: CollectorRegistry | None = None,
                shared: Any = "auto") -> Router:
    """A router with the policy and LADR parameters of ``cfg.control``.

    ``shared="auto"`` starts the Redis shared state when ``control.redis_url`` is set (the caller
    closes it with ``router.shared.close()``); pass ``None`` to stay in process.
    """
    c = cfg.control
    params = params_from_config(cfg)
    if shared == "auto":
        shared = None
        if c.redis_url:
            extras.require("redis", "control.redis_url (router state shared through Redis)")
            from llmsla.control.shared_state import from_config as shared_from_config

            shared = shared_from_config(cfg, ttl_s=c.ladr_ttl_s, interval_s=c.ladr_refresh_s)
    return Router(replicas, c.route_policy, clock=clock, rng=rng, shared=shared, registry=registry, **params)
