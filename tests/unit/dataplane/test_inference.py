"""The inference flow every API shares: a job its transport abandons ends the request cancelled."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from server.config import ModelConfig
from server.dataplane.inference import infer
from server.errors import Cancelled
from server.models.executor import Abandoned, ModelExecutor


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
