"""The harness itself: a server that fails to start or is stopped leaves no process of its group behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.harness import Server, group_members, pid_alive
from tests.support.models import copy_models


def test_a_start_that_times_out_kills_the_master_and_its_workers(model_repo: Path, tmp_path: Path) -> None:
    server = Server(models_dir=copy_models(model_repo, tmp_path / "models", "mlp"), run_dir=tmp_path / "run", workers=2)
    with pytest.raises(TimeoutError):
        server.start(timeout=0.5)  # the workers are still importing TensorFlow
    assert server.process is not None and server.process.poll() is not None
    assert group_members(server.process.pid) == []


def test_stop_kills_workers_the_master_could_not_stop(model_repo: Path, tmp_path: Path) -> None:
    server = Server(models_dir=copy_models(model_repo, tmp_path / "models", "mlp"), run_dir=tmp_path / "run", workers=1).start()
    worker = server.worker_pids()[0]
    try:
        os.kill(worker, signal.SIGSTOP)  # a stopped worker ignores the master's TERM until graceful_timeout
        server.stop(timeout=1)
        assert not pid_alive(worker)
        assert group_members(server.process.pid) == []
    finally:
        os.kill(worker, signal.SIGKILL) if pid_alive(worker) else None
        server.stop()
