"""The master's claim on the gRPC port: a lock only one forkserve holds, and a check that nobody else listens on it.

Runs in the master, before the first worker forks; plain sockets only (the master never imports grpc).
SO_REUSEPORT would otherwise let a second forkserve share the port silently: its workers bind it
once their models are warm, whatever the first's workers are doing.
"""

from __future__ import annotations

import socket
from pathlib import Path

from server.settings import split_address

MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")
LOCK_NAME = "forkserve-grpc-port-{port}"  # an abstract Unix socket name: `ss -xap | grep forkserve-grpc-port` shows who holds it


class PortTaken(Exception):
    """The gRPC port cannot be this server's; the message is the one line to refuse the start with."""


def claim(bind: str) -> socket.socket:
    """Master, at start: the lock that makes `bind`'s port this server's until its last process exits.

    Raises PortTaken when another forkserve holds the port's lock or any process listens on it.
    NOTE: the lock is an abstract Unix socket named after the port alone: binding it is atomic
    (EADDRINUSE for the second master, however close the two starts), it lives in the network
    namespace as the port does, needs no file, and the kernel releases it when the last process
    holding it exits, SIGKILL included. A TCP socket cannot be that lock: one the workers can still
    bind beside (SO_REUSEADDR or SO_REUSEPORT) lets another forkserve's grpc-core bind too, and one
    without either keeps this server's own workers out (and fails after a restart, on the last
    run's TIME_WAIT connections). The workers inherit the socket through fork, and so keep the port
    owned while they live: a SIGKILLed master's workers go on loading, then bind the port.
    Keep the socket referenced: it is closed (the lock released) when collected.
    """
    try:
        _, port = split_address(bind)
    except ValueError as exc:
        raise PortTaken(f"gRPC address {bind!r}: {exc}") from None
    name = LOCK_NAME.format(port=port)
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        lock.bind(b"\0" + name.encode())
    except OSError as exc:
        lock.close()
        raise PortTaken(f"gRPC port {bind} is taken ({exc.strerror}): another forkserve holds port {port}, "
                        f"starting or serving (ss -xap | grep @{name}); stop it or set FORKSERVE_GRPC_BIND "
                        "(\"\" turns gRPC off)") from None
    if problem := problem_with(bind):
        lock.close()
        raise PortTaken(problem)
    return lock


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
    clients' calls fail with UNAVAILABLE. A worker that stops on its own first lets its queue be
    accepted (server.rpc.sockets.pause); a killed or stalled one cannot. With 1 the kernel moves
    them to another worker's socket.
    """
    try:
        value = path.read_text().strip()
    except OSError:
        return None  # a kernel older than 5.14: no migration to turn on
    if value != "0":
        return None
    return ("net.ipv4.tcp_migrate_req is 0: gRPC connections queued on a killed or stalled worker's listener are reset "
            "(set it to 1: sysctl -w net.ipv4.tcp_migrate_req=1, or the pod's securityContext.sysctls)")
