"""Trace replay over HTTP: the simulator's arrivals sent as real streaming chat requests.

The same arrivals and transforms as the simulator (:mod:`llmsla.fleet.workload`), sent to a real
OpenAI-compatible endpoint, with request sizes scaled to what it can serve but the trace's
arrival shape kept. The load is open-loop: a request goes at its arrival time whether or not
earlier ones finished, since waiting for slots would hide the latency an overloaded replica
causes. Latency figures come from the gateway; this side only counts what it sent.
See docs/fleet.md#replay-a-trace-against-a-real-endpoint-llmsla-replay.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from llmsla.fleet import traces, workload

#: Words the prompts are made of (byte-level models see bytes; the words only keep them text).
_WORDS = ("the", "a", "service", "level", "token", "stream", "latency", "replica", "request", "model", "queue",
          "first", "budget", "error", "window", "burn", "rate", "pool", "user", "session", "answer", "why")


class Planned(NamedTuple):
    """One request to send: ``t`` seconds after the start, a prompt of ``prompt_chars``
    characters, ``max_tokens`` tokens generated (EOS ignored), on behalf of ``user``."""

    t: float
    prompt_chars: int
    max_tokens: int
    user: str


@dataclass(frozen=True)
class Fit:
    """How a trace's request sizes are scaled to the endpoint: prompt tokens x ``prompt_scale``
    characters (at most ``max_prompt_chars``), output tokens x ``output_scale`` (at most
    ``max_tokens``), each at least 1."""

    prompt_scale: float = 1.0
    output_scale: float = 1.0
    max_prompt_chars: int = 8192
    max_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.prompt_scale <= 0 or self.output_scale <= 0:
            raise ValueError("prompt_scale and output_scale must be > 0")
        if self.max_prompt_chars < 1 or self.max_tokens < 1:
            raise ValueError("max_prompt_chars and max_tokens must be >= 1")


def plan(arrivals: Sequence[workload.Arrival], fit: Fit) -> list[Planned]:
    """The arrivals as requests: same times and units, sizes scaled by ``fit``."""
    return [Planned(a.t, min(fit.max_prompt_chars, max(1, round(a.prompt * fit.prompt_scale))),
                    min(fit.max_tokens, max(1, round(a.output * fit.output_scale))), a.unit)
            for a in arrivals]


def trace_plan(trace: str, fit: Fit, *, duration_s: float, start_s: float = 0.0, time_scale: float = 1.0,
               rate: float = 1.0, sessions: float = 0.0, think_s: float = 30.0, seed: int = 0) -> list[Planned]:
    """``duration_s`` seconds (after stretching) of ``trace`` from ``start_s`` (trace seconds),
    built as ``llmsla simulate`` builds it: window, stretch and rate multiplier (the simulator's
    seeds), then sessions (mean ``sessions`` turns; 0 = every request its own unit)."""
    if duration_s <= 0 or time_scale <= 0:
        raise ValueError("duration_s and time_scale must be > 0")
    arrivals, _report = traces.load(trace)
    arrivals = workload.window(arrivals, start_s=start_s, duration_s=duration_s / time_scale)
    arrivals = workload.scale(arrivals, time_scale=time_scale, rate=rate, rng=random.Random(seed + 100))
    if sessions:
        arrivals = workload.sessions(arrivals, random.Random(seed + 3), mean_turns=sessions, think_s=think_s)
    return plan(arrivals, fit)


def prompt_text(n_chars: int, seed: int) -> str:
    """``n_chars`` characters of words, the same for the same seed."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = -1  # the joined length: one space fewer than words
    while size < n_chars:
        w = rng.choice(_WORDS)
        parts.append(w)
        size += len(w) + 1
    return " ".join(parts)[:n_chars]


def chat_body(p: Planned, i: int, model: str) -> dict[str, Any]:
    """The OpenAI chat request of planned request ``i`` (streamed; ``ignore_eos`` so the output
    length is the trace's, as vLLM's benchmarks do; ``user`` is the A/B unit)."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": prompt_text(p.prompt_chars, i)}],
                            "max_tokens": p.max_tokens, "stream": True, "ignore_eos": True, "seed": i}
    if p.user:
        body["user"] = p.user
    return body


@dataclass
class Outcome:
    """How one request ended, as the client saw it (``status``: the HTTP status, 0 when the
    connection failed or the stream was cut, -1 on the client's own timeout)."""

    index: int
    late_s: float
    status: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    error: str = ""


@dataclass
class ReplayResult:
    start_ms: int
    planned: int
    outcomes: list[Outcome] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        late = sorted(o.late_s for o in self.outcomes)
        statuses = collections.Counter(str(o.status) for o in self.outcomes)
        done = [o for o in self.outcomes if o.status == 200 and not o.error]

        def q(v: list[float], p: float) -> float | None:
            return v[min(len(v) - 1, int(p * len(v)))] if v else None

        return {"start_ms": self.start_ms, "planned": self.planned, "sent": len(self.outcomes),
                "completed": len(done), "statuses": dict(sorted(statuses.items())),
                "errors": dict(collections.Counter(o.error for o in self.outcomes if o.error)),
                "late_p50_s": q(late, 0.5), "late_p99_s": q(late, 0.99), "late_max_s": late[-1] if late else None}


Sender = Callable[[int, Planned], Coroutine[Any, Any, Outcome]]  # an async def: it becomes a task


async def pace(requests: Sequence[Planned], send: Sender, *, start: float,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> list[Outcome]:
    """Send each request at ``start + t`` on ``clock`` (open loop: each in its own task, never
    waiting for earlier ones); returns every outcome once all have ended, in plan order."""
    tasks: list[asyncio.Task[Outcome]] = []
    for i, p in enumerate(requests):
        wait = start + p.t - clock()
        if wait > 0:
            await sleep(wait)
        tasks.append(asyncio.create_task(send(i, p)))
    return list(await asyncio.gather(*tasks))


class HttpSender:
    """Streams one chat completion per planned request to ``url`` (``/v1/chat/completions``)."""

    def __init__(self, session: Any, url: str, *, model: str, start: float, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.session, self.url, self.model = session, url.rstrip("/") + "/v1/chat/completions", model
        self.start, self.timeout_s, self.clock = start, timeout_s, clock

    async def __call__(self, i: int, p: Planned) -> Outcome:
        import aiohttp

        t0 = self.clock()
        out = Outcome(i, max(0.0, t0 - (self.start + p.t)))
        try:
            async with asyncio.timeout(self.timeout_s), self.session.post(self.url, json=chat_body(p, i, self.model)) as r:
                out.status = r.status
                async for chunk in r.content.iter_any():
                    if out.ttft_s is None:
                        out.ttft_s = self.clock() - t0
                    if b"event: error" in chunk:  # the gateway ends a stream it lost this way
                        out.error = "stream_error"
                out.e2e_s = self.clock() - t0
        except TimeoutError:
            out.status, out.error = -1, "timeout"
        except (aiohttp.ClientError, OSError) as exc:
            out.error = type(exc).__name__
        return out


async def replay(url: str, requests: Sequence[Planned], *, model: str, start_ms: int | None = None,
                 timeout_s: float = 60.0) -> ReplayResult:
    """Replay ``requests`` against ``url`` in real time; t = 0 is the epoch ms ``start_ms``
    (default: now; a time in the future is waited for, so a caller can line other things up
    with it)."""
    import aiohttp

    now_ms = time.time() * 1000
    start_ms = int(now_ms) if start_ms is None else start_ms
    start = time.monotonic() + (start_ms - now_ms) / 1000.0
    # one connection per request in flight (no pool limit): an open-loop load must not queue here
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        sender = HttpSender(session, url, model=model, start=start, timeout_s=timeout_s)
        outcomes = await pace(requests, sender, start=start)
    return ReplayResult(start_ms, len(requests), outcomes)


def write_summary(path: str, result: ReplayResult, extra: dict[str, Any]) -> None:
    from pathlib import Path

    Path(path).write_text(json.dumps({**extra, **result.summary()}, indent=2) + "\n")
