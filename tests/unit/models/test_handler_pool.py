"""A handler's own threads: whatever a call raises comes back to its caller, a hung call costs its deadline only."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from server.models.handler_pool import (
    HandlerPool,
    HandlerRaised,
    HandlerStuck,
    HandlerTimeout,
)


@pytest.mark.parametrize("raise_it", [
    lambda: sys.exit(3),
    lambda: sys.exit(1),
    lambda: sys.exit(),
    lambda: (_ for _ in ()).throw(KeyboardInterrupt()),
    lambda: (_ for _ in ()).throw(BaseException("anything")),
])
def test_whatever_a_call_raises_reaches_its_caller_wrapped_and_the_pool_goes_on(raise_it) -> None:
    pool = HandlerPool("model m version 1", 2)
    with pytest.raises(HandlerRaised) as raised:
        pool.call("preprocess", raise_it, (), 5.0)
    assert isinstance(raised.value.error, BaseException) and not isinstance(raised.value.error, Exception)
    assert pool.call("preprocess", lambda x: x + 1, (41,), 5.0) == 42  # its thread survived


def test_a_hung_call_answers_its_deadline_and_holds_only_its_own_thread() -> None:
    release = threading.Event()
    pool = HandlerPool("model hung version 1", 2)
    started = time.monotonic()
    with pytest.raises(HandlerTimeout, match="model hung version 1: preprocess did not return within 0.2s"):
        pool.call("preprocess", release.wait, (), 0.2)
    assert 0.15 < time.monotonic() - started < 2.0
    assert pool.overdue == 1
    assert pool.call("preprocess", lambda: "other thread", (), 2.0) == "other thread"
    release.set()
    deadline = time.monotonic() + 5
    while pool.overdue and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.overdue == 0  # the hung call returned: its thread serves again


def test_a_pool_whose_threads_are_all_held_by_overdue_calls_refuses_at_once_until_one_returns() -> None:
    release = threading.Event()
    pool = HandlerPool("model hung version 1", 2)
    for _ in range(2):
        with pytest.raises(HandlerTimeout):
            pool.call("preprocess", release.wait, (), 0.1)
    started = time.monotonic()
    with pytest.raises(HandlerStuck, match="all 2 of its threads are still running calls that passed their deadline"):
        pool.call("preprocess", lambda: None, (), 10.0)
    assert time.monotonic() - started < 0.5
    release.set()
    deadline = time.monotonic() + 5
    while pool.overdue and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.call("preprocess", lambda: "again", (), 2.0) == "again"


def test_two_pools_never_share_threads() -> None:
    release = threading.Event()
    hung, healthy = HandlerPool("model hung version 1", 1), HandlerPool("model ok version 1", 1)
    with pytest.raises(HandlerTimeout):
        hung.call("postprocess", release.wait, (), 0.1)
    assert healthy.call("postprocess", lambda: "ok", (), 1.0) == "ok"
    release.set()


def test_a_call_that_never_started_before_its_deadline_holds_no_thread() -> None:
    running, release = threading.Event(), threading.Event()
    pool = HandlerPool("model busy version 1", 1)
    holder = threading.Thread(target=lambda: pool.call("preprocess", lambda: running.set() or release.wait(), (), 5.0))
    holder.start()
    assert running.wait(5)  # the holder's call has the only thread
    with pytest.raises(HandlerTimeout):
        pool.call("preprocess", lambda: None, (), 0.1)  # queued behind it, given up before it ran
    assert pool.overdue == 0
    release.set()
    holder.join(5)
    assert pool.call("preprocess", lambda: "ran", (), 2.0) == "ran"


def test_closing_a_pool_ends_its_idle_threads() -> None:
    pool = HandlerPool("model gone version 1", 3)
    before = threading.active_count()
    assert pool.call("preprocess", lambda: 1, (), 2.0) == 1
    assert threading.active_count() == before + 1
    pool.close()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before
