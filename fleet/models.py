"""Model/GPU performance specs for the simulator, and the calibration they encode.

One iteration of a continuously batched replica costs ``b0 + b1 * prefill_tokens + b2 *
decode_tokens`` seconds (the model vLLM-style schedulers are tuned against: a fixed launch/weight
read cost, prefill linear in prompt tokens, decode linear in the sequences in the batch). The
constants are chosen so that a saturated replica (``max_batch`` sequences decoding) produces
``max_batch / (b0 + b2 * max_batch)`` tokens/s: about 1,200 for 6B and 220 for 70B, the figures
the reference study measured. ``tests/fleet/test_calibration.py`` runs the engine at saturation
and checks it lands there (so a change in the engine that breaks the calibration is caught).

KV capacity is derived from GPU memory like vLLM does: ``(gpu_mem * mem_util - weights) /
kv_bytes_per_token``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GIB = 1 << 30


@dataclass(frozen=True)
class ModelSpec:
    """Performance of one model on one GPU (a replica)."""

    name: str
    params_b: float
    b0_s: float  # fixed cost per iteration
    b1_s: float  # per prefill token in the iteration
    b2_s: float  # per decoding sequence in the iteration
    max_batch: int  # continuous-batching limit (sequences)
    weights_bytes: int
    kv_bytes_per_token: int
    gpu_mem_bytes: int = 80 * GIB
    mem_util: float = 0.9  # share of GPU memory the engine may use (vLLM gpu_memory_utilization)
    max_prefill_tokens: int = 8192  # prefill token budget per iteration (max_num_batched_tokens)
    idle_w: float = 90.0
    tdp_w: float = 700.0
    kv_capacity_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        free = int(self.gpu_mem_bytes * self.mem_util) - self.weights_bytes
        if free <= 0:
            raise ValueError(f"model {self.name}: weights do not fit in GPU memory")
        object.__setattr__(self, "kv_capacity_tokens", free // self.kv_bytes_per_token)

    def iteration_s(self, prefill_tokens: int, decode_seqs: int) -> float:
        return self.b0_s + self.b1_s * prefill_tokens + self.b2_s * decode_seqs

    def saturated_decode_tok_s(self) -> float:
        """Decode tokens/s with ``max_batch`` sequences decoding (the calibration target)."""
        return self.max_batch / self.iteration_s(0, self.max_batch)


def _b2(b0: float, batch: int, tok_s: float) -> float:
    """Per-sequence decode cost that makes ``batch`` sequences yield ``tok_s`` tokens/s."""
    return (batch / tok_s - b0) / batch


#: Built-in models (``--replicas 70b:1,6b:2``). KV bytes/token: 2 (K,V) * layers * kv_dim * 2 bytes.
CATALOG: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        # distilled student: small and fast
        ModelSpec("1.3b", 1.3, 0.008, 2.0e-5, _b2(0.008, 96, 2400.0), 96, int(2.6e9), 2 * 24 * 2048 * 2),
        ModelSpec("6b", 6.0, 0.012, 6.25e-5, _b2(0.012, 64, 1200.0), 64, int(12e9), 2 * 32 * 4096 * 2),
        ModelSpec("13b", 13.0, 0.018, 1.25e-4, _b2(0.018, 48, 600.0), 48, int(26e9), 2 * 40 * 5120 * 2),
        # 4-bit weights + GQA (8 KV heads of 128) so one 80 GiB GPU holds it, as in the study
        ModelSpec("70b", 70.0, 0.030, 5.0e-4, _b2(0.030, 32, 220.0), 32, int(38e9), 2 * 80 * 1024 * 2),
    )
}


def get(name: str) -> ModelSpec:
    try:
        return CATALOG[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(CATALOG)})") from None
