"""The master's check that nobody listens on the gRPC port yet: SO_REUSEPORT would let us share it silently.

Runs in the master, before the first worker forks; plain sockets only (the master never imports grpc).
"""

from __future__ import annotations

import socket


def split_address(bind: str) -> tuple[str, int]:
    """("host", port) of a gRPC bind: HOST:PORT, [IPv6]:PORT or :PORT (every address)."""
    host, _, port = bind.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"FORKSERVE_GRPC_BIND must be HOST:PORT, got {bind!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def problem_with(bind: str) -> str | None:
    """Why the workers could not have `bind` to themselves (another process listens on it), or None.

    NOTE: a bind without SO_REUSEPORT fails with EADDRINUSE while any socket listens on the port,
    SO_REUSEPORT or not, so this sees a second forkserve or TF Serving on it. SO_REUSEADDR lets
    the check pass over connections of an earlier run still in TIME_WAIT.
    """
    try:
        host, port = split_address(bind)
        if port == 0:
            return None
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
