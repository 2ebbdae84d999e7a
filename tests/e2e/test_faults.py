"""Faults survived with real processes: a model that hangs while loading, a worker killed under load."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from server.target import read_failed
from tests.support.harness import Server, wait_until
from tests.support.models import copy_models
from tests.support.traffic import Traffic


def test_a_model_that_hangs_while_loading_is_stopped_by_the_rollout_deadline(model_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    shutil.copytree(model_repo / "half_plus_two" / "00000123", repo / "hp" / "1")
    server = Server(models_dir=repo, run_dir=tmp_path / "run", workers=1,
                    env={"FORKSERVE_POLL_INTERVAL": "0.5", "FORKSERVE_BOOT_TIMEOUT": "15",
                         "FORKSERVE_ROLLOUT_ATTEMPTS": "2", "FORKSERVE_ROLLOUT_BACKOFF": "1"}).start()
    try:
        before = server.worker_pids()
        staging = repo / "hp" / ".incoming"
        shutil.copytree(repo / "hp" / "1", staging)
        index = staging / "variables" / "variables.index"
        index.unlink()
        os.mkfifo(index)  # reading it blocks forever: the load hangs
        os.rename(staging, repo / "hp" / "2")
        wait_until(lambda: 2 in read_failed(server.run_dir).get("hp", {}), 90, "the hung version to be marked failed")
        reason = read_failed(server.run_dir)["hp"][2].reason
        assert "died loading it 2 times" in reason and "not ready within 15s (loading hp version 2)" in reason
        wait_until(lambda: server.worker_pids() == before, 30, "the stuck worker to be gone")
        answer = server.post("/v1/models/hp:predict", json={"instances": [1.0]})
        assert answer.json() == {"predictions": [2.5]} and answer.headers["X-Model-Version"] == "1"
        status = {s["version"]: s for s in server.get("/v1/models/hp").json()["model_version_status"]}
        assert status["2"]["state"] == "END"
    finally:
        server.stop()


def test_a_worker_killed_under_load_loses_only_its_own_requests(model_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    server = Server(models_dir=repo, run_dir=tmp_path / "run", workers=2).start()
    traffic = Traffic(f"{server.url}/v1/models/mlp:predict")
    try:
        threads = traffic.start(8)
        wait_until(lambda: len(traffic.answers) > 100, 30, "traffic")
        victim = server.worker_pids()[0]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        server.wait_reaped(victim)
        replacement = server.wait_workers_loaded(2, timeout=120)
        ready_at = time.monotonic()
        wait_until(lambda: len([a for a in traffic.answers if a[0] > ready_at]) > 200, 60, "traffic after the replacement")
    finally:
        traffic.stop.set()
        for thread in threads:
            thread.join(30)
        server.stop()
    failures = traffic.failures()
    # Only requests in flight on the killed worker may fail: at most one per client connection, all at the kill.
    assert len(failures) <= 8, failures
    assert all(abs(f[0] - killed_at) < 2.0 for f in failures), failures
    assert victim not in replacement
    # The replacement took traffic only once warm: no request after the kill failed or was slow.
    late = [a for a in traffic.answers if a[0] > killed_at + 2.0]
    assert late and all(a[1] == 200 for a in late)
    assert max(a[4] for a in late) < 5.0
