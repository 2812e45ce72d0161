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

from llmsla import names
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
    #: after :meth:`read`: the first 5 s step whose features may differ from the last read's -
    #: the first re-read row that differs from the one held (a 60 s window feeds the steps after
    #: it); the read's end when nothing differs; its start after a read of the whole range
    changed_from_ms: int = 0

    def read(self, conn: psycopg.Connection, from_ms: int, to_ms: int) -> tuple[w.Frame, ...]:
        """The same frames as :func:`store_io.read_windows` for ``[from_ms, to_ms)``."""
        frames, changed = [], to_ms
        for t in self.tables:
            frame, first_change = self._table(conn, t, from_ms - t.lookback_ms, to_ms)
            frames.append(frame)
            if first_change is not None:
                changed = min(changed, first_change + t.width_ms - names.REQUEST_WINDOW_S * 1000)
        self.changed_from_ms = changed
        return tuple(frames)

    def _table(self, conn: psycopg.Connection, t: store_io.Table, lo: int, hi: int) -> tuple[w.Frame, int | None]:
        h = self.held.get(t.table)
        reread = self.reread_ms + t.width_ms  # a window is written after it ends
        if h is None or hi < h.hi or lo < h.lo:  # first read, or the clock went back: all of it
            start, keep, was = lo, None, None
        else:
            start = min(max(lo, h.frontier - reread), h.hi)
            b = h.frame["bucket"]
            keep = {k: v[(b >= lo) & (b < start)] for k, v in h.frame.items()}
            was = {k: v[b >= start] for k, v in h.frame.items()}
        new = store_io.read_table(conn, t.table, t.keys, t.values, start, hi)
        self.rows_read += len(new["bucket"])
        frame = new if keep is None or not len(keep["bucket"]) else {
            k: np.concatenate([keep[k], new[k]]) for k in new}
        seen = frame["bucket"]
        frontier = int(seen.max()) + t.width_ms if len(seen) else (h.frontier if h is not None else lo)
        self.held[t.table] = _Held(frame, lo, hi, max(lo, min(frontier, hi)))
        return frame, lo if was is None else first_difference(was, new)


def first_difference(old: w.Frame, new: w.Frame) -> int | None:
    """The bucket of the first row where two frames in the store's row order differ (a value, a
    key, a row only one has), or ``None`` when they are equal."""
    n = min(len(old["bucket"]), len(new["bucket"]))
    same = np.ones(n, dtype=bool)
    for k, v in new.items():
        a, b = old[k][:n], v[:n]
        eq = a == b
        if b.dtype.kind == "f":
            eq |= np.isnan(a) & np.isnan(b)
        same &= eq
    differ = np.flatnonzero(~same)
    if len(differ):
        i = differ[0]
        return int(min(old["bucket"][i], new["bucket"][i]))
    if len(old["bucket"]) != len(new["bucket"]):
        return int((old if len(old["bucket"]) > n else new)["bucket"][n])
    return None
