"""Audit trail of every control change: who, why, before, after, when.

Every write through the control API, the distillation controls or the alert receiver's actions
lands here: in a bounded in-memory list (``GET /v1/audit``, tests) and, when a DSN is configured,
as one row of the store table ``names.T_ACTION_LOG``. Store writes run on a small writer thread,
so an audited change never blocks the gateway's event loop on a database round trip; a store that
is down never blocks or loses a control action: the record stays in memory with
``stored = False`` and the failure is logged. :meth:`AuditLog.flush` waits for pending writes.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import logging
import queue
import threading
from typing import Any

from llmsla import names

log = logging.getLogger(__name__)

OUTCOME_APPLIED = "applied"
OUTCOME_CLAMPED = "clamped"  # applied, but moved less than asked (bounded step)
OUTCOME_REFUSED = "refused"  # not applied (last replica, step too large, bad value ...)

_INSERT = (
    f"INSERT INTO {names.T_ACTION_LOG} (ts, source, actor, action, target, params, reason, outcome) "
    "VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s)"
)


class AuditLog:
    """Append-only record of control changes; thread-safe (API handlers may run in threads)."""

    def __init__(self, dsn: str = "", *, source: str = "control_api", maxlen: int = 10_000,
                 connect_timeout_s: float = 5.0) -> None:
        self.dsn = dsn
        self.source = source
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=maxlen)
        self.store_failures = 0
        self._timeout = connect_timeout_s
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._pending = 0
        self._writer: threading.Thread | None = None

    def record(self, *, actor: str, action: str, target: str, before: Any, after: Any,
               reason: str = "", outcome: str = OUTCOME_APPLIED, extra: dict[str, Any] | None = None,
               source: str | None = None) -> dict[str, Any]:
        """Append one change (and write it to the store when configured); returns the record."""
        rec: dict[str, Any] = {
            "ts": dt.datetime.now(dt.UTC).isoformat(),
            "source": source or self.source,
            "actor": actor or "unknown",
            "action": action,
            "target": target,
            "before": before,
            "after": after,
            "reason": reason,
            "outcome": outcome,
            **({"extra": extra} if extra else {}),
        }
        rec["stored"] = None  # None: no store configured or not written yet; then True/False
        with self._lock:
            self.records.append(rec)
            if self.dsn:
                self._pending += 1
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_loop, name="llmsla-audit", daemon=True)
                    self._writer.start()
                self._queue.put(rec)
        return rec

    def _write_loop(self) -> None:
        while True:
            rec = self._queue.get()
            try:
                rec["stored"] = self._store(rec)
            finally:
                with self._lock:
                    self._pending -= 1
                    self._idle.notify_all()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every record so far was written (or failed); False on timeout."""
        with self._lock:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def _store(self, rec: dict[str, Any]) -> bool:
        import psycopg

        params = {"before": rec["before"], "after": rec["after"], **rec.get("extra", {})}
        try:
            with psycopg.connect(self.dsn, connect_timeout=max(1, int(self._timeout))) as conn:
                conn.execute(_INSERT, (
                    rec["ts"], rec["source"], rec["actor"], rec["action"], rec["target"],
                    json.dumps(params, default=str), rec["reason"], rec["outcome"],
                ))
            return True
        except Exception as exc:  # the writer thread must survive any store failure
            self.store_failures += 1
            log.warning("audit: could not write %s to %s (%s); kept in memory", rec["action"],
                        names.T_ACTION_LOG, exc)
            return False

    def recent(self, n: int = 100) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records)[-n:]
