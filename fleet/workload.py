"""Synthetic loads and the transforms shared with trace replay (time scaling, rate multiplier).

An arrival is ``(t, prompt_tokens, output_tokens, unit)`` in seconds from the start of the run; a
load is a time-sorted list of them. Every generator takes an explicit ``random.Random`` so a seed
fixes the load exactly. ``unit`` is the user or session the request belongs to (what the gateway
reads from the OpenAI ``user`` field or ``X-Session-Id``); empty = the request is its own unit.
An arrival may also name its request class (``class_``, for load shedding).
:func:`sessions` groups a load into sessions.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import NamedTuple


class Arrival(NamedTuple):
    t: float
    prompt: int
    output: int
    unit: str = ""
    #: the request class (``tenants.classes``), what the gateway reads from its class header;
    #: empty = the first class (a trace or generator that knows no classes)
    class_: str = ""


class TokenDist(NamedTuple):
    """Token count: fixed ``mean`` when ``sigma`` is 0, else log-normal with that mean (clamped
    to ``[lo, hi]``) - request sizes in real traces are heavy-tailed, not normal."""

    mean: int
    sigma: float = 0.0
    lo: int = 1
    hi: int = 32768

    def sample(self, rng: random.Random) -> int:
        if self.sigma <= 0:
            return self.mean
        mu = math.log(self.mean) - self.sigma**2 / 2
        return int(min(self.hi, max(self.lo, round(rng.lognormvariate(mu, self.sigma)))))


def poisson(rate: float, duration_s: float, prompt: TokenDist, output: TokenDist,
            rng: random.Random, *, start_s: float = 0.0) -> list[Arrival]:
    """Poisson arrivals at ``rate`` req/s for ``duration_s``."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    out: list[Arrival] = []
    t = start_s + rng.expovariate(rate)
    end = start_s + duration_s
    while t < end:
        out.append(Arrival(t, prompt.sample(rng), output.sample(rng)))
        t += rng.expovariate(rate)
    return out


def bursty(rate: float, duration_s: float, prompt: TokenDist, output: TokenDist,
           rng: random.Random, *, burst_factor: float = 8.0, period_s: float = 30.0,
           on_s: float = 3.0) -> list[Arrival]:
    """On/off modulated Poisson: each ``period_s`` starts with ``on_s`` seconds at
    ``burst_factor`` times the quiet rate; the long-run mean stays ``rate``."""
    if not 0 < on_s < period_s:
        raise ValueError("need 0 < on_s < period_s")
    low = rate * period_s / (burst_factor * on_s + (period_s - on_s))
    high = low * burst_factor
    out: list[Arrival] = []
    t0 = 0.0
    while t0 < duration_s:
        on_end = min(t0 + on_s, duration_s)
        out += poisson(high, on_end - t0, prompt, output, rng, start_s=t0)
        off_end = min(t0 + period_s, duration_s)
        if off_end > on_end:
            out += poisson(low, off_end - on_end, prompt, output, rng, start_s=on_end)
        t0 += period_s
    return out


def burst(n: int, prompt: TokenDist, output: TokenDist, rng: random.Random, *,
          at_s: float = 0.0, spread_s: float = 0.1) -> list[Arrival]:
    """``n`` requests arriving together (uniformly within ``spread_s``)."""
    ts = sorted(at_s + rng.random() * spread_s for _ in range(n))
    return [Arrival(t, prompt.sample(rng), output.sample(rng)) for t in ts]


def scale(arrivals: list[Arrival], *, time_scale: float = 1.0, rate: float = 1.0,
          rng: random.Random | None = None) -> list[Arrival]:
    """Stretch time by ``time_scale`` (0.5 = the same requests in half the time), then multiply
    the request rate by ``rate`` while keeping the duration: below 1 each request is kept with
    probability ``rate``; above 1 the load is superposed with circularly time-shifted copies of
    itself (each copy keeps the trace's burst structure, unlike jittered duplicates)."""
    if time_scale <= 0 or rate <= 0:
        raise ValueError("time_scale and rate must be > 0")
    rng = rng or random.Random(0)
    base = [a._replace(t=a.t * time_scale) for a in arrivals]
    if not base or rate == 1.0:
        return base
    t0 = base[0].t
    span = max(base[-1].t - t0, 1e-9)
    whole, frac = int(rate), rate - int(rate)
    out: list[Arrival] = list(base) if whole >= 1 else []
    copies = [(k, 1.0) for k in range(1, whole)] + ([(whole, frac)] if frac > 0 else [])
    for k, keep in copies:
        shift = 0.0 if k == 0 else rng.random() * span
        for a in base:
            if keep < 1.0 and rng.random() >= keep:
                continue
            t = t0 + (a.t - t0 + shift) % span
            out.append(a._replace(t=t))
    out.sort()
    return out


def window(arrivals: list[Arrival], *, start_s: float = 0.0, duration_s: float | None = None) -> list[Arrival]:
    """The arrivals in ``[start_s, start_s + duration_s)``, re-based to start at 0."""
    end = math.inf if duration_s is None else start_s + duration_s
    return [a._replace(t=a.t - start_s) for a in arrivals if start_s <= a.t < end]


def surge(arrivals: list[Arrival], start_s: float, end_s: float, peak: float,
          rng: random.Random) -> list[Arrival]:
    """A load surge: over ``[start_s, end_s)`` the request rate grows linearly from the load's
    own rate to ``peak`` times it. Extra requests are copies of the load's requests (token counts
    from a random request of the load, time within 0.5 s of a real arrival), so the surge keeps
    the trace's size mix and burst structure."""
    if peak < 1 or end_s <= start_s:
        raise ValueError("surge: need peak >= 1 and start < end")
    out = list(arrivals)
    span = end_s - start_s
    for a in arrivals:
        if not start_s <= a.t < end_s:
            continue
        extra = (peak - 1.0) * (a.t - start_s) / span
        n = int(extra) + (1 if rng.random() < extra - int(extra) else 0)
        for _ in range(n):
            donor = arrivals[rng.randrange(len(arrivals))]
            out.append(Arrival(max(start_s, a.t + rng.uniform(-0.5, 0.5)), donor.prompt, donor.output))
    out.sort()
    return out


def sessions(arrivals: list[Arrival], rng: random.Random, *, mean_turns: float = 6.0, think_s: float = 30.0,
             heaviness_sigma: float = 0.5, prefix: str = "s") -> list[Arrival]:
    """Group a load into sessions (units), keeping its arrival times.

    Real chat traffic is correlated in time through its users: a conversation sends several
    requests minutes apart, and some users send long prompts and get long answers throughout.
    Each arrival either continues the open session whose next turn is due earliest (if one is
    due by then) or opens a new one; a session ends after a geometric number of turns (mean
    ``mean_turns``), with exponential think times (mean ``think_s``) between them. A session's
    token counts are scaled by its own log-normal heaviness (mean 1, ``heaviness_sigma``), so a
    unit's requests are alike. The A/B calibration runs on this, not on independent requests."""
    if mean_turns < 1 or think_s <= 0 or heaviness_sigma < 0:
        raise ValueError("sessions: need mean_turns >= 1, think_s > 0, heaviness_sigma >= 0")
    due: list[tuple[float, int, float]] = []  # (next turn due at, session id, heaviness)
    end_p = 1.0 / mean_turns
    mu = -heaviness_sigma**2 / 2
    out: list[Arrival] = []
    n_sessions = 0
    for a in arrivals:
        if due and due[0][0] <= a.t:
            _, sid, heavy = heapq.heappop(due)
        else:
            sid, heavy = n_sessions, rng.lognormvariate(mu, heaviness_sigma) if heaviness_sigma > 0 else 1.0
            n_sessions += 1
        out.append(Arrival(a.t, max(1, round(a.prompt * heavy)), max(1, round(a.output * heavy)), f"{prefix}{sid}"))
        if rng.random() >= end_p:
            heapq.heappush(due, (a.t + rng.expovariate(1.0 / think_s), sid, heavy))
    return out
