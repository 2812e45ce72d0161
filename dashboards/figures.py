"""matplotlib drawings of the report's panels, returned as PNG bytes (Agg backend, no display).

Each function takes query results already shaped like the Grafana panel's data (time in epoch
seconds) and draws what the panel draws: a bucket heatmap with the SLO bound marked, a replica x
time P99 map on a log colour scale, lines with an SLO line, bars per arm. Vertical markers show
``action_log`` annotations.
"""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LogNorm  # noqa: E402

WIDTH, HEIGHT, DPI = 11.0, 3.6, 100
SLO_COLOR = "#d62728"


def _times(ts: Sequence[float]) -> list[dt.datetime]:
    return [dt.datetime.fromtimestamp(t, dt.UTC) for t in ts]


def _finish(fig: plt.Figure, ax: plt.Axes, annotations: Sequence[tuple[float, str]] = ()) -> bytes:
    for t, _label in annotations:
        ax.axvline(dt.datetime.fromtimestamp(t, dt.UTC), color="#7f7f7f", lw=0.8, ls=":")  # type: ignore[arg-type]  # matplotlib converts datetimes; its stubs say float
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S\n%m-%d", tz=dt.UTC))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def bucket_heatmap(times: Sequence[float], bounds: Sequence[float], rates: np.ndarray, *, title: str,
                   objective: float, annotations: Sequence[tuple[float, str]] = ()) -> bytes:
    """``rates[i, j]``: requests/s in bucket ``i`` (upper bound ``bounds[i]``, last = +Inf) at
    ``times[j]``; rows are drawn between each bucket's bounds on a log y axis."""
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    finite = [b for b in bounds if math.isfinite(b)]
    edges = [finite[0] / 2, *finite, finite[-1] * 2]  # the first bucket from half its bound; +Inf drawn one step up
    step = np.median(np.diff(times)) if len(times) > 1 else 1.0
    x = _times([*(t - step / 2 for t in times), times[-1] + step / 2])
    data = np.ma.masked_invalid(np.where(rates > 0, rates, np.nan))
    mesh = ax.pcolormesh(x, edges, data, cmap="inferno", shading="flat")  # type: ignore[arg-type]  # matplotlib converts datetimes; its stubs say float
    ax.set_yscale("log")
    ax.axhline(objective, color=SLO_COLOR, lw=1.2, ls="--", label=f"SLO {objective:g} s")
    ax.set_ylabel("seconds (bucket)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    fig.colorbar(mesh, ax=ax, label="requests/s in bucket", pad=0.01)
    return _finish(fig, ax, annotations)


def replica_map(times: Sequence[float], replicas: Sequence[str], values: np.ndarray, *, title: str,
                objective: float, annotations: Sequence[tuple[float, str]] = ()) -> bytes:
    """x = time, y = replica, colour = P99 seconds on a log scale (the SLO marked on the colour bar)."""
    fig, ax = plt.subplots(figsize=(WIDTH, max(2.2, 0.35 * len(replicas) + 1.4)))
    step = np.median(np.diff(times)) if len(times) > 1 else 1.0
    x = _times([*(t - step / 2 for t in times), times[-1] + step / 2])
    data = np.ma.masked_invalid(np.where(values > 0, values, np.nan))
    lo = float(np.nanmin(data)) if data.count() else objective / 10
    hi = float(np.nanmax(data)) if data.count() else objective
    norm = LogNorm(vmin=min(lo, objective / 2), vmax=max(hi, objective * 2))
    mesh = ax.pcolormesh(x, np.arange(len(replicas) + 1), data, cmap="RdYlGn_r", norm=norm, shading="flat")  # type: ignore[arg-type]  # matplotlib converts datetimes; its stubs say float
    ax.set_yticks(np.arange(len(replicas)) + 0.5, labels=list(replicas))
    ax.set_title(title)
    bar = fig.colorbar(mesh, ax=ax, label="P99 seconds (log)", pad=0.01)
    bar.ax.axhline(objective, color="black", lw=2)
    return _finish(fig, ax, annotations)


def lines(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str, ylabel: str,
          objective: float | None = None, log_y: bool = False, annotations: Sequence[tuple[float, str]] = (),
          styles: dict[str, str] | None = None) -> bytes:
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    for name, (ts, vs) in sorted(series.items()):
        ax.plot(_times(ts), vs, lw=1.2, label=name, ls=(styles or {}).get(name, "-"), marker="o", ms=2.5)  # type: ignore[arg-type]  # matplotlib converts datetimes; its stubs say float
    if objective is not None:
        ax.axhline(objective, color=SLO_COLOR, lw=1.2, ls="--", label=f"SLO {objective:g}")
    if log_y:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 4:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0)
    elif series:
        ax.legend(loc="best", fontsize=8)
    return _finish(fig, ax, annotations)


def bars(labels: Sequence[str], groups: dict[str, Sequence[float]], *, title: str, ylabel: str,
         objective: float | None = None) -> bytes:
    fig, ax = plt.subplots(figsize=(WIDTH / 2, HEIGHT))
    width = 0.8 / max(len(groups), 1)
    xs = np.arange(len(labels))
    for i, (name, vals) in enumerate(groups.items()):
        ax.bar(xs + i * width - 0.4 + width / 2, vals, width, label=name)
    if objective is not None:
        ax.axhline(objective, color=SLO_COLOR, lw=1.2, ls="--", label=f"SLO {objective:g}")
    ax.set_xticks(xs, labels=list(labels))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()
