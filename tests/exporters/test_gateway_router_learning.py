"""The gateway gives LADR's completion-time estimate what it learns from: each successful
response's output tokens and TTFT reach ``Router.end``, each request's prompt size (read from its
body) reaches ``Router.pick`` and ``Router.begin``, and each streamed first token
``Router.first_token``. A real reference worker behind a real gateway; after a few streamed and
non-streamed requests the router knows the pool's output and prompt lengths (all four) and the
replica's decode and prefill speed (the two streamed ones; docs/control.md#expected-completion-time-learnt-replica-speed)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry

from llmsla import config as config_mod
from llmsla.app import wiring
from llmsla.exporters.openai import prompt_estimate
from llmsla.worker.server import WorkerThread

TOKENS = 12
#: two streams of 39 decode tokens: past the 64 a replica's first decode estimate rests on
LEARN_TOKENS = 40
PROMPT = "count with me"


async def _requests(url: str, model: str, tokens: int = TOKENS) -> list[int]:
    """Two non-streamed and two streamed requests; for each streamed one, the chunks with text
    the client got (a token whose bytes end mid-character streams as an empty text)."""
    texts = []
    async with aiohttp.ClientSession() as s:
        for stream in (False, True, False, True):
            body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True,
                    "stream": stream}
            async with s.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                raw = await r.read()
            if stream:
                events = [json.loads(line[5:]) for line in raw.decode().splitlines()
                          if line.startswith("data:") and line != "data: [DONE]"]
                texts.append(sum(1 for e in events if any(c.get("text") for c in e["choices"])))
    return texts


def test_gateway_feeds_output_tokens_to_the_router(tmp_path: Path) -> None:
    cfg = config_mod.load(env={})
    cfg.spool.dir = str(tmp_path / "spool")
    cfg.worker.max_tokens = 64
    worker = WorkerThread(cfg)
    try:
        cfg.gateway.upstreams = [worker.start()]

        picked: list[int | None] = []

        async def main() -> dict:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry(), spool=None) as gw:
                router = gw.gateway.plane.router
                real_pick = router.pick

                def pick(*a, **kw):  # a spy: the real router picks
                    picked.append(kw.get("prompt_tokens"))
                    return real_pick(*a, **kw)

                router.pick = pick  # type: ignore[method-assign]  # spy on the real router's pick
                await _requests(gw.url, cfg.worker.model, LEARN_TOKENS)
                return router.snapshot()

        snap = asyncio.run(main())
    finally:
        worker.stop()
    pool, rows = next(iter(snap["pools"].items()))
    assert snap["output_tokens_mean"][pool] == LEARN_TOKENS  # every response had exactly that many
    ect = rows[0]["ect"]
    # a non-streamed response has no TTFT: it teaches the output length, not the replica's speed
    assert ect["observations"] == 2
    assert ect["tpot_per_load_s"] is not None and ect["tpot_per_load_s"] > 0
    assert ect["ttft_s"] is not None and ect["ttft_s"] > 0
    # the prompt's size as the gateway reads it from the body reaches the pick and the router
    assert picked == [prompt_estimate(len(PROMPT))] * 4
    assert snap["prompt_tokens_mean"][pool] == prompt_estimate(len(PROMPT))
    assert ect["prefill_per_token_s"] is not None and ect["prefill_per_token_s"] > 0  # streamed first tokens
    assert ect["waiting_prompt_tokens"] == 0  # every prompt released: first token or end


def _told_tokens(tmp: Path, ect: str) -> tuple[list[tuple[int, float]], list[int], dict]:
    """Serve :func:`_requests` with ``control.ladr_ect = ect``: every ``Router.tokens`` call
    (n, gap_s), the chunks with text of each streamed answer, and the router's snapshot."""
    cfg = config_mod.load(env={"LLMSLA_CONTROL_LADR_ECT": ect})
    cfg.spool.dir = str(tmp / "spool")
    worker = WorkerThread(cfg)
    calls: list[tuple[int, float]] = []
    texts: list[int] = []
    try:
        cfg.gateway.upstreams = [worker.start()]

        async def main() -> dict:
            async with wiring.serve_gateway(cfg, "127.0.0.1", 0, registry=CollectorRegistry(), spool=None) as gw:
                router = gw.gateway.plane.router
                real = router.tokens

                def tokens(rid: str, n: int, gap_s: float) -> None:  # a spy: the real router is told
                    calls.append((n, gap_s))
                    real(rid, n, gap_s)

                router.tokens = tokens  # type: ignore[method-assign]
                texts.extend(await _requests(gw.url, cfg.worker.model))
                return router.snapshot()

        snap = asyncio.run(main())
    finally:
        worker.stop()
    return calls, texts, snap


def test_gateway_tells_the_router_each_streamed_token_when_its_ect_reads_them(tmp_path: Path) -> None:
    """With LADR's completion-time term on (``control.ladr_ect``), each token of a streamed
    response past its first reaches ``Router.tokens`` with its gap, as it is relayed: the
    replica's decode speed is read from streams in flight. Off (the default), none is told."""
    calls, texts, snap = _told_tokens(tmp_path / "on", "3")
    assert len(texts) == 2 and min(texts) >= 2
    assert sum(n for n, _ in calls) == sum(t - 1 for t in texts)  # every token but each stream's first
    assert all(n >= 1 and 0 <= gap < 5.0 for n, gap in calls)  # tokens read together: no gap
    assert sum(gap for _, gap in calls) > 0
    # fewer than the 64 tokens a reading needs: the speed so far is the completions'
    assert next(iter(snap["pools"].values()))[0]["ect"]["cadence_readings"] == 0
    calls, texts, _ = _told_tokens(tmp_path / "off", "0")
    assert len(texts) == 2 and calls == []
