"""Helpers shared by the Flask views and the fast path (no TensorFlow)."""

from __future__ import annotations

import logging

import pytest

from server.http import common
from server.http.common import log_unexpected, request_id_for
from server.telemetry import lines
from server.telemetry.lines import LineLimit


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
