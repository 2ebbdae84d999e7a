"""The predict fast path answers exactly as the Flask view does: same status, body, headers and metrics."""

from __future__ import annotations

import base64
import io
import re
import socket
from pathlib import Path
from typing import Iterator

import pytest
import requests
from PIL import Image

from tests.support.harness import Server
from tests.support.models import copy_models

MAX_BODY_BYTES = 64 * 1024
CONF = """
[models.mlp]
labels = { stable = 1 }
max_request_rows = 8

[models.fallback]
latest = 1

[models.slow]
max_batch_size = 1
"""
ROW = [0.5] * 20


def image_body() -> bytes:
    """One 192x192 PNG for the slow model (0.1-0.3 s a row): a deadline of 10 ms always passes first."""
    png = io.BytesIO()
    Image.new("RGB", (192, 192), (90, 120, 200)).save(png, format="PNG")
    return b'{"instances": [{"b64": "' + base64.b64encode(png.getvalue()) + b'"}]}'


JSON = {"Content-Type": "application/json"}
CASES = {  # name: (path, body, headers)
    "rows": ("/v1/models/mlp:predict", b'{"instances": [' + b",".join([str(ROW).encode()] * 3) + b"]}", JSON),
    "columns": ("/v1/models/mlp:predict", b'{"inputs": [' + str(ROW).encode() + b"]}", JSON),
    "version": ("/v1/models/mlp/versions/1:predict", b'{"instances": [' + str(ROW).encode() + b"]}", JSON),
    "label": ("/v1/models/mlp/labels/stable:predict", b'{"instances": [' + str(ROW).encode() + b"]}", JSON),
    "charset and a request id": ("/v1/models/mlp:predict", b'{"instances": [' + str(ROW).encode() + b"]}",
                                 {"Content-Type": "application/json; charset=utf-8", "X-Request-Id": "client-7"}),
    "curl's form type": ("/v1/models/half_plus_two:predict", b'{"instances": [1.0, 2.0, 5.0]}',
                         {"Content-Type": "application/x-www-form-urlencoded"}),
    "wrong width": ("/v1/models/mlp:predict", b'{"instances": [[1.0, 2.0]]}', JSON),
    "too many rows": ("/v1/models/mlp:predict", b'{"instances": [' + b",".join([str(ROW).encode()] * 9) + b"]}", JSON),
    "NaN": ("/v1/models/mlp:predict", b'{"instances": [[NaN' + b", 0.5" * 19 + b"]]}", JSON),
    "malformed": ("/v1/models/mlp:predict", b'{"instances": [[0.5,', JSON),
    "empty body": ("/v1/models/mlp:predict", b"", JSON),
    "not an object": ("/v1/models/mlp:predict", b"[1, 2]", JSON),
    "unknown signature": ("/v1/models/mlp:predict", b'{"signature_name": "nope", "instances": [' + str(ROW).encode() + b"]}", JSON),
    "bad timeout header": ("/v1/models/mlp:predict", b'{"instances": [' + str(ROW).encode() + b"]}",
                           {**JSON, "X-Request-Timeout": "soon"}),
    "past its deadline": ("/v1/models/slow:predict", image_body(), {**JSON, "X-Request-Timeout": "0.01"}),
    "html": ("/v1/models/mlp:predict", b'{"instances": [' + str(ROW).encode() + b"]}", {"Content-Type": "text/html"}),
    "too large": ("/v1/models/mlp:predict", b'{"instances": [[' + b"0.5, " * 20000 + b"0.5]]}", JSON),
    "missing version": ("/v1/models/mlp/versions/7:predict", b'{"instances": [' + str(ROW).encode() + b"]}", JSON),
    "failed version": ("/v1/models/fallback/versions/2:predict", b'{"instances": [' + str(ROW).encode() + b"]}", JSON),
    "unknown model": ("/v1/models/nope:predict", b'{"instances": [1.0]}', JSON),
    "a newline after the verb": ("/v1/models/mlp:predict%0A", b'{"instances": [' + str(ROW).encode() + b"]}", JSON),
    "a newline after the version": ("/v1/models/mlp/versions/1:predict%0A", b'{"instances": [' + str(ROW).encode() + b"]}", JSON),
}
COMPARED_HEADERS = ("Content-Type", "X-Model-Version", "Retry-After")


@pytest.fixture(scope="module")
def servers(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """The same repository served with the fast path (the default) and without it."""
    started = {}
    for name, flag in (("fast", "1"), ("flask", "0")):
        run_dir = tmp_path_factory.mktemp(f"run-{name}")
        (run_dir / "models.toml").write_text(CONF)
        repo = copy_models(model_repo, tmp_path_factory.mktemp(f"models-{name}"), "mlp", "half_plus_two", "fallback", "slow")
        started[name] = Server(models_dir=repo, run_dir=run_dir, conf_path=run_dir / "models.toml", workers=1,
                               env={"FORKSERVE_FAST_PREDICT": flag, "FORKSERVE_MAX_BODY_BYTES": str(MAX_BODY_BYTES)}).start(timeout=0)
    try:
        for server in started.values():
            server.wait_workers_loaded(1, 180)
        yield started
    finally:
        for server in started.values():
            server.stop()


def answer(server: Server, case: str) -> tuple[int, object, dict[str, str | None]]:
    path, body, headers = CASES[case]
    response = requests.post(server.url + path, data=body, headers=headers, timeout=30)
    request_id = response.headers.get("X-Request-Id", "")
    assert re.fullmatch(r"client-7|[0-9a-f]{32}", request_id), request_id
    kept = {name: response.headers.get(name) for name in COMPARED_HEADERS}
    kept["X-Request-Id"] = request_id if headers.get("X-Request-Id") else "(generated)"
    return response.status_code, response.json(), kept


@pytest.mark.parametrize("case", CASES)
def test_the_fast_path_answers_as_flask_does(servers: dict[str, Server], case: str) -> None:
    fast, flask = answer(servers["fast"], case), answer(servers["flask"], case)
    assert fast == flask


def test_both_paths_count_the_same_requests(servers: dict[str, Server]) -> None:
    """forkserve_requests_total after the same requests: the same series with the same counts."""
    def counted(server: Server) -> list[str]:
        text = requests.get(server.url + "/metrics", timeout=30).text
        return sorted(line for line in text.splitlines() if line.startswith("forkserve_requests_total{"))

    for server in servers.values():
        for case in ("rows", "wrong width", "malformed", "missing version"):
            answer(server, case)
    assert counted(servers["fast"]) == counted(servers["flask"])
    assert any('api="tfserving_predict"' in line and 'code="200"' in line for line in counted(servers["fast"]))


def test_a_body_shorter_than_its_content_length_is_a_408_on_both_paths(servers: dict[str, Server]) -> None:
    """The client declares more than it sends, then stops: even a complete JSON document is not answered as one."""
    body = b'{"instances": [' + str(ROW).encode() + b"]}"
    statuses = {}
    for name, server in servers.items():
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body) + 50}\r\n\r\n".encode() + body)
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        statuses[name] = answer.split(b"\r\n", 1)[0]
    assert statuses == {"fast": b"HTTP/1.1 408 REQUEST TIMEOUT", "flask": b"HTTP/1.1 408 REQUEST TIMEOUT"}
