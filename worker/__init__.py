"""The reference worker: a real token-streaming torch LM behind an OpenAI-compatible API."""
