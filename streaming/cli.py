"""``llmsla stream``: run the windowing job (pyflink is imported only when it runs)."""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from llmsla import names
from llmsla.config import Config

if TYPE_CHECKING:
    from llmsla.store.connection import StoreHandle

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "stream",
        help="run the PyFlink job: spool -> event-time windows -> store",
        description=(
            "Reads the spool (or Kafka with stream.source = kafka), computes 5 s request, 60 s "
            "policy and 5 s GPU windows in event time and upserts them into the store; bad and "
            "late records go to dead_letters. Resumes from the newest checkpoint in "
            "stream.checkpoint_dir."
        ),
    )
    p.add_argument("--once", action="store_true", help="process what is in the spool now, then exit")
    p.add_argument("--kinds", default=",".join(names.SPOOL_KINDS), help="comma-separated spool kinds")
    p.add_argument("--fresh", action="store_true", help="ignore existing checkpoints (start from scratch)")
    p.add_argument("--blackhole", action="store_true", help="write into Flink's blackhole sink (engine floor)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla import extras

    extras.require("stream", "llmsla stream")
    from llmsla.errors import CliError
    from llmsla.store import open_store
    from llmsla.store.connection import StoreError
    from llmsla.streaming.job import JobOptions, root_cause, run

    logging.getLogger().setLevel(logging.INFO)  # the handler (scrubbed) is set up by llmsla.app.cli
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in names.SPOOL_KINDS]
    if unknown or not kinds:
        raise CliError(f"--kinds: unknown kind {unknown[0] if unknown else '(none)'!r}; known: {', '.join(names.SPOOL_KINDS)}")
    if cfg.stream.source == "kafka" and not cfg.stream.kafka_jar:
        raise CliError("stream.source = kafka needs stream.kafka_jar (flink-sql-connector-kafka jar) and stream.kafka_bootstrap")
    store = None
    if not args.blackhole:
        try:
            store = open_store(cfg)
        except StoreError as exc:
            raise CliError(str(exc)) from None
    opts = JobOptions(bounded=args.once, sink="blackhole" if args.blackhole else "store", kinds=kinds,
                      resume=not args.fresh, dsn=store.dsn if store else "")
    for kind in kinds:
        (cfg.spool_dir() / kind).mkdir(parents=True, exist_ok=True)
    try:
        with _serving_health(cfg, store):
            run(cfg, opts)
    except Exception as exc:  # Py4J wraps the Java failure; print its cause on one line
        if type(exc).__name__ in ("Py4JJavaError", "Py4JError"):
            raise CliError(f"stream job failed: {root_cause(exc)}") from None
        raise
    return 0


@contextlib.contextmanager
def _serving_health(cfg: Config, store: StoreHandle | None) -> Iterator[None]:
    """``/metrics`` with the dead-letter counter and window lag (streaming/health.py) on
    stream.metrics_host:port while the job runs; the blackhole run stores nothing to report."""
    if store is None:
        yield
        return
    from aiohttp import web

    from llmsla.errors import CliError
    from llmsla.httpkit import BackgroundServer, add_metrics
    from llmsla.streaming.health import registry_for

    app = web.Application()
    add_metrics(app, registry_for(store))
    bg = BackgroundServer()
    try:
        try:
            served = bg.serve(app, cfg.stream.metrics_host, cfg.stream.metrics_port)
        except OSError as exc:
            raise CliError(f"{cfg.origin('stream.metrics_port')}: cannot listen on "
                           f"{cfg.stream.metrics_host}:{cfg.stream.metrics_port}: {exc.strerror or exc}") from None
        log.info("stream metrics on http://%s:%d/metrics", cfg.stream.metrics_host, served.port)
        yield
    finally:
        bg.close()
