"""A flow's waits driven on a thread: detached work answers with its value or its failure, off the driver's thread."""

from __future__ import annotations

import threading

import pytest

from server.models.flow import detached, run_blocking


def test_detached_work_runs_on_another_thread_and_hands_back_its_value() -> None:
    driver = threading.get_ident()
    assert run_blocking(detached(lambda: threading.get_ident() != driver, timeout=5)) is True


def test_detached_work_that_raises_fails_the_flow_with_its_error() -> None:
    def broken() -> None:
        raise SystemExit(3)  # anything, even what would end a thread

    with pytest.raises(SystemExit):
        run_blocking(detached(broken, timeout=5))
