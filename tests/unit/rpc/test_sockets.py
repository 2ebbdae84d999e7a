"""server.rpc.sockets.pause on real SO_REUSEPORT listeners: what the kernel queued on a socket is served, not reset."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from server.rpc import sockets

CLIENTS = 48


def listener(port: int = 0) -> socket.socket:
    """A listening socket in a SO_REUSEPORT group on 127.0.0.1, as grpc-core makes them."""
    handle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    handle.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    handle.bind(("127.0.0.1", port))
    handle.listen(128)
    return handle


def serve(handle: socket.socket, after: float) -> threading.Thread:
    """Accept on `handle` from `after` seconds on, answering each client, until the socket stops listening."""

    def run() -> None:
        time.sleep(after)  # a busy worker's acceptor, late to the queue
        handle.settimeout(0.05)
        while True:
            try:
                conn, _ = handle.accept()
            except TimeoutError:
                continue
            except OSError:  # EINVAL: shut down
                return
            with conn:
                conn.recv(16)
                conn.sendall(b"ok")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def answers(clients: list[socket.socket]) -> list[bytes | str]:
    """What each client read: the answer, or the error its connection got."""
    read: list[bytes | str] = []
    for client in clients:
        try:
            read.append(client.recv(16))
        except OSError as exc:
            read.append(type(exc).__name__)
        finally:
            client.close()
    return read


def connect_many(port: int) -> list[socket.socket]:
    """Clients whose handshake completed (queued on one socket of the group or another), each with its request sent."""
    clients = []
    for _ in range(CLIENTS):
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        client.sendall(b"hello")
        clients.append(client)
    return clients


def test_a_paused_socket_first_lets_its_acceptor_take_what_is_queued_then_leaves_the_group() -> None:
    retiring = listener()
    port = retiring.getsockname()[1]
    staying = listener(port)
    clients = connect_many(port)
    assert sockets.queued(retiring) > 0, "the kernel spread no connection to the retiring socket"
    served = serve(retiring, after=0.2)
    serve(staying, after=0.0)
    started = time.monotonic()
    asyncio.run(sockets.pause({retiring.fileno()}, patience=5.0))
    assert time.monotonic() - started < 2.0
    assert answers(clients) == [b"ok"] * CLIENTS
    served.join(5)
    assert not served.is_alive(), "the paused socket still accepts"
    after = connect_many(port)  # every new connection goes to the socket that stays
    assert sockets.queued(retiring) == 0
    assert answers(after) == [b"ok"] * CLIENTS
    staying.close()
    retiring.close()


def test_a_socket_nobody_accepts_on_is_shut_after_the_patience() -> None:
    """A hung acceptor costs its queue (reset, as before), never a stop that waits forever."""
    retiring = listener()
    port = retiring.getsockname()[1]
    staying = listener(port)
    serve(staying, after=0.0)
    clients = connect_many(port)
    stuck = sockets.queued(retiring)
    assert stuck > 0
    started = time.monotonic()
    asyncio.run(sockets.pause({retiring.fileno()}, patience=0.3))
    assert 0.3 <= time.monotonic() - started < 1.5
    read = answers(clients)
    assert read.count(b"ok") == CLIENTS - stuck
    assert read.count("ConnectionResetError") == stuck
    staying.close()
    retiring.close()


def test_a_descriptor_that_is_no_longer_a_socket_is_left_alone(tmp_path) -> None:
    with open(tmp_path / "file", "w") as plain:
        asyncio.run(sockets.pause({plain.fileno()}))
        plain.write("still open")
