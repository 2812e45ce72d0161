"""What the kernel says about a socket (llmsla/tcpinfo.py), on real loopback sockets: how long
bytes waited before a read, as a lower bound within two ticks of the truth, never more than it;
nothing where the kernel cannot say; the accept queue of a listener."""

from __future__ import annotations

import os
import socket
import sys
import time

import pytest

from llmsla import tcpinfo

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="TCP_INFO is Linux's")


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    srv = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(srv.getsockname()[:2])
    conn, _ = srv.accept()
    return srv, client, conn


def test_a_late_read_is_charged_its_wait_and_a_prompt_one_nothing() -> None:
    tick = tcpinfo.prime()
    assert 0 < tick <= 10, tick  # jiffies_to_msecs(1): 1 at HZ 1000, 4 at 250, 10 at 100
    srv, client, conn = _pair()
    with srv, client, conn:
        for wait_s in (0.0, 0.03, 0.12):
            sent = time.perf_counter()
            client.sendall(b"POST / HTTP/1.1\r\n\r\n")
            time.sleep(wait_s)  # a loop busy elsewhere: the bytes wait in the kernel
            conn.recv(1024)
            waited = tcpinfo.waited_s(conn)
            elapsed = time.perf_counter() - sent
            assert waited <= elapsed, (wait_s, waited, elapsed)  # never more than the truth
            assert waited >= wait_s - 2 * tick / 1000.0, (wait_s, waited, tick)  # at most two ticks short
            if elapsed * 1000 < tick:  # read within a tick of the send: never charged the rounding
                assert waited == 0.0, (elapsed, waited)


def test_nothing_where_the_kernel_cannot_say(tmp_path) -> None:
    tcpinfo.prime()
    assert tcpinfo.waited_s(None) == 0.0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        unix.bind(str(tmp_path / "s"))
        assert tcpinfo.waited_s(unix) == 0.0
        assert tcpinfo.accept_queue(unix) is None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        assert tcpinfo.accept_queue(udp) is None


def test_the_accept_queue_of_a_listener() -> None:
    with socket.create_server(("127.0.0.1", 0), backlog=16) as srv:
        clients = [socket.create_connection(srv.getsockname()[:2]) for _ in range(3)]
        time.sleep(0.05)
        try:
            assert tcpinfo.accept_queue(srv) == (3, 16)
            srv.accept()[0].close()
            assert tcpinfo.accept_queue(srv) == (2, 16)
        finally:
            for c in clients:
                c.close()


def test_asking_by_descriptor_answers_alike_and_leaves_the_socket_open() -> None:
    """The servers ask by (descriptor, family) through a socket object they drop at once: the
    same answer as asking the socket, and the connection (the transport's) is neither closed
    nor leaked a descriptor, however many times it is asked."""
    tick = tcpinfo.prime()
    srv, client, conn = _pair()
    with srv, client, conn:
        where = tcpinfo.descriptor(conn)
        assert where == (conn.fileno(), socket.AF_INET)
        fds = len(os.listdir("/proc/self/fd"))
        client.sendall(b"x")
        time.sleep(0.05)
        conn.recv(16)
        by_fd = [tcpinfo.waited_fd_s(where) for _ in range(2000)][-1]
        assert abs(by_fd - tcpinfo.waited_s(conn)) <= tick / 1000.0
        assert by_fd >= 0.05 - 2 * tick / 1000.0
        assert len(os.listdir("/proc/self/fd")) == fds
        client.sendall(b"still open")  # the descriptor is still the connection's
        assert conn.recv(16) == b"still open"
    assert tcpinfo.descriptor(None) is None
    assert tcpinfo.waited_fd_s(None) == 0.0
    assert tcpinfo.waited_fd_s((-1, socket.AF_INET)) == 0.0


def test_uvloops_stand_in_is_asked_by_its_descriptor() -> None:
    """A uvloop transport's ``socket`` extra is a stand-in object: its descriptor and family are
    what the servers keep, and the answer for a late read is the wait."""
    import asyncio

    import uvloop

    tick = tcpinfo.prime()

    async def main() -> tuple[tuple[int, int] | None, float, float]:
        got: asyncio.Future[asyncio.BaseTransport] = asyncio.get_running_loop().create_future()

        class Keep(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                transport.pause_reading()  # the bytes wait in the kernel, as behind a busy loop
                got.set_result(transport)

        server = await asyncio.get_running_loop().create_server(Keep, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        transport = await got
        sent = time.perf_counter()
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        where = tcpinfo.descriptor(transport.get_extra_info("socket"))
        waited = tcpinfo.waited_fd_s(where)
        elapsed = time.perf_counter() - sent
        writer.close()
        transport.close()
        server.close()
        return where, waited, elapsed

    where, waited, elapsed = uvloop.run(main())
    assert where is not None and where[1] == socket.AF_INET
    assert 0.1 - 2 * tick / 1000.0 <= waited <= elapsed, (waited, elapsed)  # the wait, never more
