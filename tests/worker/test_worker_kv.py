"""The worker's KV blocks, preemption and prefix cache: a cached prefix prefills to the same
logits as a full prefill; preempted requests are recomputed to exactly what they generate alone;
every block comes back; the prefix cache only reuses a block behind the same prefix."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import torch

from llmsla import config as config_mod
from llmsla.worker import model as lm
from llmsla.worker.kvblocks import BlockManager, PrefixCache, blocks_for
from llmsla.worker.server import WorkerThread

from ._worker_util import MODEL, post, worker_cfg

SPEC = lm.ModelSpec(max_ctx=96)


def test_prefill_behind_a_cached_prefix_matches_a_full_prefill() -> None:
    torch.set_num_threads(1)
    model = lm.build_model(0, spec=SPEC)
    cache = lm.KVCache(model, 2)
    toks = lm.encode("Four score and seven years ago our fathers brought forth")
    full = lm.prefill(model, cache, 0, toks)
    for c in (16, 32, 48):
        cached = (cache.k[:, 0, :, :c].clone(), cache.v[:, 0, :, :c].clone())
        part = lm.prefill(model, cache, 1, toks, cached=cached)
        assert torch.allclose(part, full, atol=1e-4, rtol=1e-4), c
        assert cache.lengths[1] == len(toks)
        assert torch.allclose(cache.k[:, 1, :, :len(toks)], cache.k[:, 0, :, :len(toks)], atol=1e-4, rtol=1e-4)
        # and the next decode step sees the same cache
        a, b = lm.decode_step(model, cache, [0, 1], [65, 65])
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
        lm.prefill(model, cache, 0, toks)  # back to the prompt alone
    with pytest.raises(ValueError, match="shorter than the prompt"):
        lm.prefill(model, cache, 1, toks[:16], cached=(cache.k[:, 0, :, :16], cache.v[:, 0, :, :16]))


def test_prefix_cache_keys_blocks_by_their_whole_prefix_and_leaves_the_last_token() -> None:
    pc = PrefixCache(max_blocks=3, block_size=4)
    kv = torch.arange(2 * 1 * 16 * 1, dtype=torch.float32).view(2, 1, 16, 1)
    a = list(range(12))  # three full blocks
    assert pc.lookup(a).tokens == 0
    pc.store(a, kv, kv)
    assert len(pc) == 3
    hit = pc.lookup(a)
    assert hit.tokens == 8  # at most len - 1 tokens: the third block would cover the last token
    assert hit.k is not None and torch.equal(hit.k, kv[:, :, :8])
    assert pc.lookup(a + [99]).tokens == 12
    # the same second block behind another first block is another block
    b = [50, 51, 52, 53] + a[4:]
    assert pc.hashes(b)[1] != pc.hashes(a)[1]
    assert pc.lookup(b + [1]).tokens == 0
    pc.store(b, kv, kv)  # three new blocks: the three least recently used go
    assert len(pc) == 3 and pc.lookup(a + [1]).tokens == 0 and pc.lookup(b + [1]).tokens == 12
    assert PrefixCache(0, 4).lookup(a).tokens == 0


def test_block_manager_refuses_what_it_does_not_have() -> None:
    bm = BlockManager(4, 16)
    assert blocks_for(0, 16) == 0 and blocks_for(1, 16) == 1 and blocks_for(16, 16) == 1 and blocks_for(17, 16) == 2
    bm.allocate(3)
    assert bm.free == 1 and bm.usage() == 0.75
    with pytest.raises(ValueError, match="cannot allocate 2"):
        bm.allocate(2)
    with pytest.raises(ValueError, match="cannot release 4"):
        bm.release(4)
    bm.release(3)
    assert bm.usage() == 0.0


def test_a_kv_budget_below_one_full_context_is_refused(tmp_path: Path) -> None:
    cfg = worker_cfg(tmp_path, kv_blocks=20)  # 256 + 64 + 1 tokens need 21 blocks of 16
    with pytest.raises(config_mod.ConfigError, match="worker.kv_blocks = 20 cannot hold one request.*at least 21"):
        config_mod.check_worker_kv(cfg)
    config_mod.check_worker_kv(worker_cfg(tmp_path, kv_blocks=21))
    config_mod.check_worker_kv(worker_cfg(tmp_path, kv_blocks=0))


def test_a_tight_kv_budget_preempts_and_recomputes_exactly(tmp_path: Path) -> None:
    """21 blocks for 4 slots: requests of 100-token prompts and 60 tokens out cannot all run;
    the newest is preempted and recomputed, and each output is what greedy decoding gives alone."""
    prompts = [f"{i} " + "Four score and seven years ago our fathers brought forth on this continent " * 2
               for i in range(6)]
    prompts = [p[:100] for p in prompts]
    with WorkerThread(worker_cfg(tmp_path, max_batch=4, kv_blocks=21)) as wt:
        engine = wt.running.engine if wt.running else None
        assert engine is not None and engine.blocks.total == 21

        async def go() -> list[str]:
            async with aiohttp.ClientSession() as s:
                rs = await asyncio.gather(*(post(s, wt.url, "/v1/completions", {
                    "model": MODEL, "prompt": p, "max_tokens": 60, "temperature": 0, "ignore_eos": True,
                }) for p in prompts))
            out = []
            for status, body in rs:
                assert status == 200, body
                out.append(body["choices"][0]["text"])
            return out

        texts = asyncio.run(go())
        stats = engine.stats()
    assert stats["preemptions"] > 0, stats
    assert stats["kv_blocks_used"] == 0 and stats["waiting"] == 0 and stats["running"] == 0, stats
    for p, t in zip(prompts, texts, strict=True):
        assert t == _greedy_reference_no_eos(p, 60), p


def _greedy_reference_no_eos(prompt: str, n: int) -> str:
    """Greedy by full recompute with EOS masked (``ignore_eos``)."""
    import codecs

    model = lm.build_model(0, spec=lm.ModelSpec(max_ctx=256 + 64 + 1))
    toks = lm.encode(prompt)
    out = bytearray()
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([toks]))[0, -1]
            logits[lm.EOS] = float("-inf")
            nxt = int(logits.argmax())
            toks.append(nxt)
            out.append(nxt)
    return codecs.decode(bytes(out), "utf-8", "replace")

