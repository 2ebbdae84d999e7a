"""A one-shot reply slot between a request thread and an executor thread.

Lighter than concurrent.futures.Future on the hot path (measured: Future.set_result's
Condition.notify_all was a tenth of a worker's GIL time): an explicit state guarded by a plain
lock, and a second lock released exactly once, when the state becomes final. The same method
names as Future, for the part of its API forkserve uses.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as ReplyTimeout
from typing import Any, Callable

__all__ = ["CancelledError", "Reply", "ReplyTimeout"]

PENDING, RUNNING, FINISHED, CANCELLED = "pending", "running", "finished", "cancelled"
FINAL = (FINISHED, CANCELLED)


class Reply:
    """Set once by the executor, read by the request thread that submitted the job."""

    __slots__ = ("_state", "_lock", "_final", "_value", "_error", "_callback")

    def __init__(self) -> None:
        self._state = PENDING
        self._lock = threading.Lock()  # guards every change of _state
        self._final = threading.Lock()
        self._final.acquire()  # released once, by the change to FINISHED or CANCELLED
        self._value: Any = None
        self._error: BaseException | None = None
        self._callback: Callable[[], None] | None = None  # one waiter that is not a thread (server.rpc.transport's loop)

    def on_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the reply is final, on whichever thread makes it final (at once if it is).

        NOTE: the callback runs on the executor thread: it must only hand over (call_soon_threadsafe), never work.
        """
        with self._lock:
            if self._state not in FINAL:
                self._callback = callback
                return
        callback()

    def set_running_or_notify_cancel(self) -> bool:
        """Executor: claim the job; False when the requester cancelled it first."""
        with self._lock:
            if self._state != PENDING:
                return False
            self._state = RUNNING
            return True

    def cancel(self) -> bool:
        """Requester: give up on a job that has not started; False when it runs or ran already."""
        with self._lock:
            if self._state != PENDING:
                return False
            self._state = CANCELLED
            callback = self._callback
        self._final.release()
        if callback is not None:
            callback()
        return True

    def cancelled(self) -> bool:
        """True when the requester cancelled the job before it ran."""
        return self._state == CANCELLED

    def done(self) -> bool:
        """True once a value, an error or a cancellation is there."""
        return self._state in FINAL

    def set_result(self, value: Any) -> bool:
        """Executor: hand over the value; False (and ignored) when the reply is final already."""
        return self._finish(value, None)

    def set_exception(self, error: BaseException) -> bool:
        """Executor: hand over the failure; False (and ignored) when the reply is final already."""
        return self._finish(None, error)

    def _finish(self, value: Any, error: BaseException | None) -> bool:
        with self._lock:
            if self._state in FINAL:
                return False
            self._value, self._error, self._state = value, error, FINISHED
            callback = self._callback
        self._final.release()
        if callback is not None:
            callback()
        return True

    def result(self, timeout: float | None = None) -> Any:
        """Requester: wait for the value (ReplyTimeout after `timeout` seconds)."""
        if self._state not in FINAL:
            if not self._final.acquire(timeout=-1 if timeout is None else timeout):
                raise ReplyTimeout()
            self._final.release()  # later calls find the state final and do not wait
        if self._state == CANCELLED:
            raise CancelledError()
        if self._error is not None:
            raise self._error
        return self._value
