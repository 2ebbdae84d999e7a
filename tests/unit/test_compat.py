"""Private-API paths of pinned libraries: verified against the pins, and equal to the public paths."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from server import compat
from tests.support.filesystems import filled, tmpfs

ROOT = Path(__file__).resolve().parents[2]


def test_the_verified_versions_are_the_pinned_ones_and_installed() -> None:
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.txt").read_text(), re.M))
    for distribution, version in compat.VERIFIED.items():
        assert pins[distribution] == version, distribution
        assert compat.verified(distribution), distribution


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict, float]]:
    """Every sample but the creation times."""
    return [(s.name, s.labels, s.value) for family in registry.collect() for s in family.samples
            if not s.name.endswith("_created")]


@pytest.mark.parametrize("private", [True, False], ids=["private", "public"])
def test_observe_many_writes_what_observe_would(private: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    values = [0.00005, 0.0003, 0.0003, 0.2, 7.0, 12.0]
    expected, got = CollectorRegistry(), CollectorRegistry()
    one = Histogram("h", "", ["m"], buckets=(0.0001, 0.001, 0.5, 10.0), registry=expected).labels("x")
    for value in values:
        one.observe(value)
    many = Histogram("h", "", ["m"], buckets=(0.0001, 0.001, 0.5, 10.0), registry=got).labels("x")
    monkeypatch.setattr(compat, "verified", lambda distribution: private)
    compat.observe_many(many, values)
    assert _samples(got) == _samples(expected)
    assert compat.is_histogram(many) and not compat.is_histogram(Counter("c", "", registry=got))


def test_metric_files_get_their_blocks_reserved(tmp_path: Path) -> None:
    from prometheus_client.mmap_dict import MmapedDict

    assert compat.reserve_metric_file_blocks()
    path = tmp_path / "counter_1.db"
    values = MmapedDict(str(path))
    for index in range(400):  # enough keys to grow the file past its first page
        values.write_value(f"key-{index}-" + "x" * 64, float(index), 0.0)
    size = os.stat(path).st_size
    assert size > 4096 and os.stat(path).st_blocks * 512 >= size  # allocated, not sparse
    values.close()


RESERVE_ON_A_FULL_DISK = """
import sys
from server import compat
assert compat.reserve_metric_file_blocks()
from prometheus_client.mmap_dict import MmapedDict
try:
    MmapedDict(sys.argv[1])
except OSError as exc:
    print(exc.errno)
"""


def test_a_metric_file_on_a_full_disk_is_an_error_not_a_sigbus(tmp_path: Path) -> None:
    """prometheus_client maps a sparse file and reads its header: on a full tmpfs that was a SIGBUS."""
    with tmpfs(tmp_path / "small") as where, filled(where):
        done = subprocess.run([sys.executable, "-c", RESERVE_ON_A_FULL_DISK, str(where / "counter_1.db")],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"  # -7 is SIGBUS
        assert done.stdout.strip() == str(errno.ENOSPC)
        assert not (where / "counter_1.db").exists()  # no empty file left for a scrape to choke on


class RecordingSocket:
    """A connection socket that keeps each sendall call apart."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))


def _serve_one(app, request: bytes) -> list[bytes]:
    """gunicorn's own parser and Response answering `request` with `app`, as gthread's handle_request does."""
    import socket

    from gunicorn.config import Config
    from gunicorn.http import wsgi
    from gunicorn.http.parser import RequestParser

    client, server = socket.socketpair()
    with client, server:
        client.sendall(request)
        req = next(RequestParser(Config(), server, ("127.0.0.1", 5000)))
        sock = RecordingSocket()
        resp, environ = wsgi.create(req, sock, ("127.0.0.1", 5000), ("127.0.0.1", 8000), Config())
        for item in app(environ, resp.start_response):
            resp.write(item)
        resp.close()
    return sock.writes


def _app(status: str, headers: list[tuple[str, str]], body: list[bytes]):
    def app(environ: dict, start_response) -> list[bytes]:
        start_response(status, headers)
        return body
    return app


POST = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def test_a_response_head_and_body_leave_in_one_write() -> None:
    """A worker killed between two writes would leave nginx a head without a body (no retry possible)."""
    assert compat.send_responses_in_one_write() and compat.send_responses_in_one_write()  # idempotent
    body = b'{"predictions": [[0.5]]}'
    writes = _serve_one(_app("200 OK", [("Content-Type", "application/json"),
                                        ("Content-Length", str(len(body)))], [body]), POST)
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b"\r\n\r\n" + body)


def test_bodiless_and_chunked_responses_still_send_their_head_first() -> None:
    assert compat.send_responses_in_one_write()
    empty = _serve_one(_app("204 No Content", [], []), POST)
    assert len(empty) == 1 and empty[0].startswith(b"HTTP/1.1 204 No Content\r\n")
    head = _serve_one(_app("200 OK", [("Content-Length", "5")], [b"hello"]),
                      b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"".join(head).startswith(b"HTTP/1.1 200 OK\r\n") and b"hello" not in b"".join(head)
    chunked = _serve_one(_app("200 OK", [], [b"ab", b"cd"]), POST)
    assert chunked[0].startswith(b"HTTP/1.1 200 OK\r\n") and chunked[0].endswith(b"\r\n\r\n2\r\nab\r\n")
    assert b"".join(chunked).endswith(b"2\r\ncd\r\n0\r\n\r\n")
