"""The spool: a directory of JSON-lines segment files, the embedded event transport.

One writer per file and publication by atomic ``rename``: readers only ever see complete files,
processes never share a file, and a crashed writer leaves at most its unpublished segment. Disk
use is bounded and no event is lost silently: a failed write is kept and retried, and only then
dropped and counted; the writer thread catches everything so it cannot die.
See docs/spool.md#no-event-is-lost-silently.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import json
import logging
import os
import socket
import stat
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client import CollectorRegistry, Counter

from llmsla import names
from llmsla.errors import UserError
from llmsla.events import ALL_EVENT_TYPES, EventError

INPROGRESS = ".inprogress"
SUFFIX = ".jsonl"


class SpoolError(UserError, OSError):
    """The spool cannot take writes; the message says where and what to do."""


class SpoolFullError(SpoolError):
    """The spool directory reached its byte limit; the consumer is behind or retention is off."""


@dataclass(frozen=True, slots=True)
class BadLine:
    """A line that could not be read as its kind's event: where it is and why."""

    path: Path
    line_no: int
    reason: str
    raw: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line_no}: {self.reason}"


def kind_dir(root: str | os.PathLike[str], kind: str) -> Path:
    if kind not in ALL_EVENT_TYPES:
        raise ValueError(f"unknown spool kind {kind!r}; expected one of {', '.join(ALL_EVENT_TYPES)}")
    return Path(root) / kind


def dir_bytes(path: Path) -> int:
    """Bytes used by published and in-progress segments under ``path``."""
    total = 0
    for base in (path, path / INPROGRESS):
        try:
            with os.scandir(base) as it:
                for entry in it:
                    # a file may be published or pruned between listing and stat
                    if entry.is_file(follow_symlinks=False):
                        with contextlib.suppress(FileNotFoundError):
                            total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            pass
    return total


#: Bytes buffered before they are written to the open segment (the old file buffer's size).
WRITE_BUFFER = 1 << 16
#: Hidden directory of a kind holding each writer's drop record (read by ``llmsla doctor``).
DROPPED = ".dropped"
_RECORD_BYTES = 1024  # fixed size, rewritten in place: updating it needs no new disk space

log = logging.getLogger(__name__)


def drop_reason(exc: BaseException) -> str:
    """The ``reason`` label of a failed write (``names.SPOOL_DROP_REASONS``)."""
    if isinstance(exc, SpoolFullError):
        return names.SPOOL_DROP_LIMIT
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return names.SPOOL_DROP_NO_SPACE
    return names.SPOOL_DROP_IO_ERROR


_dropped_counters: weakref.WeakKeyDictionary[Any, Counter] = weakref.WeakKeyDictionary()
_counters_lock = threading.Lock()


def dropped_counter(registry: CollectorRegistry | None = None) -> Counter:
    """``llmsla_spool_dropped_total{kind,reason}`` of ``registry`` (default: the global one),
    created once per registry so every writer of a process shares it."""
    reg = DEFAULT_REGISTRY if registry is None else registry
    with _counters_lock:
        c = _dropped_counters.get(reg)
        if c is None:
            c = _dropped_counters[reg] = Counter(
                names.SPOOL_DROPPED, "Events a spool writer could not write after retrying (spool.write_retry_s), by cause.",
                (names.L_KIND, names.L_REASON), registry=reg)
        return c


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, SpoolError):
        return str(exc)
    return (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or type(exc).__name__


def check_writable(d: Path, *, segment_bytes: int, max_total_bytes: int) -> None:
    """Raise a one-line :class:`SpoolError` unless ``d`` takes a write now: a probe file written
    and synced (a read-only or unwritable directory fails here), at least one segment of free
    space, and the kind under its ``max_total_bytes``. Run by every writer at start-up, so a
    spool that would drop every event stops the component instead."""
    probe = d / INPROGRESS / f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        if drop_reason(exc) == names.SPOOL_DROP_NO_SPACE:
            raise SpoolFullError(f"spool.dir: {d} is on a full file system ({_error_text(exc)}); "
                                 "free space or point spool.dir elsewhere") from None
        raise SpoolError(f"spool.dir: cannot write in {d} ({_error_text(exc)}); "
                         "make it writable or point spool.dir elsewhere") from None
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    if free < segment_bytes:
        raise SpoolFullError(f"spool.dir: {d} has {free} bytes free, less than one segment "
                             f"(spool.segment_max_bytes = {segment_bytes}); free space or point spool.dir elsewhere")
    used = dir_bytes(d)
    if used >= max_total_bytes:
        raise SpoolFullError(f"spool.dir: {d} is full: {used} bytes used of spool.max_total_bytes = {max_total_bytes}"
                             " (is the streaming job running? raise spool.max_total_bytes or prune)")


class SpoolWriter:
    """Appends events of one kind to this writer's own segment; rotates by size and age.

    Thread-safe. Lines are buffered in memory (``WRITE_BUFFER``) and written with ``os.write``
    in whole lines. A background thread publishes a segment that has aged even when no further
    writes arrive, so a quiet gateway never holds events back longer than ``max_segment_age_s``,
    and retries failed writes. :meth:`write_line` never raises for an I/O problem: the lines wait
    in memory (at most ``max_pending_bytes``) and are retried for ``retry_s``; what cannot be
    written then is dropped and counted (``dropped``, the ``llmsla_spool_dropped_total``
    counter, the drop record).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        kind: str,
        *,
        max_segment_bytes: int = 8 << 20,
        max_segment_age_s: float = 1.0,
        max_total_bytes: int = 10 << 30,
        fsync: bool = False,
        background: bool = True,
        retry_s: float = 10.0,
        max_pending_bytes: int = 8 << 20,
        registry: CollectorRegistry | None = None,
        check: bool = True,
    ) -> None:
        self.dir = kind_dir(root, kind)
        self.kind = kind
        self.max_segment_bytes = max_segment_bytes
        self.max_segment_age_s = max_segment_age_s
        self.max_total_bytes = max_total_bytes
        self.fsync = fsync
        self.retry_s = retry_s
        self.max_pending_bytes = max_pending_bytes
        # lines wait in memory up to this many bytes before one os.write (the hot path's buffer)
        self._buffer_limit = min(WRITE_BUFFER, max_pending_bytes)
        try:
            (self.dir / INPROGRESS).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"spool.dir: cannot create {self.dir / INPROGRESS}: {exc.strerror or exc}") from None
        if check:
            check_writable(self.dir, segment_bytes=max_segment_bytes, max_total_bytes=max_total_bytes)
        counter = dropped_counter(registry)
        self._drop_children = {r: counter.labels(kind, r) for r in names.SPOOL_DROP_REASONS}
        self._lock = threading.Lock()
        self._background = background and max_segment_age_s > 0
        self._used = dir_bytes(self.dir)
        self._closed = False
        self.published = 0
        self.tick_errors = 0
        self._reset_locked()
        self._open_record()
        self._start_thread()

    def _reset_locked(self) -> None:
        """The state of a writer that has written nothing (a new one, or a forked child)."""
        self._pid = os.getpid()
        self._tag: str = uuid.uuid4().hex[:8]
        self._seq = itertools.count()
        self._fd: int | None = None
        self._path: Path | None = None
        self._opened = 0.0
        self._size = 0
        self._pending = bytearray()  # whole lines accepted and not yet written
        self._unpublished: list[Path] = []  # written segments whose rename failed (retried)
        self._failing_since: float | None = None
        self._next_try = 0.0
        self._backoff = 0.05
        self._last_reason = names.SPOOL_DROP_IO_ERROR
        self._last_error = ""
        self._drop_logged = -1e9
        self._fail_logged = -1e9
        self._failures = 0
        self._tick_logged = -1e9
        self.dropped: dict[str, int] = dict.fromkeys(names.SPOOL_DROP_REASONS, 0)
        self._record_fd: int | None = None
        self._record_path: Path | None = None
        self._record_dirty = False
        self._record_synced = -1e9

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._background:
            self._thread = threading.Thread(target=self._tick, name=f"spool-{self.kind}", daemon=True)
            self._thread.start()

    @classmethod
    def from_config(cls, cfg: Any, kind: str, *, root: str | os.PathLike[str] | None = None,
                    registry: CollectorRegistry | None = None, **kw: Any) -> SpoolWriter:
        """A writer with every ``[spool]`` setting of ``cfg`` (``root``: instead of ``spool.dir``)."""
        sp = cfg.spool
        opts: dict[str, Any] = dict(
            max_segment_bytes=sp.segment_max_bytes, max_segment_age_s=sp.segment_max_age_s,
            max_total_bytes=sp.max_total_bytes, retry_s=sp.write_retry_s, max_pending_bytes=sp.max_pending_bytes)
        return cls(cfg.spool_dir() if root is None else root, kind, registry=registry, **{**opts, **kw})

    # -- writing ---------------------------------------------------------------------------------
    def write(self, event: Any) -> None:
        """Write one event (anything with ``to_json``), validated against its contract."""
        event.validate()
        self.write_line(event.to_json())

    def write_line(self, line: str) -> None:
        """Append one already-serialised JSON line (no newline inside). Never raises for an I/O
        problem: the line is written, held for a retry, or dropped and counted."""
        if "\n" in line:
            raise ValueError("a spool line must not contain a newline")
        data = (line + "\n").encode()
        with self._lock:
            if self._closed:
                raise ValueError("spool writer is closed")
            if os.getpid() != self._pid:
                self._forked_locked()
            now = time.monotonic()
            if self._failing_since is None:  # the hot path: buffer, write a buffer's worth at once
                pending = self._pending
                pending += data
                if (self._fd is None or len(pending) >= self._buffer_limit
                        or self._size + len(pending) > self.max_segment_bytes
                        or now - self._opened >= self.max_segment_age_s):
                    self._drain_locked(now)
                return
            # writes fail: hold the line (retried with backoff), or drop and count it
            if len(self._pending) + len(data) <= self.max_pending_bytes:
                self._pending += data
                if now >= self._next_try:
                    self._drain_locked(now)
                return
            if now >= self._next_try:  # full: a retry may make room
                self._drain_locked(now)
            if self._failing_since is not None or len(self._pending) + len(data) > self.max_pending_bytes:
                self._drop_locked(1, self._last_reason)  # nowhere to hold it
                return
            self._pending += data
            self._drain_locked(now)

    def flush(self) -> None:
        """Publish the open segment now (e.g. before shutdown or in tests); a failing write is
        tried once more (and stays pending if it fails)."""
        with self._lock:
            if os.getpid() != self._pid:
                self._forked_locked()
            self._drain_locked(time.monotonic(), publish=True)

    def close(self) -> None:
        """Stop the thread, write and publish what is pending; while writes keep failing, retry
        until ``retry_s`` has passed since they started failing, then drop (and count) the rest.
        Afterwards every line this writer accepted is published or counted as dropped."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if os.getpid() != self._pid:  # a forked child: the parent's segment is the parent's
                self._forked_locked(start=False)
            while True:
                now = time.monotonic()
                self._drain_locked(now, publish=True)
                if self._failing_since is None or not self._pending:
                    break
                if now - self._failing_since >= self.retry_s:
                    self._give_up_locked()
                    break
                time.sleep(min(0.1, max(self.retry_s, 0.01)))
            if self._fd is not None:  # the last publish failed (fsync): it holds whole lines
                fd, path = self._fd, self._path
                self._fd, self._path, self._size = None, None, 0
                with contextlib.suppress(OSError):
                    os.close(fd)
                if path is not None:
                    self._unpublished.append(path)
            with contextlib.suppress(OSError):
                self._retry_unpublished_locked()
            if self._unpublished:
                self._count_unpublished_locked()
            self._close_record()

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------
    def _forked_locked(self, *, start: bool = True) -> None:
        """A forked child: the parent owns the open segment, the lines it buffered and its drop
        record; the child starts empty, with its own name, record and background thread."""
        self._reset_locked()
        self._open_record()
        if start and not self._closed:
            self._start_thread()

    def _open_locked(self) -> None:
        # <open ms>-<host>-<pid>-<tag>-<seq>: host-pid-tag names this writer in every segment it
        # publishes (the stream job keeps one watermark per writer), seq orders them
        name = (
            f"{time.time_ns() // 1_000_000:013d}-{socket.gethostname()}-{self._pid}-"
            f"{self._tag}-{next(self._seq):06d}{SUFFIX}"
        )
        path = self.dir / INPROGRESS / name
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._path = path
        self._opened = time.monotonic()
        self._size = 0

    def _write_locked(self, buf: bytearray, n: int) -> None:
        """``buf[:n]`` (whole lines) into the open segment, or none of it: a short or failed
        write is cut back to the segment's last whole line before the error propagates."""
        assert self._fd is not None
        view = memoryview(buf)[:n]
        done = 0
        try:
            while done < n:
                done += os.write(self._fd, view[done:])
        except OSError:
            if done:
                try:
                    os.ftruncate(self._fd, self._size)
                except OSError as exc:
                    self._abandon_locked(view, done, exc)
            raise
        finally:
            view.release()

    def _abandon_locked(self, view: memoryview, done: int, exc: OSError) -> None:
        """A failed write that cannot be cut back: the segment ends in part of a line. Its whole
        lines count as written (no duplicate on the retry); it is left unpublished in
        ``.inprogress``, where ``llmsla spool recover`` publishes it without the partial line."""
        whole = bytes(view[:done]).rfind(b"\n") + 1
        fd, path = self._fd, self._path
        self._fd, self._path, self._size = None, None, 0
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        view.release()
        del self._pending[:whole]
        self._used += done
        log.error("spool %s: could not cut %s back to its last whole line after a failed write (%s); "
                  "left unpublished: run `llmsla spool recover` once the disk is healthy",
                  self.dir, path, _error_text(exc))

    def _check_room_locked(self, n: int) -> None:
        if self._used + n > self.max_total_bytes:
            self._used = dir_bytes(self.dir)  # readers may have pruned meanwhile
            if self._used + n > self.max_total_bytes:
                raise SpoolFullError(
                    f"spool {self.dir} is full: {self._used} bytes used of {self.max_total_bytes}"
                    " (is the streaming job running? raise spool.max_total_bytes or prune)"
                )

    def _flush_pending_locked(self) -> None:
        """Pending lines into segments: whole lines, a segment at most ``max_segment_bytes``
        (a full one is published and the next opened; a line larger than that goes alone)."""
        pending = self._pending
        while pending:
            if self._fd is None:
                self._open_locked()
            room = self.max_segment_bytes - self._size
            if len(pending) <= room:
                cut = len(pending)
            else:
                cut = pending.rfind(b"\n", 0, max(room, 0)) + 1
                if cut == 0:
                    if self._size:  # the next line does not fit: publish this segment first
                        self._publish_locked()
                        continue
                    cut = pending.find(b"\n") + 1  # one line larger than a segment: alone
            self._check_room_locked(cut)
            self._write_locked(pending, cut)
            self._size += cut
            self._used += cut
            del pending[:cut]
            if pending:
                self._publish_locked()

    def _drain_locked(self, now: float, *, publish: bool = False) -> None:
        """Write what is pending, publish the segment when it has aged (or ``publish``); any
        failure is handled (held for a retry, or dropped and counted), never raised."""
        try:
            if self._unpublished:
                self._retry_unpublished_locked()
            if self._pending:
                self._flush_pending_locked()  # may rotate: the new segment is not aged
            if publish or (self._fd is not None and now - self._opened >= self.max_segment_age_s):
                self._publish_locked()
        except OSError as exc:
            self._failed_locked(exc, now)
            if self._fd is not None and (publish or now - self._opened >= self.max_segment_age_s):
                with contextlib.suppress(OSError):  # what it holds is whole lines: publish those
                    self._publish_locked()
            return
        if self._failing_since is not None:
            log.warning("spool %s: writes work again after %.1f s", self.dir, now - self._failing_since)
            self._failing_since = None
            self._backoff = 0.05
        if self._record_dirty:
            self._sync_record_locked()

    def _failed_locked(self, exc: OSError, now: float) -> None:
        """A write or publish failed: start the retry window, or end it (drop what is held)."""
        self._last_reason, self._last_error = drop_reason(exc), _error_text(exc)
        if self._failing_since is None:
            self._failing_since = now
            self._backoff = 0.05
            self._failures += 1
            if now - self._fail_logged >= 60.0:
                self._fail_logged = now
                log.error("spool %s: write failed (%s); retrying for %g s, holding up to %d bytes of events"
                          " (%d failure window(s) so far)", self.dir, self._last_error, self.retry_s,
                          self.max_pending_bytes, self._failures)
        elif now - self._failing_since >= self.retry_s:
            self._give_up_locked()
            # what was held is dropped: the next line held starts its own retry window
            self._failing_since = None
            return
        self._next_try = now + self._backoff
        self._backoff = min(1.0, self._backoff * 2)

    def _give_up_locked(self) -> None:
        n = self._pending.count(b"\n")
        self._pending = bytearray()
        if n:
            self._drop_locked(n, self._last_reason)

    def _drop_locked(self, n: int, reason: str) -> None:
        self.dropped[reason] += n
        self._drop_children[reason].inc(n)
        self._record_dirty = True
        now = time.monotonic()
        if now - self._drop_logged >= 60.0:
            self._drop_logged = now
            log.error("spool %s: dropped %d events (%s: %s); %d dropped so far, counted in %s_total",
                      self.dir, n, reason, self._last_error, sum(self.dropped.values()), names.SPOOL_DROPPED)
        if now - self._record_synced >= 0.5:  # else the background thread or close() writes it
            self._sync_record_locked()

    def _count_unpublished_locked(self) -> None:
        """At close, segments written but not renamed into place (the directory became
        read-only, an I/O error): counted as dropped, since no reader sees them; they stay in
        ``.inprogress`` for ``llmsla spool recover``."""
        n = 0
        for path in self._unpublished:
            try:
                with open(path, "rb") as fh:
                    n += sum(chunk.count(b"\n") for chunk in iter(functools.partial(fh.read, 1 << 20), b""))
            except OSError:
                continue
        paths = ", ".join(p.name for p in self._unpublished)
        self._unpublished = []
        if n:
            self._last_error = self._last_error or "segment could not be published"
            self._drop_locked(n, names.SPOOL_DROP_IO_ERROR)
        log.error("spool %s: %d events in segments that could not be published (%s), counted as dropped; "
                  "they stay in %s/: `llmsla spool recover` publishes them once the disk is healthy",
                  self.dir, n, paths, INPROGRESS)

    def _publish_locked(self) -> None:
        fd, path = self._fd, self._path
        if fd is None or path is None:
            return
        if self.fsync:
            os.fsync(fd)  # a failure keeps the segment open: retried on the next publish
        size = self._size
        self._fd, self._path, self._size = None, None, 0
        with contextlib.suppress(OSError):
            os.close(fd)
        if size:
            self._unpublished.append(path)
            self._retry_unpublished_locked()
        else:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)

    def _retry_unpublished_locked(self) -> None:
        while self._unpublished:
            path = self._unpublished[0]
            os.rename(path, self.dir / path.name)  # a failure: stays listed, tried again
            self._unpublished.pop(0)
            self.published += 1

    # -- the drop record (llmsla doctor) --------------------------------------------------------
    def _open_record(self) -> None:
        """Create this writer's drop record now, while the disk has room: later updates rewrite
        its bytes in place, which a full file system still allows."""
        d = self.dir / DROPPED
        path = d / f"{socket.gethostname()}-{self._pid}-{self._tag}.json"
        self._record_path = path
        try:
            d.mkdir(exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            log.warning("spool %s: no drop record (%s); drops are still counted in %s_total",
                        self.dir, _error_text(exc), names.SPOOL_DROPPED)
            return
        try:
            os.write(fd, b" " * (_RECORD_BYTES - 1) + b"\n")
        except OSError as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            log.warning("spool %s: no drop record (%s); drops are still counted in %s_total",
                        self.dir, _error_text(exc), names.SPOOL_DROPPED)
            return
        self._record_fd = fd

    def _sync_record_locked(self) -> None:
        self._record_synced = time.monotonic()
        if self._record_fd is None:
            return
        body = json.dumps({"kind": self.kind, "pid": self._pid, "dropped": self.dropped,
                           "last_error": self._last_error[:300], "updated_ms": time.time_ns() // 1_000_000},
                          ensure_ascii=True).encode()[: _RECORD_BYTES - 1]
        try:
            os.pwrite(self._record_fd, body.ljust(_RECORD_BYTES - 1) + b"\n", 0)
            self._record_dirty = False
        except OSError:
            pass  # the counter has it; the record catches up on the next sync

    def _close_record(self) -> None:
        if self._record_dirty:
            self._sync_record_locked()
        if self._record_fd is None:
            return
        with contextlib.suppress(OSError):
            os.close(self._record_fd)
        self._record_fd = None
        if not any(self.dropped.values()) and self._record_path is not None:
            with contextlib.suppress(OSError):
                self._record_path.unlink(missing_ok=True)  # nothing to report

    def _tick(self) -> None:
        """Publish aged segments, retry failed writes, bring the drop record up to date; catches
        every exception (counted in ``tick_errors``, logged at most once a minute), so it never
        dies while the writer is open."""
        period = max(0.05, self.max_segment_age_s / 4)
        stop = self._stop
        while not stop.wait(period):
            try:
                with self._lock:
                    if self._closed or os.getpid() != self._pid:
                        continue
                    now = time.monotonic()
                    if self._failing_since is not None:
                        if now >= self._next_try:
                            self._drain_locked(now)
                    elif self._unpublished or (self._fd is not None and now - self._opened >= self.max_segment_age_s):
                        self._drain_locked(now, publish=True)
                    if self._record_dirty:
                        self._sync_record_locked()
            except Exception:  # noqa: BLE001 - a bug here must not stop publishing
                self.tick_errors += 1
                now = time.monotonic()
                if now - self._tick_logged >= 60.0:
                    self._tick_logged = now
                    log.exception("spool %s: background publish failed (%d so far); continuing",
                                  self.dir, self.tick_errors)


def drop_records(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every writer's drop record under ``root`` that counts a drop (``llmsla doctor``)."""
    out: list[dict[str, Any]] = []
    for kind in ALL_EVENT_TYPES:
        d = Path(root) / kind / DROPPED
        try:
            paths = sorted(d.iterdir())
        except OSError:
            continue
        for p in paths:
            try:
                rec = json.loads(p.read_bytes().strip() or b"{}")
            except (OSError, ValueError):
                continue
            dropped = rec.get("dropped") if isinstance(rec, dict) else None
            if isinstance(dropped, dict) and any(isinstance(v, int) and v > 0 for v in dropped.values()):
                out.append({**rec, "kind": kind, "writer": p.stem})
    return out


def not_a_segment(path: Path) -> str | None:
    """Why the entry ``path`` (named like a segment) is not one, else None: a directory, FIFO,
    socket or device, or a symbolic link to nothing. Decided by stat alone: opening a FIFO to
    look would block until a writer comes."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a dangling symbolic link" if os.path.islink(path) else "gone"
    except OSError as exc:
        return f"cannot stat: {exc.strerror or exc}"
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    if stat.S_ISFIFO(st.st_mode):
        return "a FIFO"
    if stat.S_ISSOCK(st.st_mode):
        return "a socket"
    return "not a regular file (a device)"


def _segment_files(d: Path, skipped: list[tuple[Path, str]] | None) -> list[Path]:
    """The segment files in directory ``d`` (``*.jsonl``, not hidden), sorted; any other entry
    named like one is left alone and, with ``skipped``, appended there with the reason."""
    try:
        entries = list(d.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for p in entries:
        if p.suffix != SUFFIX or p.name.startswith((".", "_")):
            continue
        if (why := not_a_segment(p)) is None:
            out.append(p)
        elif skipped is not None:
            skipped.append((p, why))
    return sorted(out)


def published_segments(root: str | os.PathLike[str], kind: str,
                       skipped: list[tuple[Path, str]] | None = None) -> list[Path]:
    """Published segments of a kind, oldest first (names start with the creation time); what is
    named like one but is no regular file is left out (and listed in ``skipped``)."""
    return _segment_files(kind_dir(root, kind), skipped)


def skipped_entries(root: str | os.PathLike[str]) -> list[tuple[Path, str]]:
    """Every entry of the spool, published or in progress, named like a segment that is none
    (a FIFO, socket, directory, dangling link), with the reason: what the spool commands skip."""
    skipped: list[tuple[Path, str]] = []
    for kind in ALL_EVENT_TYPES:
        d = kind_dir(root, kind)
        _segment_files(d, skipped)
        _segment_files(d / INPROGRESS, skipped)
    return skipped


def read_segment(path: Path, kind: str) -> Iterator[Any | BadLine]:
    """Events of one segment in order; a line that fails its contract yields a ``BadLine``
    (file and 1-based line number) instead of stopping the read. A path that is not a regular
    file is a :class:`SpoolError` (opened non-blocking: a FIFO put there is never waited on)."""
    cls = ALL_EVENT_TYPES[kind]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SpoolError(f"{path}: cannot read the segment: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SpoolError(f"{path}: not a regular file")
    with os.fdopen(fd, "rb") as fh:
        for line_no, raw in enumerate(fh, start=1):
            if not raw.endswith(b"\n"):
                yield BadLine(path, line_no, "truncated line (no newline at end)", _shown(raw))
                continue
            line = raw[:-1]
            if is_blank(line):
                continue
            try:
                yield cls.from_json(line)
            except EventError as exc:
                yield BadLine(path, line_no, str(exc), _shown(line))


#: Bytes of a line the readers skip as blank; the stream job's format skips exactly these too.
BLANK_BYTES = b" \t\r"


def is_blank(line: bytes) -> bool:
    """A line of spaces, tabs and carriage returns only (no other whitespace: Python's and Java's
    notions of Unicode whitespace differ, and the spool check and the job must agree)."""
    return not line.strip(BLANK_BYTES)


def _shown(raw: bytes) -> str:
    return raw.rstrip(b"\n").decode("utf-8", errors="replace")


class SpoolReader:
    """Follows one kind's published segments; each segment is returned once per reader."""

    def __init__(self, root: str | os.PathLike[str], kind: str) -> None:
        self.root, self.kind = root, kind
        self._seen: set[str] = set()

    def poll(self) -> list[Path]:
        new = [p for p in published_segments(self.root, self.kind) if p.name not in self._seen]
        self._seen.update(p.name for p in new)
        return new

    def read_new(self) -> Iterator[Any | BadLine]:
        for path in self.poll():
            yield from read_segment(path, self.kind)


def recover(root: str | os.PathLike[str], kind: str, *, older_than_s: float = 60.0) -> int:
    """Publish in-progress segments left by dead writers (untouched for ``older_than_s``),
    cutting a trailing partial line. Returns how many were published. A published segment of
    the same name is never replaced: the recovered one gets a fresh sequence number."""
    d = kind_dir(root, kind)
    count, now = 0, time.time()
    for p in _segment_files(d / INPROGRESS, None):
        try:
            if now - p.stat().st_mtime < older_than_s:
                continue
        except FileNotFoundError:  # its writer published it meanwhile
            continue
        data = p.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut:
            with open(p, "r+b") as fh:
                fh.truncate(cut)
            publish_new(p, d)
            count += 1
        else:
            p.unlink()
    return count


def publish_new(src: Path, d: Path) -> Path:
    """Move ``src`` into ``d`` under its own name or, when that is taken, the same name with a
    longer sequence number (``...-000003-001.jsonl`` would leave the writer pattern; this keeps
    ``<ms>-<host>-<pid>-<tag>-<seq>``): ``link`` fails rather than replace, so nothing
    published is ever overwritten."""
    stem = src.name[: -len(SUFFIX)]
    for n in range(1000):
        dst = d / (src.name if n == 0 else f"{stem}{n:03d}{SUFFIX}")
        try:
            os.link(src, dst)
        except FileExistsError:
            continue
        except OSError as exc:  # no hard links here (some network file systems): check, then rename
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            if dst.exists():
                continue
            os.rename(src, dst)
            return dst
        src.unlink()
        return dst
    raise SpoolError(f"spool recover: {src.name}: 1000 published segments already carry its name; "
                     "move them away and run it again")


def prune(root: str | os.PathLike[str], kind: str, *, older_than_s: float) -> int:
    """Delete published segments older than ``older_than_s``; returns how many were removed."""
    cutoff, removed = time.time() - older_than_s, 0
    for p in published_segments(root, kind):
        try:
            if p.stat().st_mtime < cutoff:
                p.unlink()
                removed += 1
        except FileNotFoundError:
            pass
    return removed


def spool_stats(root: str | os.PathLike[str]) -> dict[str, dict[str, int]]:
    """Per kind: published segment count and bytes used (for ``llmsla doctor`` / status)."""
    return {
        kind: {"segments": len(published_segments(root, kind)), "bytes": dir_bytes(Path(root) / kind)}
        for kind in ALL_EVENT_TYPES
    }

