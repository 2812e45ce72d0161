"""Replay of the public request traces (Azure LLM 2023, Mooncake) as simulator arrivals.

A malformed row never stops a replay: it is skipped, counted, and the first line numbers with
their reason are kept in :class:`TraceReport` so the CLI can name them (a corrupt trace then
shows up as a short list of ``file:line: reason``, not as a silently thinner load).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from llmsla.data import data_file
from llmsla.fleet.workload import Arrival

#: Short names for the shared data files (``llmsla simulate --trace azure_conv``).
TRACES: dict[str, str] = {
    "azure_code": "traces/azure_llm_2023_code.csv",
    "azure_conv": "traces/azure_llm_2023_conv.csv",
    "mooncake": "traces/mooncake_conversation.jsonl",
}

#: How many bad line numbers a report keeps (the count is always exact).
MAX_BAD_KEPT = 10

_AZURE_HEADER = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


@dataclass
class TraceReport:
    path: str
    rows: int = 0
    loaded: int = 0
    skipped: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, reason), first few

    def skip(self, line: int, reason: str) -> None:
        self.skipped += 1
        if len(self.bad) < MAX_BAD_KEPT:
            self.bad.append((line, reason))

    def summary(self) -> str:
        s = f"{self.path}: {self.loaded} requests loaded, {self.skipped} malformed rows skipped"
        if self.bad:
            s += " (" + "; ".join(f"line {n}: {r}" for n, r in self.bad) + ")"
        return s

    def to_dict(self) -> dict:
        return {"path": self.path, "rows": self.rows, "loaded": self.loaded, "skipped": self.skipped,
                "bad": [{"line": n, "reason": r} for n, r in self.bad]}


def resolve(name_or_path: str) -> Path:
    """A short trace name (``azure_conv``) via the shared data dir, else a file path."""
    if name_or_path in TRACES:
        return data_file(TRACES[name_or_path])
    p = Path(name_or_path)
    if not p.is_file():
        raise FileNotFoundError(f"trace {name_or_path!r}: no such file (short names: {', '.join(TRACES)})")
    return p


def _tokens(raw: Any, what: str) -> int:
    try:
        v = int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: not an integer: {raw!r}") from None
    if v < 0:
        raise ValueError(f"{what}: negative: {v}")
    return v


def _azure_ts(raw: str) -> float:
    """Epoch seconds of ``2023-11-16 18:15:46.6805900`` (7 fractional digits: not ISO-parsable)."""
    head, _, frac = raw.strip().partition(".")
    try:
        t = datetime.fromisoformat(head).timestamp()
        return t + (float("0." + frac) if frac else 0.0)
    except ValueError:
        raise ValueError(f"TIMESTAMP: not a timestamp: {raw!r}") from None


def load_azure(path: Path) -> tuple[list[Arrival], TraceReport]:
    """Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``)."""
    rep = TraceReport(str(path))
    rows: list[tuple[float, int, int]] = []
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != _AZURE_HEADER:
            raise ValueError(f"{path}:1: expected header {','.join(_AZURE_HEADER)}, got {header!r}")
        for row in reader:
            line = reader.line_num
            rep.rows += 1
            if len(row) != 3:
                rep.skip(line, f"expected 3 columns, got {len(row)}")
                continue
            try:
                ts = _azure_ts(row[0])
                prompt = _tokens(row[1], "ContextTokens")
                output = _tokens(row[2], "GeneratedTokens")
            except ValueError as exc:
                rep.skip(line, str(exc))
                continue
            rows.append((ts, prompt, output))
    return _finish(rows, rep)


def load_mooncake(path: Path) -> tuple[list[Arrival], TraceReport]:
    """Mooncake JSONL (``timestamp`` ms from start, ``input_length``, ``output_length``)."""
    rep = TraceReport(str(path))
    rows: list[tuple[float, int, int]] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            rep.rows += 1
            try:
                d = json.loads(text)
                if not isinstance(d, dict):
                    raise ValueError("not a JSON object")
                ts = d.get("timestamp")
                if isinstance(ts, bool) or not isinstance(ts, int | float) or ts < 0:
                    raise ValueError(f"timestamp: expected a number >= 0, got {ts!r}")
                prompt = _tokens(d.get("input_length"), "input_length")
                output = _tokens(d.get("output_length"), "output_length")
            except ValueError as exc:  # json.JSONDecodeError is a ValueError
                rep.skip(line, str(exc).splitlines()[0][:120])
                continue
            rows.append((ts / 1000.0, prompt, output))
    return _finish(rows, rep)


def _finish(rows: list[tuple[float, int, int]], rep: TraceReport) -> tuple[list[Arrival], TraceReport]:
    """Sort by time and re-base to 0; a request with 0 output tokens still costs a prefill and
    returns one token (what an engine does for ``max_tokens`` >= 1)."""
    rows.sort()
    t0 = rows[0][0] if rows else 0.0
    out = [Arrival(t - t0, max(1, p), max(1, o)) for t, p, o in rows]
    rep.loaded = len(out)
    return out, rep


def load(name_or_path: str) -> tuple[list[Arrival], TraceReport]:
    """Load a trace by short name or path; the format follows the file suffix."""
    path = resolve(name_or_path)
    if path.suffix == ".jsonl":
        return load_mooncake(path)
    return load_azure(path)
