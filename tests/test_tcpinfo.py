"""What the kernel says about a socket (llmsla/tcpinfo.py), on real loopback sockets: how long
bytes waited before a read, as a lower bound within two ticks of the truth, never more than it;
nothing where the kernel cannot say; the accept queue of a listener."""

from __future__ import annotations

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
