"""The shipped nginx configs in front of real forkserve instances."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import requests

from server.settings import DEFAULT_MAX_BODY_BYTES
from tests.support.harness import Server, wait_until
from tests.support.models import MAX_BODY_BYTES, copy_models
from tests.support.nginx import Nginx
from tests.support.traffic import Traffic


def test_single_upstream_proxies_ids_versions_and_limits(server: Server, tmp_path: Path) -> None:
    nginx = Nginx(tmp_path / "nginx", [server.port])
    try:
        answer = requests.post(f"{nginx.url}/v1/models/mlp:predict", json={"instances": [[0.1] * 20]},
                               headers={"X-Request-Id": "via-nginx-1"}, timeout=30)
        assert answer.ok and answer.headers["X-Request-Id"] == "via-nginx-1"
        assert answer.headers["X-Model-Version"] == "1"
        generated = requests.get(f"{nginx.url}/healthz", timeout=10).headers["X-Request-Id"]
        assert len(generated) == 32  # nginx's $request_id, passed to forkserve and echoed
        assert "rid=via-nginx-1 version=1" in nginx.access_log()
        assert requests.get(f"{nginx.url}/metrics", timeout=10).status_code == 200  # loopback is allowed
        for path in ("/v2/repository/index", "/v2/repository/models/mlp/unload", "/v2/repository/models/mlp/load"):
            refused = requests.post(f"{nginx.url}{path}", timeout=10)  # admin calls: the server's own port only
            assert refused.status_code == 403 and "not served through this proxy" in refused.json()["error"]
        assert requests.post(f"{server.url}/v2/repository/index", timeout=10).status_code == 200
    finally:
        nginx.stop()
    for name in ("nginx.conf", "nginx-multi.conf"):
        conf = (Path(__file__).resolve().parents[2] / "conf" / name).read_text()
        megabytes = int(re.search(r"client_max_body_size (\d+)m;", conf)[1])
        assert megabytes * 1024 * 1024 == DEFAULT_MAX_BODY_BYTES  # nginx and forkserve refuse the same bodies


def test_a_body_the_server_does_not_read_is_answered_through_nginx_every_time(server: Server, tmp_path: Path) -> None:
    """413 over the server's limit (1 MiB here, below nginx's 32m) and 404 for an unknown model, never nginx's 502.

    The worker answers before reading the body; closing with the rest unread reset the connection
    while nginx was still sending it, and nginx answered 502 (half of 4 MiB bodies before the fix).
    """
    nginx = Nginx(tmp_path / "nginx", [server.port])
    json_type = {"Content-Type": "application/json"}
    try:
        statuses = []
        for megabytes in (2, 4, 8) * 8:
            big = b'{"instances": [' + b"0.5," * (megabytes * MAX_BODY_BYTES // 4) + b"0.5]}"
            answer = requests.post(f"{nginx.url}/v1/models/mlp:predict", data=big, headers=json_type, timeout=30)
            statuses.append(answer.status_code)
            assert answer.status_code != 413 or set(answer.json()) == {"error"}
        under_the_limit = b'{"instances": [' + b"0.5," * (MAX_BODY_BYTES // 5) + b"0.5]}"
        for _ in range(8):
            statuses.append(requests.post(f"{nginx.url}/v1/models/nope:predict", data=under_the_limit,
                                          headers=json_type, timeout=30).status_code)
        assert statuses == [413] * 24 + [404] * 8
        # Over nginx's own limit: nginx answers, in forkserve's JSON shape.
        huge = requests.post(f"{nginx.url}/v1/models/mlp:predict", data=b"0" * (DEFAULT_MAX_BODY_BYTES + 1),
                             headers=json_type, timeout=30)
        assert huge.status_code == 413 and huge.headers["Content-Type"] == "application/json"
        assert "32 MiB" in huge.json()["error"]
    finally:
        nginx.stop()


@pytest.fixture()
def two_instances(model_repo: Path, tmp_path: Path) -> list[Server]:
    """Two independent forkserve instances with one worker each, serving mlp."""
    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    instances = [Server(models_dir=repo, run_dir=tmp_path / f"run{i}", workers=1) for i in range(2)]
    for instance in instances:
        instance.start()
    yield instances
    for instance in instances:
        instance.stop()


def test_requests_keep_succeeding_when_one_instance_is_sigkilled(two_instances: list[Server], tmp_path: Path) -> None:
    nginx = Nginx(tmp_path / "nginx", [s.port for s in two_instances], conf_name="nginx-multi.conf")
    traffic = Traffic(f"{nginx.url}/v1/models/mlp:predict")
    threads = traffic.start(4)
    try:
        victim, survivor = two_instances
        wait_until(lambda: all(_predictions(s) > 20 for s in two_instances), 30, "traffic through both instances")
        pids = [victim.process.pid, *victim.worker_pids()]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed_at, survivor_before = time.monotonic(), _predictions(survivor)
        wait_until(lambda: len([a for a in traffic.answers if a[0] > killed_at + 1]) > 100, 60, "traffic after the kill")
    finally:
        traffic.stop.set()
        for thread in threads:
            thread.join(30)
        nginx.stop()
    assert traffic.failures() == []
    after = [a for a in traffic.answers if a[0] > killed_at + 1]
    assert after and all(a[1] == 200 for a in after)
    # The survivor answered them all (its access log line follows each answer: wait for the last ones).
    wait_until(lambda: _predictions(survivor) - survivor_before >= len(after), 10, "the survivor's access log")


def _predictions(server: Server) -> int:
    """Predictions this instance answered, from its gunicorn access log."""
    return server.log().count("POST /v1/models/mlp:predict")


def test_slow_and_vanishing_clients_tie_up_no_worker(model_repo: Path, tmp_path: Path) -> None:
    """Behind nginx: bodies sent slowly are buffered by nginx, and clients that hang up free their worker."""
    import socket

    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    server = Server(models_dir=repo, run_dir=tmp_path / "run", workers=1, env={"FORKSERVE_THREADS": "4"}).start()
    nginx = Nginx(tmp_path / "nginx", [server.port])
    body = b'{"instances": [' + b",".join([b"[" + b",".join([b"0.5"] * 20) + b"]"] * 4) + b"]}"
    slow, gone = [], []
    try:
        for _ in range(12):  # three times the worker's threads, each stuck mid-body
            sock = socket.create_connection(("127.0.0.1", nginx.port), timeout=10)
            sock.sendall(b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
            slow.append(sock)
        for _ in range(12):  # full requests whose clients leave before the answer
            sock = socket.create_connection(("127.0.0.1", nginx.port), timeout=10)
            sock.sendall(b"POST /v1/models/mlp:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            sock.close()
            gone.append(sock)
        started = time.monotonic()
        answers = [requests.post(f"{nginx.url}/v1/models/mlp:predict", data=body,
                                 headers={"Content-Type": "application/json"}, timeout=10) for _ in range(20)]
        assert [a.status_code for a in answers] == [200] * 20
        assert time.monotonic() - started < 10  # the 4 worker threads were all free
        # nginx still holds the slow bodies: none of them reached gunicorn (vanished ones may or may not).
        wait_until(lambda: server.log().count("POST /v1/models/mlp:predict") >= 20, 10, "20 access-log lines")
        assert server.log().count("POST /v1/models/mlp:predict") <= 20 + len(gone)
    finally:
        for sock in slow:
            sock.close()
        nginx.stop()
        server.stop()
