"""Shared bench plumbing: machine facts, a printed table, and the JSON result file.

Benchmarks are not tests: they measure, print a table, and write ``bench/results/<name>.json``
with the machine, the inputs and ratios against an anchor measured in the same run (machines
here are shared and noisy, so a lone absolute time proves nothing).
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        with open("/proc/meminfo") as fh:
            info["mem_total_kib"] = int(fh.readline().split()[1])
        with open("/proc/loadavg") as fh:
            info["loadavg_at_start"] = fh.read().split()[:3]
    except OSError:
        pass
    return info


def print_table(rows: list[dict[str, Any]], title: str = "") -> None:
    if title:
        print(f"\n{title}")
    if not rows:
        print("(no rows)")
        return
    cols = list(rows[0])
    fmt = [lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)] * len(cols)
    cells = [[f(r.get(c, "")) for f, c in zip(fmt, cols, strict=True)] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"bench": name, "machine": machine_info(), **data}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"\nwrote {path}")
    return path


def paired_interval(ratios: list[float | None], target: float | None = None) -> dict[str, Any]:
    """Geometric mean of paired rounds' ``ratios`` and its 95 % Student t interval (on the logs);
    with a ``target``, the verdict: ``met`` / ``not met`` only when the interval lies wholly
    above / below it, else ``unresolved``."""
    from llmsla.control.ab_stats import t_ppf

    logs = [math.log(x) for x in ratios if x]
    if len(logs) < 2:
        return {"rounds": len(logs), "verdict": "unresolved: fewer than 2 rounds with both figures"}
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = t_ppf(0.975, len(logs) - 1) * sd / math.sqrt(len(logs))
    low, high = math.exp(mean - half), math.exp(mean + half)
    out: dict[str, Any] = {"rounds": len(logs), "geomean": math.exp(mean), "low": low, "high": high, "sd_log": sd}
    if target is not None:
        out["verdict"] = "met" if low >= target else "not met" if high < target else "unresolved"
    return out


def mean_interval(values: list[float], ceiling: float | None = None) -> dict[str, Any]:
    """Mean of per-round ``values`` (differences in the same unit, which may be negative) and its
    95 % Student t interval; with a ``ceiling`` (a "no more than" target), the verdict: ``met`` /
    ``not met`` only when the interval lies wholly at-or-below / above it, else ``unresolved``."""
    from llmsla.control.ab_stats import t_ppf

    if len(values) < 2:
        return {"rounds": len(values), "verdict": "unresolved: fewer than 2 rounds"}
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = t_ppf(0.975, len(values) - 1) * sd / math.sqrt(len(values))
    out: dict[str, Any] = {"rounds": len(values), "mean": mean, "low": mean - half, "high": mean + half, "sd": sd}
    if ceiling is not None:
        out["verdict"] = "met" if mean + half <= ceiling else "not met" if mean - half > ceiling else "unresolved"
    return out
