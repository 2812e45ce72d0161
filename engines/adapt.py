"""One exposition -> one :class:`EngineSnapshot`, through the adapter of the replica's engine
(configured per pool, or ``auto``: by metric prefix, :func:`llmsla.engines.parse.detect`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmsla import names

from . import sglang, triton, trtllm, vllm
from .parse import Exposition, detect, parse
from .record import EngineSnapshot

ADAPTERS: dict[str, Callable[[Exposition], dict[str, Any]]] = {
    names.ENGINE_VLLM: vllm.read,
    names.ENGINE_SGLANG: sglang.read,
    names.ENGINE_TRTLLM: trtllm.read,
    names.ENGINE_TRITON: triton.read,
}


#: Every family some adapter reads: the rest of an exposition is not parsed.
READS: tuple[str, ...] = tuple(sorted({*vllm.READS, *sglang.READS, *trtllm.READS, *triton.READS}))


class UnknownEngine(ValueError):
    """No known engine's metrics in the exposition (``auto``), or none of the configured one's."""


def snapshot(expo: Exposition, engine: str, *, replica: str, pool: str, ts: float) -> EngineSnapshot:
    """The normalised record of ``expo`` read as ``engine`` (``auto``: detected)."""
    if engine == names.ENGINE_AUTO:
        found = detect(expo)
        if found is None:
            raise UnknownEngine("no vllm:, sglang:, trtllm_ or nv_trt_llm_ metrics in the exposition")
        engine = found
    elif engine not in ADAPTERS:
        raise UnknownEngine(f"unknown engine type {engine!r}")
    fields = ADAPTERS[engine](expo)
    return EngineSnapshot(replica=replica, pool=pool, engine=engine, ts=ts, **fields)


def from_text(body: str, content_type: str | None, engine: str, *, replica: str, pool: str,
              ts: float) -> EngineSnapshot:
    """Parse and adapt in one step (tests, ``llmsla engines --once``)."""
    return snapshot(parse(body, content_type, READS), engine, replica=replica, pool=pool, ts=ts)
