"""A TCP proxy that injects latency, like toxiproxy's ``latency`` toxic: every chunk the upstream
sends is held ``delay_s`` before it reaches the client (order kept, not cumulative). Put one in
front of a replica and set ``delay_s`` to make it slow without touching the replica itself."""

from __future__ import annotations

import asyncio
import contextlib
import time


class LatencyProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.delay_s = 0.0
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self._tasks: set[asyncio.Task] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> LatencyProxy:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for t in list(self._tasks):
                t.cancel()
            await self.server.wait_closed()

    async def _conn(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            ur, uw = await asyncio.open_connection(*self.upstream)
        except OSError:
            cw.close()
            self._tasks.discard(task)
            return
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def up() -> None:  # client -> upstream, as is
            while data := await cr.read(65536):
                uw.write(data)
                await uw.drain()
            uw.write_eof() if uw.can_write_eof() else None

        async def down_read() -> None:  # upstream -> queue, stamped with when it may leave
            while data := await ur.read(65536):
                queue.put_nowait((time.monotonic() + self.delay_s, data))
            queue.put_nowait((0.0, b""))

        async def down_write() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                cw.write(data)
                await cw.drain()

        try:
            await asyncio.gather(up(), down_read(), down_write())
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (cw, uw):
                with contextlib.suppress(Exception):
                    w.close()
            self._tasks.discard(task)
