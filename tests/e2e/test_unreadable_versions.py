"""A server running as a user who may not read some versions: each is one failed version, never a crash or a stuck rollout.

Root reads everything, so the server runs as `nobody` over a repository it can reach, with
versions made 0700 by root, as `tempfile.mkdtemp()` makes them and `cp -a` keeps them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from server.state import read_worker_states
from server.target import read_failed
from tests.support.harness import Server, wait_until

USER = "nobody"
FEATURES = {"instances": [[0.5] * 20]}


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A directory `nobody` can reach (pytest's tmp_path is root's 0700)."""
    if os.geteuid() != 0:
        pytest.skip("running the server as another user needs root")
    root = Path(tempfile.mkdtemp(prefix="forkserve-unreadable-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def hidden_version(model_repo: Path, repo: Path, name: str, version: int) -> Path:
    """A copy of the test MLP as `name/version` that only root can read (a 0700 directory, 0600 file)."""
    target = repo / name / str(version)
    staging = repo / name / f".{version}.partial"
    staging.parent.mkdir(exist_ok=True, mode=0o755)
    shutil.copytree(model_repo / "mlp" / "1", staging)
    staging.chmod(0o700)
    (staging / "model.keras").chmod(0o600)
    staging.rename(target)
    return target


def readable_version(model_repo: Path, repo: Path, name: str, version: int) -> Path:
    staging = repo / name / f".{version}.partial"
    staging.parent.mkdir(exist_ok=True, mode=0o755)
    shutil.copytree(model_repo / "mlp" / "1", staging)
    staging.rename(repo / name / str(version))
    return repo / name / str(version)


@pytest.fixture(scope="module")
def server(model_repo: Path, shared_dir: Path) -> Iterator[Server]:
    """2 workers as `nobody`: model a readable, model b's only version not."""
    repo = shared_dir / "models"
    repo.mkdir(mode=0o755)
    readable_version(model_repo, repo, "a", 1)
    hidden_version(model_repo, repo, "b", 1)
    run_dir = shared_dir / "run"
    run_dir.mkdir()
    shutil.chown(run_dir, USER)
    instance = Server(models_dir=repo, run_dir=run_dir, workers=2, user=USER,
                      env={"FORKSERVE_POLL_INTERVAL": "0.5", "FORKSERVE_ROLLOUT_BACKOFF": "1"}).start()
    yield instance
    instance.stop()


def test_an_unreadable_version_at_start_is_one_failed_version(server: Server) -> None:
    assert server.post("/v1/models/a:predict", json=FEATURES).status_code == 200
    status = server.get("/v1/models/b").json()["model_version_status"]
    assert status[0]["state"] == "END" and "Permission denied" in status[0]["status"]["error_message"]
    ready = server.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"]["b"]["serving"] == []


def test_an_unreadable_version_published_while_running_never_blocks_another_model(server: Server, model_repo: Path) -> None:
    repo = server.models_dir
    hidden_version(model_repo, repo, "c", 1)
    readable_version(model_repo, repo, "a", 2)  # published after: rolled out all the same
    wait_until(lambda: [s.serving("a") for pid, s in read_worker_states(server.run_dir).items()
                        if pid in server.worker_pids()] == [[2], [2]], 240, "a/2 served by both workers")
    wait_until(lambda: 1 in read_failed(server.run_dir).get("c", {}), 60, "c/1 marked failed")
    assert "cannot read the version directory: Permission denied" in read_failed(server.run_dir)["c"][1].reason
    assert server.post("/v1/models/a:predict", json=FEATURES).headers["X-Model-Version"] == "2"
    assert "rollout pass failed" not in server.log()
