"""A request's flow written once, as a generator that yields each wait for the model: driven by a thread or by an event loop.

Runs in workers. A flow (server.dataplane.inference.predict_steps, the gRPC servicers) does its work
between waits and yields a Wait for each job it queued on a model's executor; its driver waits
and sends the outputs back in (or throws the failure in). A request thread drives a flow with
run_blocking; the gRPC event loop (server.rpc.transport) awaits the same Wait without a thread,
so a small call runs on the loop from message to answer. A flow that is closed while it waits
(its client left) withdraws its job: it never computes for nobody.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any, Callable, Generator, TypeVar

from server.models.reply import Reply, ReplyTimeout

T = TypeVar("T")


@dataclass(frozen=True)
class Wait:
    """A flow's request to its driver: the reply of `job` on `executor`, within `timeout` seconds."""

    executor: Any  # server.models.executor.ModelExecutor
    job: Any  # server.models.executor.Job
    timeout: float

    def abandon(self) -> None:
        """The caller is gone: withdraw the job if it waits (it then replies CancelledError), else stop it at its next chunk."""
        self.executor.abandon(self.job)


Steps = Generator[Wait, Any, T]


class Detached:
    """Work run on a thread of its own, waited for as a flow's Wait: its reply comes when it returns or raises."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.future = Reply()
        threading.Thread(target=self._run, args=(work,), name="forkserve-detached", daemon=True).start()

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            self.future.set_result(work())
        except BaseException as exc:  # NOTE: handed to the flow, which maps it like any failure
            self.future.set_exception(exc)

    def abandon(self, job: Any) -> None:
        """The caller left: the work finishes on its own and nobody reads it."""


def detached(work: Callable[[], T], timeout: float) -> Steps[T]:
    """Run `work` off the driver's thread (the gRPC loop must not wait on a file lock) and wait for it."""
    job = Detached(work)
    return (yield Wait(job, job, timeout))


def run_blocking(steps: Steps[T], on_wait: Callable[[Wait], None] | None = None) -> T:
    """Drive a flow on this thread: block for each reply, within its timeout (ReplyTimeout thrown in past it).

    `on_wait`: told of each wait before it starts (the gRPC pool registers the client's cancel there).
    """
    try:
        wait = next(steps)
        while True:
            if on_wait is not None:
                on_wait(wait)
            try:
                value = wait.job.future.result(timeout=wait.timeout)
            except (ReplyTimeout, CancelledError, Exception) as exc:  # the flow decides what each failure means
                wait = steps.throw(exc)
            else:
                wait = steps.send(value)
    except StopIteration as done:
        return done.value


