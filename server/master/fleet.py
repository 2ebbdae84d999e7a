"""The gunicorn arbiter as the rollout thread drives it: list, add and retire workers (master, no TensorFlow).

NOTE: the rollout thread changes the arbiter's `num_workers` and worker ages and then wakes the
arbiter's loop, whose manage_workers forks or stops workers to match; that is what gunicorn's
own TTIN/TTOU handlers do in the main thread. Doing it here instead of sending TTIN/TTOU lets
the thread say which worker goes (manage_workers stops the lowest age first) and restore the
count exactly when a new worker died, instead of leaving gunicorn to respawn it for ever.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Callable, Iterable

RETIRING_AGE = -1  # below every age gunicorn gives: manage_workers stops such a worker first


class Fleet:
    """The arbiter's workers, from the master's rollout thread."""

    def __init__(self, arbiter: Any, send_signal: Callable[[int, int], None] | None = None) -> None:
        self.arbiter = arbiter
        self._send_signal = send_signal or _kill
        self._retire_born_after: int | None = None  # while withdrawing: workers older than this stay

    def pids(self) -> list[int]:
        """The arbiter's workers, oldest first."""
        return [pid for pid, worker in sorted(self._workers(), key=lambda item: item[1].age)]

    def _workers(self) -> list[tuple[int, Any]]:
        """(pid, worker) pairs; the arbiter's dict changes under this thread: copy, retry on change."""
        while True:
            try:
                return list(self.arbiter.WORKERS.items())
            except RuntimeError:
                continue

    def add_worker(self) -> set[int]:
        """One worker more than now; returns the workers there were before it."""
        before = set(self.pids())
        self.arbiter.num_workers += 1
        self.arbiter.wakeup()
        return before

    def retire(self, pid: int) -> None:
        """Stop `pid` gracefully (it finishes its requests) and lower the count by one."""
        self._mark_retiring([pid])
        self.arbiter.num_workers -= 1
        self.arbiter.wakeup()

    def withdraw(self, before: set[int], kill: bool) -> list[int]:
        """Lower the count by one and stop every worker started since `before`; returns those workers.

        That is the new worker, or gunicorn's replacement for it if it died (gunicorn respawns up
        to the raised count). `kill`: SIGKILL at once, for a worker that never accepted a
        connection and may be stuck in a load that no signal handler can interrupt.
        """
        # NOTE: gunicorn may be forking a replacement for a dead extra right now (spawn_worker puts
        # it into WORKERS only after pre_fork and fork); pre_fork calls mark_newborn, which marks
        # it retiring at birth, so manage_workers never stops an old worker in its place.
        self._retire_born_after = max((w.age for p, w in self._workers() if p in before), default=0)
        self._mark_retiring(self._since(before))
        self.arbiter.num_workers -= 1
        extras = self._since(before)
        self._mark_retiring(extras)
        self.arbiter.wakeup()
        if kill:
            self.kill(extras)
        return extras

    def mark_newborn(self, worker: Any) -> None:
        """pre_fork (master main thread): a worker forked while a withdrawal runs is retiring from birth."""
        threshold = self._retire_born_after
        if threshold is not None and worker.age > threshold:
            worker.age = RETIRING_AGE

    def forks_so_far(self) -> int:
        """gunicorn's fork count now (its workers' ages count forks): a worker of a higher age is forked after this."""
        age = getattr(self.arbiter, "worker_age", None)
        return age if isinstance(age, int) else max((worker.age for _, worker in self._workers()), default=0)

    def withdrawn(self, before: set[int]) -> list[int]:
        """After a withdrawal: workers started since `before` that are still there (a late-forked one too)."""
        return self._since(before)

    def end_withdrawal(self) -> None:
        """The extras are gone: workers forked from now on are ordinary again."""
        self._retire_born_after = None

    def wait_gone(self, pids: Iterable[int], timeout: float) -> list[int]:
        """Wait until the arbiter reaped `pids`; returns those still there at the deadline."""
        pending = set(pids)
        deadline = time.monotonic() + timeout
        while True:
            pending &= set(self.pids())
            if not pending or time.monotonic() >= deadline:
                return sorted(pending)
            time.sleep(0.05)

    def kill(self, pids: Iterable[int]) -> None:
        """SIGKILL workers that did not stop when asked."""
        for pid in pids:
            self._send_signal(pid, signal.SIGKILL)

    def _since(self, before: set[int]) -> list[int]:
        return [pid for pid in self.pids() if pid not in before]

    def _mark_retiring(self, pids: Iterable[int]) -> None:
        for pid in pids:
            worker = self.arbiter.WORKERS.get(pid)
            if worker is not None:
                worker.age = RETIRING_AGE


def _kill(pid: int, sig: int) -> None:
    """os.kill that ignores a process already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
