"""Where the receiver keeps what it knows: idempotency keys, per-target state, audit rows.

:class:`PgJournal` (the store; production and the integration tests) makes the receiver
restartable and safe to run several times over: each target is processed inside one
transaction holding ``pg_advisory_xact_lock`` on the target key, so two receivers never act on
the same replica or pool at once; the idempotency key is claimed with ``INSERT ... ON CONFLICT DO
NOTHING`` in that transaction, so a delivery is acted on by exactly one of them; state and audit
rows commit together with the claim. A restarted receiver reads ``receiver_state`` and resumes
hold-downs and restores where they were.

:class:`MemoryJournal` is the same contract in process memory (no DSN configured): nothing
survives a restart, and it says so at startup.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from llmsla import names

log = logging.getLogger(__name__)
SOURCE = "alert_receiver"
AUDIT_COLUMNS = ("ts", "source", "actor", "action", "target", "params", "reason", "alertname", "fingerprint",
                 "outcome", "alert_status", "decision", "latency_ms", "dedupe_key")


class JournalUnavailable(RuntimeError):
    """The store cannot be reached: the alert was not recorded (the sender should retry)."""


class Tx:
    """One target's transaction: its state, the claim of idempotency keys, audit rows."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.saved: dict[str, Any] | None = None
        self.rows: list[dict[str, Any]] = []
        self.claims: list[tuple[str, str, str, str, str]] = []

    async def claim(self, dedupe_key: str, fingerprint: str, status: str, starts_at: str, group_key: str) -> bool:
        """Record the idempotency key; False if it was recorded before (a duplicate)."""
        raise NotImplementedError

    async def load(self) -> dict[str, Any] | None:
        """The target's state (read after the claim: a duplicate never needs it)."""
        raise NotImplementedError

    async def serialize(self, name: str) -> None:
        """Also hold lock ``name`` until this transaction ends (decisions that span targets,
        such as how many replicas of a pool are drained)."""
        raise NotImplementedError

    async def claim_many(self, claims: list[tuple[str, str, str, str, str]]) -> list[bool]:
        """Claim many idempotency keys at once (:meth:`Journal.batch`): per claim, in order,
        whether it was new; a key listed twice is new at most once."""
        raise NotImplementedError

    def save(self, state: dict[str, Any]) -> None:
        self.saved = state

    def audit(self, **row: Any) -> dict[str, Any]:
        full = {c: row.get(c) for c in AUDIT_COLUMNS}
        full["ts"] = full["ts"] or dt.datetime.now(dt.UTC)
        full["source"] = SOURCE
        full["actor"] = full["actor"] or "alert-receiver"
        full["params"] = full["params"] or {}
        full["reason"] = full["reason"] or ""
        self.rows.append(full)
        return full


class Journal:
    """Common part: the in-process tail of audit rows (``GET /v1/audit``)."""

    durable = False

    def __init__(self, keep: int = 10_000) -> None:
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, key: str) -> asyncio.Lock:
        lk = self._locks.get(key)
        if lk is None:
            if len(self._locks) > 10_000:
                self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            lk = self._locks[key] = asyncio.Lock()
        return lk

    def lock(self, key: str, claim: tuple[str, str, str, str, str] | None = None
             ) -> contextlib.AbstractAsyncContextManager[Tx]:
        """The target's transaction; ``claim`` = the idempotency key the caller will claim first
        (lets a store journal send it together with the lock)."""
        raise NotImplementedError

    def batch(self) -> contextlib.AbstractAsyncContextManager[Tx]:
        """A transaction for alerts that touch no target (no rule matches, no target label):
        their claims (:meth:`Tx.claim_many`) and audit rows commit together, without a target
        lock or state. A large group of such alerts (static alerts grouped by labels they do not
        carry) costs a few round trips, not two per alert."""
        raise NotImplementedError

    async def states(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        raise NotImplementedError

    async def prune(self, older_than_s: float) -> int:
        return 0

    async def close(self) -> None:
        pass


class _MemTx(Tx):
    def __init__(self, key: str, journal: MemoryJournal) -> None:
        super().__init__(key)
        self._j = journal
        self._new: set[str] = set()
        self.held: list[asyncio.Lock] = []

    async def load(self) -> dict[str, Any] | None:
        raw = self._j._states.get(self.key)
        return json.loads(json.dumps(raw)) if raw is not None else None

    async def serialize(self, name: str) -> None:
        lk = self._j._lock(name)
        await lk.acquire()
        self.held.append(lk)

    async def claim(self, dedupe_key: str, fingerprint: str, status: str, starts_at: str, group_key: str) -> bool:
        if dedupe_key in self._j._receipts or dedupe_key in self._new:
            return False
        self._new.add(dedupe_key)
        return True

    async def claim_many(self, claims: list[tuple[str, str, str, str, str]]) -> list[bool]:
        return [await self.claim(*c) for c in claims]


class MemoryJournal(Journal):
    def __init__(self, keep: int = 10_000) -> None:
        super().__init__(keep)
        self._states: dict[str, dict[str, Any]] = {}
        self._receipts: set[str] = set()

    @contextlib.asynccontextmanager
    async def lock(self, key: str, claim: tuple[str, str, str, str, str] | None = None) -> AsyncIterator[Tx]:
        async with self._lock(key):
            tx = _MemTx(key, self)
            try:
                yield tx
                self._receipts |= tx._new
                if tx.saved is not None:
                    self._states[key] = json.loads(json.dumps(tx.saved))
                self.recent.extend(tx.rows)
            finally:
                for lk in tx.held:
                    lk.release()

    @contextlib.asynccontextmanager
    async def batch(self) -> AsyncIterator[Tx]:
        tx = _MemTx("", self)
        yield tx
        self._receipts |= tx._new
        self.recent.extend(tx.rows)

    async def states(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        return {k: json.loads(json.dumps(v)) for k, v in self._states.items() if k.startswith(prefix)}


_CLAIM = (f"INSERT INTO {names.T_ALERT_RECEIPTS} (dedupe_key, fingerprint, status, starts_at, group_key) "
          "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (dedupe_key) DO NOTHING RETURNING 1")
_CLAIM_MANY = (f"INSERT INTO {names.T_ALERT_RECEIPTS} (dedupe_key, fingerprint, status, starts_at, group_key) "
               "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[]::timestamptz[], %s::text[]) "
               "ON CONFLICT (dedupe_key) DO NOTHING RETURNING dedupe_key")
_LOAD = f"SELECT state FROM {names.T_RECEIVER_STATE} WHERE key = %s"
_XLOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"


class _PgTx(Tx):
    """Runs in pipeline mode: lock, claim and state read go out in one round trip."""

    def __init__(self, key: str, conn: Any, pipe: Any) -> None:
        super().__init__(key)
        self._conn = conn
        self._pipe = pipe
        self._claim: tuple[str, bool] | None = None
        self._state: dict[str, Any] | None = None

    async def load(self) -> dict[str, Any] | None:
        return self._state

    async def claim(self, dedupe_key: str, fingerprint: str, status: str, starts_at: str, group_key: str) -> bool:
        if self._claim is not None and self._claim[0] == dedupe_key:
            return self._claim[1]
        cur = await self._conn.execute(_CLAIM, (dedupe_key, fingerprint, status, starts_at, group_key[:2000]))
        await self._pipe.sync()
        return (await cur.fetchone()) is not None

    async def serialize(self, name: str) -> None:
        await self._conn.execute(_XLOCK, (name,))
        await self._pipe.sync()  # wait until the lock is actually held


class _PgBatchTx(Tx):
    """No target: no lock, no state; claims in one statement."""

    def __init__(self, conn: Any) -> None:
        super().__init__("")
        self._conn = conn

    async def claim_many(self, claims: list[tuple[str, str, str, str, str]]) -> list[bool]:
        if not claims:
            return []
        cols = [list(col) for col in zip(*((k, fp, st, at, gk[:2000]) for k, fp, st, at, gk in claims), strict=True)]
        cur = await self._conn.execute(_CLAIM_MANY, cols)
        new = {r[0] for r in await cur.fetchall()}
        out = []
        for c in claims:
            out.append(c[0] in new)
            new.discard(c[0])  # a key listed twice: its later copies are duplicates
        return out


_INSERT_AUDIT = (f"INSERT INTO {names.T_ACTION_LOG} ({', '.join(AUDIT_COLUMNS)}) VALUES "
                 f"({', '.join('%s::jsonb' if c == 'params' else '%s' for c in AUDIT_COLUMNS)})")


_COPY_AUDIT = f"COPY {names.T_ACTION_LOG} ({', '.join(AUDIT_COLUMNS)}) FROM STDIN"


def _audit_params(r: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(json.dumps(r[c], default=str) if c == "params" else r[c] for c in AUDIT_COLUMNS)


class PgJournal(Journal):
    """The store-backed journal; ``size`` connections, opened lazily."""

    durable = True

    def __init__(self, dsn: str, *, size: int = 4, connect_timeout_s: float = 5.0, keep: int = 10_000) -> None:
        super().__init__(keep)
        self.dsn = dsn
        self.size = size
        self.timeout = connect_timeout_s
        self._pool: asyncio.Queue[Any] = asyncio.Queue()
        self._opened = 0

    async def _get(self) -> Any:
        import psycopg

        if self._pool.empty() and self._opened < self.size:
            self._opened += 1
            try:
                return await psycopg.AsyncConnection.connect(self.dsn, autocommit=True,
                                                            connect_timeout=max(1, int(self.timeout)))
            except psycopg.Error as exc:
                self._opened -= 1
                raise JournalUnavailable(f"store unreachable: {exc}") from None
        return await self._pool.get()

    def _put(self, conn: Any) -> None:
        if conn.closed or conn.broken:
            self._opened -= 1
        else:
            self._pool.put_nowait(conn)

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[Any]:
        import psycopg

        conn = await self._get()
        try:
            yield conn
        except psycopg.OperationalError as exc:
            raise JournalUnavailable(f"store failed mid-transaction: {exc}") from None
        finally:
            self._put(conn)

    @contextlib.asynccontextmanager
    async def lock(self, key: str, claim: tuple[str, str, str, str, str] | None = None) -> AsyncIterator[Tx]:
        """BEGIN, the target's advisory lock, ``claim`` (if given) and the state read in one round
        trip; the state, audit rows and COMMIT in another."""
        async with self._lock(key), self._conn() as conn, conn.pipeline() as pipe, conn.transaction():
            await conn.execute(_XLOCK, (key,))
            claimed = await conn.execute(_CLAIM, (*claim[:4], claim[4][:2000])) if claim else None
            state = await conn.execute(_LOAD, (key,))
            await pipe.sync()
            tx = _PgTx(key, conn, pipe)
            if claimed is not None and claim is not None:
                tx._claim = (claim[0], (await claimed.fetchone()) is not None)
            row = await state.fetchone()
            tx._state = row[0] if row else None
            yield tx
            if tx.saved is not None:
                await conn.execute(
                    f"INSERT INTO {names.T_RECEIVER_STATE} (key, state, updated_at) VALUES (%s, %s::jsonb, now()) "
                    "ON CONFLICT (key) DO UPDATE SET state = EXCLUDED.state, updated_at = now()",
                    (key, json.dumps(tx.saved)))
            for r in tx.rows:
                await conn.execute(_INSERT_AUDIT, _audit_params(r))
        self.recent.extend(tx.rows)

    @contextlib.asynccontextmanager
    async def batch(self) -> AsyncIterator[Tx]:
        """BEGIN, one INSERT for the claims, the audit rows by COPY, COMMIT."""
        async with self._conn() as conn, conn.transaction():
            tx = _PgBatchTx(conn)
            yield tx
            if tx.rows:
                async with conn.cursor().copy(_COPY_AUDIT) as copy:
                    for r in tx.rows:
                        await copy.write_row(_audit_params(r))
        self.recent.extend(tx.rows)

    async def states(self, prefix: str = "") -> dict[str, dict[str, Any]]:
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT key, state FROM {names.T_RECEIVER_STATE} WHERE key LIKE %s",
                                     (prefix.replace("%", r"\%").replace("_", r"\_") + "%",))
            rows = await cur.fetchall()
        return {k: s for k, s in rows}

    async def prune(self, older_than_s: float) -> int:
        async with self._conn() as conn:
            cur = await conn.execute(
                f"DELETE FROM {names.T_ALERT_RECEIPTS} WHERE received_at < now() - make_interval(secs => %s)",
                (older_than_s,))
            return cur.rowcount

    async def check(self) -> None:
        """Fail early (with the fix) when the tables are missing."""
        async with self._conn() as conn:
            cur = await conn.execute("SELECT to_regclass(%s), to_regclass(%s)",
                                     (names.T_ALERT_RECEIPTS, names.T_RECEIVER_STATE))
            row = await cur.fetchone()
        if row is None or None in row:
            raise JournalUnavailable(f"tables {names.T_ALERT_RECEIPTS}/{names.T_RECEIVER_STATE} missing: run `llmsla migrate`")

    async def close(self) -> None:
        while not self._pool.empty():
            await (self._pool.get_nowait()).close()
        self._opened = 0
