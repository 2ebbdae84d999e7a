"""The multiprocess metrics directory: scraping it, and folding dead workers' files into one.

prometheus_client keeps one counter file and one histogram file per process forever (counters
must not go backwards), so every worker restart adds files and scrapes slow down (client_python
issues 204, 367). When the master reaps a worker (child_exit) it adds that worker's counter and
histogram values into `counter_archive.db` / `histogram_archive.db` (its "max" gauges into
`gauge_max_archive.db`, keeping the larger value) and deletes its files: the
directory holds the live workers' files plus two archives, however many workers came and went.
A file lock keeps a scrape from seeing a value in both places or in neither.

Folding one file is all or nothing on a full or read-only disk: the archive makes room for every
key first (the step that can fail), the dead file goes next, and only then are values added (writes
into blocks already reserved, which cannot fail). A fold that fails leaves both files as they were.
"""

from __future__ import annotations

import fcntl
import operator
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from prometheus_client import Metric, generate_latest
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from server.telemetry.tfserving import forkserve_families

# what a dead process's file adds to the archive's value: counters and histograms sum, a "max" gauge keeps the max
FOLDS: dict[str, Callable[[float, float], float]] = {"counter": operator.add, "histogram": operator.add, "gauge_max": max}
LOCK_NAME = ".compaction.lock"
HEADER_BYTES = 8  # a value file's header (bytes used, padding); a shorter file holds nothing


@contextmanager
def _locked(directory: Path, exclusive: bool) -> Iterator[None]:
    """Hold the directory's lock: shared while scraping, exclusive while compacting.

    Opened for reading: a lock file that exists can be locked in a read-only directory too.
    """
    fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def collect(directory: Path) -> list[Metric]:
    """Every process's metrics merged (any worker can answer a scrape), read under the directory's lock."""
    collector = MultiProcessCollector(None, path=str(directory))
    with _locked(directory, exclusive=False):
        return list(collector.collect())


def exposition(metrics: list[Metric]) -> bytes:
    """The Prometheus text exposition of these metrics."""
    return generate_latest(_Collected(metrics))  # type: ignore[arg-type]


def scrape(directory: Path) -> bytes:
    """The text exposition of forkserve's own families (/metrics)."""
    return exposition(forkserve_families(collect(directory)))


class _Collected:
    """Metrics already collected, as generate_latest asks for them."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        """The metrics, as given."""
        return self.metrics


def families(directory: Path, kinds: tuple[str, ...]) -> list[Metric]:
    """Every process's metrics of these file kinds ("counter", "gauge_max", ...) summed, as /metrics sums them.

    NOTE: only the kinds asked for are read: the histograms' files, most of a scrape's work, are skipped.
    """
    with _locked(directory, exclusive=False):
        paths = sorted(str(path) for kind in kinds for path in directory.glob(f"{kind}_*.db"))
        return list(MultiProcessCollector.merge(paths, accumulate=True))


def compact_dead_process(directory: Path, pid: int) -> int:
    """Master: fold a dead process's counters, histograms and "max" gauges into the archives; returns files removed."""
    removed = 0
    with _locked(directory, exclusive=True):
        for kind, fold in FOLDS.items():
            dead = directory / f"{kind}_{pid}.db"
            if not dead.exists():
                continue
            if dead.stat().st_size < HEADER_BYTES:  # killed between creating its file and reserving it: no values
                os.remove(dead)
                removed += 1
                continue
            values = list(MmapedDict.read_all_values_from_file(str(dead)))
            archive = MmapedDict(str(directory / f"{kind}_archive.db"))
            try:
                totals = {key: archive.read_value(key)[0] for key, _, _, _ in values}  # room for new keys: may fail
                os.remove(dead)
                for key, value, timestamp, _ in values:
                    totals[key] = fold(totals[key], value)
                    archive.write_value(key, totals[key], timestamp)
            finally:
                archive.close()
            removed += 1
        mark_process_dead(pid, str(directory))  # drops the live* gauge files of that pid
    return removed
