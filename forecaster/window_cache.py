"""The online scorer's windows, read incrementally: each step re-reads only the newest rows.

Every step scores the last W steps, but only the newest ones change: reading all W x targets
rows again (3,584 request rows for 64 targets) cost the full step hundreds of milliseconds in
``fetchall`` alone. The cache keeps the rows of the scored range and re-reads, per table, from
``reread_ms`` before its *frontier* - one window past the newest bucket it has seen - so that
windows the streaming job upserts again (late events within its lateness) or writes late
(the job catching up after a stall: the frontier does not move while nothing new arrives) are
read again; a row that changes further back than that is not seen until it leaves the range.
``reread_ms`` comes from ``forecast.reread_s``, plus the table's window width (a 60 s policy
window is written only after its minute).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import psycopg

from llmsla.forecaster import store_io
from llmsla.forecaster import windowing as w


@dataclass
class _Held:
    frame: w.Frame
    lo: int  # rows held: lo <= bucket < hi
    hi: int
    frontier: int  # one window past the newest bucket seen


@dataclass
class WindowCache:
    reread_ms: int
    tables: tuple[store_io.Table, ...] = store_io.TABLES
    held: dict[str, _Held] = field(default_factory=dict)
    rows_read: int = 0  # rows fetched so far (for tests and the benchmark)

    def read(self, conn: psycopg.Connection, from_ms: int, to_ms: int) -> tuple[w.Frame, ...]:
        """The same frames as :func:`store_io.read_windows` for ``[from_ms, to_ms)``."""
        return tuple(self._table(conn, t, from_ms - t.lookback_ms, to_ms) for t in self.tables)

    def _table(self, conn: psycopg.Connection, t: store_io.Table, lo: int, hi: int) -> w.Frame:
        h = self.held.get(t.table)
        reread = self.reread_ms + t.width_ms  # a window is written after it ends
        if h is None or hi < h.hi or lo < h.lo:  # first read, or the clock went back: all of it
            start, keep = lo, None
        else:
            start = min(max(lo, h.frontier - reread), h.hi)
            b = h.frame["bucket"]
            keep = {k: v[(b >= lo) & (b < start)] for k, v in h.frame.items()}
        new = store_io.read_table(conn, t.table, t.keys, t.values, start, hi)
        self.rows_read += len(new["bucket"])
        frame = new if keep is None or not len(keep["bucket"]) else {
            k: np.concatenate([keep[k], new[k]]) for k in new}
        seen = frame["bucket"]
        frontier = int(seen.max()) + t.width_ms if len(seen) else (h.frontier if h is not None else lo)
        self.held[t.table] = _Held(frame, lo, hi, max(lo, min(frontier, hi)))
        return frame
