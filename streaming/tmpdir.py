"""A private temporary directory per local stream run, removed when the run is over.

Why: a local run unpacks Flink's planner (45 MB) and RPC system (24 MB) jars and creates the
mini-cluster's blob, shuffle, web-upload and Python-worker directories in the system temp dir.
Flink deletes some of them on a clean JVM exit, none of them when the job is killed, so every
killed run left about 70 MB there. Here everything goes to ``<data dir>/flink-tmp/run-<pid>-*``:
the JVM gets ``-Djava.io.tmpdir`` (Flink's ``io.tmp.dirs``, ``web.upload.dir`` and the planner
loader default to it), the Python workers inherit ``TMPDIR``. The directory is removed once the
run's JVM has exited (it outlives this process by a moment), and the next run removes any left by
a run that was killed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from llmsla.services import pid_alive

#: Waits for the JVM to exit, then removes the run directory (runs detached from the stream).
_CLEANER = """
import os, shutil, sys, time
pid, path = int(sys.argv[1]), sys.argv[2]
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    except PermissionError:
        pass
    time.sleep(0.2)
shutil.rmtree(path, ignore_errors=True)
"""


def default_root() -> Path:
    from llmsla.config import default_data_dir

    return default_data_dir() / "flink-tmp"


def remove_stale(root: Path) -> int:
    """Remove run directories whose owner process is gone (a killed run); returns how many."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for run in root.iterdir():
            parts = run.name.split("-")
            if len(parts) >= 3 and parts[0] == "run" and parts[1].isdigit() and not pid_alive(int(parts[1])):
                shutil.rmtree(run, ignore_errors=True)
                removed += 1
    return removed


_CURRENT: RunDir | None = None


def for_this_process() -> RunDir:
    """This process's run directory, created and activated on first use (before the JVM starts:
    a JVM already running keeps its temp dir). Removed at exit."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = RunDir()
        _CURRENT.activate()
    return _CURRENT


class RunDir:
    """The current run's directory; :meth:`activate` before the JVM starts."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_root()
        self.root.mkdir(parents=True, exist_ok=True)
        remove_stale(self.root)
        self.path = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=self.root))
        self._closed = False

    def activate(self) -> None:
        """Point this process, the JVM it will launch and the Python workers at the directory."""
        os.environ["TMPDIR"] = str(self.path)
        tempfile.tempdir = str(self.path)
        args = os.environ.get("JVM_ARGS", "")
        os.environ["JVM_ARGS"] = f"{args} -Djava.io.tmpdir={self.path}".strip()
        atexit.register(self.close)

    @staticmethod
    def _jvm_pid() -> int | None:
        """The gateway JVM's pid, if this process started one (never starts one)."""
        try:
            from pyflink import java_gateway

            gateway = getattr(java_gateway, "_gateway", None)  # None until build() launched it
            return None if gateway is None else int(gateway.jvm.java.lang.ProcessHandle.current().pid())
        except Exception:  # noqa: BLE001 - gone or unreachable: nothing to wait for
            return None

    def close(self) -> None:
        """Remove the directory now, or, while the JVM still runs (it exits right after this
        process), by a detached helper once it has exited."""
        if self._closed:
            return
        self._closed = True
        pid = self._jvm_pid()
        if pid is None or not pid_alive(pid):
            shutil.rmtree(self.path, ignore_errors=True)
            return
        subprocess.Popen(  # noqa: S603 - our own interpreter and script
            [sys.executable, "-c", _CLEANER, str(pid), str(self.path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )
