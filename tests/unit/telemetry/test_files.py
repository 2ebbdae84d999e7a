"""Folding a dead worker's metric files into the archives: totals kept, files gone, live gauges dropped."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from server.telemetry.files import compact_dead_process, scrape
from tests.support.filesystems import filled, tmpfs

WORKER = """
from prometheus_client import Counter, Gauge, Histogram
Counter("jobs", "", ["kind"]).labels("a").inc({count})
Gauge("alive", "", multiprocess_mode="livesum").set(1)
Histogram("seconds", "", buckets=(1, 2)).observe(1.5)
import os; print(os.getpid())
"""


def run_worker(directory: Path, count: int) -> int:
    """A short-lived process writing metrics in multiprocess mode, as a worker does; returns its pid."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    out = subprocess.run([sys.executable, "-c", WORKER.format(count=count)], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout)


def values(directory: Path) -> dict[str, float]:
    return {
        sample.name + "".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k == "le"): sample.value
        for family in text_string_to_metric_families(scrape(directory).decode())
        for sample in family.samples
    }


def test_dead_workers_are_folded_and_their_totals_kept(tmp_path: Path) -> None:
    first, second = run_worker(tmp_path, 3), run_worker(tmp_path, 4)
    before = values(tmp_path)
    assert before["jobs_total"] == 7 and before["alive"] == 2
    assert compact_dead_process(tmp_path, first) == 2  # its counter and histogram files
    assert compact_dead_process(tmp_path, second) == 2
    after = values(tmp_path)
    assert after["jobs_total"] == 7 and after["seconds_count"] == 2 and after["seconds_bucketle=2.0"] == 2
    assert "alive" not in after  # a live gauge of a dead process is dropped
    names = sorted(p.name for p in tmp_path.glob("*.db"))
    assert names == ["counter_archive.db", "histogram_archive.db"]


def test_folding_a_process_without_files_changes_nothing(tmp_path: Path) -> None:
    run_worker(tmp_path, 1)
    assert compact_dead_process(tmp_path, 999_999) == 0
    assert values(tmp_path)["jobs_total"] == 1


FOLD_ON_A_FULL_DISK = """
import sys
from server import compat
assert compat.reserve_metric_file_blocks()
from server.telemetry.files import compact_dead_process
try:
    compact_dead_process(__import__("pathlib").Path(sys.argv[1]), int(sys.argv[2]))
except OSError as exc:
    print(exc.errno)
"""


def test_folding_on_a_full_disk_fails_whole_and_works_once_there_is_room(tmp_path: Path) -> None:
    """The master folds a dead worker into an archive it must create: on a full tmpfs that was a SIGBUS."""
    with tmpfs(tmp_path / "small") as where:
        dead = run_worker(where, 3)
        with filled(where):
            done = subprocess.run([sys.executable, "-c", FOLD_ON_A_FULL_DISK, str(where), str(dead)],
                                  cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"  # -7 is SIGBUS
            assert done.stdout.strip() == str(errno.ENOSPC)
            assert values(where)["jobs_total"] == 3  # nothing folded, nothing lost
            assert not list(where.glob("*_archive.db"))
        assert compact_dead_process(where, dead) == 2
        assert values(where)["jobs_total"] == 3 and sorted(p.name for p in where.glob("*.db")) == [
            "counter_archive.db", "histogram_archive.db"]


def test_a_dead_workers_empty_file_is_dropped(tmp_path: Path) -> None:
    """A worker killed between creating its value file and reserving it leaves an empty file."""
    (tmp_path / "counter_77.db").write_bytes(b"")
    assert compact_dead_process(tmp_path, 77) == 1 and not (tmp_path / "counter_77.db").exists()


MAX_GAUGE = """
from prometheus_client import Gauge
Gauge("last_seen", "", ["model"], multiprocess_mode="max").labels("m").set({value})
import os; print(os.getpid())
"""


def test_a_dead_worker_s_max_gauge_is_folded_keeping_the_largest_value(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    pids = [int(subprocess.run([sys.executable, "-c", MAX_GAUGE.format(value=value)], env=env, capture_output=True,
                               text=True, check=True).stdout) for value in (20, 30, 10)]
    for pid in pids:
        assert compact_dead_process(tmp_path, pid) == 1
    assert values(tmp_path)["last_seen"] == 30
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["gauge_max_archive.db"]
