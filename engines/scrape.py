"""The scraper: every replica's /metrics every ``engine.scrape_interval_s``, each on its own task.

A scrape is bounded in time (``engine.timeout_s`` for connect, headers and body together) and in
size (``engine.max_bytes``, read in chunks and cut off past the limit), so a replica that hangs or
streams forever costs its own task one timeout and nothing else: the other replicas' scrapes run
on their own schedule. A failed scrape marks the replica down and retries it after
``scrape_interval_s * 2**(failures-1)``, capped at ``engine.backoff_max_s``; the first success
brings it back to the normal interval. Replicas start spread over one interval so that N of them
are not fetched in one burst, on a grid of :data:`TICKS_PER_INTERVAL` ticks: the replicas due
at one tick start together (one wake-up of the process for them all).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmsla import names
from llmsla.config import Config

from .adapt import READS, UnknownEngine, snapshot
from .httpget import Client, FetchError
from .parse import ParseError, is_openmetrics, kept_runs, parse, same_kept
from .record import EngineSnapshot, ReplicaState

log = logging.getLogger(__name__)

#: What a scrape asks for: OpenMetrics first (its ``# EOF`` makes a truncated body an error), the
#: Prometheus text format otherwise. ``escaping=allow-utf-8`` keeps names as the engine wrote
#: them: prometheus-client >= 0.22 (what vLLM, SGLang and trtllm-serve expose through) answers a
#: bare OpenMetrics Accept with ``escaping=underscores``, which rewrites the sample names
#: (``vllm_num_requests_running``) but not their ``# TYPE vllm:...`` lines, a body no parser reads.
ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.9,"
          "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
#: Bodies up to this size are parsed on the event loop, longer ones in a worker thread.
INLINE_PARSE_CHARS = 256 * 1024


@dataclass(frozen=True)
class Target:
    """One replica to scrape: its id and pool (the labels of everything it yields), the full URL
    of its metrics endpoint and the engine type to read it as (``auto``: by metric prefix)."""

    replica: str
    pool: str
    url: str
    engine: str = names.ENGINE_AUTO


class ScrapeError(Exception):
    """A failed scrape; ``reason`` is one of ``names.ENGINE_FAIL_REASONS``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class TargetStatus:
    """A replica's scrape state, as the scraper and ``/metrics`` see it."""

    up: bool = False
    failures: int = 0  # consecutive
    last_error: str = ""
    last_reason: str = ""
    last_duration_s: float = 0.0
    delay_s: float = 0.0  # until the next scrape, as last scheduled
    scrapes: int = 0
    state: ReplicaState = field(default_factory=ReplicaState)


OnSample = Callable[[Target, EngineSnapshot, float, float], None]  # target, snapshot, preempted, seconds
OnFailure = Callable[[Target, ScrapeError, float], None]  # target, error, seconds


#: Scrapes start on a grid of this many ticks per ``scrape_interval_s``: the replicas due at
#: one tick start together, so the process wakes about this many times an interval instead of
#: twice per replica. A wake-up of an idle process costs more CPU than the GET's own Python
#: (bench/engines.py: at 256 replicas a second, 4.4 % of a core for the GETs spread out, 2 %
#: on 10 ticks). The replicas stay spread over the ticks of one interval.
TICKS_PER_INTERVAL = 10


def _json_hint(raw: bytes) -> str:
    """What a JSON body at the metrics path most likely is, and where the exposition is."""
    if raw.lstrip()[:1] not in (b"[", b"{"):
        return ""
    return (" (a JSON body: trtllm-serve answers /metrics with its iteration stats and serves Prometheus "
            f"metrics at {names.ENGINE_METRICS_PATHS[names.ENGINE_TRTLLM]}: set engine.types POOL=trtllm or --path)")


def on_tick(t: float, tick_s: float) -> float:
    """``t`` (loop time) moved to the nearest tick of the grid every ``tick_s`` seconds."""
    return round(t / tick_s) * tick_s


def next_due(due: float, delay_s: float, now: float, tick_s: float) -> float:
    """When a replica's next scrape is due: ``delay_s`` after the tick its last one was due at,
    not after the moment it started, so a busy loop that starts scrapes late does not move the
    replicas onto later ticks until they bunch on a few. Slots that passed while a scrape ran or
    the loop stalled are skipped but the latest, which is taken at once (still on the grid)."""
    nxt = due + delay_s
    if nxt < now:
        nxt += math.floor((now - nxt) / delay_s) * delay_s
    return on_tick(nxt, tick_s)


def backoff_s(failures: int, interval_s: float, cap_s: float) -> float:
    """Delay before the next try after ``failures`` consecutive failures (>= 1)."""
    return min(cap_s, interval_s * 2.0 ** min(failures - 1, 30))


class Scraper:
    """Scrapes ``targets`` until stopped; ``on_sample`` / ``on_failure`` get every outcome."""

    def __init__(self, cfg: Config, targets: Sequence[Target], *, on_sample: OnSample | None = None,
                 on_failure: OnFailure | None = None) -> None:
        ids = [t.replica for t in targets]
        if len(set(ids)) != len(ids):
            raise ValueError("replica ids must be unique")
        self.cfg = cfg
        self.targets = list(targets)
        self.status: dict[str, TargetStatus] = {t.replica: TargetStatus() for t in self.targets}
        self.on_sample = on_sample
        self.on_failure = on_failure
        self.on_remove: Callable[[Target], None] | None = None
        self._session: Client | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # -- membership --------------------------------------------------------------------------------
    def sync(self, targets: Sequence[Target]) -> tuple[list[str], list[str]]:
        """Make ``targets`` the scraped set (discovery): a new one is scraped at once, one no
        longer named stops being scraped and ``on_remove`` forgets its series; one whose URL,
        pool or engine changed under the same id starts over. Returns (added, removed) ids."""
        want = {t.replica: t for t in targets}
        if len(want) != len(targets):
            raise ValueError("replica ids must be unique")
        have = {t.replica: t for t in self.targets}
        removed = [rid for rid, t in have.items() if want.get(rid) != t]
        added = [rid for rid, t in want.items() if have.get(rid) != t]
        for rid in removed:
            task = self._tasks.pop(rid, None)
            if task is not None:
                task.cancel()
            del self.status[rid]
            if self.on_remove is not None:
                self.on_remove(have[rid])
        self.targets = list(targets)
        for rid in added:
            self.status[rid] = TargetStatus()
            if self._stop is not None:
                self._start(want[rid], 0.0)
        return added, [rid for rid in removed if rid not in want]

    def _start(self, target: Target, phase_s: float) -> None:
        assert self._stop is not None
        self._tasks[target.replica] = asyncio.create_task(self._loop(target, self._stop, phase_s),
                                                          name=f"engine-scrape-{target.replica}")

    # -- one scrape ------------------------------------------------------------------------------
    async def fetch(self, target: Target) -> tuple[bytes, str | None]:
        """(body, Content-Type) of one bounded GET; :class:`ScrapeError` on any failure."""
        e = self.cfg.engine
        client = self._session
        assert client is not None, "fetch runs inside run() or scrape_all_once()"
        try:
            async with asyncio.timeout(e.timeout_s):
                resp = await client.get(target.url)
        except TimeoutError:
            raise ScrapeError(names.ENGINE_FAIL_TIMEOUT, f"no complete answer in engine.timeout_s {e.timeout_s} s") from None
        except FetchError as exc:
            hint = ""
            if target.engine == names.ENGINE_TRTLLM and exc.status == 404:
                hint = " (trtllm-serve mounts its Prometheus metrics only with return_perf_metrics enabled)"
            raise ScrapeError(exc.reason, f"{exc}{hint}") from None
        return resp.body, resp.content_type

    async def scrape(self, target: Target) -> tuple[EngineSnapshot, float]:
        """Fetch, parse and adapt one replica; the snapshot has the replica's counter state
        applied (hit rate over the interval, resets) and comes with the preemptions since the
        previous one."""
        ts = time.time()
        state = self.status[target.replica].state  # this target's, even if it is replaced meanwhile
        raw, ctype = await self.fetch(target)
        read_as = (target.engine, target.replica, target.pool)
        # a usual exposition (tens of KB) is read in well under a millisecond: in the loop, as a
        # thread hop would cost more; a large one in a worker thread
        inline = len(raw) <= INLINE_PARSE_CHARS
        om = is_openmetrics(ctype)
        snap = None
        if state.repeats and inline and ctype == state.content_type and state.raw is not None and same_kept(
                state.raw, raw, om, READS):  # only lines of other families moved: the same runs
            snap = state.adapted_again(state.kept, ctype, read_as, ts)
        if snap is None:
            try:
                body = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ScrapeError(names.ENGINE_FAIL_PARSE, f"not UTF-8 at byte {exc.start}") from None
            runs = kept_runs(body, om, READS) if inline else await asyncio.to_thread(kept_runs, body, om, READS)
            snap = state.adapted_again(runs, ctype, read_as, ts)
        if snap is not None:  # the engine's families as the last scrape read them: the same record, at this time
            state.raw, state.repeats = raw, True
            return state.update(snap)
        try:
            expo = (parse(body, ctype, READS, state.reuse, runs) if inline
                    else await asyncio.to_thread(parse, body, ctype, READS, state.reuse, runs))
            snap = snapshot(expo, target.engine, replica=target.replica, pool=target.pool, ts=ts)
        except ParseError as exc:
            raise ScrapeError(names.ENGINE_FAIL_PARSE, f"{exc}{_json_hint(raw)}") from None
        except UnknownEngine as exc:
            raise ScrapeError(names.ENGINE_FAIL_UNKNOWN_ENGINE, f"{exc}{_json_hint(raw)}") from None
        state.keep_adapted(raw, expo.kept, ctype, read_as, snap)
        return state.update(snap)

    async def scrape_all_once(self) -> dict[str, tuple[EngineSnapshot, float] | ScrapeError]:
        """Every target once, concurrently (``llmsla engines --once``)."""
        async with self._session_ctx():
            results = await asyncio.gather(*(self._one(t) for t in self.targets))
        return {t.replica: r for t, r in zip(self.targets, results, strict=True)}

    async def _one(self, target: Target) -> tuple[EngineSnapshot, float] | ScrapeError:
        st = self.status[target.replica]
        start = time.monotonic()
        try:
            snap, preempted = await self.scrape(target)
        except ScrapeError as exc:
            st.up, st.failures, st.last_error, st.last_reason = False, st.failures + 1, str(exc), exc.reason
            st.last_duration_s = time.monotonic() - start
            if st.failures == 1 or st.failures % 10 == 0:
                log.warning("engine %s (%s): scrape failed (%s, %d in a row): %s", target.replica, target.url,
                            exc.reason, st.failures, exc)
            if self.on_failure is not None and self.status.get(target.replica) is st:  # not removed meanwhile
                self.on_failure(target, exc, st.last_duration_s)
            return exc
        st.up, st.failures, st.last_error, st.last_reason = True, 0, "", ""
        st.last_duration_s = time.monotonic() - start
        st.scrapes += 1
        if self.on_sample is not None and self.status.get(target.replica) is st:
            self.on_sample(target, snap, preempted, st.last_duration_s)
        return snap, preempted

    # -- the loop --------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _session_ctx(self) -> Any:
        if self._session is not None:
            yield self._session
            return
        # kept connections, one per replica in use; no proxy from the environment; no
        # compression asked for (a gzip bomb would pass the size check decompressed)
        client = Client(self.cfg.engine.max_bytes, ACCEPT)
        self._session = client
        try:
            yield client
        finally:
            self._session = None
            client.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape every target on its own schedule until ``stop`` is set."""
        async with self._session_ctx():
            self._stop = stop
            n = max(1, len(self.targets))
            for i, t in enumerate(self.targets):
                self._start(t, i / n * self.cfg.engine.scrape_interval_s)
            try:
                await stop.wait()
            finally:
                self._stop = None
                tasks = list(self._tasks.values())
                self._tasks.clear()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, target: Target, stop: asyncio.Event, phase_s: float) -> None:
        e = self.cfg.engine
        st = self.status[target.replica]
        loop = asyncio.get_running_loop()
        tick = e.scrape_interval_s / TICKS_PER_INTERVAL
        due = on_tick(loop.time() + phase_s, tick)
        while not stop.is_set():
            wait = due - loop.time()
            if wait > 0:
                # a plain sleep: run() cancels every loop when stop is set, and a wait_for on the
                # shared event cost a task and an O(replicas) waiter removal per scrape
                await asyncio.sleep(wait)
                if stop.is_set():
                    return
            try:
                await self._one(target)
            except Exception:  # a bug in an adapter must not end this replica's loop
                log.exception("engine %s: scrape crashed", target.replica)
                st.up, st.failures = False, st.failures + 1
            st.delay_s = e.scrape_interval_s if st.up else backoff_s(st.failures, e.scrape_interval_s, e.backoff_max_s)
            due = next_due(due, st.delay_s, loop.time(), tick)
