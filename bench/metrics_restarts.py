"""Scrape time of /metrics after many worker restarts, with forkserve's compaction and without.

    .venv/bin/python -m bench.metrics_restarts [--restarts 200]

Runs a 2-worker forkserve with no models (workers restart in about a second), restarts one
worker at a time (every third with SIGKILL), sends a few requests per round, and times
/metrics. Then it rebuilds the directory prometheus_client alone would leave (one counter and
one histogram file per dead worker) and times a scrape of that, side by side.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path

import requests

from server.telemetry.files import scrape
from tests.support.harness import Server


def time_scrapes(url: str, count: int = 20) -> float:
    """Median seconds of `count` GET /metrics."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        requests.get(url + "/metrics", timeout=60).raise_for_status()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def time_directory_scrape(directory: Path, count: int = 5) -> float:
    """Median seconds to collect a multiprocess directory in-process."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        scrape(directory)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def uncompacted_copy(directory: Path, dead_workers: int, target: Path) -> int:
    """The directory as it would be without compaction: each dead worker's files left in place."""
    shutil.copytree(directory, target)
    for fake_pid in range(10_000_000, 10_000_000 + dead_workers):
        for kind in ("counter", "histogram"):
            # The archive holds the same series a dead worker's own file held.
            shutil.copy(directory / f"{kind}_archive.db", target / f"{kind}_{fake_pid}.db")
    return len(list(target.glob("*.db")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=200)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="forkserve-bench-"))
    server = Server(models_dir=work / "models", run_dir=work / "run", workers=2).start(timeout=60)
    try:
        before = time_scrapes(server.url)
        started = time.monotonic()
        for index in range(args.restarts):
            for _ in range(3):
                requests.post(server.url + "/v1/models/absent:predict", json={"instances": [1]}, timeout=30)
            server.restart_worker(signal.SIGKILL if index % 3 == 0 else signal.SIGTERM)
        restart_seconds = time.monotonic() - started
        after = time_scrapes(server.url)
        metrics_dir = server.run_dir / "metrics"
        files = len(list(metrics_dir.glob("*.db")))
        without_files = uncompacted_copy(metrics_dir, args.restarts, work / "uncompacted")
        compacted_collect = time_directory_scrape(metrics_dir)
        uncompacted_collect = time_directory_scrape(work / "uncompacted")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"| {args.restarts} worker restarts in {restart_seconds:.0f} s | files | collect (in-process) | GET /metrics |")
    print("|---|---|---|---|")
    print(f"| forkserve (compaction) | {files} | {compacted_collect * 1000:.1f} ms | {before * 1000:.1f} ms before, {after * 1000:.1f} ms after |")
    print(f"| prometheus_client alone | {without_files} | {uncompacted_collect * 1000:.1f} ms | (not served) |")


if __name__ == "__main__":
    main()
