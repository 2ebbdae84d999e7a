"""forkserve's gthread worker (server/worker/gthread.py): how it closes connections and how it stops."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest
import requests

from server.worker.gthread import LINGERING_LIMIT
from tests.support.harness import Server, wait_until
from tests.support.models import copy_models

BODY = b'{"instances": [[' + b",".join([b"0.5"] * 20) + b"]]}"
PREDICT = (b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY)


def exchange(sock: socket.socket, request: bytes = PREDICT) -> tuple[str, bool]:
    """Send one request and read its answer: (status or what went wrong, whether the connection stays open)."""
    try:
        sock.sendall(request)
    except OSError as exc:
        return f"send failed: {exc!r}", False
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError as exc:
            return f"{'reset after part of an answer' if data else 'reset after the request was sent'}: {exc!r}", False
        if not chunk:
            return ("truncated answer" if data else "closed after the request was sent"), False
        data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        if _ and len(rest) >= int(re.search(rb"(?i)content-length: *(\d+)", head)[1]):
            return head.split(b" ", 2)[1].decode(), not re.search(rb"(?i)\r\nconnection: *close", head)


def worker_sockets(pid: int, port: int) -> int:
    """Connections to `port` (not the listener) whose descriptor the worker still holds."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] != "0A":
                inodes.add(fields[9])
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        held += target.startswith("socket:[") and target[8:-1] in inodes
    return held


def closes(server: Server) -> dict[str, float]:
    """forkserve_connection_closes_total by `how`."""
    text = requests.get(server.url + "/metrics", timeout=30).text
    return {m[1]: float(m[2]) for m in re.finditer(r'forkserve_connection_closes_total\{how="(\w+)"\} (\S+)', text)}


@pytest.fixture(scope="module")
def one_worker(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One worker, so every connection lands on it."""
    repo = copy_models(model_repo, tmp_path_factory.mktemp("models"), "mlp")
    server = Server(models_dir=repo, run_dir=tmp_path_factory.mktemp("run"), workers=1).start()
    yield server
    server.stop()


def test_clients_that_ignore_connection_close_hold_a_bounded_number_of_descriptors(one_worker: Server) -> None:
    """Each lingering close holds a descriptor until its client closes (5 s at most): past 64, closed at once, counted."""
    clients = LINGERING_LIMIT + 36
    (worker,) = one_worker.worker_pids()
    sockets = [socket.create_connection(("127.0.0.1", one_worker.port), timeout=30) for _ in range(clients)]
    try:
        request = PREDICT.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda sock: exchange(sock, request)[0], sockets))
        assert answers == ["200"] * clients
        # These clients never close their end: a lingering close waits 5 s for them (gunicorn's waited 2 s, 4 at a time).
        wait_until(lambda: worker_sockets(worker, one_worker.port) <= LINGERING_LIMIT, 2, "at most 64 lingering closes")
        counted = closes(one_worker)
        assert counted.get("at_once", 0) >= clients - LINGERING_LIMIT, counted
        started = time.monotonic()
        assert requests.get(one_worker.url + "/healthz", timeout=10).ok  # the worker is not held up meanwhile
        assert time.monotonic() - started < 1.0
    finally:
        for sock in sockets:
            sock.close()
    wait_until(lambda: closes(one_worker).get("lingered", 0) >= LINGERING_LIMIT, 30, "the lingering closes to end")


def test_an_unread_body_is_read_to_its_end_before_the_close(one_worker: Server) -> None:
    """A 404 before reading a 4 MiB body: the worker reads the rest after its answer, so the client sees a close, not a reset."""
    body = b"0" * (4 * 1024 * 1024)
    with socket.create_connection(("127.0.0.1", one_worker.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/models/nope:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:  # the answer comes first, as nginx sees it; then the body follows
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 404"), answer[:100]
        sock.sendall(body)  # a reset here is ConnectionResetError or BrokenPipeError
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):  # the rest of the answer, then the server's close
            pass


def test_requests_sent_after_the_server_is_told_to_stop_are_answered_or_refused(model_repo: Path, tmp_path: Path) -> None:
    """TERM to the master under keep-alive clients: each request is answered, or its connection refused; none reset.

    A client whose connection was closed after an answer reconnects. gthread kept its listening
    socket open until its last request was done, so those connections queued in a backlog that
    nobody accepted, and each was reset, request sent, when the workers exited.
    """
    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    server = Server(models_dir=repo, run_dir=tmp_path / "run", workers=2).start()
    stop, outcomes, lock = threading.Event(), [], threading.Lock()
    termed_at = [float("inf")]

    def client() -> None:
        sock = None
        while not stop.is_set():
            if sock is None:
                try:
                    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
                except ConnectionRefusedError:
                    time.sleep(0.01)
                    continue
            sent_at = time.monotonic()
            outcome, keep = exchange(sock)
            with lock:
                outcomes.append((sent_at, outcome))
            if not keep:
                sock.close()
                sock = None
        if sock is not None:
            sock.close()

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: len(outcomes) > 200, 30, "traffic on kept-alive connections")
        termed_at[0] = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(30)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        server.stop()
    after = [outcome for at, outcome in outcomes if at >= termed_at[0]]
    assert after and set(after) == {"200"}, sorted(set(after))
