"""The reference worker's KV-cache accounting in vLLM's terms: blocks and a prefix cache.

Why: vLLM's queue, KV usage, preemptions and prefix-cache hits are the precursors of a TTFT
breach that a router and the dashboards read (docs/engines.md). The worker's cache is one
preallocated slot per running request (worker/model.py); on top of it, :class:`BlockManager`
counts the blocks of ``block_size`` tokens each running request fills and bounds them by a
budget (``worker.kv_blocks``), so admission waits for blocks and a decode step that needs one
more than is free preempts, as vLLM's scheduler does. :class:`PrefixCache` keeps the keys and
values of full prompt blocks under the chained hash of their tokens (vLLM's block hash: a block
is only reused behind the same prefix) and hands them to prefill, which then computes only the
rest. See docs/worker.md#kv-blocks-preemption-and-the-prefix-cache.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that ``tokens`` positions fill (the last one may be partly full)."""
    return -(-tokens // block_size)


class BlockManager:
    """``total`` blocks of ``block_size`` tokens; running requests hold what their tokens fill."""

    def __init__(self, total: int, block_size: int) -> None:
        if total < 1 or block_size < 1:
            raise ValueError(f"total and block_size must be >= 1, got {total}, {block_size}")
        self.total = total
        self.block_size = block_size
        self.used = 0

    @property
    def free(self) -> int:
        return self.total - self.used

    def usage(self) -> float:
        """Share of blocks held, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
        return self.used / self.total

    def allocate(self, n: int) -> None:
        if n < 0 or n > self.free:
            raise ValueError(f"cannot allocate {n} blocks, {self.free} free")
        self.used += n

    def release(self, n: int) -> None:
        if n < 0 or n > self.used:
            raise ValueError(f"cannot release {n} blocks, {self.used} held")
        self.used -= n


@dataclass(frozen=True)
class Hit:
    """What a lookup found: ``tokens`` positions whose keys and values are ``k``/``v``
    (layers, heads, tokens, head_dim), or none (``tokens`` 0, tensors None)."""

    tokens: int
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None


class PrefixCache:
    """Full prompt blocks' keys and values under their chained hash, least recently used out
    beyond ``max_blocks``. Blocks are copies (the slot cache keeps its own), so the cache never
    counts towards the running requests' blocks, like vLLM's cached free blocks."""

    def __init__(self, max_blocks: int, block_size: int) -> None:
        self.max_blocks = max_blocks
        self.block_size = block_size
        self._blocks: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def hashes(self, tokens: list[int]) -> list[int]:
        """The chained hash of each full block of ``tokens``: block i's hash covers blocks 0..i."""
        out: list[int] = []
        parent = 0
        bs = self.block_size
        for i in range(len(tokens) // bs):
            parent = hash((parent, tuple(tokens[i * bs:(i + 1) * bs])))
            out.append(parent)
        return out

    def lookup(self, tokens: list[int]) -> Hit:
        """The longest cached prefix of full blocks, leaving at least the last token to compute
        (its logits give the first output token), as vLLM caps a hit at ``len - 1``."""
        if self.max_blocks <= 0:
            return Hit(0)
        found: list[tuple[torch.Tensor, torch.Tensor]] = []
        for h in self.hashes(tokens[:-1]):
            kv = self._blocks.get(h)
            if kv is None:
                break
            self._blocks.move_to_end(h)
            found.append(kv)
        if not found:
            return Hit(0)
        return Hit(len(found) * self.block_size, torch.cat([k for k, _ in found], dim=2),
                   torch.cat([v for _, v in found], dim=2))

    def store(self, tokens: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Keep every full block of ``tokens`` whose keys/values ``k``/``v`` (layers, heads,
        >= len(tokens), head_dim) hold, evicting the least recently used past the bound."""
        if self.max_blocks <= 0:
            return
        bs = self.block_size
        for i, h in enumerate(self.hashes(tokens)):
            if h in self._blocks:
                self._blocks.move_to_end(h)
                continue
            self._blocks[h] = (k[:, :, i * bs:(i + 1) * bs].clone(), v[:, :, i * bs:(i + 1) * bs].clone())
            while len(self._blocks) > self.max_blocks:
                self._blocks.popitem(last=False)
