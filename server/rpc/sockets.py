"""This worker's gRPC sockets, seen from /proc: its listening sockets on the port, its open connections, a pause that lets the queue in first.

Runs in a worker only. grpcio gives Python no handle on its sockets; the kernel's tables do.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")  # this network namespace's TCP sockets, of every process
LISTEN, ESTABLISHED = "0A", "01"
PATIENCE = 1.0  # seconds a pause waits for grpc-core to accept what is queued on a socket before it shuts it anyway
ACCEPT_POLL = 0.001  # seconds between two looks at a socket's accept queue
TCP_INFO_SIZE = 104  # bytes of struct tcp_info read (Linux 4.x's size; later kernels add fields after it)
TCP_INFO_UNACKED = 24  # offset of tcpi_unacked: 8 one-byte fields, then rto, ato, snd_mss, rcv_mss (u32 each)


def _inodes(port: int, state: str) -> set[str]:
    """Socket inodes in `state` whose local port is `port`, in this network namespace."""
    found: set[str] = set()
    for table in TABLES:
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == state and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def _own(inodes: set[str]) -> set[int]:
    """This process's descriptors of those sockets."""
    fds: set[int] = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            fds.add(int(name))
    return fds


def listening(port: int) -> set[int]:
    """Descriptors of this process's sockets listening on `port`."""
    return _own(_inodes(port, LISTEN))


def connections(port: int) -> int:
    """Established connections to `port` that this process holds."""
    return len(_own(_inodes(port, ESTABLISHED)))


async def pause(fds: set[int], patience: float = PATIENCE) -> None:
    """Stop listening on these sockets and leave their SO_REUSEPORT group, once their accept queues are empty.

    NOTE: shutdown() on a listening socket unhashes it: new connections go to the group's other
    sockets, and those already queued on it move there too when net.ipv4.tcp_migrate_req is 1, but
    are reset when it is 0 (Linux's default): a proxy that had sent its request on one (nginx never
    retries a gRPC call whose body it sent) answers UNAVAILABLE. So each socket is shut the moment
    grpc-core has accepted everything queued on it, or after `patience` seconds if it never empties.
    grpc-core's acceptor then fails with EINVAL and logs "Closing acceptor" once.
    """
    deadline = time.monotonic() + patience
    for fd in fds:
        try:
            duplicate = os.dup(fd)
        except OSError:  # closed by grpcio meanwhile
            continue
        try:
            with socket.socket(fileno=duplicate) as handle:
                while queued(handle) and time.monotonic() < deadline:
                    await asyncio.sleep(ACCEPT_POLL)
                handle.shutdown(socket.SHUT_RD)  # NOTE: right after the check: a connection completed in between is the one lost
        except OSError:  # not a socket any more (the number was reused): leave it alone
            os.close(duplicate) if _is_open(duplicate) else None


def queued(listener: socket.socket) -> int:
    """Connections the kernel has completed on this listening socket that nobody has accepted yet."""
    info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_SIZE)
    return struct.unpack_from("I", info, TCP_INFO_UNACKED)[0]  # NOTE: a listener's tcpi_unacked is its accept queue's length


def _is_open(fd: int) -> bool:
    """Whether `fd` is still an open descriptor of this process."""
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
