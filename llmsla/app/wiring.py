"""The composition root's object graphs: every command that runs a gateway, a control plane or
a recorder gets them from these functions, and components take them built.

Why here: ``llmsla.app`` is the one layer allowed to import every component, so the
collaborators that cross components (the control plane the gateway routes with, the recorder
the gateway, the ASGI middleware and the simulator emit through, the store the audit log writes
to) are put together in one place, once per process, and closed by whoever built them. See
docs/architecture.md (who builds what).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor
from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry

from llmsla import discovery, names
from llmsla.config import Config, check_discovery, named_pools
from llmsla.control.audit import AuditLog
from llmsla.control.distill import DistillControls
from llmsla.control.membership import Membership
from llmsla.control.plane import ControlPlane
from llmsla.control.probe import HealthProber
from llmsla.control.rollout import Rollout
from llmsla.control.router import Router
from llmsla.control.router import from_config as router_from_config
from llmsla.control.shed import ShedControls
from llmsla.discovery_metrics import DiscoveryMetrics
from llmsla.exporters import gateway as gateway_mod
from llmsla.exporters.recording import Recorder
from llmsla.replicas import Replica, replicas_from_config
from llmsla.spool import SpoolWriter

log = logging.getLogger(__name__)


def control_plane(cfg: Config, replicas: Iterable[Replica] | None = None, *,
                  registry: CollectorRegistry | None = None, audit: AuditLog | None = None,
                  router: Router | None = None, rollout: Rollout | None = None,
                  shared: Any = "auto") -> ControlPlane:
    """The router of ``replicas`` (default: the configuration's, :func:`replicas_from_config`,
    and with ``gateway.discovery`` file, dns or kubernetes the replicas its source finds at run time)
    with the policy and LADR parameters of ``control.*`` (Redis-shared state when
    ``control.redis_url`` is set, unless ``shared=None``), the pools' distillation controls,
    the load shedding of ``tenants.classes`` and the A/B rollout on it, all auditing to ``audit`` (default: in memory only).
    ``registry``: where the router, distillation and rollout metrics go (None: a registry
    of their own each, which the control API shows). ``router``/``rollout``: ones built already (tests, benches). Close with
    ``ControlPlane.close``."""
    audit = audit if audit is not None else AuditLog()
    check_discovery(cfg)
    source = discovery.source_from_config(cfg) if replicas is None else None
    if router is None:
        reps = replicas_from_config(cfg) if replicas is None else list(replicas)
        router = router_from_config(cfg, reps, registry=registry, shared=shared)
    pools = router.pools()
    if source is not None:  # the configured pools; discovered replicas join them at run time
        pools = list(dict.fromkeys([*named_pools(cfg.gateway), *pools]))
    distill = DistillControls.from_config(cfg, pools, audit=audit, registry=registry, router=router)
    if rollout is None:
        rollout = Rollout.from_config(cfg, audit=audit, registry=registry, router=router)
    prober = HealthProber(router)
    membership = None
    if source is not None:
        membership = Membership(router, source, default_pool=cfg.gateway.pool,
                                interval_s=cfg.gateway.discovery_interval_s, prober=prober,
                                metrics=DiscoveryMetrics.of(cfg.gateway.discovery, registry), pools=pools)
    shed = ShedControls(cfg.tenants.classes, pools, audit=audit, registry=registry, router=router)
    return ControlPlane(router, distill, rollout, audit, prober, membership, shed)


def recorder(cfg: Config, *, registry: CollectorRegistry | None = None, spool: SpoolWriter | None = None,
             span_processor: SpanProcessor | None = None) -> Recorder:
    """Metrics (``registry``), request spool lines (``spool``; None: metrics only), spans and
    OTLP metrics (``otel.*``, or ``span_processor`` in place of OTLP span export)."""
    return Recorder.from_config(cfg, registry=registry, spool=spool, span_processor=span_processor)


def open_spool(cfg: Config, registry: CollectorRegistry | None = None) -> SpoolWriter:
    """The request spool; raises a one-line SpoolError when it cannot take writes (start-up)."""
    return SpoolWriter.from_config(cfg, names.SPOOL_REQUESTS, registry=registry)


def gateway(cfg: Config, *, registry: CollectorRegistry | None = None, spool: SpoolWriter | None = None,
            plane: ControlPlane | None = None, router: Router | None = None, rollout: Rollout | None = None,
            audit: AuditLog | None = None, span_processor: SpanProcessor | None = None) -> gateway_mod.Gateway:
    """A gateway of ``cfg`` with its control plane (built here unless given) and its recorder
    writing to ``spool``. The caller closes a plane built here (``gateway.plane.close()``);
    :func:`start_gateway` does it on stop."""
    if plane is None:
        # router and distillation metrics go where the request metrics go: this gateway's
        # /metrics shows picks, weights, drains and the student share (multi-process: merged)
        exposed = registry if registry is not None else DEFAULT_REGISTRY
        plane = control_plane(cfg, registry=exposed, router=router, rollout=rollout, audit=audit)
    rec = recorder(cfg, registry=registry, spool=spool, span_processor=span_processor)
    background = [engine_signals(cfg, plane.router)] if cfg.gateway.engine_signals else []
    return gateway_mod.Gateway(cfg, plane=plane, recorder=rec, registry=registry, background=background)


def engine_signals(cfg: Config, router: Router, *, path: str | None = None) -> Callable[[asyncio.Event], Awaitable[None]]:
    """``gateway.engine_signals``: a loop that scrapes the router's replicas' own metrics
    with the engine adapters (``engine.*``: interval, timeout, size, engine type per pool or the
    replica's own from its pod label),
    follows the router's replicas as discovery changes them, and hands each sample's queue and
    KV-cache usage to ``Router.update_engine`` (docs/control.md#engine-signals). Built here: the
    gateway may not import the engines; it runs the loop it is given."""
    from llmsla.engines.follow import Follow, metrics_url
    from llmsla.engines.record import EngineSnapshot
    from llmsla.engines.scrape import Scraper, Target

    def replicas() -> list[Target]:
        out = []
        for r in router.replicas():
            if r.url:
                engine = r.engine or cfg.engine.engine_of(r.pool)  # the pod's label first
                out.append(Target(r.id, r.pool, metrics_url(r.url, path, engine), engine))
        return out

    async def resolve() -> list[Target]:
        return replicas()

    def feed(target: Target, snap: EngineSnapshot, _preempted: float, _seconds: float) -> None:
        if snap.waiting is None:  # an engine that does not report its queue: nothing to score
            return
        try:
            router.update_engine(target.replica, waiting=snap.waiting, running=snap.running or 0.0,
                                 kv_usage=snap.kv_usage if snap.kv_usage is not None else 0.0)
        except LookupError:  # left the router meanwhile
            pass
        except ValueError as exc:  # a bad value from the engine: the previous record stays
            log.warning("engine signals of %s ignored: %s", target.replica, exc)

    async def run(stop: asyncio.Event) -> None:
        scraper = Scraper(cfg, [], on_sample=feed)
        follow = Follow(scraper, resolve, interval_s=cfg.engine.scrape_interval_s, describe="the router's replicas")
        await follow.serve(stop)
    return run


async def start_gateway(cfg: Config, host: str | None = None, port: int | None = None, *,
                        registry: CollectorRegistry | None = None, spool: SpoolWriter | None | bool = True,
                        plane: ControlPlane | None = None, router: Router | None = None,
                        rollout: Rollout | None = None, audit: AuditLog | None = None,
                        span_processor: SpanProcessor | None = None,
                        reuse_port: bool = False) -> gateway_mod.RunningGateway:
    """Build and start a gateway on ``host:port`` (port 0 = a free one). ``spool=True`` opens
    the request spool from ``cfg``; pass a writer to share one, or None for metrics only. What
    is opened here (the spool, a control plane not given) is closed when it stops."""
    closers: list[Callable[[], None]] = []
    writer: SpoolWriter | None = None
    if spool is True:
        writer = open_spool(cfg, registry)
        closers.append(writer.close)
    elif spool:
        writer = spool
    try:
        gw = gateway(cfg, registry=registry, spool=writer, plane=plane, router=router, rollout=rollout,
                     audit=audit, span_processor=span_processor)
    except BaseException:
        for close in closers:
            close()
        raise
    if plane is None and router is None:  # a router given stays its owner's to close
        closers.insert(0, gw.plane.close)
    return await gateway_mod.start(gw, host, port, reuse_port=reuse_port, closers=closers)


@contextlib.asynccontextmanager
async def serve_gateway(cfg: Config, host: str | None = None, port: int | None = None,
                        **kw: Any) -> AsyncIterator[gateway_mod.RunningGateway]:
    """``async with serve_gateway(cfg, "127.0.0.1", 0) as gw: gw.url`` - stopped (spool
    flushed, control plane closed) on exit. Keywords as :func:`start_gateway`."""
    gw = await start_gateway(cfg, host, port, **kw)
    try:
        yield gw
    finally:
        await gw.stop()
