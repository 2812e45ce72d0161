"""A standalone Flink session cluster on this machine, from the apache-flink wheel's own ``bin/``.

The wheel's scripts run against a cluster directory of llmsla's own, so the installed package
is never touched. Every daemon carries ``LLMSLA_FLINK_CLUSTER=<root>`` in its environment, which
the Python workers a TaskManager forks inherit, so :meth:`Cluster.stop` ends every process of
this cluster, orphaned workers included, and nothing else.
See docs/scaling.md#the-stream-job-on-a-flink-cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llmsla.errors import UserError

MARKER_ENV = "LLMSLA_FLINK_CLUSTER"
STATE_FILE = "cluster.json"


class ClusterError(UserError):
    """The cluster cannot be started, reached or stopped as asked; the message says why."""


@dataclass
class ClusterSpec:
    """What to start. Ports 0 are not allowed: clients need to know them in advance."""

    root: Path
    host: str = "127.0.0.1"
    rest_port: int = 8081
    rpc_port: int = 6123
    taskmanagers: int = 2
    slots: int = 1
    checkpoint_dir: str = ""  # cluster default (a job sets its own); empty = <root>/checkpoints
    jobmanager_memory: str = "1024m"
    taskmanager_memory: str = "1536m"
    #: heartbeats: a SIGKILLed TaskManager is noticed by the JobManager within this timeout when
    #: its connections do not fail first; long enough for a GC pause on a busy machine
    heartbeat_interval_ms: int = 2000
    heartbeat_timeout_ms: int = 20000


def pyflink_home() -> Path:
    import pyflink

    return Path(pyflink.__file__).resolve().parent


def flink_config(spec: ClusterSpec) -> dict[str, Any]:
    """``config.yaml`` of the cluster (flat keys, which Flink 2's YAML loader accepts)."""
    import yaml

    shipped = yaml.safe_load((pyflink_home() / "conf" / "config.yaml").read_text())
    ckpt = Path(spec.checkpoint_dir) if spec.checkpoint_dir else spec.root / "checkpoints"
    return {
        # the JVM module flags the wheel's own config carries (Flink needs them on Java 17+)
        "env.java.opts.all": shipped["env"]["java"]["opts"]["all"],
        "jobmanager.rpc.address": spec.host,
        "jobmanager.rpc.port": spec.rpc_port,
        "jobmanager.bind-host": spec.host,
        "jobmanager.memory.process.size": spec.jobmanager_memory,
        "rest.address": spec.host,
        "rest.bind-address": spec.host,
        "rest.port": spec.rest_port,
        "taskmanager.host": spec.host,
        "taskmanager.bind-host": spec.host,
        "taskmanager.numberOfTaskSlots": spec.slots,
        "taskmanager.memory.process.size": spec.taskmanager_memory,
        "heartbeat.interval": spec.heartbeat_interval_ms,
        "heartbeat.timeout": spec.heartbeat_timeout_ms,
        "io.tmp.dirs": str(spec.root / "tmp"),
        "env.pid.dir": str(spec.root / "pids"),
        "env.log.dir": str(spec.root / "log"),
        # cluster defaults; the llmsla job sets its own checkpoint dir and restart strategy
        "execution.checkpointing.dir": ckpt.resolve().as_uri(),
        "state.backend.type": "hashmap",
        "restart-strategy.type": "exponential-delay",
        # the default for jobs that set none; a job's own python.executable wins (the llmsla job
        # sets stream.python_executable, else its submitter's interpreter)
        "python.executable": sys.executable,
    }


class Cluster:
    """A cluster directory: started by :meth:`start`, found again by :meth:`open`."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.root = spec.root

    # -- addresses ---------------------------------------------------------------------------
    @property
    def rest_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.rest_port}"

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the REST endpoint, what ``llmsla stream --jobmanager`` takes."""
        return f"{self.spec.host}:{self.spec.rest_port}"

    @classmethod
    def open(cls, root: Path) -> Cluster:
        state = root / STATE_FILE
        if not state.is_file():
            raise ClusterError(f"no Flink cluster in {root} ({STATE_FILE} missing): start one with `llmsla flink start`")
        data = json.loads(state.read_text())
        data["root"] = Path(data["root"])
        return cls(ClusterSpec(**data))

    # -- processes ---------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        from llmsla.streaming.job import ensure_java

        ensure_java()
        env = dict(os.environ)
        env.update({
            "FLINK_CONF_DIR": str(self.root / "conf"), "FLINK_LIB_DIR": str(self.root / "lib"),
            "FLINK_LOG_DIR": str(self.root / "log"), "FLINK_PID_DIR": str(self.root / "pids"),
            "FLINK_IDENT_STRING": "llmsla", MARKER_ENV: str(self.root.resolve()),
        })
        return env

    def _script(self, name: str, *args: str) -> None:
        script = pyflink_home() / "bin" / name
        done = subprocess.run(["bash", str(script), *args], env=self._env(), capture_output=True, text=True,
                              timeout=120, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise ClusterError(f"{name} {' '.join(args)} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()[-800:]}")

    def _pids(self, daemon: str) -> list[int]:
        pid_file = self.root / "pids" / f"flink-llmsla-{daemon}.pid"
        if not pid_file.is_file():
            return []
        pids = [int(x) for x in pid_file.read_text().split() if x.strip().isdigit()]
        return [p for p in pids if _alive(p)]

    def jobmanager_pids(self) -> list[int]:
        return self._pids("standalonesession")

    def taskmanager_pids(self) -> list[int]:
        return self._pids("taskexecutor")

    def processes(self) -> list[int]:
        """Every live process of this cluster: daemons and the Python workers they forked."""
        return marked_processes(str(self.root.resolve()))

    # -- REST --------------------------------------------------------------------------------
    def rest(self, path: str, timeout_s: float = 5.0) -> Any:
        with urllib.request.urlopen(self.rest_url + path, timeout=timeout_s) as resp:
            return json.loads(resp.read())

    def overview(self) -> dict[str, Any] | None:
        try:
            return self.rest("/overview")
        except (OSError, ValueError):
            return None

    def wait_taskmanagers(self, n: int, timeout_s: float = 120.0) -> None:
        """Until ``n`` TaskManagers are registered (a killed one is dropped after the heartbeat
        timeout or when its connection fails)."""
        deadline = time.monotonic() + timeout_s
        seen: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            seen = self.overview()
            if seen is not None and seen.get("taskmanagers") == n:
                return
            time.sleep(0.5)
        raise ClusterError(f"{n} TaskManagers not registered after {timeout_s:.0f} s (overview: {seen}); "
                           f"logs in {self.root / 'log'}")

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def start(cls, spec: ClusterSpec, *, timeout_s: float = 180.0) -> Cluster:
        """JobManager, then ``spec.taskmanagers`` TaskManagers; returns once all are registered.
        Anything started is stopped again if the cluster does not come up."""
        import yaml

        cluster = cls(spec)
        running = marked_processes(str(spec.root.resolve()))
        if running:
            raise ClusterError(f"a Flink cluster is already running from {spec.root} (pids {running}): "
                               "`llmsla flink stop` it first")
        for sub in ("conf", "lib", "log", "pids", "tmp"):
            (spec.root / sub).mkdir(parents=True, exist_ok=True)
        home = pyflink_home()
        for link in (spec.root / "lib").iterdir():
            link.unlink()
        for jar in [*sorted((home / "lib").glob("*.jar")), *sorted((home / "opt").glob("flink-python-*.jar"))]:
            (spec.root / "lib" / jar.name).symlink_to(jar)
        for name in ("log4j.properties", "log4j-console.properties", "log4j-cli.properties"):
            if (home / "conf" / name).is_file():
                (spec.root / "conf" / name).write_bytes((home / "conf" / name).read_bytes())
        (spec.root / "conf" / "config.yaml").write_text(yaml.safe_dump(flink_config(spec), sort_keys=True))
        state = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()}
        (spec.root / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        try:
            for port, option in ((spec.rest_port, "rest port"), (spec.rpc_port, "rpc port")):
                if _port_in_use(spec.host, port):
                    raise ClusterError(f"{option} {spec.host}:{port} is already in use")
            cluster._script("jobmanager.sh", "start")
            cluster.wait_rest(timeout_s)
            for _ in range(spec.taskmanagers):
                cluster._script("taskmanager.sh", "start")
            cluster.wait_taskmanagers(spec.taskmanagers, timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def wait_rest(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.overview() is not None:
                return
            if not self.jobmanager_pids():
                time.sleep(1.0)  # the pid file is written just after the fork
                if not self.jobmanager_pids():
                    raise ClusterError(f"the JobManager exited; see {self.root / 'log'}{_log_tail(self.root / 'log', 'standalonesession')}")
            time.sleep(0.3)
        raise ClusterError(f"JobManager REST {self.rest_url} not up after {timeout_s:.0f} s; see {self.root / 'log'}")

    def taskmanager_ids(self) -> set[str]:
        """Resource ids of the TaskManagers the JobManager has registered."""
        try:
            return {tm["id"] for tm in self.rest("/taskmanagers").get("taskmanagers", [])}
        except (OSError, ValueError):
            return set()

    def add_taskmanager(self, *, timeout_s: float = 120.0) -> int:
        """Start one more TaskManager; returns its pid once the JobManager has registered it
        (a new resource id: a killed TaskManager may still be counted until its heartbeat
        times out)."""
        before, known = set(self.taskmanager_pids()), self.taskmanager_ids()
        self._script("taskmanager.sh", "start")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.taskmanager_ids() - known:
                (pid,) = set(self.taskmanager_pids()) - before
                return pid
            time.sleep(0.5)
        raise ClusterError(f"the new TaskManager did not register within {timeout_s:.0f} s; logs in {self.root / 'log'}")

    def kill_taskmanager(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """Kill one TaskManager JVM (its Python workers are left to notice, as in a real crash;
        :meth:`stop` ends any that linger)."""
        if pid not in self.taskmanager_pids():
            raise ClusterError(f"pid {pid} is not a TaskManager of {self.root}")
        os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self, timeout_s: float = 30.0) -> list[int]:
        """TERM every process of this cluster, KILL what is left after ``timeout_s``; returns the
        pids it had to kill. Idempotent."""
        marker = str(self.root.resolve())
        for pid in marked_processes(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        killed = marked_processes(marker)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid_file in (self.root / "pids").glob("*.pid"):
            pid_file.unlink()
        return killed

    def status(self) -> dict[str, Any]:
        overview = self.overview()
        jobs: list[dict[str, Any]] = []
        if overview is not None:
            with contextlib.suppress(OSError, ValueError):
                jobs = [{"id": j["jid"], "name": j["name"], "state": j["state"]}
                        for j in self.rest("/jobs/overview").get("jobs", [])]
        return {"root": str(self.root), "rest": self.rest_url, "jobmanager_pids": self.jobmanager_pids(),
                "taskmanager_pids": self.taskmanager_pids(), "processes": len(self.processes()),
                "overview": overview, "jobs": jobs}


def marked_processes(marker: str) -> list[int]:
    """Pids whose environment holds ``LLMSLA_FLINK_CLUSTER=<marker>`` (this user's processes)."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in env.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _port_in_use(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _log_tail(log_dir: Path, daemon: str, n: int = 1500) -> str:
    logs = sorted(log_dir.glob(f"*{daemon}*.log")) + sorted(log_dir.glob(f"*{daemon}*.out"))
    text = "".join(p.read_text(errors="replace")[-n:] for p in logs[-2:])
    return f"\n--- log tail ---\n{text}" if text else ""
