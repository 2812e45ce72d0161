"""Engine adapters: each replica's own /metrics (vLLM, SGLang, trtllm-serve, Triton TRT-LLM)
scraped and normalised into one record (docs/engines.md)."""
