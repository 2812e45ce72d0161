"""Housekeeping subcommands: ``migrate``, ``store``, ``config``, ``schemas``, ``spool``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llmsla import argtypes, events, generated, names, spool
from llmsla import config as config_mod
from llmsla.errors import CliError

if TYPE_CHECKING:
    from llmsla.store import StoreHandle

SCHEMA_DIR = Path("deploy") / "schemas"
CONFIG_DOC = Path("docs") / "config.md"


def render_schemas(cfg: config_mod.Config, root: Path) -> dict[Path, str]:
    """The event contracts' JSON Schemas under ``root``."""
    return {root / fname: text for fname, text in events.render_schemas().items()}


def render_config_doc(cfg: config_mod.Config, root: Path) -> dict[Path, str]:
    """The key reference; ``root`` is the file itself."""
    return {root: config_mod.render_doc()}


SCHEMAS = generated.Generator(
    "schemas", "llmsla schemas", SCHEMA_DIR, render_schemas,
    lambda root: ["-m", "llmsla", "schemas", "--out", str(root), "--check"])
CONFIG_DOCS = generated.Generator(
    "config-doc", "llmsla config doc", CONFIG_DOC, render_config_doc,
    lambda root: ["-m", "llmsla", "config", "doc", "--out", str(root), "--check"])


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("migrate", help="apply store migrations and partition/policy upkeep")
    p.set_defaults(handler=cmd_migrate)

    store = sub.add_parser("store", help="store status and maintenance; start/stop the embedded PostgreSQL")
    ss = store.add_subparsers(dest="store_cmd", required=True, metavar="ACTION")
    ss.add_parser("status", help="server running or not, flavour, versions, tables, rows, partitions"
                  ).set_defaults(handler=cmd_store_status)
    ss.add_parser("start", help="start the embedded PostgreSQL and keep it running until `store stop`"
                  ).set_defaults(handler=cmd_store_start)
    ss.add_parser("stop", help="stop the embedded PostgreSQL of the data dir").set_defaults(handler=cmd_store_stop)
    ss.add_parser("maintain", help="create partitions ahead, apply retention").set_defaults(handler=cmd_store_maintain)

    conf = sub.add_parser("config", help="show, check or document the configuration")
    cs = conf.add_subparsers(dest="config_cmd", required=True, metavar="ACTION")
    cs.add_parser("show", help="the effective configuration as TOML-like text").set_defaults(handler=cmd_config_show)
    cs.add_parser("check", help="validate --config FILE and the LLMSLA_* environment").set_defaults(handler=cmd_config_check)
    d = cs.add_parser("doc", help="write the key reference (docs/config.md)")
    d.add_argument("--out", default=str(CONFIG_DOC))
    d.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is stale")
    d.set_defaults(handler=cmd_config_doc)

    sch = sub.add_parser("schemas", help="write JSON Schemas of the event contracts")
    sch.add_argument("--out", type=argtypes.writable_dir, default=None, help=f"output folder (default {SCHEMA_DIR})")
    sch.add_argument("--check", action="store_true", help="write nothing; exit 1 if the files are stale")
    sch.set_defaults(handler=cmd_schemas)

    sp = sub.add_parser("spool", help="spool statistics and upkeep")
    sps = sp.add_subparsers(dest="spool_cmd", required=True, metavar="ACTION")
    sps.add_parser("stats", help="segments and bytes per kind").set_defaults(handler=cmd_spool_stats)
    sps.add_parser("recover", help="publish segments left by dead writers").set_defaults(handler=cmd_spool_recover)
    sps.add_parser("prune", help="delete segments older than spool.retention_s").set_defaults(handler=cmd_spool_prune)
    check = sps.add_parser("check", help="validate every published line; report file:line of bad ones")
    check.set_defaults(handler=cmd_spool_check)


def cmd_migrate(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    from llmsla.redaction import redact
    from llmsla.store import open_store
    from llmsla.store.migrate import migrate

    with open_store(cfg, migrate=False) as handle, handle.connect() as conn:
        result = migrate(conn, cfg)
    print(f"store: {redact(handle.dsn)}")
    print(f"flavour: {result.flavor} (PostgreSQL {result.server_version}"
          f"{', TimescaleDB ' + result.timescale_version if result.timescale_version else ''})")
    print(f"applied: {', '.join(result.applied) or 'nothing (up to date)'}")
    print(f"partitions created: {result.partitions_created}")
    return 0


def store_status(handle: StoreHandle) -> dict:
    """Flavour, versions, migrations, per-table rows and partitions (plain) or chunks (Timescale)."""
    from llmsla.store.connection import scalar
    from llmsla.store.migrate import recorded_flavor, timescale_version

    with handle.connect() as conn:
        flavor = recorded_flavor(conn)
        info: dict = {
            "server_version": scalar(conn, "SHOW server_version"),
            "timescaledb": timescale_version(conn),
            "flavor": flavor,
            "migrations": [r[0] for r in conn.execute(
                f"SELECT version FROM {names.T_MIGRATIONS} ORDER BY version")] if flavor else [],
            "tables": {},
        }
        if not flavor:
            return info
        for table in names.TIME_TABLES:
            rows = scalar(conn, f"SELECT count(*) FROM {table}")
            if flavor == "plain":
                parts = scalar(conn,
                    "SELECT count(*) FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s",
                    (table,),
                )
            else:
                parts = scalar(conn,
                    "SELECT count(*) FROM timescaledb_information.chunks WHERE hypertable_name = %s", (table,)
                )
            info["tables"][table] = {"rows": rows, "partitions": parts}
    return info


def cmd_store_status(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    """The store's contents; for the embedded server also whether it runs. A stopped one is
    started for the answer and stopped again; a data dir never initialised is not created."""
    from llmsla.redaction import redact
    from llmsla.store import open_store

    if not cfg.store.dsn:
        data_dir = cfg.store_data_dir()
        if not (data_dir / "PG_VERSION").exists():
            print(f"store: embedded PostgreSQL in {data_dir}: not created yet "
                  "(`llmsla migrate` or `llmsla store start` creates it)")
            return 1
        state = _embedded_state(data_dir)
    with open_store(cfg, migrate=False) as handle:
        info = store_status(handle)
    print(f"store: {redact(handle.dsn)}{' (embedded, ' + str(handle.data_dir) + ')' if handle.embedded else ''}")
    if handle.embedded:
        print(f"server: {state}")
    print(json.dumps(info, indent=2))
    return 0 if info["flavor"] else 1


def _embedded_state(data_dir: Path) -> str:
    from llmsla import extras
    from llmsla.store import embedded

    extras.require("embedded", "the embedded PostgreSQL (no store.dsn / --dsn)")
    pm = embedded.running(data_dir)
    if pm is None:
        return "not running (started for this status and stopped again)"
    users = embedded.live_users(data_dir)
    why = ("kept until `llmsla store stop`" if embedded.kept(data_dir)
           else f"in use by pid {', '.join(map(str, users))}" if users else "not started by llmsla")
    return f"running (pid {pm.pid}, {why})"


def _embedded_only(cfg: config_mod.Config, command: str) -> Path:
    """The data dir ``store start|stop`` act on; an external DSN is not theirs to manage."""
    from llmsla import extras
    from llmsla.redaction import redact

    if cfg.store.dsn:
        raise CliError(f"llmsla {command} manages the embedded PostgreSQL, but {cfg.origin('store.dsn')} "
                       f"points at {redact(cfg.store.dsn)}: start and stop that server where it runs")
    extras.require("embedded", f"llmsla {command}")
    return cfg.store_data_dir()


def cmd_store_start(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    """Start (or keep) the embedded server, migrated, for every later command to use."""
    from llmsla.redaction import redact
    from llmsla.store import embedded, open_store

    data_dir = _embedded_only(cfg, "store start")
    before = embedded.running(data_dir)
    with open_store(cfg, keep_running=True) as handle:  # closing a kept server leaves it up
        pm = embedded.running(data_dir)
    pid = pm.pid if pm else "?"
    print(f"store: {redact(handle.dsn)} (embedded, {data_dir})")
    print(f"server: {'already running' if before else 'started'} (pid {pid}); "
          "kept running until `llmsla store stop`")
    return 0


def cmd_store_stop(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    """Stop the embedded server; one that llmsla processes still use stops when they exit."""
    from llmsla.store import embedded

    data_dir = _embedded_only(cfg, "store stop")
    res = embedded.stop(data_dir)
    if res.postmaster is None:
        print(f"store: no embedded PostgreSQL running in {data_dir}")
        return 0
    if not res.stopped:
        print(f"store: the embedded PostgreSQL in {data_dir} (pid {res.postmaster.pid}) is in use by llmsla "
              f"process{'es' if len(res.users) > 1 else ''} {', '.join(map(str, res.users))}: no longer kept, "
              "it stops when the last of them exits")
        return 1
    print(f"store: stopped the embedded PostgreSQL in {data_dir} (pid {res.postmaster.pid})")
    return 0


def cmd_store_maintain(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    from llmsla.store import open_store
    from llmsla.store.maintenance import maintain
    from llmsla.store.migrate import recorded_flavor

    with open_store(cfg) as handle, handle.connect(autocommit=True) as conn:
        result = maintain(conn, cfg, flavor=recorded_flavor(conn) or "plain")
    print(f"partitions created: {result.partitions_created}, dropped: {result.partitions_dropped}")
    return 0


def cmd_config_show(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    for section, values in config_mod.shown(cfg).items():
        print(f"[{section}]")
        for key, value in values.items():
            print(f"{key} = {json.dumps(value)}")
        print()
    return 0


def cmd_config_check(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    # load() (before this handler) ran every key's check; the components' cross-key ones here
    config_mod.check_startup(cfg)
    print(f"ok: {cfg.source or 'defaults'} + environment")
    return 0


def cmd_config_doc(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    files = CONFIG_DOCS.render(cfg, Path(args.out))
    try:
        return generated.run(files, check=args.check, command=CONFIG_DOCS.command)
    except OSError as exc:
        raise CliError(f"--out {args.out}: cannot write: {exc.strerror or exc}") from None


def cmd_schemas(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    root = Path(args.out or SCHEMA_DIR)
    return generated.run(SCHEMAS.render(cfg, root), check=args.check, command=SCHEMAS.command)


def _report_skipped(root: Path) -> list[tuple[Path, str]]:
    """Name, on stderr, each entry of the spool that looks like a segment but is none (a FIFO,
    socket, directory or dangling link): the spool commands leave them alone."""
    skipped = spool.skipped_entries(root)
    for path, why in skipped:
        print(f"llmsla spool: skipped {path}: {why}, not a segment", file=sys.stderr)
    return skipped


def cmd_spool_stats(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    skipped = _report_skipped(cfg.spool_dir())
    print(json.dumps({"dir": str(cfg.spool_dir()), **spool.spool_stats(cfg.spool_dir()),
                      "skipped": [{"path": str(p), "reason": why} for p, why in skipped]}, indent=2))
    return 0


def cmd_spool_recover(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    _report_skipped(cfg.spool_dir())
    for kind in names.SPOOL_ALL_KINDS:
        print(f"{kind}: published {spool.recover(cfg.spool_dir(), kind)} abandoned segments")
    return 0


def cmd_spool_prune(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    _report_skipped(cfg.spool_dir())
    for kind in names.SPOOL_ALL_KINDS:
        n = spool.prune(cfg.spool_dir(), kind, older_than_s=cfg.spool.retention_s)
        print(f"{kind}: removed {n} segments")
    return 0


def cmd_spool_check(args: argparse.Namespace, cfg: config_mod.Config) -> int:
    skipped = _report_skipped(cfg.spool_dir())
    bad = good = 0
    for kind in names.SPOOL_ALL_KINDS:
        for path in spool.published_segments(cfg.spool_dir(), kind):
            for item in spool.read_segment(path, kind):
                if isinstance(item, spool.BadLine):
                    bad += 1
                    print(item)
                else:
                    good += 1
    print(f"{good} good, {bad} bad lines" + (f", {len(skipped)} entries skipped (not segments)" if skipped else ""))
    return 1 if bad else 0
