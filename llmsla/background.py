"""One asyncio task a component runs beside its server (the health probe, discovery, the loop
sampler): started at most once, stopped by cancelling it and waiting for it to end, so a
server's shutdown never leaves a round half-run or a task pending. See docs/architecture.md."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class BackgroundTask:
    """The task slot of one periodic job."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._task: asyncio.Task[None] | None = None

    def start(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` in the current event loop, unless the job already runs (``coro`` is then
        closed unstarted, so no "never awaited" warning)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(coro, name=self.name)
        else:
            coro.close()
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
