"""Reply: the one-shot slot between a request thread and the executor."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import pytest

from server.models.reply import Reply, ReplyTimeout


def test_value_reaches_a_waiting_thread_and_can_be_read_again() -> None:
    reply = Reply()
    assert reply.set_running_or_notify_cancel()
    threading.Timer(0.05, reply.set_result, args=("answer",)).start()
    assert reply.result(timeout=5) == "answer"
    assert reply.result(timeout=0) == "answer" and reply.done()


def test_error_is_raised_in_the_requester() -> None:
    reply = Reply()
    reply.set_exception(ValueError("bad input"))
    with pytest.raises(ValueError, match="bad input"):
        reply.result(timeout=1)


def test_timeout_then_cancel_keeps_the_executor_from_running_it() -> None:
    reply = Reply()
    with pytest.raises(ReplyTimeout):
        reply.result(timeout=0.01)
    assert reply.cancel() and reply.cancelled() and reply.done()
    assert not reply.set_running_or_notify_cancel()
    with pytest.raises(CancelledError):
        reply.result(timeout=0)


def test_a_running_job_cannot_be_cancelled() -> None:
    reply = Reply()
    assert reply.set_running_or_notify_cancel()
    assert not reply.cancel() and not reply.cancelled() and not reply.done()
    reply.set_result(1)
    assert reply.result(timeout=1) == 1


def test_a_second_outcome_is_ignored_and_the_first_stays() -> None:
    reply = Reply()
    assert reply.set_running_or_notify_cancel()
    assert reply.set_result("first")
    assert not reply.set_exception(RuntimeError("late executor error"))
    assert reply.done() and reply.result(timeout=0) == "first"


def test_done_stays_true_while_the_requester_reads_the_result() -> None:
    # The executor checks done() before failing a batch; reading the result must not make it False.
    reply = Reply()
    reply.set_result(1)
    readers = [threading.Thread(target=reply.result) for _ in range(8)]
    for thread in readers:
        thread.start()
    seen = [reply.done() for _ in range(10_000)]
    for thread in readers:
        thread.join()
    assert all(seen)
    assert not reply.set_exception(RuntimeError("after the fact")) and reply.result(timeout=0) == 1


def test_a_cancelled_reply_cannot_be_finished() -> None:
    reply = Reply()
    assert reply.cancel()
    assert not reply.set_result("too late") and not reply.cancel()
    with pytest.raises(CancelledError):
        reply.result(timeout=0)
