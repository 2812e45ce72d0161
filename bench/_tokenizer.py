"""A local tokenizer for AIPerf, built at run time (this machine has no internet, and AIPerf's
``--tokenizer builtin`` downloads its encoding): a small byte-level BPE trained on the
repository's own docs, saved as ``tokenizer.json`` + ``tokenizer_config.json`` so that
``transformers.AutoTokenizer.from_pretrained(dir)`` (what AIPerf calls) loads it.

Run by AIPerf's own interpreter (it has ``tokenizers``; the llmsla venv need not):
``<aiperf's python> bench/_tokenizer.py OUT_DIR``. Nothing binary is committed.
See docs/gateway.md#measured-against-aiperf.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 2000


def build(out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = [p.read_text(errors="replace") for p in sorted((ROOT / "docs").glob("*.md"))]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench/_tokenizer.py OUT_DIR")
    print(build(Path(sys.argv[1])))
