"""What one streamed piece costs the gateway right after its CPU was idle, against back to back.

Scenario (b) of ``bench/gateway.py`` (200 streams x 256 tokens at 20 ms) keeps the proxy's core
about a fifth busy: between two upstream pieces the loop sleeps, often for 100 us to a few ms.
This measures, in one process pinned to one CPU, the Python work of one piece when the pieces
come back to back (warm) and when each follows a sleep, for two paths:

- ``gateway``: the gateway's relay of one upstream read: ``_Conn.data_received`` (llhttp's chunked
  framing) handing the piece to a sink that makes the calls ``Gateway._proxy``'s relay makes
  (arrival stamp, ``UsageStripper.feed``, the client's chunk framing and write, ``StreamTimer.feed``);
- ``relay`` (the anchor): what ``bench/_relay.py`` does per read, ``data_received`` -> ``write``.

The writes go to an in-memory transport: no syscall is timed, only the Python work. Each sleep
condition runs twice: alone, and with an idle-priority spinner (``chrt -i 0``) on the same CPU,
which keeps the CPU from halting while the measured process sleeps. The ratio to warm is what
an idle-then-woken CPU charges this code on this machine.

    python bench/gateway_wake.py [--pieces N] [--rounds R]

Results: ``bench/results/gateway-wake.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, write_result  # noqa: E402

from llmsla.exporters.openai import UsageStripper  # noqa: E402
from llmsla.exporters.recorder import StreamTimer  # noqa: E402
from llmsla.exporters.upstream import _Conn  # noqa: E402

TOKEN = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
FRAMED = b"%x\r\n%s\r\n" % (len(TOKEN), TOKEN)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class _Sink:
    """A transport that keeps nothing: the write's Python call, not its syscall."""

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def gateway_piece() -> Callable[[], None]:
    """One upstream read through the gateway's relay path (see the module docstring)."""
    conn = _Conn(("upstream", 0))
    conn.tr = _Sink()  # type: ignore[assignment]
    conn.data_received(HEAD)
    timer, stripper, client = StreamTimer(time.perf_counter(), streaming=True), UsageStripper(), _Sink()
    feed, strip, clock = timer.feed, stripper.feed, time.perf_counter

    def piece(data: bytes, end: bool) -> None:
        now = clock()
        out = strip(data)
        client.write(b"%x\r\n%s\r\n" % (len(out), out))
        feed(data, now)

    conn.sink = piece
    return lambda: conn.data_received(FRAMED)


def relay_piece() -> Callable[[], None]:
    """One read through a bare relay: the callback writes the bytes on."""
    out = _Sink()

    def data_received(data: bytes) -> None:
        out.write(data)

    return lambda: data_received(FRAMED)


@contextmanager
def spinner(cpu: int):
    """An idle-priority busy loop on ``cpu`` while the block runs (None where chrt is missing)."""
    if shutil.which("chrt") is None:
        yield None
        return
    proc = subprocess.Popen(["chrt", "-i", "0", sys.executable, "-c", "while True: pass"],
                            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        time.sleep(0.2)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def measure(make: Callable[[], Callable[[], None]], pieces: int, sleep_s: float) -> list[float]:
    """Seconds of one piece each, after ``sleep_s`` idle (0: back to back)."""
    step = make()
    for _ in range(200):
        step()
    pc, out = time.perf_counter, []
    for _ in range(pieces):
        if sleep_s:
            time.sleep(sleep_s)
        t0 = pc()
        step()
        out.append(pc() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--pieces", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cpu = max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    paths = {"gateway": gateway_piece, "relay": relay_piece}
    conditions = [("warm", 0.0, False), ("after 100 us idle", 1e-4, False), ("after 1 ms idle", 1e-3, False),
                  ("after 100 us, CPU kept busy", 1e-4, True), ("after 1 ms, CPU kept busy", 1e-3, True)]
    samples: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for name, sleep_s, busy in conditions if r % 2 == 0 else list(reversed(conditions)):
            for path, make in paths.items():
                if busy:
                    with spinner(cpu):
                        got = measure(make, args.pieces, sleep_s)
                else:
                    got = measure(make, args.pieces, sleep_s)
                samples.setdefault((name, path), []).extend(got)
    rows: list[dict[str, Any]] = []
    warm = {p: statistics.median(samples[("warm", p)]) for p in paths}
    for name, _, _ in conditions:
        g, r = samples[(name, "gateway")], samples[(name, "relay")]
        gm, rm = statistics.median(g), statistics.median(r)
        rows.append({"condition": name, "gateway_us": round(gm * 1e6, 2),
                     "gateway_p90_us": round(sorted(g)[int(len(g) * 0.9)] * 1e6, 2),
                     "relay_us": round(rm * 1e6, 2), "gateway_minus_relay_us": round((gm - rm) * 1e6, 2),
                     "gateway_vs_warm": round(gm / warm["gateway"], 2), "relay_vs_warm": round(rm / warm["relay"], 2)})
    print_table(rows, f"one streamed piece's Python work, CPU {cpu}, {args.rounds} rounds x {args.pieces} pieces (medians)")
    write_result("gateway-wake", {"inputs": {"pieces": args.pieces, "rounds": args.rounds, "cpu": cpu}, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
