"""The discrete-event fleet simulator: arrivals -> real ``Router`` -> simulated replicas -> events.

One heap of ``(time, seq, kind, payload)`` drives everything; ``seq`` breaks ties in push order,
so a run is a pure function of its inputs and seed (no wall clock, no hash order, no threads).
The router is the production :class:`llmsla.control.router.Router`, given the simulated clock,
so every policy decision (LADR refresh cadence, TTL) happens in simulated time.

Each finished request becomes a :class:`~llmsla.events.RequestEvent` handed to a sink (the
gateway's ``RequestRecorder`` in production use), so streaming, dashboards and the forecaster
see simulated traffic exactly as they see real traffic.
"""

from __future__ import annotations

import heapq
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from prometheus_client import CollectorRegistry

from llmsla import names
from llmsla.control.distill import DistillControls, role_for_share
from llmsla.control.router import LastReplicaError, NoReplicaAvailable, Replica, Router
from llmsla.control.shed import ShedControls
from llmsla.events import EngineSample, GpuSample, ItlSummary, RequestEvent
from llmsla.fleet import models, oracle
from llmsla.fleet.faults import ALL_REPLICAS, GRADUAL, LOAD_KINDS, THERMAL_RISE_C, Fault
from llmsla.fleet.replica import ReplicaSim, Req
from llmsla.fleet.tenancy import Picker, Share
from llmsla.fleet.workload import Arrival
from llmsla.seams import RolloutHandle

# event kinds (ints: cheap to compare, and ordering among equal times is by push sequence)
_DELIVER, _STEP, _FINISH, _TIMEOUT, _FAULT_ON, _FAULT_OFF, _HEALTH, _TICK, _SCRAPE, _TOKENS = range(10)
#: How often the gateway's view of the tokens streamed back is brought up to date (seconds).
TOKENS_S = 0.05
#: Gradual faults (ramp, leak, thermal) are re-applied at every tick, at least this often.
GRADUAL_STEP_S = 1.0


@dataclass(frozen=True)
class ReplicaConfig:
    id: str
    model: str  # a models.CATALOG name
    pool: str = names.DEFAULT_POOL
    role: str = ""  # "teacher" | "student" | ""


def fleet(spec: str, *, pool: str = names.DEFAULT_POOL) -> list[ReplicaConfig]:
    """``"70b:1,6b:2"`` -> replicas r0 (70b), r1, r2 (6b) in one pool. A ``/teacher`` or
    ``/student`` suffix sets the role: ``"70b/teacher:1,6b/student:2"``; a ``name=`` prefix puts
    replicas in another pool (an A/B arm's): ``"6b:4,canary=6b:4"``."""
    out: list[ReplicaConfig] = []
    default_pool = pool
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        pool = default_pool
        if "=" in part:
            pool, _, part = part.partition("=")
            if not pool:
                raise ValueError(f"fleet {spec!r}: empty pool name before '='")
        model, _, count = part.partition(":")
        model, _, role = model.partition("/")
        models.get(model)
        try:
            n = int(count or "1")
        except ValueError:
            raise ValueError(f"fleet {spec!r}: count of {model!r} must be an integer") from None
        for _ in range(n):
            out.append(ReplicaConfig(f"r{len(out)}", model.lower(), pool, role))
    if not out:
        raise ValueError(f"fleet {spec!r}: no replicas")
    return out


@dataclass
class SimConfig:
    replicas: list[ReplicaConfig]
    policy: str = "round_robin"  # names.SIM_ROUTE_POLICIES: the router's, or the oracle (fleet/oracle.py)
    router_params: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    timeout_s: float = 300.0  # gateway request timeout (gateway.request_timeout_s)
    max_concurrency: int = 256  # gateway upstream slots; the rest wait in its queue (gateway.max_concurrency)
    max_in_flight: int = 1024  # gateway rejects (429) past this many requests (gateway.max_in_flight)
    net_delay_s: float = 0.0005  # one-way gateway <-> replica
    detect_s: float = 2.0  # health checker: drain a crashed replica this long after the crash
    probe_s: float = 0.5  # queue-length reports to the router (the worker's gauge); 0 = off
    #: engine signals to the router (``Router.update_engine``: waiting, running, KV usage, as
    #: the engine adapters scrape them) every this many seconds (engine.scrape_interval_s);
    #: the router holds each scrape until the next, so it reads values up to this old. 0 = off
    engine_scrape_s: float = 0.0
    gpu_interval_s: float = 5.0  # GPU samples (gpu.interval_s); 0 = off
    student_share: float | None = None  # share of requests asking for role "student"
    arm: str = names.DEFAULT_ARM
    temperature_policy: str = names.DEFAULT_POLICY  # RequestEvent.policy
    node: str = "sim"  # GPU node name prefix (8 GPUs per node)
    #: A/B rollout (llmsla.control.rollout.Rollout): each arrival's unit is assigned as the
    #: gateway does, and the arm's strategy (pool, route policy, student share, schedule) applied
    rollout: RolloutHandle | None = None
    #: pools that receive arrivals (default: every pool, in proportion to its replicas); an A/B
    #: arm's own pool (a canary) is then reached only through its arm
    entry_pools: list[str] | None = None
    #: each request's (tenant, class) drawn from this mix (fleet/tenancy.py); empty: the defaults
    tenant_mix: tuple[Share, ...] = ()


class RequestRow(NamedTuple):
    """Per-request outcome kept in memory for benchmarks and tests (ms; None = no token)."""

    arrival_s: float
    end_s: float
    replica: str
    pool: str
    status: str
    prompt: int
    output_tokens: int
    queue_ms: float
    ttft_ms: float | None
    e2e_ms: float
    preempted: int
    arm: str = names.DEFAULT_ARM
    itl_n: int = 0  # inter-token gaps
    itl_sum_ms: float = 0.0  # their sum


class Sink(Protocol):
    def request(self, event: RequestEvent) -> None: ...
    def gpu(self, sample: GpuSample, model_name: str) -> None: ...


@dataclass
class SimResult:
    rows: list[RequestRow]
    replicas: dict[str, dict[str, Any]]
    faults: list[Fault]
    start_ms: int
    end_s: float
    wall_s: float
    heap_events: int
    router: dict[str, Any]


class Simulator:
    """Build once per run: ``Simulator(cfg).run(arrivals, faults=..., sink=...)``."""

    def __init__(self, cfg: SimConfig, *, registry: CollectorRegistry | None = None,
                 distill: DistillControls | None = None, lock: threading.RLock | None = None,
                 shed: ShedControls | None = None) -> None:
        """``distill``: the pools' student share and temperature schedule, as the gateway applies
        them (a control API may change them while a paced run goes). ``shed``: the share of each
        request class each pool refuses, as the gateway applies it (refused requests record no
        event, as at the gateway; counted in :attr:`shed_counts`). ``lock``: held while each
        event is processed, so another thread (that control API) can change the router and the
        distillation controls between events, never in the middle of one."""
        self.cfg = cfg
        self.distill = distill
        self.shed = shed
        #: (pool, class) -> requests refused by load shedding
        self.shed_counts: dict[tuple[str, str], int] = {}
        self.lock = lock
        self.now = 0.0
        self.rng = random.Random(cfg.seed)
        self.reps: dict[str, ReplicaSim] = {}
        for i, rc in enumerate(cfg.replicas):
            if rc.id in self.reps:
                raise ValueError(f"duplicate replica id {rc.id!r}")
            self.reps[rc.id] = ReplicaSim(rc.id, rc.pool, rc.role, models.get(rc.model), i)
        if cfg.policy not in names.SIM_ROUTE_POLICIES:
            raise ValueError(f"policy: must be one of {', '.join(names.SIM_ROUTE_POLICIES)}, got {cfg.policy!r}")
        if not cfg.engine_scrape_s >= 0 or not math.isfinite(cfg.engine_scrape_s):
            raise ValueError(f"engine_scrape_s: must be a finite number >= 0, got {cfg.engine_scrape_s!r}")
        self._oracle = cfg.policy == names.ORACLE_POLICY
        #: requests dispatched and not yet delivered, per replica (what the oracle also sees)
        self._transit: dict[str, list[Req]] = {rc.id: [] for rc in cfg.replicas}
        self.router = Router(
            [Replica(rc.id, rc.pool, role=rc.role) for rc in cfg.replicas],
            # the oracle is the simulator's own; the router keeps the bookkeeping (and its
            # least-outstanding pick serves an A/B arm that names another policy)
            "least_outstanding" if self._oracle else cfg.policy,
            clock=self._clock,
            rng=random.Random(cfg.seed + 1),
            registry=registry if registry is not None else CollectorRegistry(),
            shared=None,  # one simulated router: nothing to share (and router_params cannot set it)
            **cfg.router_params,
        )
        pools: dict[str, int] = {}
        for rc in cfg.replicas:
            pools[rc.pool] = pools.get(rc.pool, 0) + 1
        entry = cfg.entry_pools or list(pools)
        if cfg.student_share is not None:
            if not 0.0 <= cfg.student_share <= 1.0:
                raise ValueError(f"student_share must be in [0, 1], got {cfg.student_share}")
            for pool in entry:  # an arm's own pool without the split: any role (as the gateway)
                roles = {rc.role for rc in cfg.replicas if rc.pool == pool}
                if not {"teacher", "student"} <= roles:
                    raise ValueError(f"student_share needs teacher and student replicas in pool {pool!r} "
                                     "(e.g. --fleet 70b/teacher:1,6b/student:2)")
        unknown = [p for p in entry if p not in pools]
        if unknown:
            raise ValueError(f"entry pool(s) {unknown} have no replicas (pools: {', '.join(pools)})")
        self._pools = list(entry)
        self._pool_cum = _cumulative([pools[p] for p in self._pools])
        self._heap: list[tuple] = []
        self._seq = 0
        self._open = 0  # requests arrived and not yet recorded
        self._slots = 0  # gateway upstream slots in use
        self._gw_queue: deque[Req] = deque()  # waiting for a slot
        self._releasing = False
        self._ran = False
        self._jitter: list[Fault] = []
        self._active: list[Fault] = []
        self._gradual_run = False  # the run has gradual faults: ticks re-apply them
        self.rows: list[RequestRow] = []
        self.sink: Sink | None = None
        self.engine_sink: Callable[[EngineSample], None] | None = None
        self.start_ms = 0
        self.drain_refused = 0

    def _clock(self) -> float:
        return self.now

    # -- heap ------------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, a, b))

    # -- run -------------------------------------------------------------------------------------
    def run(self, arrivals: Sequence[Arrival], *, faults: Sequence[Fault] = (), sink: Sink | None = None,
            start_ms: int | None = None, until_s: float | None = None,
            pace: float = 0.0, live_from_s: float = 0.0,
            progress: Callable[[float], None] | None = None,
            on_live: Callable[[], None] | None = None,
            engine_sink: Callable[[EngineSample], None] | None = None) -> SimResult:
        """Simulate ``arrivals`` (time-sorted) with ``faults``; events go to ``sink``.

        ``engine_sink``: each up replica's engine state (waiting and running requests, KV usage,
        cumulative preemptions) as an :class:`EngineSample` - what ``llmsla engines`` would
        scrape from a vLLM replica - at every GPU sample (``gpu_interval_s``); the forecaster's
        simulated data sets read it like the store's ``engine_windows``.

        ``start_ms``: epoch ms of simulated time 0. Default: now minus the simulated span, so
        every event lies in the recent past (the streaming job dead-letters events more than
        ``stream.max_future_s`` ahead or ``stream.max_past_s`` behind). ``pace`` > 0 runs in
        real time (``pace`` simulated seconds per wall second) from simulated time
        ``live_from_s`` on: what comes before is history, replayed as fast as it computes, and
        start_ms then defaults to now minus that history, so simulated time meets the wall clock
        where the live part begins (a demo: minutes of past traffic, then a fault as it happens).
        ``on_live`` is called once, when the paced part begins (a /metrics endpoint opened then
        shows the history as its counters' starting values, not as minutes of traffic in one
        scrape interval).
        """
        if self._ran:
            raise RuntimeError("a Simulator runs once; build a new one per run")
        self._ran = True
        wall0 = time.perf_counter()
        cfg = self.cfg
        for f in faults:
            if f.replica != ALL_REPLICAS and f.replica not in self.reps:
                raise ValueError(f"fault {f.kind}: unknown replica {f.replica!r} (fleet: {', '.join(self.reps)})")
        last = arrivals[-1].t if arrivals else 0.0
        if start_ms is None:
            now_ms = int(time.time() * 1000)
            start_ms = (now_ms - round(live_from_s * 1000) if pace > 0
                        else now_ms - math.ceil((last + cfg.timeout_s + 1) * 1000))
        lock = self.lock
        self.start_ms = start_ms
        self.sink = sink
        self.engine_sink = engine_sink
        for f in faults:
            self._push(f.start_s, _FAULT_ON, f)
            self._push(f.end_s, _FAULT_OFF, f)
        self._gradual_run = any(f.kind in GRADUAL for f in faults)
        if cfg.gpu_interval_s > 0 or cfg.probe_s > 0 or self._gradual_run:
            self._push(0.0, _TICK, 0.0, 0.0)
        if cfg.engine_scrape_s > 0:
            self._push(0.0, _SCRAPE)
        if self.router.reads_tokens:
            self._push(0.0, _TOKENS, {})  # LADR's completion-time term reads the tokens streamed
        trace_rng = random.Random(cfg.seed + 2)
        tenancy = Picker(cfg.tenant_mix, cfg.seed + 5)  # its own draws: the rest of the run is unchanged
        n_arr, ai = len(arrivals), 0
        heap = self._heap
        pop = heapq.heappop
        handlers = (self._on_deliver, self._on_step, self._on_finish, self._on_timeout,
                    self._on_fault_on, self._on_fault_off, self._on_health, self._on_tick, self._on_scrape,
                    self._on_tokens)
        popped = 0
        until = math.inf if until_s is None else until_s
        next_progress = 60.0
        while ai < n_arr or heap:
            if ai < n_arr and (not heap or arrivals[ai].t <= heap[0][0]):
                a = arrivals[ai]
                t = a.t
                if t > until:
                    break
                if pace > 0 and t > live_from_s:
                    if on_live is not None:
                        begin, on_live = on_live, None
                        begin()
                    _sleep_until(wall0 + (t - live_from_s) / pace)
                self.now = t
                r = Req(ai, t, a.prompt, max(1, a.output))
                r.trace_id = f"{trace_rng.getrandbits(128) | 1:032x}"
                r.unit = a.unit
                r.tenant, r.class_ = tenancy.pick()
                if a.class_:  # an arrival that names its class keeps it over the mix's draw
                    r.class_ = a.class_
                ai += 1
                if lock is None:
                    self._on_arrival(r)
                else:
                    with lock:
                        self._on_arrival(r)
                continue
            t, _, kind, x, y = pop(heap)
            if t > until:
                break
            popped += 1
            if pace > 0 and t > live_from_s:
                if on_live is not None:
                    begin, on_live = on_live, None
                    begin()
                _sleep_until(wall0 + (t - live_from_s) / pace)
            self.now = t
            if lock is None:
                handlers[kind](x, y)
            else:
                with lock:
                    handlers[kind](x, y)
            if progress is not None and t >= next_progress:
                progress(t)
                next_progress = t + 60.0
            if self._open == 0 and ai >= n_arr:
                break  # every request is recorded: only stale timeouts, ticks, later faults left
        end = self.now
        for rep in self.reps.values():
            rep.stop_busy(end)
        return SimResult(
            rows=self.rows,
            replicas={rid: self._replica_stats(rep, end) for rid, rep in self.reps.items()},
            faults=list(faults),
            start_ms=start_ms,
            end_s=end,
            wall_s=time.perf_counter() - wall0,
            heap_events=popped + n_arr,
            router=self.router.snapshot(),
        )

    def _policy(self, pool: str) -> str:
        """``RequestEvent.policy``: the pool's schedule when the control plane set one."""
        if self.distill is not None:
            schedule = self.distill.schedule_in_force(pool)
            if schedule is not None:
                return schedule.name
        return self.cfg.temperature_policy

    # -- request path ----------------------------------------------------------------------------
    def _on_arrival(self, r: Req) -> None:
        """The gateway receives a request: the same admission steps as ``exporters/gateway.py``
        (in-flight cap -> rejected; wait for an upstream slot; pick; dispatch). Its per-client
        bound (``gateway.client_share``) is not modelled: arrivals carry no client address (a
        unit is a session, not a peer), and the bound's 429 records no RequestEvent; a replayed
        trace never has one client holding a share of ``max_in_flight``."""
        cfg, rng = self.cfg, self.rng
        self._open += 1
        pool = self._pools[0] if len(self._pools) == 1 else self._pools[_draw(self._pool_cum, rng.random())]
        shed = self.shed
        if shed is not None and shed.active and shed.sheds(pool, r.class_):  # the gateway's 429 shed_by_slo
            self._open -= 1
            key = (pool, r.class_)
            self.shed_counts[key] = self.shed_counts.get(key, 0) + 1
            return
        role = None
        if cfg.student_share is not None:
            role = "student" if rng.random() < cfg.student_share else "teacher"
        unit = r.unit or r.trace_id
        share = None  # an A/B arm's student share, over the pool's
        if cfg.rollout is not None:  # the gateway's A/B step: the unit's arm and its strategy
            a = cfg.rollout.assign(pool, unit)
            r.arm = a.label
            s = a.strategy
            if s is not None:
                pool = s.pool or pool
                r.route_policy = s.route_policy
                share = s.student_share_pct
                if s.schedule is not None:
                    r.policy = s.schedule.name
        if share is not None:
            role = role_for_share(pool, unit, share)
        elif role is None and self.distill is not None:  # the pool's share, deterministic per unit, as in the gateway
            role = self.distill.role_for(pool, unit)
        r.pool, r.role = pool, role
        t = self.now
        if self._open - 1 >= cfg.max_in_flight:  # this one not counted yet
            self._record(r, None, names.STATUS_REJECTED, t)
            return
        self._push(t + cfg.timeout_s, _TIMEOUT, r)  # the gateway's timeout covers the slot wait
        if self._slots < cfg.max_concurrency:
            self._dispatch(r)
        else:
            self._gw_queue.append(r)

    def _dispatch(self, r: Req) -> None:
        cfg = self.cfg
        t = self.now
        self._slots += 1
        r.dispatch_t = t
        try:
            # the key's role if the pool has replicas of it, else any replica (as the gateway)
            if r.role is not None and self.router.has_role(r.pool, r.role):
                try:
                    rep_id = self._pick(r, r.role)
                except NoReplicaAvailable:  # every replica of that role excluded: any role
                    rep_id = self._pick(r, None)
            else:
                rep_id = self._pick(r, None)
        except NoReplicaAvailable:  # the gateway answers 503: status error, replica "none"
            self._record(r, None, names.STATUS_ERROR, t)
            return
        rep = self.reps[rep_id]
        r.rep = rep
        r.ahead = self.router.begin(rep_id, r.prompt)
        self._transit[rep_id].append(r)
        net = cfg.net_delay_s
        out_delay, r.net_back = net, net
        if self._jitter:
            out_delay += self._jitter_delay(rep_id)
            r.net_back += self._jitter_delay(rep_id)
        self._push(t + out_delay, _DELIVER, r)

    def _pick(self, r: Req, role: str | None) -> str:
        """The router's pick, or the oracle's among the replicas the router would consider."""
        if not self._oracle or (r.route_policy is not None and r.route_policy != names.ORACLE_POLICY):
            # the prompt size the gateway reads from the request body, as the gateway passes it
            return self.router.pick(r.pool, role=role, policy=r.route_policy, prompt_tokens=r.prompt).id
        reps = [self.reps[x.id] for x in self.router.eligible(r.pool, role=role)]
        best = oracle.pick(reps, r.prompt, r.output, self.now, self._transit)
        if best is None:
            raise NoReplicaAvailable(f"pool {r.pool!r}: no replica available")
        return best.id

    def _release(self) -> None:
        """A gateway slot freed: dispatch queued requests (a loop, not recursion: a dispatch that
        fails at once frees its slot again)."""
        if self._releasing:
            return
        self._releasing = True
        try:
            q, cap = self._gw_queue, self.cfg.max_concurrency
            while q and self._slots < cap:
                r = q.popleft()
                if not r.done:
                    self._dispatch(r)
        finally:
            self._releasing = False
        self._ran = False

    def _on_deliver(self, r: Req, _: Any) -> None:
        rep = r.rep
        assert rep is not None
        self._transit[rep.id].remove(r)
        if r.done:
            return
        t = self.now
        if not rep.up:  # connection refused
            self._fail(r, t + r.net_back)
            return
        r.engine_t = t
        rep.waiting.append(r)
        self._kick(rep, t)

    def _kick(self, rep: ReplicaSim, t: float) -> None:
        """Let the replica react at its next iteration boundary (now, if idle)."""
        if rep.busy:
            end = rep.interrupt(t)
            if end is not None:
                self._push(end, _STEP, rep, rep.version)
        else:
            self._plan(rep, t)

    def _plan(self, rep: ReplicaSim, t: float) -> None:
        end = rep.plan(t)
        if rep.failed:
            for r in rep.failed:
                self._fail(r, t + r.net_back)
            rep.failed.clear()
        if end is not None:
            self._push(end, _STEP, rep, rep.version)

    def _on_step(self, rep: ReplicaSim, version: int) -> None:
        if version != rep.version or not rep.up:
            return
        t = self.now
        newcomers = rep.prefill  # they make their first token in this segment
        for r in rep.advance():
            if not r.done:
                self._push(t + r.net_back, _FINISH, r)
        for r in newcomers:  # the router hears of a first token as the gateway would (its TTFT)
            if r.ahead is not None and r.first_t is not None and not r.done and r.dispatch_t is not None:
                self.router.first_token(rep.id, (r.first_t + r.net_back - r.dispatch_t) * 1000.0,
                                        prompt_tokens=r.prompt, ahead_tokens=r.ahead)
                r.ahead = None
        self._plan(rep, t)

    def _on_finish(self, r: Req, status: str | None) -> None:
        if not r.done:
            self._record(r, r.rep, status or names.STATUS_OK, self.now)

    def _on_timeout(self, r: Req, _: Any) -> None:
        if r.done:
            return
        rep = r.rep
        self._record(r, rep, names.STATUS_TIMEOUT, self.now)
        if rep is not None and not r.dead:
            r.dead = True
            if r in rep.running:
                rep.n_dead += 1
                self._kick(rep, self.now)  # free its KV at the next boundary

    def _fail(self, r: Req, at: float) -> None:
        """Error outcome, seen by the gateway at ``at`` (now plus the way back)."""
        r.dead = True
        if not r.done:
            self._push(at, _FINISH, r, names.STATUS_ERROR)

    # -- outcomes --------------------------------------------------------------------------------
    def _record(self, r: Req, rep: ReplicaSim | None, status: str, t: float) -> None:
        """The gateway's view of the outcome: queue = arrival -> dispatch, TTFT and E2E from
        arrival; the router is told dispatch-relative times, as the gateway does."""
        r.done = True
        self._open -= 1
        arrival = r.arrival
        e2e_ms = round((t - arrival) * 1000.0, 3)
        first = None if r.first_t is None or r.first_t + r.net_back > t else r.first_t + r.net_back
        ttft_ms = None if first is None else min(e2e_ms, round((first - arrival) * 1000.0, 3))
        dispatch = r.dispatch_t
        queue_ms = min(e2e_ms, round(((t if dispatch is None else dispatch) - arrival) * 1000.0, 3))
        out_tokens = r.gen if status != names.STATUS_OK else r.output
        rid = rep.id if rep is not None else names.NO_REPLICA
        arm = r.arm or self.cfg.arm
        self.rows.append(RequestRow(arrival, t, rid, r.pool, status, r.prompt, out_tokens,
                                    queue_ms, ttft_ms, e2e_ms, r.preempted, arm, r.itl_n, r.itl_sum * 1000.0))
        if rep is not None and dispatch is not None:
            self.router.end(rep.id, (t - dispatch) * 1000.0, ok=status == names.STATUS_OK,
                            ttft_ms=None if first is None else (first - dispatch) * 1000.0, output_tokens=out_tokens,
                            prompt_tokens=r.prompt if r.ahead is not None else None)  # no first token told
        if dispatch is not None:
            self._slots -= 1
            self._release()
        sink = self.sink
        if sink is not None:
            n = r.itl_n
            if n:
                mean = r.itl_sum / n
                std = math.sqrt(max(0.0, r.itl_sq / n - mean * mean))
                mean_ms = round(mean * 1000.0, 4)
                itl = ItlSummary(n, mean_ms, round(std * 1000.0, 4), max(mean_ms, round(r.itl_max * 1000.0, 4)))
            else:
                itl = ItlSummary(0, 0.0, 0.0, 0.0)
            model = rep.spec.name if rep is not None else r.pool
            sink.request(RequestEvent(
                ts_ms=self.start_ms + round(t * 1000.0), trace_id=r.trace_id, model=model,
                pool=r.pool, replica=rid, arm=arm, policy=r.policy or self._policy(r.pool),
                prompt_tokens=r.prompt, output_tokens=out_tokens, queue_ms=queue_ms,
                ttft_ms=ttft_ms, itl_ms=itl, e2e_ms=e2e_ms, status=status, tenant=r.tenant, class_=r.class_,
            ))

    # -- faults ----------------------------------------------------------------------------------
    def _jitter_delay(self, rep_id: str) -> float:
        extra = 0.0
        for f in self._jitter:
            if f.factor > 0 and (f.replica == ALL_REPLICAS or f.replica == rep_id):
                extra += self.rng.expovariate(1.0 / f.factor)
        return extra

    def _apply(self, rep: ReplicaSim) -> None:
        """Recompute a replica's slowdown and KV capacity from the active faults (gradual
        ones at their strength now)."""
        slow, share = 1.0, 1.0
        t = self.now
        for f in self._active:
            if f.replica == rep.id:
                slow *= f.slow_at(t)
                share = min(share, f.kv_share_at(t))
        rep.slow = slow
        rep.kv_cap = max(1, int(rep.spec.kv_capacity_tokens * share))
        if rep.up:
            self._kick(rep, self.now)

    def _on_fault_on(self, f: Fault, _: Any) -> None:
        self._active.append(f)
        if f.kind in LOAD_KINDS:  # already in the arrivals (workload.surge)
            return
        if f.kind == "jitter":
            self._jitter.append(f)
            return
        rep = self.reps[f.replica]
        if f.kind == "crash":
            t = self.now
            rep.up = False
            rep.stop_busy(t)
            for r in rep.crash():
                self._fail(r, t + r.net_back)
            self._push(t + self.cfg.detect_s, _HEALTH, rep, True)
            return
        self._apply(rep)

    def _on_fault_off(self, f: Fault, _: Any) -> None:
        self._active.remove(f)
        if f.kind in LOAD_KINDS:
            return
        if f.kind == "jitter":
            self._jitter.remove(f)
            return
        rep = self.reps[f.replica]
        if f.kind == "crash":
            rep.up = True
            self._push(self.now + self.cfg.detect_s, _HEALTH, rep, False)
            self._apply(rep)
            return
        self._apply(rep)

    def _on_health(self, rep: ReplicaSim, drain: bool) -> None:
        """The simulated health checker takes a dead replica out of rotation and puts it back when
        it is up; an operator's drain (the alert receiver, through the control API) is another
        flag, so a replica back up stays drained until the operator restores it."""
        if drain and not rep.up:
            try:
                self.router.set_down(rep.id, True)
            except LastReplicaError:
                self.drain_refused += 1
        elif not drain and rep.up:
            self.router.set_down(rep.id, False)

    # -- periodic: GPU samples and queue probes --------------------------------------------------
    def _on_tick(self, next_gpu: float, next_probe: float) -> None:
        t = self.now
        cfg = self.cfg
        if cfg.gpu_interval_s > 0 and t >= next_gpu - 1e-9:
            self._sample_gpus(t)
            next_gpu = t + cfg.gpu_interval_s
        if cfg.probe_s > 0 and t >= next_probe - 1e-9:
            for rep in self.reps.values():
                if rep.up:
                    self.router.observe(rep.id, queue_length=rep.queue_length())
            next_probe = t + cfg.probe_s
        nxt = min(next_gpu if cfg.gpu_interval_s > 0 else math.inf,
                  next_probe if cfg.probe_s > 0 else math.inf)
        if self._gradual_run:
            for rid in {f.replica for f in self._active if f.kind in GRADUAL}:
                rep = self.reps[rid]
                if rep.up:
                    self._apply(rep)
            nxt = min(nxt, t + GRADUAL_STEP_S)
        self._push(nxt, _TICK, next_gpu, next_probe)

    def _on_scrape(self, _a: Any, _b: Any) -> None:
        """Each up replica's engine state, as a scrape of its ``vllm:*`` gauges reads it, given
        to the router; held there until the next scrape (a down replica's scrape fails: its
        last record ages out)."""
        t = self.now
        for rep in self.reps.values():
            if rep.up:
                self.router.update_engine(
                    rep.id, waiting=sum(1 for r in rep.waiting if not r.dead),
                    running=sum(1 for r in rep.running if not r.dead),
                    kv_usage=min(1.0, rep.kv_at(t) / max(1, rep.kv_cap)), at=t)
        self._push(t + self.cfg.engine_scrape_s, _SCRAPE)

    def _on_tokens(self, told: dict[str, tuple[int, float]], _b: Any) -> None:
        """The tokens each replica streamed since the last call (past each stream's first) and
        their gaps, told to the router as the gateway relays them (``told``: what was told)."""
        t = self.now
        for rep in self.reps.values():
            n, gap = rep.decoded_at(t)
            n0, gap0 = told.get(rep.id, (0, 0.0))
            if n > n0 and rep.up:
                self.router.tokens(rep.id, n - n0, gap - gap0)
            told[rep.id] = (n, gap)
        self._push(t + TOKENS_S, _TOKENS, told)

    def _sample_engines(self, t: float) -> None:
        """Each up replica's engine gauges and preemption counter at ``t`` (see :meth:`run`)."""
        out = self.engine_sink
        if out is None:
            return
        ts_ms = self.start_ms + round(t * 1000.0)
        for rep in self.reps.values():
            if rep.up:
                out(EngineSample(
                    ts_ms=ts_ms, replica=rep.id, pool=rep.pool, engine=names.ENGINE_VLLM,
                    waiting=float(sum(1 for r in rep.waiting if not r.dead)),
                    running=float(sum(1 for r in rep.running if not r.dead)),
                    kv_usage=min(1.0, rep.kv_at(t) / max(1, rep.kv_cap)), kv_blocks_total=None, kv_block_size=None,
                    kv_capacity_tokens=rep.kv_cap, preemptions_total=float(rep.preemptions),
                    prefix_cache_hits_total=None, prefix_cache_queries_total=None, prefix_cache_hit_rate=None,
                    lora_adapters=None, counter_reset=0, ttft=None, itl=None, e2e=None, queue=None))

    def _sample_gpus(self, t: float) -> None:
        self._sample_engines(t)
        sink, cfg = self.sink, self.cfg
        for rep in self.reps.values():
            busy = rep.busy_time(t)
            last_t, last_busy = rep.gpu_last
            rep.gpu_last = (t, busy)
            if sink is None or not rep.up:
                continue
            span = t - last_t
            util = min(1.0, max(0.0, (busy - last_busy) / span)) if span > 0 else 0.0
            spec = rep.spec
            total = spec.gpu_mem_bytes
            stolen = (spec.kv_capacity_tokens - rep.kv_cap) * spec.kv_bytes_per_token
            used = min(total, spec.weights_bytes + rep.kv_at(t) * spec.kv_bytes_per_token + stolen)
            heat = sum(THERMAL_RISE_C * f.progress(t) for f in self._active
                       if f.kind == "thermal" and f.replica == rep.id) if self._gradual_run else 0.0
            sink.gpu(GpuSample(
                ts_ms=self.start_ms + round(t * 1000.0), node=f"{cfg.node}-{rep.index // 8}",
                gpu=rep.index % 8, uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'llmsla-sim/{rep.id}')}",
                mem_used_bytes=int(used), mem_total_bytes=total, util=round(util, 4),
                temp_c=round(35.0 + 45.0 * util + heat, 2), power_w=round(spec.idle_w + (spec.tdp_w - spec.idle_w) * util, 1),
            ), spec.name)

    def _replica_stats(self, rep: ReplicaSim, end: float) -> dict[str, Any]:
        spec = rep.spec
        return {
            "model": spec.name, "pool": rep.pool, "role": rep.role,
            "preemptions": rep.preemptions, "iterations": rep.iterations,
            "tokens_out": rep.tokens_out, "busy_s": round(rep.busy_time(end), 3),
            "kv_peak_tokens": rep.kv_peak, "kv_capacity_tokens": spec.kv_capacity_tokens,
            "kv_peak_ratio": round(rep.kv_peak / spec.kv_capacity_tokens, 4),
            "kv_peak_bytes": rep.kv_peak * spec.kv_bytes_per_token,
        }


def _cumulative(weights: list[float]) -> list[float]:
    total, out = 0.0, []
    for w in weights:
        total += w
        out.append(total)
    return [c / total for c in out]


def _draw(cum: list[float], u: float) -> int:
    for i, c in enumerate(cum):
        if u < c:
            return i
    return len(cum) - 1


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
