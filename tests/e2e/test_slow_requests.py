"""A request slower than FORKSERVE_SLOW_REQUEST_MS leaves one log line saying where its time went."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Iterator

import numpy as np
import orjson
import pytest

from tests.support.harness import Server, wait_until
from tests.support.models import copy_models


@pytest.fixture(scope="module")
def server(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One worker with one request thread, where every request is "slow" and so logged."""
    tmp_path = tmp_path_factory.mktemp("slow")
    repo = copy_models(model_repo, tmp_path / "models", "mlp", "slow")
    conf = tmp_path / "models.toml"
    conf.write_text("[models.slow]\nmax_batch_size = 1\n")  # its requests are one row: warm-up at 1 row, not up to 64
    server = Server(models_dir=repo, run_dir=tmp_path / "run", conf_path=conf, workers=1,
                    env={"FORKSERVE_SLOW_REQUEST_MS": "0.001", "FORKSERVE_THREADS": "1"}).start()
    yield server
    server.stop()


def stage_times(server: Server, request_id: str, what: str) -> dict[str, float]:
    """The stage times of the slow-request line of `request_id` (waited for)."""
    line = wait_until(lambda: re.search(rf"slow request {request_id}: {what} (.*)", server.log()), 10, f"{request_id}'s line")[1]
    return {name: float(value) for name, value in re.findall(r"(\w+)=([\d.]+)", line)}


def test_a_slow_request_logs_its_stage_times(server: Server) -> None:
    answer = server.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 20]}, headers={"X-Request-Id": "slow-1"})
    assert answer.status_code == 200
    times = stage_times(server, "slow-1", "mlp tfserving_predict version=1 status=200")
    assert {"total_ms", "thread_wait", "decode", "queue", "compute", "encode", "other"} <= times.keys(), times
    stages = sum(value for name, value in times.items() if name != "total_ms")
    assert abs(stages - times["total_ms"]) < 0.05 and times["compute"] > 0  # the stages and the rest add up
    refused = server.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 3]}, headers={"X-Request-Id": "slow-2"})
    assert refused.status_code == 400
    wait_until(lambda: "slow request slow-2: mlp tfserving_predict version=1 status=400" in server.log(), 10, "the 400's line")
    late = server.post("/v1/models/slow:predict", json={"instances": [np.zeros((192, 192, 3)).tolist()]},
                       headers={"X-Request-Id": "slow-3", "X-Request-Timeout": "0.01"})  # 0.1-0.3 s a row
    assert late.status_code == 504, late.text
    line = wait_until(lambda: re.search(r"slow request slow-3: slow tfserving_predict version=1 status=504 (.*)", server.log()),
                      10, "the timed-out request's line")[1]
    assert "queue=" in line, line  # it gave up while queued (or running): that wait is shown, not lumped into other


def test_the_wait_for_a_request_thread_is_its_own_stage(server: Server) -> None:
    """With one request thread, a request that arrives while another holds it waits for it: thread_wait shows it."""
    body = orjson.dumps({"instances": [np.zeros((192, 192, 3)).tolist()]})  # 0.1-0.3 s a row
    head = (f"POST /v1/models/slow:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-Request-Id: wait-a\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as slow:
        slow.sendall(head + body)  # sent whole before the next connection opens: gthread queues it first
        fast = server.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 20]}, headers={"X-Request-Id": "wait-b"})
        assert fast.status_code == 200
        answer = b"".join(iter(lambda: slow.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    times = stage_times(server, "wait-b", "mlp tfserving_predict version=1 status=200")
    assert times["thread_wait"] >= 50, times  # it waited for the slow request's whole call (>= 100 ms)
    assert times["thread_wait"] <= times["total_ms"]  # and the wait is part of its total
