"""A full queue answers 503 with Retry-After at once; a request past its deadline answers 504."""

from __future__ import annotations

import base64
import io
import time
from concurrent.futures import ThreadPoolExecutor

import requests
from PIL import Image

from tests.support.harness import Server
from tests.support.metrics import samples, value


def _slow_body() -> dict:
    """One small image for the slow model (resized to 192x192 by the server)."""
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), "blue").save(buffer, format="PNG")
    return {"instances": [{"b64": base64.b64encode(buffer.getvalue()).decode()}]}


def test_full_queue_is_shed_at_once_with_retry_after(server: Server) -> None:
    before = samples(server)
    body = _slow_body()

    def send(_: int) -> tuple[int, float, str | None]:
        started = time.monotonic()
        response = requests.post(f"{server.url}/v1/models/slow:predict", json=body, timeout=60)
        return response.status_code, time.monotonic() - started, response.headers.get("Retry-After")

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(send, range(12)))
    codes = [code for code, _, _ in results]
    assert set(codes) == {200, 503}, codes
    shed = [(seconds, retry) for code, seconds, retry in results if code == 503]
    assert all(retry == "1" for _, retry in shed)
    served = [seconds for code, seconds, _ in results if code == 200]
    assert min(s for s, _ in shed) < max(served)  # refused without waiting for the queue
    after = samples(server)
    rejected = value(after, "forkserve_rejected_requests_total", model="slow", reason="queue_full") - value(
        before, "forkserve_rejected_requests_total", model="slow", reason="queue_full"
    )
    assert rejected == len(shed)
    assert server.post("/v1/models/slow:predict", json=body).status_code == 200


def test_client_deadline_header_shortens_the_wait(server: Server) -> None:
    response = server.post("/v1/models/slow:predict", json=_slow_body(), headers={"X-Request-Timeout": "0.001"})
    assert response.status_code == 504
    assert "did not answer within 0.001s" in response.json()["error"]
    bad = server.post("/v1/models/slow:predict", json=_slow_body(), headers={"X-Request-Timeout": "soon"})
    assert bad.status_code == 400 and "X-Request-Timeout" in bad.json()["error"]
    assert server.post("/v1/models/mlp:predict", json={"instances": [[0.0] * 20]}, headers={"X-Request-Timeout": "5"}).ok
