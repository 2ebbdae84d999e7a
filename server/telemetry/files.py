"""The multiprocess metrics directory: scraping it, and folding dead workers' files into one.

prometheus_client keeps one counter file and one histogram file per process forever (counters
must not go backwards), so every worker restart adds files and scrapes slow down (client_python
issues 204, 367). When the master reaps a worker (child_exit) it adds that worker's counter and
histogram values into `counter_archive.db` / `histogram_archive.db` and deletes its files: the
directory holds the live workers' files plus two archives, however many workers came and went.
A file lock keeps a scrape from seeing a value in both places or in neither.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

ADDITIVE_TYPES = ("counter", "histogram")
LOCK_NAME = ".compaction.lock"


@contextmanager
def _locked(directory: Path, exclusive: bool) -> Iterator[None]:
    """Hold the directory's lock: shared while scraping, exclusive while compacting."""
    with open(directory / LOCK_NAME, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def scrape(directory: Path) -> bytes:
    """The text exposition of every process's metrics (any worker can answer /metrics)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    with _locked(directory, exclusive=False):
        return generate_latest(registry)


def compact_dead_process(directory: Path, pid: int) -> int:
    """Master: fold a dead process's counters and histograms into the archives; returns files removed."""
    removed = 0
    with _locked(directory, exclusive=True):
        for kind in ADDITIVE_TYPES:
            dead = directory / f"{kind}_{pid}.db"
            if not dead.exists():
                continue
            archive = MmapedDict(str(directory / f"{kind}_archive.db"))
            try:
                for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(str(dead)):
                    total, _ = archive.read_value(key)
                    archive.write_value(key, total + value, timestamp)
            finally:
                archive.close()
            os.remove(dead)
            removed += 1
        mark_process_dead(pid, str(directory))  # drops the live* gauge files of that pid
    return removed
