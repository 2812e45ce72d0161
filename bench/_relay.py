"""A bare TCP relay in Python: the floor of a Python proxy, for ``bench/gateway.py --relay``.

Each client connection gets its own connection to the upstream, and bytes are copied both ways
as they arrive, with no HTTP parsing, routing, metrics, events or spans, on uvloop where it is
installed (as the gateway runs). Whatever the llmsla gateway adds to TTFT beyond this relay's
added TTFT is its own per-request work, not the cost of a Python process in the path (two more
socket hops and wake-ups, which the relay pays too). Bench only: it has no back-pressure, no
timeouts and no limits. Own process, until SIGTERM: ``python bench/_relay.py PORT UPSTREAM_PORT``.
"""

from __future__ import annotations

import asyncio
import signal
import sys


class _Upstream(asyncio.Protocol):
    """The upstream side of one relayed connection: what it sends goes to the client."""

    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    """The client side: bytes read before the upstream connection is up wait in ``pending``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.transport: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        assert self.transport is not None
        try:
            up, _ = await asyncio.get_running_loop().create_connection(
                lambda: _Upstream(self.transport), "127.0.0.1", self.port)  # type: ignore[arg-type]
        except OSError:
            self.transport.close()
            return
        if self.transport.is_closing():
            up.close()
            return
        self.upstream = up
        for data in self.pending:
            up.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.pending.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Client(upstream_port), "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    port, upstream_port = int(sys.argv[1]), int(sys.argv[2])
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(port, upstream_port))
    else:
        uvloop.run(serve(port, upstream_port))


if __name__ == "__main__":
    main()
