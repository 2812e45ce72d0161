"""A tiny byte-level causal transformer with a slot-based KV cache, for the reference worker.

Why this shape: the worker must do *real* inference (real prefill, real per-token decode, real
batching) while staying fast on one CPU thread, so the model is small (2 layers, d=128) and the
vocabulary is bytes (no tokenizer download). The KV cache is preallocated per batch slot so one
decode step for every running request is a handful of batched matmuls, whatever their lengths.

Token ids: 0..255 are bytes, ``EOS`` (256) ends a sequence and also starts every prompt (BOS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F

EOS = 256
VOCAB = 257


@dataclass(frozen=True)
class ModelSpec:
    """Shape of the model; the defaults are what the worker serves."""

    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    max_ctx: int = 2048 + 256 + 1
    #: scale of the output projection; large enough that logits are well separated, so greedy
    #: decoding does not flip on float rounding between batched and single-request runs.
    logit_scale: float = 4.0


def encode(text: str) -> list[int]:
    """Prompt text -> token ids, with the BOS marker first."""
    return [EOS, *text.encode("utf-8")]


class Block(torch.nn.Module):
    """One decoder layer; a class of its own so its parts are typed (TinyLM sets the weights)."""

    def __init__(self, d: int, ff: int) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, ff)
        self.fc2 = torch.nn.Linear(ff, d)


class TinyLM(torch.nn.Module):
    """Pre-LN GPT-style decoder; weights are a pure function of ``seed`` (and optional training)."""

    def __init__(self, spec: ModelSpec = ModelSpec(), seed: int = 0) -> None:
        super().__init__()
        self.spec = spec
        d, ff = spec.d_model, spec.d_ff
        g = torch.Generator().manual_seed(seed)

        def w(*shape: int, std: float) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * std)

        self.tok = w(VOCAB, d, std=1.0)
        self.pos = w(spec.max_ctx, d, std=0.3)
        self.layers = torch.nn.ModuleList()
        for _ in range(spec.n_layers):
            layer = Block(d, ff)
            for lin in (layer.qkv, layer.proj, layer.fc1, layer.fc2):
                lin.weight = w(*lin.weight.shape, std=1.0 / math.sqrt(lin.weight.shape[1]))
                lin.bias = torch.nn.Parameter(torch.zeros(lin.bias.shape))
            self.layers.append(layer)
        self.ln_f = torch.nn.LayerNorm(d)
        self.head = w(VOCAB, d, std=spec.logit_scale / math.sqrt(d))

    def blocks(self) -> list[Block]:
        """The layers, typed (a ModuleList yields plain Modules)."""
        return [cast(Block, layer) for layer in self.layers]

    # -- full recompute (training, prefill, and the reference the KV cache is tested against) ----
    def forward(self, tokens: torch.Tensor, *, return_kv: bool = False):
        """``tokens`` (B, T) -> logits (B, T, V); with ``return_kv`` also per-layer (k, v)."""
        s = self.spec
        B, T = tokens.shape
        h = self.tok[tokens] + self.pos[:T]
        kvs = []
        hd = s.d_model // s.n_heads
        for layer in self.blocks():
            q, k, v = layer.qkv(layer.ln1(h)).split(s.d_model, dim=-1)
            q, k, v = (t.view(B, T, s.n_heads, hd).transpose(1, 2) for t in (q, k, v))
            kvs.append((k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + layer.proj(a.transpose(1, 2).reshape(B, T, s.d_model))
            h = h + layer.fc2(F.gelu(layer.fc1(layer.ln2(h))))
        logits = self.ln_f(h) @ self.head.T
        return (logits, kvs) if return_kv else logits


class KVCache:
    """Preallocated keys/values for ``slots`` sequences of up to ``max_ctx`` tokens each.

    A request owns one slot from admission to finish; ``lengths[slot]`` is how many positions
    hold valid keys. Freeing a slot is just forgetting its length.
    """

    def __init__(self, model: TinyLM, slots: int) -> None:
        s = model.spec
        hd = s.d_model // s.n_heads
        shape = (s.n_layers, slots, s.n_heads, s.max_ctx, hd)
        self.k = torch.zeros(shape)
        self.v = torch.zeros(shape)
        self.lengths = [0] * slots

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


@torch.inference_mode()
def prefill(model: TinyLM, cache: KVCache, slot: int, tokens: list[int], *,
            cached: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Run the prompt through the model, fill ``slot``'s cache; return last-position logits (V,).

    ``cached``: keys and values (layers, heads, c, head_dim) of the first ``c < len(tokens)``
    positions (a prefix-cache hit): they are copied in and only the rest is computed."""
    if len(tokens) > model.spec.max_ctx:
        raise ValueError(f"prompt of {len(tokens)} tokens exceeds the context of {model.spec.max_ctx}")
    if cached is not None and cached[0].shape[2] > 0:
        return _prefill_rest(model, cache, slot, tokens, cached)
    t = torch.tensor([tokens], dtype=torch.long)
    logits, kvs = model(t, return_kv=True)
    n = len(tokens)
    for i, (k, v) in enumerate(kvs):
        cache.k[i, slot, :, :n] = k[0]
        cache.v[i, slot, :, :n] = v[0]
    cache.lengths[slot] = n
    return logits[0, -1]


def _prefill_rest(model: TinyLM, cache: KVCache, slot: int, tokens: list[int],
                  cached: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Prefill positions ``c..n-1`` behind ``c`` cached ones: each new query attends to the
    cached keys and to the new ones up to itself (the causal mask, shifted by ``c``)."""
    s = model.spec
    hd = s.d_model // s.n_heads
    c, n = cached[0].shape[2], len(tokens)
    if not 0 < c < n:
        raise ValueError(f"a cached prefix of {c} tokens must be shorter than the prompt of {n}")
    cache.k[:, slot, :, :c] = cached[0]
    cache.v[:, slot, :, :c] = cached[1]
    T = n - c
    h = model.tok[torch.tensor(tokens[c:], dtype=torch.long)] + model.pos[c:n]  # (T, d)
    mask = (torch.arange(n)[None, :] <= (c + torch.arange(T))[:, None]).view(1, T, n)
    for i, layer in enumerate(model.blocks()):
        q, k, v = layer.qkv(layer.ln1(h)).split(s.d_model, dim=-1)
        q, k, v = (t.view(T, s.n_heads, hd).transpose(0, 1) for t in (q, k, v))  # (H, T, hd)
        cache.k[i, slot, :, c:n] = k
        cache.v[i, slot, :, c:n] = v
        a = F.scaled_dot_product_attention(q, cache.k[i, slot, :, :n], cache.v[i, slot, :, :n], attn_mask=mask)
        h = h + layer.proj(a.transpose(0, 1).reshape(T, s.d_model))
        h = h + layer.fc2(F.gelu(layer.fc1(layer.ln2(h))))
    cache.lengths[slot] = n
    return (model.ln_f(h[-1:]) @ model.head.T)[0]


@torch.inference_mode()
def decode_step(model: TinyLM, cache: KVCache, slots: list[int], tokens: list[int]) -> torch.Tensor:
    """One token for each of ``slots`` (their last sampled ``tokens``) -> logits (B, V).

    Each sequence attends to its own cached prefix only: keys past its length are masked, so
    sequences of different lengths share one batched step without affecting each other. The step
    runs over the contiguous slot range ``min(slots)..max(slots)`` so the cache is read through
    views, not gathered copies; free slots inside the range compute a throw-away row (the engine
    hands out the lowest free slot, so such holes are few).
    """
    s = model.spec
    hd = s.d_model // s.n_heads
    lo, hi = min(slots), max(slots)
    R = hi - lo + 1
    pos_list = [0] * R
    tok_list = [EOS] * R
    live = [False] * R
    for slot, tok in zip(slots, tokens, strict=True):
        pos_list[slot - lo] = cache.lengths[slot]
        tok_list[slot - lo] = tok
        live[slot - lo] = True
    if max(pos_list) >= s.max_ctx:
        raise ValueError("a sequence reached the model context")
    pos_t = torch.tensor(pos_list, dtype=torch.long)
    rows = torch.arange(R)
    L = max(pos_list) + 1
    h = model.tok[torch.tensor(tok_list, dtype=torch.long)] + model.pos[pos_t]  # (R, d)
    # (R, 1, 1, L): key j is visible to row r iff j <= pos[r]
    mask = (torch.arange(L)[None, :] <= pos_t[:, None]).view(R, 1, 1, L)
    for i, layer in enumerate(model.blocks()):
        q, k, v = layer.qkv(layer.ln1(h)).split(s.d_model, dim=-1)
        q, k, v = (t.view(R, s.n_heads, hd) for t in (q, k, v))
        ck, cv = cache.k[i, lo : hi + 1], cache.v[i, lo : hi + 1]  # views (R, H, max_ctx, hd)
        ck[rows, :, pos_t] = k
        cv[rows, :, pos_t] = v
        a = F.scaled_dot_product_attention(q.unsqueeze(2), ck[:, :, :L], cv[:, :, :L], attn_mask=mask)
        h = h + layer.proj(a.reshape(R, s.d_model))
        h = h + layer.fc2(F.gelu(layer.fc1(layer.ln2(h))))
    for slot in slots:
        cache.lengths[slot] += 1
    logits = model.ln_f(h) @ model.head.T
    if all(live) and slots == list(range(lo, hi + 1)):
        return logits
    return logits[torch.tensor([slot - lo for slot in slots], dtype=torch.long)]


def build_model(seed: int = 0, *, train_steps: int = 0, spec: ModelSpec = ModelSpec()) -> TinyLM:
    """Deterministic weights from ``seed``; optionally a few steps of training on bundled text.

    Training is on ``corpus.TEXT`` (public domain) with a seeded generator and a fixed step count,
    so the same seed and step count give the same weights on every machine with the same torch.
    """
    model = TinyLM(spec, seed)
    if train_steps > 0:
        from llmsla.worker.corpus import TEXT

        data = torch.tensor(list(TEXT.encode("utf-8")), dtype=torch.long)
        g = torch.Generator().manual_seed(seed + 1)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        seq, batch = 128, 16
        model.train()
        for _ in range(train_steps):
            starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
            x = torch.stack([data[s : s + seq] for s in starts])
            y = torch.stack([data[s + 1 : s + seq + 1] for s in starts])
            loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
