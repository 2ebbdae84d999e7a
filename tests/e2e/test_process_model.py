"""The process model: TensorFlow only in workers, and a killed worker is replaced without halting."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.support.harness import Server

# These tests stop or kill workers of the session's shared server: it gets them all back whatever happens.
pytestmark = pytest.mark.usefixtures("restores_workers")


def _maps_tensorflow(pid: int) -> bool:
    """True when the process has TensorFlow's shared library mapped."""
    return "libtensorflow" in Path(f"/proc/{pid}/maps").read_text()


def test_master_never_loads_tensorflow_and_workers_do(server: Server) -> None:
    assert server.process is not None
    assert not _maps_tensorflow(server.process.pid)
    workers = server.worker_pids()
    assert len(workers) == 2
    assert all(_maps_tensorflow(pid) for pid in workers)
    assert all(int(Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[1]) == server.process.pid for pid in workers)


def test_each_worker_freezes_its_loaded_heap_out_of_the_collector_s_reach(server: Server) -> None:
    """Full collections walking TensorFlow's object graph stalled requests 120-220 ms (docs/performance.md)."""
    for pid in server.worker_pids():
        frozen = re.search(rf"forkserve worker {pid} froze (\d+) loaded objects", server.log())
        assert frozen and int(frozen[1]) > 100_000, server.log()[-2000:]


def test_sigkilled_worker_is_replaced_and_serving_continues(server: Server) -> None:
    victim = server.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    server.wait_reaped(victim)
    pids = server.wait_workers_loaded(2, timeout=120)
    assert victim not in pids
    assert not _maps_tensorflow(server.process.pid)
    response = server.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]})
    assert response.json() == {"predictions": [2.5]}
