"""Threads of one model version's handler: each call is waited for at most its request's deadline.

Runs in workers (and in `publish`'s checking child); no TensorFlow. A request thread hands the
handler's preprocess or postprocess to the version's pool and waits with what is left of its
deadline. A handler that hangs then holds its own pool's threads, and each waiting request
thread at most until its deadline: the request gets its 504 and the thread serves again.

NOTE: Python cannot stop a thread. A call that outlives its deadline keeps its pool thread until
it returns (its result is dropped); while every thread of the pool is held that way, calls are
refused at once (HandlerStuck) instead of queueing behind them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

from server.models.reply import Reply, ReplyTimeout
from server.telemetry.lines import LineLimit

log = logging.getLogger("forkserve.handlers")
OVERDUE_LOG_LIMIT = LineLimit(per_second=5)  # NOTE: under overload every call may be late: not a line each


class HandlerRaised(Exception):
    """The handler's method raised `error` (whatever it was: SystemExit and KeyboardInterrupt too)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


class HandlerTimeout(Exception):
    """The call did not return within its deadline; it may still be running on its thread."""


class HandlerStuck(Exception):
    """Every thread of the pool is held by a call that outlived its deadline."""


class _Call:
    """One handler call, its reply slot, and whether its caller gave up while it ran."""

    __slots__ = ("method", "args", "reply", "started", "finished", "overdue")

    def __init__(self, method: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.method = method
        self.args = args
        self.reply = Reply()
        self.started = 0.0
        self.finished = False  # set under the pool's lock
        self.overdue = False  # likewise: the caller timed out while the call ran


class HandlerPool:
    """Up to `size` daemon threads, started on demand, running one version's handler calls."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name  # "model version N", for the log
        self.size = max(1, size)
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()  # None: a thread's end
        self._lock = threading.Lock()  # guards the counts below and each call's finished / overdue
        self._threads = 0
        self._pending = 0  # calls queued or running
        self._overdue = 0  # calls running after their caller gave up: each holds a thread

    @property
    def overdue(self) -> int:
        """Threads held now by calls that outlived their deadline."""
        return self._overdue

    def call(self, what: str, method: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
        """`method(*args)` on a pool thread, waited for at most `timeout` seconds; `what` names it in messages.

        Raises HandlerRaised (what the method raised), HandlerTimeout or HandlerStuck; anything
        else raised here (a signal's SystemExit while waiting) is the calling thread's own.
        """
        work = _Call(method, args)
        with self._lock:
            if self._overdue >= self.size:
                raise HandlerStuck(f"the handler of {self.name} is stuck: all {self.size} of its threads are still "
                                   f"running calls that passed their deadline")
            self._pending += 1
            start = self._pending > self._threads and self._threads < self.size
            if start:
                self._threads += 1
        if start:
            threading.Thread(target=self._serve, name=f"forkserve-handler-{self.name}", daemon=True).start()
        self._queue.put(work)
        try:
            return work.reply.result(timeout=max(0.0, timeout))
        except ReplyTimeout:
            if not work.reply.cancel():  # it runs: its thread stays held until it returns
                with self._lock:
                    if not work.finished:
                        work.overdue = True
                        self._overdue += 1
                if work.overdue and OVERDUE_LOG_LIMIT.admit() is not None:
                    log.warning("%s: %s did not return within its deadline (%.3gs); its thread is held until it "
                                "returns (%d of %d held)", self.name, what, timeout, self._overdue, self.size)
            raise HandlerTimeout(f"{self.name}: {what} did not return within {timeout:.3g}s") from None

    def close(self) -> None:
        """End the idle threads (the version will not be served); a thread in a call ends when it returns."""
        with self._lock:
            threads, self._threads = self._threads, self.size  # NOTE: no thread starts after this
        for _ in range(threads):
            self._queue.put(None)

    def _serve(self) -> None:
        """A pool thread: run calls until closed (a daemon: the worker's exit never waits for it)."""
        while True:
            work = self._queue.get()
            if work is None:
                return
            if work.reply.set_running_or_notify_cancel():
                work.started = time.monotonic()
                try:
                    value = work.method(*work.args)
                except BaseException as exc:  # NOTE: SystemExit too: a handler never ends a thread of the worker
                    work.reply.set_exception(HandlerRaised(exc))
                else:
                    work.reply.set_result(value)
            with self._lock:
                work.finished = True
                self._pending -= 1
                if work.overdue:
                    self._overdue -= 1
            if work.overdue and OVERDUE_LOG_LIMIT.admit() is not None:
                log.warning("%s: an overdue handler call returned after %.1fs; its thread is free again",
                            self.name, time.monotonic() - work.started)
            work.method = work.args = None  # type: ignore[assignment]  # drop the body and arrays now
