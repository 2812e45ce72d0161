"""``llmsla stream``: run the windowing job (pyflink is imported only when it runs)."""

from __future__ import annotations

import argparse
import logging

from llmsla import names
from llmsla.config import Config

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
    p.add_argument("--kinds", default=",".join(names.SPOOL_ALL_KINDS), help="comma-separated spool kinds")
    p.add_argument("--fresh", action="store_true", help="ignore existing checkpoints (start from scratch)")
    p.add_argument("--blackhole", action="store_true", help="write into Flink's blackhole sink (engine floor)")
    p.add_argument("--jobmanager", metavar="HOST:PORT", default="",
                   help="submit to a running Flink cluster (its REST address, e.g. the one `llmsla flink start` "
                        "prints) instead of a local mini-cluster; waits for the job and serves /metrics meanwhile")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla import extras

    extras.require("stream", "llmsla stream")
    from llmsla.errors import CliError
    from llmsla.store import open_store
    from llmsla.store.connection import StoreError
    from llmsla.streaming.health import serving
    from llmsla.streaming.job import JobOptions, parse_jobmanager, root_cause, run, running_jobs

    logging.getLogger().setLevel(logging.INFO)  # the handler (scrubbed) is set up by llmsla.app.cli
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in names.SPOOL_ALL_KINDS]
    if unknown or not kinds:
        raise CliError(f"--kinds: unknown kind {unknown[0] if unknown else '(none)'!r}; known: {', '.join(names.SPOOL_ALL_KINDS)}")
    if cfg.stream.source == "kafka" and not cfg.stream.kafka_jar:
        raise CliError("stream.source = kafka needs stream.kafka_jar (flink-sql-connector-kafka jar) and stream.kafka_bootstrap")
    if args.jobmanager:
        try:
            parse_jobmanager(args.jobmanager)
        except ValueError as exc:
            raise CliError(f"--jobmanager: {exc}") from None
        try:
            busy = running_jobs(args.jobmanager)
        except (OSError, ValueError) as exc:  # refused, timed out, or an answer that is not Flink's JSON
            raise CliError(f"--jobmanager {args.jobmanager}: no Flink REST endpoint answers there "
                           f"({getattr(exc, 'reason', None) or exc}); start one with `llmsla flink start`") from None
        if busy and not args.blackhole:  # two jobs would read one spool and race on its windows
            ids = ", ".join(f"{j['jid']} ({j['state']})" for j in busy)
            raise CliError(f"--jobmanager {args.jobmanager}: the stream job already runs there: {ids}; "
                           f"cancel it first (flink cancel, or PATCH /jobs/<id>?mode=cancel)")
    store = None
    if not args.blackhole:
        try:
            store = open_store(cfg)
        except StoreError as exc:
            raise CliError(str(exc)) from None
    opts = JobOptions(bounded=args.once, sink="blackhole" if args.blackhole else "store", kinds=kinds,
                      resume=not args.fresh, dsn=store.dsn if store else "",
                      local=not args.jobmanager, jobmanager=args.jobmanager)
    for kind in kinds:
        (cfg.spool_dir() / kind).mkdir(parents=True, exist_ok=True)
    try:
        with serving(cfg, store):
            run(cfg, opts)
    except Exception as exc:  # Py4J wraps the Java failure; print its cause on one line
        if type(exc).__name__ in ("Py4JJavaError", "Py4JError"):
            raise CliError(f"stream job failed: {root_cause(exc)}") from None
        raise
    finally:
        if store is not None:  # an embedded server this job started stops with it
            store.close()
    return 0
