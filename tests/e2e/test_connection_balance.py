"""Keep-alive connections spread over the workers: none holds much more than an even share (server.connection_board)."""

from __future__ import annotations

import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.harness import Server, wait_until

CLIENTS = 32
BODY = b'{"instances": [[' + b",".join([b"0.5"] * 20) + b"]]}"


# These tests stop or kill workers of the session's shared server: it gets them all back whatever happens.
pytestmark = pytest.mark.usefixtures("restores_workers")


def established_per_worker(server: Server) -> dict[int, int]:
    """Established connections to the server's port that each worker holds (from /proc, no ss needed)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == server.port and fields[3] == "01":
                inodes.add(fields[9])
    held = {}
    for pid in server.worker_pids():
        sockets = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
        held[pid] = len(sockets & inodes)
    return held


class KeepAliveClient:
    """One client on one keep-alive connection, reconnecting when the server says Connection: close."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.reconnects = 0

    def predict(self) -> int:
        self.sock.sendall(b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            assert chunk, "connection closed before the answer"
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in head.split(b"\r\n")[1:])}
        while len(rest) < int(headers[b"content-length"]):
            rest += self.sock.recv(65536)
        if headers.get(b"connection", b"").lower() == b"close":
            self.sock.close()
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=60)
            self.reconnects += 1
        return int(head.split(b" ", 2)[1])


def test_connections_piled_on_one_worker_spread_out_with_no_failed_request(server: Server) -> None:
    """A worker that accepted everything while the other was stalled hands the excess back."""
    busy, stalled = server.worker_pids()
    os.kill(stalled, signal.SIGSTOP)  # a long pause in one worker while a burst of clients connects
    clients: list[KeepAliveClient] = []
    try:
        clients += [KeepAliveClient(server.port) for _ in range(CLIENTS)]
        wait_until(lambda: established_per_worker(server)[busy] >= 8, 30, "the busy worker to accept")
        with ThreadPoolExecutor(CLIENTS) as pool:
            first = [pool.submit(client.predict) for client in clients]
            wait_until(lambda: sum(f.done() for f in first) >= 8, 30, "answers from the busy worker")
            os.kill(stalled, signal.SIGCONT)
            answers = [f.result() for f in first]
            answers += [status for statuses in pool.map(lambda c: [c.predict() for _ in range(20)], clients)
                        for status in statuses]
        assert answers == [200] * (CLIENTS * 21)  # a connection handed back is closed after its answer, never during
        held = established_per_worker(server)
        assert sum(held.values()) == CLIENTS, held
        assert max(held.values()) <= 0.6 * CLIENTS, held  # an even share (16) plus at most 15 %
    finally:
        os.kill(stalled, signal.SIGCONT)
        for client in clients:
            client.sock.close()


def test_connections_left_on_the_survivor_of_a_restart_move_to_the_new_worker(server: Server) -> None:
    """While a replacement loads, the one accepting worker takes every client; then it hands the excess back."""
    survivor, victim = server.worker_pids()
    os.kill(victim, signal.SIGKILL)
    server.wait_reaped(victim)
    clients = [KeepAliveClient(server.port) for _ in range(CLIENTS)]
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = list(pool.map(lambda c: c.predict(), clients))
            assert established_per_worker(server) == {survivor: CLIENTS}  # the only worker accepting
            server.wait_workers_loaded(2, timeout=120)
            answers += [status for statuses in pool.map(lambda c: [c.predict() for _ in range(20)], clients)
                        for status in statuses]
        assert answers == [200] * (CLIENTS * 21)
        held = established_per_worker(server)
        assert sum(held.values()) == CLIENTS and max(held.values()) <= 0.6 * CLIENTS, held
        assert sum(client.reconnects for client in clients) >= CLIENTS // 2 - 0.1 * CLIENTS  # handed back, with Connection: close
    finally:
        for client in clients:
            client.sock.close()


def test_a_client_that_keeps_a_closed_connection_open_does_not_stall_the_worker(server: Server) -> None:
    """A `Connection: close` answer to a client that never closes its end leaves the worker's other clients served."""
    busy, stalled = server.worker_pids()
    os.kill(stalled, signal.SIGSTOP)  # every connection below lands on the busy worker
    lingering = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    other = KeepAliveClient(server.port)
    try:
        assert other.predict() == 200  # kept alive: back on the busy worker's poller
        lingering.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = lingering.recv(65536)
            assert chunk, "closed before the answer"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
        # The server now waits for this client's FIN, which never comes (gunicorn lingers up to 2 s).
        slowest = 0.0
        for _ in range(5):
            started = time.monotonic()
            assert other.predict() == 200
            slowest = max(slowest, time.monotonic() - started)
        assert slowest < 1.0, f"a keep-alive client waited {slowest:.2f} s behind another client's close"
    finally:
        os.kill(stalled, signal.SIGCONT)
        lingering.close()
        other.sock.close()
