"""AIPerf as the benches' reference client: find it, give it a local tokenizer, run ``aiperf
profile`` and read its per-request export (``profile_export.jsonl``) into one row per request.

AIPerf is not a dependency of llmsla: install it in its own venv (``python -m venv ~/aiperf &&
~/aiperf/bin/pip install aiperf``) and name it with ``--aiperf PATH`` or ``$AIPERF``; the default
is ``aiperf`` on PATH. Nothing here installs anything. The tokenizer is built at run time by
AIPerf's own interpreter (``bench/_tokenizer.py``), so no network and no committed binaries.
Rows carry the trace id the gateway returned (its ``X-Request-Id`` response header, recorded by
``--export-http-trace``), which is the ``RequestEvent.trace_id`` of the same request.
See docs/gateway.md#measured-against-aiperf.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TOKENIZER = Path(__file__).resolve().parent / "_tokenizer.py"
INSTALL_HINT = ("AIPerf not found: install it in its own venv (python -m venv ~/aiperf-venv && "
                "~/aiperf-venv/bin/pip install aiperf), then pass --aiperf ~/aiperf-venv/bin/aiperf "
                "or set AIPERF to that path")


class AiperfMissing(SystemExit):
    """The bench cannot run without AIPerf; says how to install it."""


@dataclass(frozen=True)
class Record:
    """One request as AIPerf measured it (ms; None where AIPerf had no value)."""

    trace_id: str | None
    ok: bool
    ttft_ms: float | None
    itl_ms: float | None  # AIPerf's inter_token_latency: (latency - TTFT) / (output tokens - 1)
    latency_ms: float | None
    output_tokens: int | None
    good: bool
    #: of the client TTFT, the time spent before the request was on the wire: waiting for a
    #: connection (http_req_blocked) and opening one (http_req_connecting)
    connect_ms: float = 0.0
    #: epoch ns when AIPerf started the request, and when its last byte was written
    start_ns: int | None = None
    sent_ns: int | None = None


def find(flag: str | None) -> str:
    """The aiperf executable: ``--aiperf``, else ``$AIPERF``, else ``aiperf`` on PATH."""
    want = flag or os.environ.get("AIPERF") or "aiperf"
    path = shutil.which(want)
    if path is None:
        raise AiperfMissing(f"{want!r}: {INSTALL_HINT}")
    return path


def interpreter(aiperf: str) -> str:
    """The Python AIPerf runs under (its script's shebang), which has ``tokenizers``."""
    first = Path(aiperf).read_bytes()[:512].split(b"\n", 1)[0]
    if first.startswith(b"#!") and b"python" in first:
        return first[2:].decode().strip().split()[0]
    sibling = Path(aiperf).resolve().parent / "python"
    if sibling.exists():
        return str(sibling)
    raise AiperfMissing(f"cannot tell which Python runs {aiperf}; {INSTALL_HINT}")


def tokenizer(aiperf: str, out: Path) -> Path:
    """Build the local tokenizer directory with AIPerf's interpreter."""
    subprocess.run([interpreter(aiperf), str(TOKENIZER), str(out)], check=True, capture_output=True, timeout=300)
    return out


def profile(aiperf: str, url: str, model: str, tok: Path, out: Path, *, requests: int, input_tokens: int,
            output_tokens: int, concurrency: int | None = None, rate: float | None = None, endpoint: str = "chat",
            goodput: str | None = None, headers: Sequence[str] = (), seed: int = 1, timeout_s: float = 900,
            cpus: str | None = None) -> list[Record]:
    """One ``aiperf profile`` of streamed ``endpoint`` requests (chat or completions) at a fixed
    request count (closed loop at ``concurrency``, or open loop at ``rate`` requests/s, with at
    most ``concurrency`` in flight when given); returns its per-request records."""
    cmd = [aiperf, "profile", "-m", model, "--url", url, "--endpoint-type", endpoint, "--streaming",
           "--tokenizer", str(tok), "--use-server-token-count", "--use-legacy-max-tokens",
           "--extra-inputs", "ignore_eos:true", "--prompt-input-tokens-mean", str(input_tokens),
           "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", str(output_tokens),
           "--prompt-output-tokens-stddev", "0", "--request-count", str(requests), "--export-http-trace",
           "--ui", "none", "--artifact-dir", str(out), "--no-server-metrics", "--no-gpu-telemetry",
           "--random-seed", str(seed)]
    if rate is not None:
        cmd += ["--request-rate", f"{rate:.3f}"]
        if concurrency:
            cmd += ["--concurrency", str(concurrency)]
    else:
        cmd += ["--concurrency", str(concurrency or 1)]
    if goodput:
        cmd += ["--goodput", goodput]
    for h in headers:
        cmd += ["--header", h]
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "aiperf.stdout", "wb") as log:
        res = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
    if res.returncode:
        tail = (out / "aiperf.stdout").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"aiperf exited {res.returncode}:\n{tail}")
    return read_records(out / "profile_export.jsonl")


def _value(metrics: dict, tag: str) -> float | None:
    m = metrics.get(tag)
    return None if not isinstance(m, dict) or not isinstance(m.get("value"), int | float) else float(m["value"])


def read_records(path: Path) -> list[Record]:
    """Rows of AIPerf's per-request export; the trace id from the response's X-Request-Id."""
    rows: list[Record] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        metrics, trace = r.get("metrics") or {}, r.get("trace_data") or {}
        hdrs = {k.lower(): v for k, v in (trace.get("response_headers") or {}).items()}
        status = trace.get("response_status_code")
        out = _value(metrics, "output_sequence_length")
        rows.append(Record(trace_id=hdrs.get("x-request-id"), ok=status == 200 and not r.get("error"),
                           ttft_ms=_value(metrics, "time_to_first_token"),
                           itl_ms=_value(metrics, "inter_token_latency"),
                           latency_ms=_value(metrics, "request_latency"),
                           output_tokens=None if out is None else int(out),
                           good=_value(metrics, "good_request_count") == 1,
                           connect_ms=(_value(metrics, "http_req_blocked") or 0.0)
                           + (_value(metrics, "http_req_connecting") or 0.0),
                           start_ns=(r.get("metadata") or {}).get("request_start_ns"),
                           sent_ns=trace.get("request_send_end_ns")))
    return rows


def span_s(records: list[Record]) -> float | None:
    """Seconds from the first request's start to the last one's end."""
    spans = [(r.start_ns, r.start_ns + r.latency_ms * 1e6) for r in records
             if r.ok and r.start_ns is not None and r.latency_ms is not None]
    if len(spans) < 2:
        return None
    return (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e9


def served_rps(records: list[Record]) -> float | None:
    """Requests completed per second, from the first start to the last end among the records."""
    span = span_s(records)
    return None if not span else sum(r.ok for r in records) / span


def summary(out: Path, tag: str, stat: str = "avg") -> float | None:
    """One figure of AIPerf's summary (profile_export_aiperf.json), e.g. request_throughput."""
    m = json.loads((out / "profile_export_aiperf.json").read_text()).get(tag)
    return None if not isinstance(m, dict) or m.get(stat) is None else float(m[stat])


def good_count(out: Path) -> int | None:
    """AIPerf's own summary figure: good_request_count of profile_export_aiperf.json."""
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    g = summary.get("good_request_count")
    return None if not g else int(g.get("avg", 0))
