"""The spool: a directory of JSON-lines segment files, the embedded event transport.

Layout: ``<root>/<kind>/`` holds published segments (``*.jsonl``); ``<root>/<kind>/.inprogress/``
holds the one open segment of each writer. A writer appends whole lines to its own file only, and
publishes it by an atomic ``rename`` into the kind directory when it reaches a size or an age. So
readers (the Flink file source, ``SpoolReader``) only ever see complete files, several writer
processes never share a file, and a crashed writer leaves at most its unpublished segment behind
(``recover`` publishes those). Dot-prefixed paths are hidden from Flink's default file filter.

Disk use is bounded per kind: past ``max_total_bytes`` a write raises :class:`SpoolFullError`
rather than filling the disk under the database.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmsla.errors import UserError
from llmsla.events import EVENT_TYPES, EventError

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
    if kind not in EVENT_TYPES:
        raise ValueError(f"unknown spool kind {kind!r}; expected one of {', '.join(EVENT_TYPES)}")
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


class SpoolWriter:
    """Appends events of one kind to this writer's own segment; rotates by size and age.

    Thread-safe. A background thread publishes a segment that has aged even when no further
    writes arrive, so a quiet gateway never holds events back longer than ``max_segment_age_s``.
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
    ) -> None:
        self.dir = kind_dir(root, kind)
        self.kind = kind
        self.max_segment_bytes = max_segment_bytes
        self.max_segment_age_s = max_segment_age_s
        self.max_total_bytes = max_total_bytes
        self.fsync = fsync
        try:
            (self.dir / INPROGRESS).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(f"spool.dir: cannot create {self.dir / INPROGRESS}: {exc.strerror or exc}") from None
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._file: Any = None
        self._path: Path | None = None
        self._opened = 0.0
        self._size = 0
        self._pid = os.getpid()
        self._tag: str | None = None
        self._used = dir_bytes(self.dir)
        self._closed = False
        self.published = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background and max_segment_age_s > 0:
            self._thread = threading.Thread(target=self._tick, name=f"spool-{kind}", daemon=True)
            self._thread.start()

    # -- writing ---------------------------------------------------------------------------------
    def write(self, event: Any) -> None:
        """Write one event (anything with ``to_json``), validated against its contract."""
        event.validate()
        self.write_line(event.to_json())

    def write_line(self, line: str) -> None:
        """Append one already-serialised JSON line (no newline inside)."""
        if "\n" in line:
            raise ValueError("a spool line must not contain a newline")
        data = (line + "\n").encode()
        with self._lock:
            if self._closed:
                raise ValueError("spool writer is closed")
            if self._file is not None and (
                os.getpid() != self._pid
                or self._size + len(data) > self.max_segment_bytes
                or time.monotonic() - self._opened >= self.max_segment_age_s
            ):
                self._publish_locked()
            if self._used + len(data) > self.max_total_bytes:
                self._used = dir_bytes(self.dir)  # readers may have pruned meanwhile
                if self._used + len(data) > self.max_total_bytes:
                    raise SpoolFullError(
                        f"spool {self.dir} is full: {self._used} bytes used of {self.max_total_bytes}"
                        " (is the streaming job running? raise spool.max_total_bytes or prune)"
                    )
            if self._file is None:
                self._open_locked()
            self._file.write(data)
            self._size += len(data)
            self._used += len(data)

    def flush(self) -> None:
        """Publish the open segment now (e.g. before shutdown or in tests)."""
        with self._lock:
            self._publish_locked()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._lock:
            self._publish_locked()
            self._closed = True

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------
    def _open_locked(self) -> None:
        if os.getpid() != self._pid or self._tag is None:  # a new writer (or a forked child)
            self._pid, self._tag = os.getpid(), uuid.uuid4().hex[:8]
            self._seq = itertools.count()
        # <open ms>-<host>-<pid>-<tag>-<seq>: host-pid-tag names this writer in every segment it
        # publishes (the stream job keeps one watermark per writer), seq orders them
        name = (
            f"{time.time_ns() // 1_000_000:013d}-{socket.gethostname()}-{self._pid}-"
            f"{self._tag}-{next(self._seq):06d}{SUFFIX}"
        )
        self._path = self.dir / INPROGRESS / name
        self._file = open(self._path, "xb", buffering=1 << 16)  # noqa: SIM115 - closed on publish
        self._opened = time.monotonic()
        self._size = 0

    def _publish_locked(self) -> None:
        if self._file is None or self._path is None:
            return
        if os.getpid() != self._pid:  # forked child: the parent owns that file
            self._file, self._path = None, None
            return
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self._file.close()
        if self._size:
            os.rename(self._path, self.dir / self._path.name)
            self.published += 1
        else:
            self._path.unlink(missing_ok=True)
        self._file, self._path = None, None

    def _tick(self) -> None:
        period = max(0.05, self.max_segment_age_s / 4)
        while not self._stop.wait(period):
            with self._lock:
                if self._file is not None and time.monotonic() - self._opened >= self.max_segment_age_s:
                    self._publish_locked()


def published_segments(root: str | os.PathLike[str], kind: str) -> list[Path]:
    """Published segments of a kind, oldest first (names start with the creation time)."""
    d = kind_dir(root, kind)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.suffix == SUFFIX and not p.name.startswith((".", "_")))


def read_segment(path: Path, kind: str) -> Iterator[Any | BadLine]:
    """Events of one segment in order; a line that fails its contract yields a ``BadLine``
    (file and 1-based line number) instead of stopping the read."""
    cls = EVENT_TYPES[kind]
    with open(path, "rb") as fh:
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
    for p in sorted((d / INPROGRESS).glob(f"*{SUFFIX}")):
        if now - p.stat().st_mtime < older_than_s:
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
        for kind in EVENT_TYPES
    }

