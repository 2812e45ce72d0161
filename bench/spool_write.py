"""The spool's hot path: ``SpoolWriter.write_line`` throughput, this tree against a git revision.

The gateway writes one spool line per request, and ``bench/streaming.py`` builds its backlogs
through the same path, so the writer must stay cheap. This bench loads ``llmsla/spool.py`` of
``--base`` (default ``main``) from git as a module of its own and, in paired rounds, times both
writers on the same line (a real ``RequestEvent``, ~330 bytes) with their production settings
(background thread on, 8 MiB segments, 1 s age), the order alternating per round. The ratio of a
round is old seconds / new seconds (new throughput relative to old); the summary is their
geometric mean and 95 % interval (``_common.paired_interval``), judged against ``--target``.

    python bench/spool_write.py                       # 15 rounds of 200k lines
    python bench/spool_write.py --rounds 5 --lines 50000 --threads 4

Writes bench/results/spool-write.json (``--name``).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import paired_interval, print_table, write_result  # noqa: E402

from llmsla import names  # noqa: E402
from llmsla import spool as new_spool  # noqa: E402
from llmsla.events import ItlSummary, RequestEvent  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def load_base(rev: str, where: Path) -> ModuleType:
    """``llmsla/spool.py`` at ``rev`` as the module ``spool_base`` (its imports resolve to this tree)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:llmsla/spool.py"], check=True,
                         capture_output=True, text=True).stdout
    path = where / "spool_base.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("spool_base", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["spool_base"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def one_run(mod: ModuleType, work: Path, line: str, lines: int, threads: int) -> float:
    """Seconds to write ``lines`` lines (split over ``threads``) into a fresh writer; the close
    (publishing the last segment) is outside the timing, as it is outside a request."""
    d = Path(tempfile.mkdtemp(dir=work))
    w = mod.SpoolWriter(d, names.SPOOL_REQUESTS, max_total_bytes=1 << 40)
    write = w.write_line
    per = lines // threads

    def body() -> None:
        for _ in range(per):
            write(line)

    try:
        if threads == 1:
            t0 = time.perf_counter()
            body()
            return time.perf_counter() - t0
        ts = [threading.Thread(target=body) for _ in range(threads)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return time.perf_counter() - t0
    finally:
        w.close()
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="main", help="git revision of the writer to compare with (default main)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--lines", type=int, default=200_000, help="lines per run")
    ap.add_argument("--threads", type=int, default=1, help="writer threads sharing one writer")
    ap.add_argument("--target", type=float, default=0.95, help="new throughput / old, at least")
    ap.add_argument("--dir", default=None, help="where the segments go (default: a temporary directory)")
    ap.add_argument("--name", default="spool-write")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="llmsla-bench-spool-", dir=args.dir))
    try:
        base = load_base(args.base, work)
        gaps = [12.5 + i for i in range(16)]
        line = RequestEvent(ts_ms=1_700_000_000_000, trace_id="a" * 32, model="m", pool="p", replica="r0",
                            arm="default", policy="default", prompt_tokens=20, output_tokens=17, queue_ms=0.4,
                            ttft_ms=35.0, itl_ms=ItlSummary.from_gaps(gaps), e2e_ms=35.0 + sum(gaps),
                            status="ok").to_json()
        impls = {"old": base, "new": new_spool}
        one_run(base, work, line, min(args.lines, 20_000), args.threads)  # warm-up
        one_run(new_spool, work, line, min(args.lines, 20_000), args.threads)
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            secs = {k: one_run(impls[k], work, line, args.lines, args.threads) for k in order}
            row = {"round": r + 1, "first": order[0],
                   "old_klines_s": args.lines / secs["old"] / 1e3, "new_klines_s": args.lines / secs["new"] / 1e3,
                   "ratio": secs["old"] / secs["new"]}
            rounds.append(row)
            print(f"round {r + 1}: old {row['old_klines_s']:.0f}k/s new {row['new_klines_s']:.0f}k/s "
                  f"ratio {row['ratio']:.3f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = paired_interval([x["ratio"] for x in rounds], args.target)
    print_table(rounds, f"SpoolWriter.write_line, {args.lines} lines of {len(line)} B, {args.threads} thread(s)")
    print(f"\nnew/old throughput: geomean {summary.get('geomean', float('nan')):.3f}, 95 % interval "
          f"[{summary.get('low', float('nan')):.3f}, {summary.get('high', float('nan')):.3f}], "
          f"target >= {args.target}: {summary['verdict']}")
    write_result(args.name, {
        "base": args.base, "lines": args.lines, "line_bytes": len(line) + 1, "threads": args.threads,
        "anchor": f"SpoolWriter of {args.base} (git show), same line, same settings, the other run of the round",
        "target": args.target, "rounds": rounds, "summary": summary,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
