"""Upstream response framing: llhttp (httptools, today) against the hand-written state machine it
replaced, on the same bytes in the same run.

The gateway's upstream client parses every proxied response; the structure issue swapped its
framing for llhttp and set a budget of +10 % gateway CPU per proxied stream. This measures the
framing itself, in process, without sockets: the bytes of an 8-chunk SSE stream (chunked, one
token per chunk, as the exporters bench's upstream sends) and of a 5 kB JSON answer
(content-length), fed whole and in small network-sized pieces, through each implementation's
``_Conn`` protocol, the decoded body drained as the gateway does. The previous implementation is
loaded from git history (``--ref``, default: the commit before the switch).

``python bench/upstream.py`` prints a table and writes bench/results/upstream.json.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: exporters/upstream.py before llhttp (the hand-written state machine)
LEGACY_REF = "2e4638e"


def load_legacy(ref: str):  # -> module
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:exporters/upstream.py"], check=True,
                         capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="llmsla-bench-")) / "legacy_upstream.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("legacy_upstream", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def responses() -> dict[str, bytes]:
    parts = [b'data: {"choices":[{"index":0,"text":"x"}]}\n\n' for _ in range(8)] + [b"data: [DONE]\n\n"]
    chunked = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"
    sse = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    body = b'{"choices":[{"text":"' + b"y" * 5000 + b'"}]}'
    fixed = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    return {"SSE, 8 chunks": sse, "JSON, 5 kB": fixed}


class _Transport:
    """The two transport calls the protocol makes while parsing (socket options, flow control)."""

    def get_extra_info(self, name: str, default=None):
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


def run_one(mod, data: bytes, piece: int, n: int) -> float:
    """Seconds per response: a fresh protocol state, the response fed in ``piece``-byte slices,
    its body drained from the queue."""
    pieces = [data[i:i + piece] for i in range(0, len(data), piece)] if piece else [data]
    loop = asyncio.new_event_loop()
    try:
        conn = mod._Conn(("127.0.0.1", 1))
        conn.connection_made(_Transport())
        total = 0
        t0 = time.perf_counter()
        for _ in range(n):
            conn._reset()
            conn.head_fut = loop.create_future()
            for p in pieces:
                conn.data_received(p)
            q = conn.queue
            while q:
                total += len(q.popleft())
            assert conn.done and conn.error is None
        dt = time.perf_counter() - t0
        assert total > 0
        return dt / n
    finally:
        loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000, help="responses per case")
    ap.add_argument("--ref", default=LEGACY_REF, help="git revision of the previous implementation")
    ap.add_argument("--repeats", type=int, default=5, help="alternating runs per case; the median is reported")
    args = ap.parse_args()
    from llmsla.exporters import upstream as current

    legacy = load_legacy(args.ref)
    rows = []
    for name, data in responses().items():
        for piece in (0, 64):
            times: dict[str, list[float]] = {"hand-written (anchor)": [], "llhttp (httptools)": []}
            for _ in range(args.repeats):  # alternate, so drift on a shared machine hits both
                times["hand-written (anchor)"].append(run_one(legacy, data, piece, args.n))
                times["llhttp (httptools)"].append(run_one(current, data, piece, args.n))
            med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
            anchor = med["hand-written (anchor)"]
            for impl, t in med.items():
                rows.append({"response": name, "delivery": "whole" if not piece else f"{piece}-byte pieces",
                             "framing": impl, "us_per_response": round(t * 1e6, 2),
                             "ratio_vs_anchor": round(t / anchor, 3)})
    print_table(rows, "upstream response framing, per response (median of alternating runs)")
    write_result("upstream", {"inputs": {"n": args.n, "repeats": args.repeats, "legacy_ref": args.ref,
                                                "responses": {k: len(v) for k, v in responses().items()}},
                                     "rows": rows})
    print(json.dumps({r["response"] + " / " + r["delivery"]: r["ratio_vs_anchor"] for r in rows
                      if r["framing"].startswith("llhttp")}, indent=1))


if __name__ == "__main__":
    main()
