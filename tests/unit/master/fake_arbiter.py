"""A stand-in for gunicorn's arbiter and its workers, for the rollout controller's unit tests.

It keeps what the controller reads and changes (WORKERS with ages, num_workers, wakeup) and
behaves as gunicorn's manage_workers does: fork up to num_workers, stop the lowest ages beyond
it. Each worker "boots" in a thread: it reads target.json like a real worker, reports which
version it is loading, then does what the test's `boot` says: serve, fail versions, die or hang.
As in gunicorn, a worker asked to stop (SIGTERM) while it loads finishes the load first: one
that hangs leaves only when killed, and its exit is "killed", not "graceful".
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from server.state import (
    LOADED,
    ModelReport,
    WorkerState,
    remove_worker_state,
    write_worker_state,
)
from server.target import Target, read_target

DIE, HANG = "die", "hang"
Boot = Callable[[int, Target], "WorkerState | str"]


def serve_intended(pid: int, target: Target) -> WorkerState:
    """A healthy worker: serves every intended version."""
    return WorkerState(pid, target.generation, LOADED, None, True,
                       {name: ModelReport(list(t.intended)) for name, t in target.models.items()})


def failing(bad: set[tuple[str, int]]) -> Boot:
    """A worker that fails `bad` versions and falls back to the next candidate, as a real one does."""

    def boot(pid: int, target: Target) -> WorkerState:
        models = {}
        for name, wanted in target.models.items():
            serving, failed = [], {}
            for version in wanted.candidates:
                if len(serving) >= wanted.keep:
                    break
                if (name, version) in bad:
                    failed[version] = f"failed to load: {name} {version} is broken"
                else:
                    serving.append(version)
            models[name] = ModelReport(serving, failed)
        return WorkerState(pid, target.generation, LOADED, None, all(m.serving for m in models.values()), models)

    return boot


@dataclass
class FakeWorker:
    pid: int
    age: int
    aborted: bool = False
    booted: bool = False  # its load is over: a graceful stop ends it at once
    stopping: bool = False  # asked to stop while loading: it leaves once the load is over


class FakeArbiter:
    """WORKERS, num_workers, wakeup() and signals to workers, as the controller uses them."""

    def __init__(self, run_dir: Path, workers: int, boot: Boot = serve_intended) -> None:
        self.run_dir = run_dir
        self.boot = boot
        self.cfg = SimpleNamespace(graceful_timeout=1)
        self.WORKERS: dict[int, FakeWorker] = {}
        self.num_workers = workers
        self.controller = None  # set by the test: child_exit's call goes to it
        self.exits: list[tuple[int, str]] = []
        self.report_loading = True  # False: workers hang (HANG) before naming a version, as in importing TensorFlow
        self.wakeup_delay = 0.0  # seconds before the main loop takes a wakeup (gunicorn's forks come from its loop)
        self._pids = itertools.count(1000)
        self._ages = itertools.count(1)
        self._lock = threading.RLock()

    def wakeup(self) -> None:
        if self.wakeup_delay:
            threading.Timer(self.wakeup_delay, self.manage_workers).start()
        else:
            self.manage_workers()

    def manage_workers(self) -> None:
        """Fork up to num_workers; stop the lowest ages beyond it (gracefully)."""
        with self._lock:
            while len(self.WORKERS) < self.num_workers:
                self._spawn()
            extra = sorted(self.WORKERS.values(), key=lambda w: w.age)[: max(0, len(self.WORKERS) - self.num_workers)]
        for worker in extra:
            if worker.booted:
                self.reap(worker.pid, "graceful")
            else:
                worker.stopping = True

    def send_signal(self, pid: int, sig: int) -> None:
        """What the controller's os.kill would do to a fake worker."""
        assert sig == signal.SIGKILL
        self.reap(pid, "killed")

    def reap(self, pid: int, reason: str) -> None:
        """The worker is gone: as reap_workers + child_exit do it, then gunicorn respawns up to the count."""
        with self._lock:
            worker = self.WORKERS.pop(pid, None)
            if worker is None:
                return
        self.exits.append((pid, reason))
        if self.controller is not None:
            self.controller.worker_exited(pid, reason, worker.age)
        remove_worker_state(self.run_dir, pid)
        self.manage_workers()

    def _spawn(self) -> None:
        pid = next(self._pids)
        self.WORKERS[pid] = FakeWorker(pid, next(self._ages))
        threading.Thread(target=self._run_boot, args=(pid,), daemon=True).start()

    def _run_boot(self, pid: int) -> None:
        time.sleep(0.05)  # importing TensorFlow, much shortened: respawns are not instant either
        target = read_target(self.run_dir)
        assert target is not None, "workers fork only after the master published a target"
        first = next(((name, t.candidates[0]) for name, t in sorted(target.models.items()) if t.candidates), None)
        write_worker_state(self.run_dir, WorkerState(pid, target.generation, loading=first if self.report_loading else None))
        outcome = self.boot(pid, target)
        if outcome == DIE:
            self.reap(pid, "killed")
        elif outcome != HANG:
            with self._lock:
                worker = self.WORKERS.get(pid)
                if worker is not None:
                    write_worker_state(self.run_dir, outcome)
                    worker.booted = True
            if worker is not None and worker.stopping:
                self.reap(pid, "graceful")
