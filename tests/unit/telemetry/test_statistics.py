"""Triton's statistics read from the multiprocess files that forkserve's own metrics write: every worker summed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from server.telemetry import statistics
from server.telemetry.files import compact_dead_process

WORKER = """
import os, time
from server.telemetry import measure
from server.telemetry.buffer import BUFFER
from server.models.executor import ModelExecutor
import numpy as np
executor = ModelExecutor("m/3", lambda signature, fed: {{"y": fed["x"] * 2}}, 8, 0.0, 64, model="m", version="3")
for rows in {batches}:
    executor.call_padded("serving_default", {{"x": np.ones((rows, 2), np.float32)}}, rows)
for status in {statuses}:
    measure.begin("m", "predict")
    measure.set_version(3)
    measure.stage("queue", 0.001)
    measure.stage("compute", 0.002)
    measure.stage("encode", 0.004)
    measure.record(status)
    measure.release()
BUFFER.flush()
print(os.getpid())
"""


def run_worker(directory: Path, batches: list[int], statuses: list[int]) -> int:
    """A process that runs batches and records requests through forkserve's own code, as a worker does."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    out = subprocess.run([sys.executable, "-c", WORKER.format(batches=batches, statuses=statuses)], env=env,
                         capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[3])
    return int(out.stdout.strip().splitlines()[-1])


def test_two_workers_requests_and_executions_are_summed_live_and_after_one_dies(tmp_path: Path) -> None:
    first = run_worker(tmp_path, [3, 1], [200, 200, 400])
    run_worker(tmp_path, [3, 12], [200, 504])
    for _ in range(2):  # both alive, then the first one's files folded into the archives
        found = statistics.read(tmp_path)[("m", "3")].as_triton("m", "3")
        stats = found["inference_stats"]
        assert (stats["success"]["count"], stats["fail"]["count"]) == (3, 2)
        assert stats["queue"] == {"count": 3, "ns": 3_000_000}
        assert stats["compute_infer"]["ns"] == 6_000_000 and stats["compute_output"]["ns"] == 12_000_000
        assert stats["compute_input"] == {"count": 3, "ns": 0}
        assert stats["success"]["ns"] > 0 and stats["fail"]["ns"] > 0
        # rows 3, 1, 3 and 12 (run as 8 + 4 with max_batch_size 8)
        assert [(b["batch_size"], b["compute_infer"]["count"]) for b in found["batch_stats"]] == [(1, 1), (3, 2), (4, 1), (8, 1)]
        assert (found["inference_count"], found["execution_count"]) == (19, 5)
        assert found["last_inference"] > 1_700_000_000_000
        compact_dead_process(tmp_path, first)


def test_a_version_nobody_called_has_zeros() -> None:
    empty = statistics.VersionStatistics().as_triton("m", "1")
    assert empty["inference_count"] == 0 and empty["batch_stats"] == []
    assert all(value == {"count": 0, "ns": 0} for value in empty["inference_stats"].values())
