"""What Linux's ``TCP_INFO`` tells about a socket that a server cannot see from its reads.

- :func:`accept_queue`: a listening socket's accept queue (its length and bound).
- :func:`waited_s`: how long a connection's latest bytes waited in the kernel before the server
  read them. A saturated event loop reads its sockets late: a request's head sits in the
  receive queue (on a new connection, in the accept queue too) while the loop runs other
  handlers, and a clock started at the read misses that wait, which the client feels. The
  kernel keeps when data last arrived (``tcpi_last_data_recv``, ms since, counted in kernel
  ticks); the wait is that value less one tick, a lower bound: a request read at once is never
  charged the tick's rounding, and a late one is charged all but at most two ticks (8 ms at the
  common 250 Hz) of its wait.

Where the kernel does not tell (not Linux, not TCP) each says so (None, 0) and callers go on
as before: the clock starts at the read.
"""

from __future__ import annotations

import _socket
import socket
import struct
import sys
import time
from typing import Any

#: ``struct tcp_info`` (linux/tcp.h) up to ``tcpi_last_data_recv``: eight one-byte fields, then
#: rto, ato, snd_mss, rcv_mss, unacked, sacked, lost, retrans, fackets, last_data_sent,
#: last_ack_sent, last_data_recv (``__u32`` each)
_INFO = struct.Struct("=8B12I")
_UNACKED, _SACKED, _LAST_DATA_RECV = 12, 13, 19
_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None) if sys.platform.startswith("linux") else None
#: the kernel tick in ms once :func:`prime` has measured it (0 where it cannot be); None before
_tick_ms: int | None = None


def _info(sock: Any) -> tuple[int, ...]:
    """The fields above; ``OSError`` (or ``struct.error`` on a short answer) where unsupported."""
    if _TCP_INFO is None:
        raise OSError("TCP_INFO is Linux's")
    return _INFO.unpack(sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _INFO.size))


def accept_queue(sock: socket.socket) -> tuple[int, int] | None:
    """(connections waiting to be accepted, the queue's bound) of a listening TCP socket, or None
    where the kernel does not say (not Linux, not TCP): Linux puts the accept queue's length in
    ``tcpi_unacked`` and its bound in ``tcpi_sacked`` for a listener."""
    if sock.type != socket.SOCK_STREAM:
        return None
    try:
        fields = _info(sock)
    except (OSError, struct.error):
        return None
    return fields[_UNACKED], fields[_SACKED]


def prime() -> int:
    """Measure the kernel tick once per process (servers call it as they start; it takes five
    ticks, 20 ms at 250 Hz) and return it in ms; 0 where the kernel does not tell, and :func:`waited_s` says 0."""
    global _tick_ms
    if _tick_ms is None:
        _tick_ms = _measure_tick_ms()
    return _tick_ms


def _measure_tick_ms() -> int:
    """The tick as ``TCP_INFO`` counts it (``jiffies_to_msecs(1)``: 4 at 250 Hz), from a loopback
    connection that received one byte: the smallest step of ``tcpi_last_data_recv`` over its
    first five (a poll the machine delays can only overstate a step, which makes
    :func:`waited_s` err low)."""
    if _TCP_INFO is None:
        return 0
    try:
        with socket.create_server(("127.0.0.1", 0)) as srv, \
                socket.create_connection(srv.getsockname()[:2], timeout=1) as client:
            conn, _ = srv.accept()
            with conn:
                client.sendall(b"x")
                seen = [0]
                deadline = time.monotonic() + 0.2
                while len(seen) < 6 and time.monotonic() < deadline:
                    v = _info(conn)[_LAST_DATA_RECV]
                    if v != seen[-1]:
                        seen.append(v)
                    time.sleep(0.0005)
    except (OSError, struct.error):
        return 0
    steps = [b - a for a, b in zip(seen, seen[1:], strict=False) if b > a]
    return min(steps) if steps else 0


def waited_s(sock: Any) -> float:
    """Seconds the latest bytes read from ``sock`` (a TCP socket, or uvloop's stand-in for one)
    had waited in the kernel: at least this long, at most two ticks longer; 0 when the kernel
    cannot tell. Call it where those bytes are read (``data_received``); 0 until :func:`prime`
    has run. A server asking once per request keeps :func:`descriptor` of the connection and
    calls :func:`waited_fd_s`: the same answer, without a socket object per call."""
    return waited_fd_s(descriptor(sock))


def descriptor(sock: Any) -> tuple[int, int] | None:
    """(file descriptor, address family) of a connection's socket (or uvloop's stand-in), for
    :func:`waited_fd_s`; None when there is none to ask."""
    if sock is None:
        return None
    try:
        return int(sock.fileno()), int(sock.family)
    except (OSError, AttributeError, TypeError, ValueError):
        return None


def waited_fd_s(where: tuple[int, int] | None) -> float:
    """:func:`waited_s` of the TCP socket :func:`descriptor` gave (None: 0). It asks through a bare
    ``_socket.socket`` on the descriptor, detached before it returns (the descriptor stays the
    transport's): uvloop's stand-in builds and drops a full ``socket.socket`` on each call, which
    cost a request's first read about 30 us in a gateway under load."""
    tick = _tick_ms
    if not tick or where is None or where[0] < 0:
        return 0.0
    try:
        s = _socket.socket(where[1], socket.SOCK_STREAM, 0, where[0])
    except OSError:
        return 0.0
    try:
        ms = _info(s)[_LAST_DATA_RECV]
    except (OSError, struct.error):
        return 0.0
    finally:
        s.detach()
    return (ms - tick) / 1000.0 if ms > tick else 0.0
