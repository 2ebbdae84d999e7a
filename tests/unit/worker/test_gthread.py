"""close_lingering: read what the client still sends until it closes, within bounds (real sockets, no server)."""

from __future__ import annotations

import socket
import threading

from server.worker.gthread import close_lingering


def test_what_the_client_still_sends_is_read_until_it_closes() -> None:
    server, client = socket.socketpair()
    sender = threading.Thread(target=lambda: (client.sendall(b"x" * 3_000_000), client.close()))
    sender.start()  # more than the socket buffers hold: it completes only if close_lingering reads it
    assert close_lingering(server, seconds=10) == "lingered"
    sender.join(10)
    assert server.fileno() == -1


def test_a_client_that_never_closes_is_cut_short_by_time() -> None:
    server, client = socket.socketpair()
    try:
        assert close_lingering(server, seconds=0.2) == "cut_short"
        assert server.fileno() == -1
    finally:
        client.close()


def test_a_client_that_keeps_sending_is_cut_short_by_bytes() -> None:
    server, client = socket.socketpair()
    client.sendall(b"x" * 100_000)
    try:
        assert close_lingering(server, seconds=10, max_bytes=50_000) == "cut_short"
    finally:
        client.close()
