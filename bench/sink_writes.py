"""The stream sink's database cost per event, on the rows a real job run writes.

The streaming benchmark's walls mix the JVM, Python and PostgreSQL on two busy cores; this one
measures the sink's share alone, and repeatably. It runs ``llmsla stream --once`` once on a
multi-writer backlog (``bench/streaming.py``'s generator) into a private embedded store, reads
back the 5 s window rows and the job's minute rows as the COPY text the job sends, then writes
them again through ``StoreWriter`` into emptied tables in the sink's batch sizes (5 s rows in
flushes of ``stream.sink_batch_rows``, minutes a few minutes at a time, as a backlog flushes
them), measuring the PostgreSQL backend's CPU seconds (user + system) per phase:

* ``windows``: the 5 s rows, new (what a live stream and a backlog write);
* ``minutes``: the job's 1 m rows, new, with the hour trigger they fire;
* ``replay``: the 5 s rows again, every key there already (a restart from a checkpoint).

Anchor, in the same run: a bare ``COPY`` of the same 5 s lines into a temporary table with the
same columns (``anchor_copy``). Per event = the CPU of ``windows`` + ``minutes`` divided by the
backlog's events.

    python bench/sink_writes.py                       # 1M events, 5 rounds
    python bench/sink_writes.py --events 200000 --rounds 2

To compare two versions of the sink, check the other version's ``streaming/`` and
``llmsla/store/`` out over this tree, run with ``--name``, and check them back.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

import psutil
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_result  # noqa: E402

from llmsla import names  # noqa: E402
from llmsla.streaming import sql, store_sink  # noqa: E402
from streaming import private_store, run_job, write_backlog  # noqa: E402

W, M1, H1 = names.T_REQUEST_WINDOWS, names.T_REQUEST_WINDOWS_1M, names.T_REQUEST_WINDOWS_1H


def _lines(conn: psycopg.Connection, table: str, cols: tuple[str, ...]) -> list[str]:
    with conn.cursor().copy(f"COPY (SELECT {', '.join(cols)} FROM {table} ORDER BY bucket) TO STDOUT") as cp:
        data = b"".join(bytes(b) for b in cp)
    conn.commit()
    return data.decode().splitlines()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5, help="writes of the same rows; the median is reported")
    ap.add_argument("--name", default="sink-writes", help="result file bench/results/<name>.json")
    ap.add_argument("--minutes-per-flush", type=int, default=3, help="minute batches per flush (a backlog's)")
    args = ap.parse_args()

    work, cfg, handle = private_store("llmsla-bench-sink-")
    start_ms = int(time.time() * 1000) - 2 * 3600 * 1000
    backlog = write_backlog(work / "spool", args.events, start_ms, 5_000, args.writers,
                            segment_bytes=cfg.spool.segment_max_bytes, segment_age_s=cfg.spool.segment_max_age_s)
    cfg.spool.dir = str(backlog.full.parent)
    run_job(cfg, log=work / "job.log")
    with psycopg.connect(cfg.store.dsn) as conn:
        windows = _lines(conn, W, sql.REQUEST_COLUMNS)
        minutes = _lines(conn, M1, sql.MINUTE_COLUMNS)
    if not windows or not minutes:
        raise SystemExit(f"the job wrote {len(windows)} window and {len(minutes)} minute rows; see {work / 'job.log'}")

    writer = store_sink.StoreWriter(cfg.store.dsn, job_minutes=True)
    conn = writer._connection()
    backend = psutil.Process(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
    conn.commit()

    def cpu() -> float:
        t = backend.cpu_times()
        return t.user + t.system

    batch = cfg.stream.sink_batch_rows
    per_minute = len({line.split("\t", 1)[0] for line in minutes})
    minute_batch = max(1, len(minutes) // per_minute) * args.minutes_per_flush
    phases: dict[str, list[float]] = {"anchor_copy": [], "windows": [], "minutes": [], "replay": []}
    for _ in range(args.rounds):
        conn.execute(f"TRUNCATE {W}, {M1}, {H1}")
        conn.commit()
        c0 = cpu()
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(f"CREATE TEMP TABLE anchor ON COMMIT DROP AS SELECT {', '.join(sql.REQUEST_COLUMNS)} FROM {W} WITH NO DATA")
            for i in range(0, len(windows), batch):
                with cur.copy(f"COPY anchor ({', '.join(sql.REQUEST_COLUMNS)}) FROM STDIN") as cp:
                    cp.write("\n".join(windows[i:i + batch]) + "\n")
        phases["anchor_copy"].append(cpu() - c0)
        for phase, table, rows, size in (("windows", W, windows, batch), ("minutes", M1, minutes, minute_batch),
                                         ("replay", W, windows, batch)):
            c0 = cpu()
            for i in range(0, len(rows), size):
                writer.write(table, [sql.ROW_SEPARATOR.join(rows[i:i + size])])
            phases[phase].append(cpu() - c0)
    writer.close()
    handle.close()
    shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in phases.items()}
    n_rows = {"anchor_copy": len(windows), "windows": len(windows), "minutes": len(minutes), "replay": len(windows)}
    table = [{"phase": k, "rows": n_rows[k], "cpu_s_median": round(v, 3), "us_per_row": round(v / n_rows[k] * 1e6, 1),
              "vs_anchor_per_row": round((v / n_rows[k]) / (med["anchor_copy"] / len(windows)), 2),
              "spread_s": round(max(phases[k]) - min(phases[k]), 3)} for k, v in med.items()]
    per_event_us = (med["windows"] + med["minutes"]) / backlog.events * 1e6
    print_table(table, f"PostgreSQL backend CPU of the sink's writes ({backlog.events:,} events, {args.rounds} rounds)")
    print(f"\nper event (windows + minutes): {per_event_us:.3f} us")
    write_result(args.name, {
        "inputs": {"events": backlog.events, "writers": args.writers, "segments": backlog.segments,
                   "rounds": args.rounds, "batch_rows": batch, "minute_rows_per_flush": minute_batch},
        "anchor": "bare COPY of the same 5 s lines into a temporary table, same run",
        "phases": table, "raw_cpu_s": phases, "per_event_us": round(per_event_us, 3),
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
