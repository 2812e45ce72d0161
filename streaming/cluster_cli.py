"""``llmsla flink start|stop|status``: a standalone Flink session cluster on this machine
(streaming/cluster.py); ``llmsla stream --jobmanager HOST:PORT`` submits the job to it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from llmsla import argtypes
from llmsla.config import Config


def default_root() -> Path:
    from llmsla.config import default_data_dir

    return default_data_dir() / "flink-cluster"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("flink", help="a standalone Flink session cluster on this machine (JobManager + TaskManagers)")
    sub = p.add_subparsers(dest="flink_command", required=True, metavar="SUBCOMMAND")
    s = sub.add_parser("start", help="start a JobManager and N TaskManagers on loopback; prints the --jobmanager address")
    _dir(s)
    s.add_argument("--taskmanagers", type=argtypes.positive_int, default=2, help="TaskManager processes (default 2)")
    s.add_argument("--slots", type=argtypes.positive_int, default=1, help="task slots per TaskManager (default 1)")
    s.add_argument("--rest-port", type=argtypes.port, default=8081, help="JobManager REST port (default 8081)")
    s.add_argument("--rpc-port", type=argtypes.port, default=6123, help="JobManager RPC port (default 6123)")
    s.add_argument("--checkpoint-dir", default="", help="cluster default checkpoint dir (default <dir>/checkpoints); "
                   "the llmsla job uses stream.checkpoint_dir")
    s.add_argument("--taskmanager-memory", type=argtypes.memory_size, default="1536m", help="process memory per TaskManager (default 1536m)")
    s.set_defaults(handler=cmd_start)
    t = sub.add_parser("stop", help="stop every process of the cluster (Python workers included)")
    _dir(t)
    t.set_defaults(handler=cmd_stop)
    u = sub.add_parser("status", help="processes, TaskManagers, slots and jobs, as JSON")
    _dir(u)
    u.set_defaults(handler=cmd_status)


def _dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, default=None, help="cluster directory (default <data dir>/flink-cluster)")


def cmd_start(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla import extras
    from llmsla.errors import CliError

    extras.require("stream", "llmsla flink start")
    from llmsla.streaming.cluster import Cluster, ClusterSpec

    if args.rest_port == args.rpc_port:
        raise CliError("--rest-port and --rpc-port must differ")
    spec = ClusterSpec(root=(args.dir or default_root()).resolve(), rest_port=args.rest_port,
                       rpc_port=args.rpc_port, taskmanagers=args.taskmanagers, slots=args.slots, checkpoint_dir=args.checkpoint_dir,
                       taskmanager_memory=args.taskmanager_memory)
    cluster = Cluster.start(spec)
    print(f"Flink session cluster up: JobManager {cluster.rest_url} (web UI and REST), "
          f"{spec.taskmanagers} TaskManagers x {spec.slots} slots; logs in {spec.root / 'log'}")
    print(f"submit the job with: llmsla stream --jobmanager {cluster.address}")
    return 0


def cmd_stop(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla.streaming.cluster import Cluster

    cluster = Cluster.open((args.dir or default_root()).resolve())
    running = cluster.processes()
    killed = cluster.stop()
    print(f"stopped {len(running)} processes" + (f" ({len(killed)} needed SIGKILL)" if killed else ""))
    return 0


def cmd_status(args: argparse.Namespace, cfg: Config) -> int:
    from llmsla.streaming.cluster import Cluster

    status = Cluster.open((args.dir or default_root()).resolve()).status()
    print(json.dumps(status, indent=2))
    return 0 if status["overview"] is not None else 1
