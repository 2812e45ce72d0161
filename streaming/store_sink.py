"""Writes the job's window rows and dead letters into the store, idempotently.

Each flush is one transaction: COPY the batch into a temporary staging table, then one
``INSERT ... SELECT`` from it. Window rows upsert on their primary key (bucket + labels), so a
replay after a restart rewrites the same row instead of adding to it; dead letters insert only
when their fingerprint is not there yet. A broken connection is retried with exponential backoff
for ``retry_s``; after that :class:`StoreUnavailable` stops the job rather than dropping rows (the
restarted job resumes from its last checkpoint, whose sink buffer still holds them).

No pyflink import here: the Flink operator in ``flink_sink`` wraps this, and tests use it directly.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from llmsla import names
from llmsla.events import ALL_EVENT_TYPES, EventError, shown_name
from llmsla.redaction import redact
from llmsla.store import rollups
from llmsla.streaming import sql

log = logging.getLogger(__name__)

#: First word of a dead letter's ``reason``; counters and the roll-up view group by it.
REASONS: tuple[str, ...] = ("parse", "schema", "future", "past", "late")


class StoreUnavailable(RuntimeError):
    """The store stayed unreachable for the whole retry budget; the job must stop, not drop rows."""


def fingerprint(source: str, file: str | None, verdict: str, raw: bytes) -> str:
    """Identity of a dead letter: the same line (its bytes as read) of the same file rejected for
    the same reason: sha256 of ``source, file, verdict, raw`` each followed by a NUL byte (text as
    UTF-8), first 32 hex digits. For a UTF-8 line this is what earlier releases computed from the
    line's text, so replays of old dead letters still match."""
    h = hashlib.sha256()
    for part in (source.encode("utf-8", "replace"), (file or "").encode("utf-8", "replace"),
                 verdict.encode("utf-8", "replace"), raw):
        h.update(part)
        h.update(b"\x00")
    return h.hexdigest()[:32]


def storable(text: str) -> str:
    """``text`` as PostgreSQL can hold it: NUL written as the six characters ``\\u0000`` and a lone
    surrogate (which UTF-8 cannot encode) as U+FFFD; anything else unchanged."""
    if text.isascii():
        return text.replace("\x00", "\\u0000") if "\x00" in text else text
    text = text.replace("\x00", "\\u0000")
    return _LONE_SURROGATE.sub("\ufffd", text)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # str regexes see each surrogate as one character


def shown_line(raw: bytes) -> str:
    """A raw line for the ``raw`` column: invalid UTF-8 bytes as U+FFFD, NUL escaped (storable)."""
    return storable(raw.decode("utf-8", "replace"))


#: Files whose dead letters could not be numbered (warned about once).
_UNREADABLE: set[str] = set()


def line_numbers(file: str, raws: set[bytes]) -> dict[bytes, int]:
    """1-based number of the first line of ``file`` equal to each of ``raws`` (bytes as read).

    The line is found again in its published segment, which never changes (the stream reads it
    once per batch of dead letters; Flink's file source, the fallback's, does not say where a
    record came from). A file that is gone (pruned) gives no number."""
    path = Path(urllib.parse.urlparse(file).path) if file.startswith("file:") else Path(file)
    found: dict[bytes, int] = {}
    try:
        with open(path, "rb") as fh:
            for n, line in enumerate(fh, 1):
                line = line.rstrip(b"\n")
                if line.endswith(b"\r"):
                    line = line[:-1]
                if line in raws and line not in found:
                    found[line] = n
                    if len(found) == len(raws):
                        break
    except OSError as exc:
        if file not in _UNREADABLE:  # once per file: every later batch from it fails the same way
            _UNREADABLE.add(file)
            log.warning("dead letters of %s get no line numbers: %s", file, exc)
    return found


def dead_letter_reason(source: str, verdict: str, raw: bytes, *, problem: str | None = None,
                       max_future_s: float, max_past_s: float) -> str:
    """``<category>: <detail>``; for invalid lines the contract in ``llmsla.events`` says why,
    judging the line's bytes exactly as ``llmsla spool check`` does. Never raises: a line that
    breaks the contract's own code still gets a reason (and the job keeps running)."""
    if verdict == "late":
        return "late: its event-time window was already emitted (beyond watermark delay + allowed lateness)"
    if verdict == "future":
        return f"future: ts_ms more than {max_future_s:g} s ahead of the job's clock"
    if verdict == "past":
        return f"past: ts_ms more than {max_past_s:g} s behind the job's clock"
    cls = ALL_EVENT_TYPES.get(source)
    if cls is None:
        return f"schema: unknown spool kind {shown_name(source)}"
    if problem == "truncated":  # the segment's last bytes, without a newline (spool check agrees)
        return f"parse: {cls.KIND}.<record>: truncated line (no newline at end)"
    try:
        cls.from_json(raw)
    except EventError as exc:
        category = "parse" if "not valid JSON" in exc.reason or exc.field == "<record>" else "schema"
        return f"{category}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a contract bug must not stop the job
        log.error("the contract raised %s on a %s line; dead-lettered as schema", type(exc).__name__, source)
        return f"schema: {cls.KIND}: the contract check failed ({type(exc).__name__}: {exc})"
    return (
        "schema: rejected by the stream's check although the contract accepts it "
        f"(format problem: {problem or 'none'}); please report this line"
    )


class StoreWriter:
    """Batched, idempotent writes of encoded job output to PostgreSQL/TimescaleDB."""

    def __init__(
        self,
        dsn: str,
        *,
        retry_s: float = 30.0,
        max_future_s: float = 300.0,
        max_past_s: float = 7 * 86400.0,
        on_dead_letter: Callable[[str], None] | None = None,
        job_minutes: bool = False,
    ) -> None:
        self.dsn = dsn
        self.job_minutes = job_minutes  # the job sends the 1 m roll-up rows (the Java path)
        self._writes_minutes: bool | None = None  # ... and the store takes them (decided once)
        self.retry_s = retry_s
        self.max_future_s = max_future_s
        self.max_past_s = max_past_s
        self.on_dead_letter = on_dead_letter
        self._conn: psycopg.Connection | None = None
        self.rows_written = 0
        self.flushes = 0
        self.retries = 0

    # -- public ----------------------------------------------------------------------------------
    def write(self, kind: str, payloads: Iterable[str]) -> int:
        """Write payloads of one output kind: a window kind's are lines of COPY text (one per
        row; a payload may hold a window's rows, ``sql.batched_query``), a dead letter's a JSON
        array (``sql.DEAD_COLUMNS``); returns rows handed to the database."""
        rows: list[Any]  # COPY text lines, or a dead letter's column tuples
        if kind == sql.DEAD_LETTERS:
            rows = self._dead_letter_rows(payloads)
        else:
            rows = self._window_rows(kind, payloads)
        minutes = kind in (names.T_REQUEST_WINDOWS, names.T_REQUEST_WINDOWS_1M) and self._minutes_taken()
        if kind == names.T_REQUEST_WINDOWS_1M and not minutes:
            return 0  # TimescaleDB: its continuous aggregate computes the minutes
        if not rows:
            return 0
        self._with_retries(lambda conn: self._flush(conn, kind, rows, minutes=minutes))
        self.rows_written += len(rows)
        self.flushes += 1
        return len(rows)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    # -- encoding --------------------------------------------------------------------------------
    def _window_rows(self, kind: str, payloads: Iterable[str]) -> list[str]:
        """The payloads' COPY text lines, the last one of each key (the table's leading
        columns): a replayed row replaces, never adds, and one INSERT never meets a key twice."""
        n = len(sql.TABLE_KEYS[kind])
        latest: dict[tuple[str, ...], str] = {}
        for batch in payloads:
            for line in batch.split(sql.ROW_SEPARATOR):
                latest[tuple(line.split("\t", n)[:n])] = line
        return list(latest.values())

    def _dead_letter_rows(self, payloads: Iterable[str]) -> list[Sequence[Any]]:
        out: dict[str, list[Any]] = {}
        for p in payloads:
            source, file, verdict, problem, raw_b64 = json.loads(p)
            try:
                raw = base64.b64decode(raw_b64 or "", validate=True)
            except (binascii.Error, ValueError):
                raw = (raw_b64 or "").encode()
            reason = dead_letter_reason(source, verdict, raw, problem=problem,
                                        max_future_s=self.max_future_s, max_past_s=self.max_past_s)
            fp = fingerprint(source, file, verdict, raw)
            if fp not in out and self.on_dead_letter is not None:
                self.on_dead_letter(reason.split(":", 1)[0])
            out[fp] = [storable(source), storable(file) if file else file, None, storable(reason), raw, fp]
        by_file: dict[str, list[list[Any]]] = {}
        for row in out.values():
            if row[1]:
                by_file.setdefault(row[1], []).append(row)
        for file, rows in by_file.items():
            numbers = line_numbers(file, {row[4] for row in rows})
            for row in rows:
                row[2] = numbers.get(row[4])
        for row in out.values():
            row[4] = shown_line(row[4])
        return list(out.values())

    # -- database --------------------------------------------------------------------------------
    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, connect_timeout=5, application_name="llmsla-stream")
        return self._conn

    def _with_retries(self, fn: Callable[[psycopg.Connection], None]) -> None:
        deadline = time.monotonic() + self.retry_s
        delay = 0.1
        while True:
            try:
                conn = self._connection()
                fn(conn)
                return
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                self.close()
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"store sink: {redact(self.dsn)} unavailable for {self.retry_s:g} s "
                        f"({str(exc).strip() or type(exc).__name__}); stopping the job so no window is "
                        "lost - a restart resumes from the last checkpoint"
                    ) from None
                self.retries += 1
                log.warning("store write failed (%s); retrying in %.1f s", str(exc).strip(), delay)
                time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
                delay = min(delay * 2, 5.0)

    def _minutes_taken(self) -> bool:
        """Whether the job's minute rows go into the store: only a plain store's 1 m table (with
        migration 0009's triggers) takes them; TimescaleDB's roll-ups are continuous aggregates."""
        if not self.job_minutes:
            return False
        if self._writes_minutes is None:
            def probe(conn: psycopg.Connection) -> None:
                row = conn.execute(
                    "SELECT c.relkind = 'r' AND to_regproc(%s) IS NOT NULL FROM pg_class c WHERE c.oid = to_regclass(%s)",
                    (rollups.MINUTE_INSERT_FUNCTION, names.T_REQUEST_WINDOWS_1M)).fetchone()
                conn.rollback()
                self._writes_minutes = bool(row and row[0])
                log.info("1 m roll-ups: %s", "written by the job" if self._writes_minutes else "the store's")
            self._with_retries(probe)
        return bool(self._writes_minutes)

    def _flush(self, conn: psycopg.Connection, kind: str, rows: list[Any], *, minutes: bool) -> None:
        with conn.transaction(), conn.cursor() as cur:
            if minutes:
                # this transaction's minutes come from the job: the 5 s triggers skip them
                cur.execute("SELECT set_config(%s, 'on', true)", (rollups.WRITER_MINUTES,))
            if kind == sql.DEAD_LETTERS:
                self._flush_dead(cur, rows)
            elif kind == names.T_REQUEST_WINDOWS_1M:
                _copy_or_upsert(cur, kind, ", ".join(sql.MINUTE_COLUMNS), rows, rollups.writer_minutes_upsert)
            else:
                self._flush_windows(cur, kind, rows)

    @staticmethod
    def _flush_windows(cur: psycopg.Cursor, table: str, rows: Sequence[str]) -> None:
        cols = sql.TABLE_COLUMNS[table]
        keys = sql.TABLE_KEYS[table]
        col_list = ", ".join(cols)
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in cols if c not in keys)
        _copy_or_upsert(cur, table, col_list, rows, lambda stage: (
            f"INSERT INTO {table} ({col_list}) SELECT {col_list} FROM {stage} "
            f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}, updated_at = now()"))

    @staticmethod
    def _flush_dead(cur: psycopg.Cursor, rows: list[Sequence[Any]]) -> None:
        t = names.T_DEAD_LETTERS
        cols = "source, file, line, reason, raw, fingerprint"
        stage = _stage(cur, t, cols, rows)
        # One writer at a time per database, so two sink subtasks cannot both insert a fingerprint
        # (dead_letters is partitioned by time, so fingerprint cannot carry a unique index).
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (0x11A5_DEAD,))
        cur.execute(
            f"INSERT INTO {t} ({cols}) SELECT {cols} FROM {stage} s "
            f"WHERE NOT EXISTS (SELECT 1 FROM {t} d WHERE d.fingerprint = s.fingerprint)"
        )


def _copy_or_upsert(cur: psycopg.Cursor, table: str, col_list: str, rows: Sequence[str],
                    upsert: Callable[[str], str]) -> None:
    """Window rows (lines of COPY text) into ``table``: COPY straight into it, inside a
    savepoint, which is all a live stream or a backlog needs (its windows are new); a row that
    is there already (a replay after a restart, a ``--fresh`` run) fails that COPY with a unique
    violation, and the whole batch then goes through the staging table and ``upsert(stage)``
    (replace on the key). The staging copy and the INSERT from it were ~20 % of the database's
    time per 5 s row (docs/streaming.md). Statement triggers fire for COPY as for INSERT."""
    try:
        with cur.connection.transaction(), cur.copy(f"COPY {table} ({col_list}) FROM STDIN") as copy:
            copy.write("\n".join(rows) + "\n")
        return
    except psycopg.errors.UniqueViolation:
        pass  # rolled back to the savepoint: nothing of this batch was written
    cur.execute(upsert(_stage(cur, table, col_list, rows)))


def _stage(cur: psycopg.Cursor, table: str, col_list: str, rows: Sequence[Sequence[Any] | str]) -> str:
    """COPY ``rows`` (values, or lines of COPY text as the job encodes window rows) into this
    transaction's temp staging copy of ``table``; returns its name."""
    stage = f"llmsla_stage_{table}"
    cur.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS "
        f"SELECT {col_list} FROM {table} WITH NO DATA"
    )
    with cur.copy(f"COPY {stage} ({col_list}) FROM STDIN") as copy:
        if rows and isinstance(rows[0], str):
            copy.write("\n".join(rows) + "\n")  # type: ignore[arg-type]  # one encoding per batch: all str
        else:
            for row in rows:
                copy.write_row(row)
    return stage
