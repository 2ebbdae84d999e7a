"""Worker exits as child_exit reports them (master main thread) to the rollout thread."""

from __future__ import annotations

import threading
import time

from server.master.rollout.policy import WorkerExit


class ExitLog:
    """Exits not yet counted, by pid; written by the main thread, read and emptied by the rollout thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._exits: dict[int, WorkerExit] = {}

    def record(self, pid: int, gone: WorkerExit) -> None:
        with self._lock:
            self._exits[pid] = gone

    def get(self, pid: int) -> WorkerExit | None:
        with self._lock:
            return self._exits.get(pid)

    def dead_since(self, age: int) -> list[int]:
        """Workers forked after the one of age `age` that died (any way but a graceful stop), not yet counted."""
        with self._lock:
            return sorted(pid for pid, gone in self._exits.items() if gone.age > age and gone.reason != "graceful")

    def take(self) -> dict[int, WorkerExit]:
        """Every exit recorded since the last take."""
        with self._lock:
            exits, self._exits = self._exits, {}
        return exits

    def wait_for(self, pids: set[int], timeout: float) -> None:
        """Give child_exit (main thread) a moment to record workers the arbiter just reaped."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if pids <= set(self._exits):
                    return
            time.sleep(0.05)
