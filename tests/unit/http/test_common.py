"""Helpers shared by the Flask views and the fast path (no TensorFlow)."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from server.config import ModelConfig
from server.errors import Cancelled
from server.http import common
from server.http.common import infer, log_unexpected, request_id_for
from server.telemetry import lines
from server.telemetry.lines import LineLimit
from server.worker.executor import Abandoned, ModelExecutor


@pytest.mark.parametrize("given", ["client-7", "a.b:c_d-1", "x" * 128])
def test_a_sane_request_id_is_kept(given: str) -> None:
    assert request_id_for(given) == given


@pytest.mark.parametrize("given", ["", "client-7\n", "client 7", "x" * 129, "id\r\nSet-Cookie: a=b"])
def test_any_other_request_id_is_replaced(given: str) -> None:
    """A final newline passed re.match with `$`: it must not reach a response header or a log line."""
    replaced = request_id_for(given)
    assert replaced != given and len(replaced) == 32


def test_unexpected_error_tracebacks_are_rate_limited_and_the_rest_counted(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    monkeypatch.setattr(lines.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(common, "TRACEBACK_LOG_LIMIT", LineLimit(per_second=1))
    logger = logging.getLogger("forkserve.test")

    def fail(request_id: str) -> None:
        try:
            raise ValueError("a bug")
        except ValueError:
            log_unexpected(logger, request_id)

    with caplog.at_level(logging.WARNING):
        for number in range(50):
            fail(f"r{number}")
        now[0] += 1.0
        fail("r50")
    tracebacks = [record for record in caplog.records if record.exc_info]
    assert [record.getMessage() for record in tracebacks] == ["request r0: unexpected error", "request r50: unexpected error"]
    assert "49 more unexpected errors were not logged" in caplog.text


def test_a_job_the_transport_abandons_while_its_request_waits_ends_the_request_cancelled() -> None:
    running, gate = threading.Event(), threading.Event()

    def run(signature: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        running.set()
        assert gate.wait(10)
        return {"y": inputs["x"]}

    executor = ModelExecutor("m/1", run, 1, 0.0, 100)  # one row a call: 3 rows are 3 calls
    executor.start()
    version = SimpleNamespace(executor=executor, config=ModelConfig(), name="m", version=1)
    jobs, submitted = [], threading.Event()
    submit = executor.submit

    def submit_and_keep(*args: object, **kwargs: object) -> object:
        jobs.append(submit(*args, **kwargs))  # type: ignore[arg-type]
        submitted.set()
        return jobs[-1]

    executor.submit = submit_and_keep  # type: ignore[method-assign]

    def client_cancels() -> None:  # what the gRPC transport does when its client cancels the call
        assert running.wait(10) and submitted.wait(10)
        executor.abandon(jobs[0])
        gate.set()

    canceller = threading.Thread(target=client_cancels)
    canceller.start()
    with pytest.raises(Cancelled, match="model m version 1 was cancelled") as cancelled:
        infer(version, "serving_default", {"x": np.zeros((3, 2), np.float32)}, 3, True, timeout=10)
    canceller.join()
    assert cancelled.value.status == 499
    with pytest.raises(Abandoned, match="after 1 of 3 rows"):  # it stopped after its first row
        jobs[0].future.result(timeout=0)
