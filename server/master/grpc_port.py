"""The master's check that nobody listens on the gRPC port yet: SO_REUSEPORT would let us share it silently.

Runs in the master, before the first worker forks; plain sockets only (the master never imports grpc).
"""

from __future__ import annotations

import socket
from pathlib import Path

MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")


def split_address(bind: str) -> tuple[str, int]:
    """("host", port) of a gRPC bind: HOST:PORT, [IPv6]:PORT or :PORT (every address)."""
    host, colon, port = bind.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) <= 65535:
        # NOTE: port 0 would give every worker a port of its own that no client knows
        raise ValueError(f"FORKSERVE_GRPC_BIND must be HOST:PORT with a port from 1 to 65535, got {bind!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def problem_with(bind: str) -> str | None:
    """Why the workers could not have `bind` to themselves (another process listens on it), or None.

    NOTE: a bind without SO_REUSEPORT fails with EADDRINUSE while any socket listens on the port,
    SO_REUSEPORT or not, so this sees a second forkserve or TF Serving on it. SO_REUSEADDR lets
    the check pass over connections of an earlier run still in TIME_WAIT.
    """
    try:
        host, port = split_address(bind)
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (ValueError, OSError) as exc:
        return f"gRPC address {bind!r}: {exc}"
    for family, kind, protocol, _, address in addresses:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                return (f"gRPC port {bind} is taken ({exc.strerror}): another server listens on it; "
                        "stop it or set FORKSERVE_GRPC_BIND (\"\" turns gRPC off)")
    return None


def migrate_warning(path: Path = MIGRATE_REQ) -> str | None:
    """A warning when the kernel resets connections queued on a closing SO_REUSEPORT listener, or None.

    NOTE: a worker that stops (a rollout, a restart, the balancer moving connections) closes its
    gRPC listening sockets; with net.ipv4.tcp_migrate_req = 0 (Linux's default) the connections
    the kernel had queued on them, handshake done but not yet accepted, are reset, and those
    clients' calls fail with UNAVAILABLE. With 1 the kernel moves them to another worker's socket.
    """
    try:
        value = path.read_text().strip()
    except OSError:
        return None  # a kernel older than 5.14: no migration to turn on
    if value != "0":
        return None
    return ("net.ipv4.tcp_migrate_req is 0: gRPC connections queued on a stopping worker's listener are reset "
            "(set it to 1: sysctl -w net.ipv4.tcp_migrate_req=1, or the pod's securityContext.sysctls)")
