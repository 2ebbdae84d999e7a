"""What a request records: its wait for a request thread; the slow-request log's line limit."""

from __future__ import annotations

import time

import pytest

from server.telemetry import arrival, measure
from server.telemetry.lines import LineLimit


def test_lines_beyond_the_limit_are_counted_and_reported_with_the_next_line(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.2]
    monkeypatch.setattr(measure.time, "monotonic", lambda: now[0])
    limit = LineLimit(per_second=3)
    assert [limit.admit() for _ in range(5)] == [0, 0, 0, None, None]
    now[0] = 101.0
    assert limit.admit() == 2  # the next second's first line says how many were dropped
    assert limit.admit() == 0


def test_the_wait_for_a_request_thread_is_a_stage_and_part_of_the_request_time() -> None:
    arrival.set_thread_wait(0.25)
    before = time.perf_counter()
    measure.begin("m", "tfserving_predict", "rid-1")
    try:
        current = measure._CURRENT.get()
        assert current is not None and current.stages == {"thread_wait": 0.25}
        assert before - 0.25 <= current.started <= time.perf_counter() - 0.25  # the request began when it could be read
    finally:
        measure.release()
    measure.begin("m", "tfserving_predict", "rid-2")  # the next request on this thread did not wait (yet)
    try:
        current = measure._CURRENT.get()
        assert current is not None and "thread_wait" not in current.stages
    finally:
        measure.release()
