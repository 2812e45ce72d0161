"""Helpers shared by the reference-worker tests: config, SSE parsing, metric scraping."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp

from llmsla import config as config_mod

MODEL = "llmsla-tiny"


def worker_cfg(tmp_path: Path, **worker: Any) -> config_mod.Config:
    c = config_mod.load(env={})
    c.spool.dir = str(tmp_path / "spool")
    c.worker.max_prompt_tokens = 256
    c.worker.max_tokens = 64
    for k, v in worker.items():
        setattr(c.worker, k, v)
    return c


def parse_sse(raw: bytes) -> list[Any]:
    """Strict SSE framing check: every event is exactly one ``data: `` line ended by a blank line,
    the last one is ``[DONE]``; returns the decoded JSON payloads before it."""
    assert raw.endswith(b"\n\n"), raw[-50:]
    events = raw[:-2].split(b"\n\n")
    assert events[-1] == b"data: [DONE]", events[-1]
    out = []
    for ev in events[:-1]:
        assert ev.startswith(b"data: ") and b"\n" not in ev, ev[:80]
        out.append(json.loads(ev[6:]))
    return out


async def post(s: aiohttp.ClientSession, url: str, path: str, body: Any, headers: dict | None = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with s.post(url + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as r:
        raw = await r.read()
        if r.headers.get("Content-Type", "").startswith("text/event-stream"):
            return r.status, parse_sse(raw)
        return r.status, json.loads(raw)


def metric_samples(text: str, name: str) -> dict[str, float]:
    """``{label-string: value}`` for every sample of ``name`` in a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out
