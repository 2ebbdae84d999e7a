"""scripts/forkserve-healthcheck, the image's HEALTHCHECK: healthy when one of the REST ports answers /healthz with 200."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from tests.support.harness import ROOT, free_port

SCRIPT = ROOT / "scripts" / "forkserve-healthcheck"


def serving(status: int) -> Iterator[int]:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def healthy_port() -> Iterator[int]:
    yield from serving(200)


@pytest.fixture
def failing_port() -> Iterator[int]:
    yield from serving(503)


def check(*ports: int) -> int:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, ports)], timeout=30).returncode


def test_healthy_when_either_port_answers(healthy_port: int) -> None:
    closed = free_port()
    assert check(healthy_port, closed) == 0  # native mode: 8000 answers
    assert check(closed, healthy_port) == 0  # TF Serving's mode: 8501 answers


def test_unhealthy_when_no_port_answers_200(failing_port: int) -> None:
    assert check(free_port(), failing_port) == 1
