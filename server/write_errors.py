"""Writes in the run directory that failed (full, read-only, not permitted): logged once per kind in each process, counted.

Runs in the master and in workers. A full or read-only run directory costs the file concerned,
never the process: each writer catches the OSError and reports it here with what it costs. The
log line is the part that always works (the log is not in the run directory); the counter,
forkserve_run_dir_write_errors_total{file}, lives in the run directory too and may be lost with it.
It counts once server.telemetry.metrics is imported (it registers itself with count_with()): the
master imports it in on_starting, before anything here can fail, and workers inherit it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

log = logging.getLogger("forkserve.run_dir")

# The `file` label (which file a failed write was for) and what the failure costs.
WORKER_STATE = "worker_state"  # workers/<pid>.json (worker)
WORKER_EXIT = "worker_exit"  # workers/<pid>.exit (worker)
TARGET = "target"  # target.json (master)
FAILED = "failed"  # failed.json (master)
METRICS = "metrics"  # this process's metric value files (metrics.record)
METRICS_ARCHIVE = "metrics_archive"  # folding a dead worker's metric files into the archives (master)
CLEANUP = "cleanup"  # removing a dead worker's files (master)
CONTROL = "control"  # control/: a load or unload call's request (worker) or its answer (master)
REPOSITORY = "repository"  # repository.json: the repository index (master)
COSTS = {
    WORKER_STATE: "this worker serves, but the master does not see it loaded until the file is written "
                  "(tried again every few seconds); a rollout waits for it meanwhile",
    WORKER_EXIT: "the master counts this worker's exit as killed",
    TARGET: "no rollout starts until it can be written; the workers keep serving what they loaded",
    FAILED: "the versions marked failed now are not remembered: a later rollout may try them again",
    METRICS: "this process's metric updates are dropped until its metric files can be written",
    METRICS_ARCHIVE: "the dead worker's metric files stay as they are (scrapes still count them)",
    CLEANUP: "the dead worker's files stay (nothing reads them)",
    CONTROL: "the load or unload call fails (503), or waits for its answer until its timeout",
    REPOSITORY: "the repository index shows the models' states as last written",
}
FILES = tuple(COSTS)

_told: set[tuple[str, int | None]] = set()
_told_lock = threading.Lock()
_count: Callable[[str], None] | None = None


def count_with(counter: Callable[[str], None]) -> None:
    """server.telemetry.metrics, at import: count each failed write of a `file` label from now on."""
    global _count
    _count = counter


def report(file: str, path: Path | str, error: OSError) -> None:
    """One failed write of `file` at `path`: the first of its kind (file and errno) in this process is logged, each is counted."""
    with _told_lock:
        first = (file, error.errno) not in _told
        _told.add((file, error.errno))
    if first:
        reason = f"[Errno {error.errno}] {error.strerror}" if error.strerror else str(error)
        log.error("forkserve: cannot write %s (%s): %s; %s (logged once per kind of problem)",
                  path, file, reason, COSTS[file])
    if _count is not None:
        _count(file)
