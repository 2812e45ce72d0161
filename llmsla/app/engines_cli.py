"""``llmsla engines``: scrape each replica's own /metrics, export ``llmsla_engine_*``, spool
``EngineSample`` lines (docs/engines.md).

A composition-root module: the replicas and their ids come from the gateway's configuration
through the gateway's own function (``r0, r1, ...`` in ``gateway.upstreams``,
``gateway.student_upstreams``, ``gateway.pools`` order), and with ``gateway.discovery`` file or
dns from the gateway's discovery source (ids from addresses, followed as replicas come and go),
so an ``EngineSample``'s ``replica`` is the ``RequestEvent``'s; the scraping itself is
``llmsla.engines``, which imports core only.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from llmsla import argtypes
from llmsla.config import Config


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("engines", help="engine adapters: scrape replicas' /metrics (vLLM, SGLang, "
                                              "trtllm-serve, Triton), /metrics and EngineSample events")
    p.add_argument("--upstream", action="append", metavar="[POOL=]URL",
                   help="replica base URL to scrape instead of the gateway's replicas; repeat "
                        "(ids r0, r1, ... in this order; pool gateway.pool unless POOL= is given)")
    p.add_argument("--type", dest="engine_type", metavar="ENGINE",
                   help="engine type of every replica (auto|vllm|sglang|trtllm|triton), over a pod's engine-type label "
                        "and engine.types")
    p.add_argument("--path", help="metrics path on every replica (default: /metrics; /prometheus/metrics "
                                   "where the pool's engine type is trtllm)")
    p.add_argument("--host", type=argtypes.host, help="listen address (engine.host)")
    p.add_argument("--port", type=argtypes.port0, help="listen port (engine.port); 0 = a free one")
    p.add_argument("--once", action="store_true",
                   help="scrape every replica once, print the EngineSamples as JSON, exit 1 if any failed")
    p.set_defaults(handler=engines_main)


def targets(cfg: Config, upstreams: list[str] | None, engine_type: str | None, path: str | None) -> list[Any]:
    """The replicas to scrape, with the gateway's ids and each pool's engine type."""
    from llmsla import names
    from llmsla.config import ConfigError, split_pool_spec, url_problem
    from llmsla.engines.follow import metrics_url
    from llmsla.engines.scrape import Target
    from llmsla.redaction import redact

    if engine_type is not None and engine_type not in names.ENGINE_TYPES:
        raise ConfigError(f"--type: must be one of {', '.join(names.ENGINE_TYPES)}, got {engine_type!r}")
    if upstreams:
        pairs: list[tuple[str, str, str]] = []
        for spec in upstreams:
            pool, url = cfg.gateway.pool, spec
            if "=" in spec.split("://", 1)[0]:
                try:
                    pool, url = split_pool_spec(spec)
                except ValueError as exc:
                    raise ConfigError(f"--upstream {redact(spec)!r}: {exc}") from None
            elif (problem := url_problem(url)) is not None:
                raise ConfigError(f"--upstream {redact(spec)!r}: {problem}")
            pairs.append((f"r{len(pairs)}", pool, url.rstrip("/")))
    else:
        from llmsla.replicas import replicas_from_config

        pairs = [(r.id, r.pool, r.url) for r in replicas_from_config(cfg)]
    if not pairs and cfg.gateway.discovery == "static":
        raise ConfigError("no replicas: set gateway.upstreams / gateway.pools, gateway.discovery, or pass --upstream URL")
    engines = {pool: engine_type or cfg.engine.engine_of(pool) for _, pool, _ in pairs}
    return [Target(rid, pool, metrics_url(url, path, engines[pool]), engines[pool]) for rid, pool, url in pairs]


def following(cfg: Config, static: list[Any], upstreams: list[str] | None, engine_type: str | None,
              path: str | None) -> tuple[Any, str, str]:
    """(resolve, source label, description): what ``llmsla engines`` follows. ``--upstream`` or
    ``gateway.discovery`` static: the fixed ``static`` targets; file, dns or kubernetes: the
    gateway's source (the static ``gateway.pools`` replicas, r0, r1, ..., stay
    scraped alongside)."""
    from llmsla import discovery
    from llmsla.config import check_discovery
    from llmsla.engines.follow import fixed, from_source

    if upstreams or cfg.gateway.discovery == "static":
        return fixed(static), "static", f"{len(static)} configured replicas"
    check_discovery(cfg)
    source = discovery.source_from_config(cfg)
    assert source is not None  # file, dns or kubernetes
    # --type over the pod's engine-type label over the pool's engine.types
    found = from_source(source, default_pool=cfg.gateway.pool, path=path,
                        engine_of=lambda f: engine_type or f.engine or cfg.engine.engine_of(f.pool))

    async def resolve() -> list[Any]:
        return [*static, *await found()]
    return resolve, cfg.gateway.discovery, source.describe()


def engines_main(args: argparse.Namespace, cfg: Config) -> int:
    from prometheus_client import CollectorRegistry

    from llmsla import names
    from llmsla.discovery_metrics import DiscoveryMetrics
    from llmsla.engines.follow import Follow
    from llmsla.engines.recorder import EngineRecorder
    from llmsla.engines.scrape import ScrapeError, Scraper
    from llmsla.exporters.cli import run_loop
    from llmsla.spool import SpoolWriter

    if args.host is not None:
        cfg.engine.host = args.host
    if args.port is not None:
        cfg.engine.port = args.port
    tgts = targets(cfg, args.upstream, args.engine_type, args.path)
    resolve, source_name, describe = following(cfg, tgts, args.upstream, args.engine_type, args.path)

    if args.once:
        if source_name != "static":
            tgts = run_loop(resolve())
        scraper = Scraper(cfg, tgts)
        results = run_loop(scraper.scrape_all_once())
        out: dict[str, Any] = {}
        for t in tgts:
            r = results[t.replica]
            out[t.replica] = ({"up": False, "reason": r.reason, "error": str(r)} if isinstance(r, ScrapeError)
                              else {"up": True, "sample": r[0].to_event().to_dict()})
        print(json.dumps(out, indent=2))
        return 0 if all(v["up"] for v in out.values()) else 1

    from aiohttp import web

    from llmsla.httpkit import Limits, serve_exporter

    registry = CollectorRegistry()  # this exporter shows the engine series and nothing else
    spool = SpoolWriter.from_config(cfg, names.SPOOL_ENGINE, registry=registry)
    recorder = EngineRecorder(registry=registry, spool=spool)
    scraper = Scraper(cfg, [], on_sample=recorder.sample, on_failure=recorder.failure)
    scraper.on_remove = recorder.forget
    follow = Follow(scraper, resolve, interval_s=cfg.gateway.discovery_interval_s,
                    metrics=DiscoveryMetrics(source_name, registry=registry), describe=describe)

    async def healthz(_request: Any) -> Any:
        return web.json_response({"status": "ok", "replicas": {
            rid: {"up": st.up, "failures": st.failures, "reason": st.last_reason}
            for rid, st in scraper.status.items()}})

    try:
        run_loop(serve_exporter(registry, cfg.engine.host, cfg.engine.port, Limits.from_config(cfg), follow.serve,
                                   banner=lambda url: f"llmsla engines listening on {url}/metrics, "
                                                      + (f"scraping {len(tgts)} replicas" if source_name == "static"
                                                         else f"following {describe}"), healthz=healthz))
    finally:
        spool.close()
    return 0
