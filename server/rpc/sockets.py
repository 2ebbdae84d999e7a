"""This worker's gRPC sockets, seen from /proc: its listening sockets on the port, its open connections, a pause.

Runs in a worker only. grpcio gives Python no handle on its sockets; the kernel's tables do.
"""

from __future__ import annotations

import os
import socket

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")  # this network namespace's TCP sockets, of every process
LISTEN, ESTABLISHED = "0A", "01"


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


def pause(fds: set[int]) -> None:
    """Stop listening on these sockets and leave their SO_REUSEPORT group; connections already accepted stay.

    NOTE: shutdown() on a listening socket unhashes it: new connections go to the group's other
    sockets, and those already queued on it move there too when net.ipv4.tcp_migrate_req is 1
    (reset when 0). grpc-core's acceptor then fails with EINVAL and logs "Closing acceptor" once.
    """
    for fd in fds:
        try:
            duplicate = os.dup(fd)
        except OSError:  # closed by grpcio meanwhile
            continue
        try:
            with socket.socket(fileno=duplicate) as handle:
                handle.shutdown(socket.SHUT_RD)
        except OSError:  # not a socket any more (the number was reused): leave it alone
            os.close(duplicate) if _is_open(duplicate) else None


def _is_open(fd: int) -> bool:
    """Whether `fd` is still an open descriptor of this process."""
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
