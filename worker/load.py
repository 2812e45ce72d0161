"""Closed-loop load against an OpenAI-compatible server: tokens per second at a given batch.

Why here and not in a bench: the worker bench and the gateway bench (``bench/exporters.py``)
both measure the reference worker through HTTP, so they share this one definition.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp


async def measure_tokens_per_second(url: str, *, concurrency: int = 16, max_tokens: int = 64, rounds: int = 2,
                                    model: str = "llmsla-tiny", prompt: str = "The quick brown fox",
                                    session: aiohttp.ClientSession | None = None) -> dict[str, Any]:
    """Run ``rounds`` waves of ``concurrency`` simultaneous non-streaming completions.

    Each request asks for exactly ``max_tokens`` tokens (``ignore_eos``, vLLM's extension, which
    the reference worker honours); output tokens are read from ``usage`` and summed, so a server
    that stops early is measured honestly. Returns tokens/s over the wall time.
    """
    own = session is None
    s = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, "ignore_eos": True}
    out_tokens = 0
    n = 0
    try:
        t0 = time.perf_counter()
        for r in range(rounds):
            async def one(i: int, r: int = r) -> int:
                async with s.post(f"{url}/v1/completions", json={**body, "seed": r * concurrency + i}) as resp:
                    resp.raise_for_status()
                    data = await resp.json()
                    return int(data["usage"]["completion_tokens"])

            counts = await asyncio.gather(*(one(i) for i in range(concurrency)))
            out_tokens += sum(counts)
            n += len(counts)
        wall = time.perf_counter() - t0
    finally:
        if own:
            await s.close()
    return {"concurrency": concurrency, "max_tokens": max_tokens, "requests": n, "output_tokens": out_tokens,
            "wall_s": wall, "tokens_per_s": out_tokens / wall if wall > 0 else 0.0}
