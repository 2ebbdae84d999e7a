"""Rollouts that go wrong, with real processes: one broken model among two, a new worker killed, served files touched."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from server.state import read_worker_states
from server.target import read_failed
from tests.support.harness import Server, wait_until
from tests.support.metrics import samples, value
from tests.support.traffic import Traffic


@pytest.fixture(scope="module")
def two_models(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """2 workers serving models a and b (both the test MLP), version 1 each."""
    repo = tmp_path_factory.mktemp("failures-models")
    for name in ("a", "b"):
        shutil.copytree(model_repo / "mlp" / "1", repo / name / "1")
    server = Server(
        models_dir=repo, run_dir=tmp_path_factory.mktemp("failures-run"), workers=2,
        env={"FORKSERVE_POLL_INTERVAL": "0.5", "FORKSERVE_BOOT_TIMEOUT": "90", "FORKSERVE_ROLLOUT_BACKOFF": "1"},
    ).start()
    yield server
    server.stop()


def serving(server: Server) -> list[dict[str, list[int]]]:
    """What each loaded live worker serves."""
    states = read_worker_states(server.run_dir)
    return [{m: states[pid].serving(m) for m in ("a", "b")} for pid in server.worker_pids()]


def publish_by_rename(server: Server, name: str, version: int, model_bytes: bytes) -> Path:
    """A version written into a hidden directory, then renamed into place (as `publish` does)."""
    staging = server.models_dir / name / f".incoming-{version}"
    staging.mkdir()
    (staging / "model.keras").write_bytes(model_bytes)
    return staging


def test_touching_and_rewriting_the_served_version_under_traffic_changes_nothing(two_models: Server) -> None:
    server = two_models
    pids = server.worker_pids()
    traffic = Traffic(f"{server.url}/v1/models/a:predict")
    traffic.start(4)
    try:
        model_file = server.models_dir / "a" / "1" / "model.keras"
        for _ in range(3):  # `touch`, then an rsync of identical content (same bytes, new mtime)
            os.utime(model_file)
            wait_until(lambda: len(traffic.answers) > 20, 30, "traffic")
            model_file.write_bytes(model_file.read_bytes())
            deadline = time.monotonic() + 2.0  # four polls of the watcher
            wait_until(lambda: time.monotonic() > deadline, 5, "four polls")
    finally:
        traffic.finish()
    assert traffic.failures() == [] and len(traffic.answers) > 50
    assert {a[2] for a in traffic.answers} == {"1"}
    assert server.worker_pids() == pids  # no rollout
    assert value(samples(server), "forkserve_rollouts_total", result="succeeded") == 0


def test_a_broken_version_rolled_out_with_a_healthy_one_fails_alone(two_models: Server) -> None:
    server = two_models
    good = (server.models_dir / "a" / "1" / "model.keras").read_bytes()
    healthy = publish_by_rename(server, "a", 2, good)
    broken = publish_by_rename(server, "b", 2, good[: len(good) // 2])
    os.rename(healthy, server.models_dir / "a" / "2")
    os.rename(broken, server.models_dir / "b" / "2")  # both in the same poll: one rollout
    wait_until(lambda: serving(server) == [{"a": [2], "b": [1]}] * 2, 180, "a/2 served by every worker")
    assert list(read_failed(server.run_dir)) == ["b"] and list(read_failed(server.run_dir)["b"]) == [2]
    assert "not a valid .keras file" in read_failed(server.run_dir)["b"][2].reason
    # One answer about b/2 everywhere: END with the reason, not "Servable not found".
    status = server.get("/v1/models/b/versions/2").json()["model_version_status"][0]
    assert status["state"] == "END" and "not a valid .keras file" in status["status"]["error_message"]
    predict = server.post("/v1/models/b/versions/2:predict", json={"instances": [[0.5] * 20]})
    assert predict.status_code == 503 and "END" in predict.json()["error"] and "not a valid" in predict.json()["error"]
    ready = server.get("/v2/models/b/versions/2/ready")
    assert ready.status_code == 400 and ready.json()["ready"] is False and "END" in ready.json()["error"]
    assert server.post("/v1/models/b:predict", json={"instances": [[0.5] * 20]}).headers["X-Model-Version"] == "1"
    scrape = samples(server)
    assert value(scrape, "forkserve_rollout_failed_versions_total", model="b", version="2") == 1
    assert value(scrape, "forkserve_rollout_failed_versions_total", model="a", version="2") == 0


def test_a_new_worker_killed_while_loading_is_retried_and_the_fleet_stays_at_two(two_models: Server) -> None:
    server = two_models
    before = set(server.worker_pids())
    good = (server.models_dir / "a" / "1" / "model.keras").read_bytes()
    os.rename(publish_by_rename(server, "a", 3, good), server.models_dir / "a" / "3")

    def loading_worker() -> int | None:
        return next((pid for pid, state in read_worker_states(server.run_dir).items()
                     if not state.loaded and pid not in before), None)

    victim = wait_until(loading_worker, 60, "the rollout's new worker to start loading", interval=0.02)
    os.kill(victim, signal.SIGKILL)  # the OOM killer, say
    wait_until(lambda: serving(server) == [{"a": [3], "b": [1]}] * 2, 180, "a/3 served by every worker")
    assert 3 not in read_failed(server.run_dir).get("a", {})
    wait_until(lambda: len(server.children()) == 2, 60, "two workers, not three")
    assert value(samples(server), "forkserve_rollout_retries_total") >= 1
    # The gauge drops when the master reaps the retired worker (child_exit), a moment after it exits.
    wait_until(lambda: value(samples(server), "forkserve_workers_alive") == 2, 30, "forkserve_workers_alive == 2")
    assert "try 1 of 3" in server.log() and f"new worker {victim} exited" in server.log()
