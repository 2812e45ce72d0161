"""Who stops the embedded PostgreSQL, and when.

pgserver shares one postmaster per data dir but leaves stopping it to each caller and never
forgets a process that died, so a server outlived everything that used it. Here the last live
llmsla process to release the data dir stops a server llmsla started, unless it was kept; a
server llmsla did not start is stopped only by ``llmsla store stop``.
See docs/store.md#the-embedded-server-who-stops-it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: in the data dir: {"pid", "start_time", "keep"} of the postmaster an llmsla process started
OWNER_FILE = "llmsla-owner.json"
#: pgserver's list of the processes that hold a handle on the data dir
PIDS_FILE = ".handle_pids.json"
#: how long a fast shutdown may take before the postmaster is told to quit immediately
STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Postmaster:
    """A running postmaster of a data dir, as its ``postmaster.pid`` describes it."""

    pid: int
    start_time: int  #: epoch seconds, line 3 of postmaster.pid: tells a restarted server apart
    dsn: str


def resolve(data_dir: Path | str) -> Path:
    """The data dir as pgserver names it (absolute, symlinks resolved)."""
    return Path(data_dir).expanduser().resolve()


def running(data_dir: Path | str) -> Postmaster | None:
    """The live postmaster of ``data_dir``, or None; starts nothing. A ``postmaster.pid`` whose
    process is gone, or is no longer a postgres serving this data dir (a reused pid), is None."""
    import psutil

    path = resolve(data_dir)
    try:
        lines = (path / "postmaster.pid").read_text().splitlines()
        pid, pgdata, start_time = int(lines[0]), lines[1].strip(), int(lines[2])
    except (OSError, ValueError, IndexError):
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or not proc.name().startswith("postgres"):
            return None
    except psutil.Error:
        return None
    if resolve(pgdata) != path:
        return None
    socket_dir = lines[4].strip() if len(lines) > 4 else ""
    port = lines[3].strip() if len(lines) > 3 else ""
    dsn = (f"postgresql://postgres:@/postgres?host={socket_dir}" if socket_dir
           else f"postgresql://postgres:@127.0.0.1:{port}/postgres")
    return Postmaster(pid=pid, start_time=start_time, dsn=dsn)


def live_users(data_dir: Path | str, *, exclude: int | None = None) -> list[int]:
    """The processes that hold a handle on ``data_dir`` and are still alive (zombies are not)."""
    import psutil

    try:
        pids = json.loads((resolve(data_dir) / PIDS_FILE).read_text())
    except (OSError, ValueError):
        return []
    out = []
    for pid in pids:
        if not isinstance(pid, int) or pid == exclude:
            continue
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return out


def _read_owner(path: Path) -> dict[str, Any] | None:
    try:
        rec = json.loads((path / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _owns(rec: dict[str, Any] | None, pm: Postmaster) -> bool:
    """The record is about this postmaster (not one that ran in this data dir before)."""
    return rec is not None and rec.get("pid") == pm.pid and rec.get("start_time") == pm.start_time


def _write_owner(path: Path, pm: Postmaster, *, keep: bool) -> None:
    tmp = path / f"{OWNER_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"pid": pm.pid, "start_time": pm.start_time, "keep": keep, "by": os.getpid()}))
    tmp.replace(path / OWNER_FILE)


def kept(data_dir: Path | str) -> bool:
    """Whether the running postmaster was asked to stay up (``store start``, ``demo --keep``)."""
    path = resolve(data_dir)
    pm = running(path)
    rec = _read_owner(path)
    return pm is not None and _owns(rec, pm) and bool(rec and rec.get("keep"))


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """pgserver's machine-wide lock: the one it holds while it starts a server and edits the
    pid list, so nobody joins a server while it is being stopped here."""
    from pgserver.postgres_server import PostgresServer

    with PostgresServer._lock:
        yield


def _shutdown(pm: Postmaster) -> None:
    """Fast shutdown (SIGINT: sessions end, nothing is lost), then immediate, then SIGKILL."""
    import psutil

    try:
        proc = psutil.Process(pm.pid)
        for sig, wait_s in ((signal.SIGINT, STOP_TIMEOUT_S), (signal.SIGQUIT, 10.0), (signal.SIGKILL, 10.0)):
            proc.send_signal(sig)
            try:
                proc.wait(wait_s)
                return
            except psutil.TimeoutExpired:
                continue
    except psutil.NoSuchProcess:
        return


def _stop_if_last(path: Path, *, me: int) -> bool:
    """With the machine lock held: drop ``me`` and dead processes from the pid list; stop the
    server if no live process is left and an llmsla process started it without keeping it."""
    users = live_users(path, exclude=me)
    with contextlib.suppress(OSError):
        (path / PIDS_FILE).write_text(json.dumps(users))
    if users:
        return False
    pm = running(path)
    rec = _read_owner(path)
    if pm is None or not _owns(rec, pm) or (rec or {}).get("keep"):
        return False
    _shutdown(pm)
    with contextlib.suppress(OSError):
        (path / OWNER_FILE).unlink()
    return True


class _Shared:
    """This process's pgserver handle on one data dir and how many EmbeddedServers use it."""

    def __init__(self, server: Any, pid: int) -> None:
        self.server = server
        self.pid = pid  # a forked child inherits the registry; it must not release the parent's
        self.users = 0


_lock = threading.RLock()  # re-entrant: the SIGTERM handler may run while the main thread holds it
_open: dict[Path, _Shared] = {}
_hooks_installed = False


class EmbeddedServer:
    """One use of the embedded server of a data dir by this process; :meth:`close` it when done
    (the last close on the machine stops a server llmsla started and nobody kept)."""

    def __init__(self, data_dir: Path, dsn: str) -> None:
        self.data_dir = data_dir
        self.dsn = dsn
        self._closed = False

    def get_uri(self) -> str:
        return self.dsn

    def close(self) -> None:
        with _lock:
            if self._closed:
                return
            self._closed = True
            shared = _open.get(self.data_dir)
            if shared is None:
                return
            shared.users -= 1
            if shared.users <= 0:
                _release(self.data_dir, shared)

    cleanup = close  #: pgserver's name for it, which scripts holding a server handle call


def _release(path: Path, shared: _Shared) -> None:
    from pgserver.postgres_server import PostgresServer

    _open.pop(path, None)
    PostgresServer._instances.pop(path, None)  # a later start here makes a fresh handle
    if shared.pid != os.getpid():
        return
    with _machine_lock():
        _stop_if_last(path, me=shared.pid)


def close_all() -> None:
    """Release every data dir this process opened (at exit, on SIGTERM)."""
    with _lock:
        for path, shared in list(_open.items()):
            _release(path, shared)


def _on_sigterm(signum: int, frame: Any) -> None:
    """Stop what this process started, then die of SIGTERM as before (same exit status)."""
    try:
        close_all()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(close_all)
    # A service that handles SIGTERM itself (asyncio's add_signal_handler) closes its handle on
    # the way out; everything else would die with the server still up.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)


def start(data_dir: Path | str, *, keep: bool = False) -> EmbeddedServer:
    """Start (or join) the server of ``data_dir``; ``keep`` leaves it running after every
    llmsla process has released it (until ``llmsla store stop``)."""
    import pgserver

    path = resolve(data_dir)
    with _lock:
        shared = _open.get(path)
        if shared is None or shared.pid != os.getpid():
            _install_hooks()
            before = running(path) if (path / "postmaster.pid").exists() else None
            # cleanup_mode=None: pgserver's own exit hook never stops it; the rule above does
            server = pgserver.get_server(path, cleanup_mode=None)
            atexit.unregister(server._cleanup)
            shared = _open[path] = _Shared(server, os.getpid())
            pm = running(path)
            with _machine_lock():
                rec = _read_owner(path)
                if pm is None:
                    pass  # stopped again already (by `store stop`): nothing to record
                elif _owns(rec, pm):
                    if keep and not (rec or {}).get("keep"):
                        _write_owner(path, pm, keep=True)
                elif keep or before is None or before.pid != pm.pid:
                    _write_owner(path, pm, keep=keep)  # this process (or one racing it) started it
        elif keep:
            pm = running(path)
            if pm is not None:
                with _machine_lock():
                    _write_owner(path, pm, keep=True)
        shared.users += 1
        return EmbeddedServer(path, shared.server.get_uri())


@dataclass(frozen=True)
class StopResult:
    """What ``llmsla store stop`` found: the postmaster (None: nothing ran) and, when it could
    not stop it, the live llmsla processes still using it."""

    postmaster: Postmaster | None
    users: list[int]
    stopped: bool


def stop(data_dir: Path | str) -> StopResult:
    """Stop the server of ``data_dir`` unless llmsla processes still use it (then it is no
    longer kept, and the last of them stops it when it exits): a running receiver keeps its
    store."""
    path = resolve(data_dir)
    with _lock, _machine_lock():
        pm = running(path)
        if pm is None:
            return StopResult(None, [], False)
        users = live_users(path, exclude=os.getpid())
        if users:
            _write_owner(path, pm, keep=False)
            return StopResult(pm, users, False)
        _shutdown(pm)
        with contextlib.suppress(OSError):
            (path / OWNER_FILE).unlink()
        with contextlib.suppress(OSError):
            (path / PIDS_FILE).write_text("[]")
        return StopResult(pm, [], True)
