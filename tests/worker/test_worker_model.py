"""The worker's model: KV-cache decode equals full recompute, batched or not; weights are seeded."""

from __future__ import annotations

import torch

from llmsla.worker import model as lm

SPEC = lm.ModelSpec(max_ctx=96)


def test_weights_are_a_function_of_the_seed() -> None:
    a, b, c = lm.build_model(5, spec=SPEC), lm.build_model(5, spec=SPEC), lm.build_model(6, spec=SPEC)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), n
    assert not torch.equal(a.head, c.head)


def test_incremental_decode_matches_full_recompute_in_a_mixed_batch() -> None:
    torch.set_num_threads(1)
    model = lm.build_model(0, spec=SPEC)
    cache = lm.KVCache(model, 6)
    g = torch.Generator().manual_seed(1)
    # three sequences of different lengths in slots 0, 2 and 5 (holes at 1, 3, 4)
    seqs = {0: lm.encode("Four score"), 2: lm.encode("and seven years ago, our"), 5: lm.encode("x")}
    full = {}
    for slot, toks in seqs.items():
        ext = toks + torch.randint(0, 256, (20,), generator=g).tolist()
        full[slot] = (ext, model(torch.tensor([ext]))[0])  # (T, V) reference, no cache
        last = lm.prefill(model, cache, slot, toks)
        assert torch.allclose(last, full[slot][1][len(toks) - 1], atol=1e-4, rtol=1e-4)
    # cache garbage in a free slot must not leak into others
    lm.prefill(model, cache, 3, lm.encode("junk junk junk"))
    cache.lengths[3] = 0
    for i in range(20):
        slots = sorted(seqs)
        toks = [full[s][0][len(seqs[s]) + i] for s in slots]
        logits = lm.decode_step(model, cache, slots, toks)
        for row, s in enumerate(slots):
            ref = full[s][1][len(seqs[s]) + i]
            assert torch.allclose(logits[row], ref, atol=1e-4, rtol=1e-4), (s, i, (logits[row] - ref).abs().max())
    # a batch of one (contiguous fast path) agrees too
    ext, ref = full[5]
    n = len(seqs[5]) + 20
    one = lm.decode_step(model, cache, [5], [ext[n]] if n < len(ext) else [65])
    check = model(torch.tensor([ext[: n] + [ext[n] if n < len(ext) else 65]]))[0, -1]
    assert torch.allclose(one[0], check, atol=1e-4, rtol=1e-4)


def test_training_is_deterministic_and_lowers_loss() -> None:
    torch.set_num_threads(1)
    spec = lm.ModelSpec(max_ctx=160)
    a, b = lm.build_model(0, train_steps=3, spec=spec), lm.build_model(0, train_steps=3, spec=spec)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    from llmsla.worker.corpus import TEXT

    data = torch.tensor([list(TEXT.encode()[:129])])
    untrained = lm.build_model(0, spec=spec)
    loss = [torch.nn.functional.cross_entropy(m(data[:, :-1])[0], data[0, 1:]).item() for m in (untrained, a)]
    assert loss[1] < loss[0]
