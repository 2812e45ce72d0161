"""Replicas that come and go: a discovery source's answers turned into router changes.

Why here: the router (control) owns membership; the sources (core, ``llmsla.discovery``) only
say which replicas exist. Every ``gateway.discovery_interval_s`` this asks the source, and for
each difference from the last answer: a new replica joins *pending* and is probed at once (it
takes traffic after its first healthy answer, ``Router.mark_healthy``); a replica no longer
named is *retired* (no new request, its in-flight ones finish, then it and its gauges are
forgotten); one named again before it drained serves on with its state. A source that cannot
answer, or answers with no replica at all, leaves the set as it was (a missing file, a DNS
outage or a truncated file must not empty the fleet). Ids come from addresses
(``discovery.replica_id``), so the router's state, operator drains and weights, the alert
receiver's per-target state and the ``replica`` label stay with their replica through the churn.
See docs/gateway.md#discovery.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass, field

import aiohttp

from llmsla import names
from llmsla.background import BackgroundTask
from llmsla.control.probe import HealthProber
from llmsla.control.router import Replica, Router
from llmsla.discovery import DiscoveryError, replica_id
from llmsla.discovery_metrics import DiscoveryMetrics
from llmsla.redaction import redact
from llmsla.seams import ReplicaSource

log = logging.getLogger(__name__)


@dataclass
class Change:
    """What one round did (for logs and tests)."""

    joined: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    kept: bool = False  # the source could not answer (or answered nothing): last set kept


class Membership:
    """Keeps the router's discovered replicas equal to the source's answer; see the module
    docstring. Replicas the router had before (a static ``gateway.pools``) are never touched."""

    def __init__(self, router: Router, source: ReplicaSource, *, default_pool: str, interval_s: float,
                 prober: HealthProber | None = None, metrics: DiscoveryMetrics | None = None,
                 pools: Collection[str] | None = None) -> None:
        self.router = router
        #: the pools requests can reach (the gateway's and those ``gateway.pools`` names); a
        #: replica discovered in another one is routed there by no request: said once per pool
        self.pools = None if pools is None else frozenset(pools)
        self._unreached: set[str] = set()
        self.metrics = metrics
        self.source = source
        self.default_pool = default_pool
        self.interval_s = interval_s
        self.prober = prober
        self.managed: set[str] = set()  # ids the last good answer named
        self.rounds = 0
        self.failures = 0
        self._warned: str | None = None
        self._task = BackgroundTask("llmsla-discovery")

    async def sync_once(self, session: aiohttp.ClientSession | None = None) -> Change:
        """Ask the source once and apply the difference; new replicas are probed at once when
        a prober and a session are given."""
        change = await self._sync(session)
        self.publish()
        return change

    async def _sync(self, session: aiohttp.ClientSession | None) -> Change:
        self.rounds += 1
        change = Change()
        try:
            found = await self.source.resolve()
        except DiscoveryError as exc:
            self._warn(f"{self.source.describe()}: {exc}; keeping the last {len(self.managed)} replicas")
            self._failed(exc.reason)
            change.kept = True
            return change
        if not found:
            self._warn(f"{self.source.describe()} names no replica; keeping the last {len(self.managed)}")
            self._failed(names.DISCOVERY_FAIL_EMPTY)
            change.kept = True
            return change
        if self.metrics is not None:
            self.metrics.refreshed()
        self._warned = None
        want: dict[str, Replica] = {}
        for f in found:
            rid = replica_id(f.pool, f.url, self.default_pool)
            want.setdefault(rid, Replica(rid, f.pool, url=f.url, engine=f.engine))
        known = {r.id for r in self.router.replicas()}
        owned: set[str] = set()
        for rid, rep in want.items():
            if rid in known:
                if rid in self.managed or self.router.is_leaving(rid):
                    self.router.rejoin(rid)
                else:  # a static replica of the same id: discovery does not own it
                    log.warning("discovery: %s names %s, already a configured replica; ignored", rid, redact(rep.url))
                    continue
                owned.add(rid)
            else:
                owned.add(rid)
                self.router.add_replica(rep, pending=True)
                change.joined.append(rid)
                log.info("discovery: replica %s (%s, pool %s) joined; it takes traffic after a healthy probe",
                         rid, redact(rep.url), rep.pool)
                if self.pools is not None and rep.pool not in self.pools and rep.pool not in self._unreached:
                    self._unreached.add(rep.pool)
                    log.warning("discovery: replica %s is in pool %r, which the configuration does not name: no "
                                "request goes there; name it in gateway.pools (its name alone) for an A/B arm "
                                "to send units to it", rid, rep.pool)
        for rid in sorted(self.managed - owned):
            if rid in known:
                removed = self.router.retire(rid)
                change.left.append(rid)
                log.info("discovery: replica %s left; %s", rid,
                         "removed (idle)" if removed else "draining its in-flight requests")
        self.managed = owned
        if change.joined and self.prober is not None and session is not None:
            await self.prober.probe_once(session, only=change.joined)
        return change

    def _failed(self, reason: str) -> None:
        self.failures += 1
        if self.metrics is not None:
            self.metrics.failed(reason)

    def states(self) -> list[tuple[str, str]]:
        """(pool, state) of every replica the router knows: probing (joined, no healthy probe
        yet), draining (left the answer, in-flight requests finishing) or serving."""
        out = []
        for rep in self.router.replicas():
            state = (names.DISCOVERY_DRAINING if self.router.is_leaving(rep.id) else
                     names.DISCOVERY_PROBING if self.router.is_pending(rep.id) else names.DISCOVERY_SERVING)
            out.append((rep.pool, state))
        return out

    def publish(self) -> None:
        """Set the replica gauge from the router as it is now (after every round)."""
        if self.metrics is not None:
            self.metrics.set_replicas(self.states(), self.pools or ())

    def _warn(self, msg: str) -> None:
        if msg != self._warned:  # once per distinct problem, not every interval
            log.warning("discovery: %s", msg)
            self._warned = msg

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Re-ask the source every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.sync_once(session)
            except Exception:  # noqa: BLE001 - one bad round must not stop discovery
                log.exception("discovery round failed")
                self._failed(names.DISCOVERY_FAIL_ERROR)

    def start(self, session: aiohttp.ClientSession) -> asyncio.Task[None]:
        """Run in the current event loop (after a first :meth:`sync_once`); ``await stop()``."""
        return self._task.start(self.run(session))

    async def stop(self) -> None:
        await self._task.stop()
