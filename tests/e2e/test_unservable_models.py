"""Models with nothing to serve beside a healthy one: reported everywhere, never an outage of the healthy one.

One broken new model used to make every worker unready (`/readyz` 503 while every model
answered), its failed version answered "Servable not found", and fixing its cause did not bring
it back. A real server over a repository where such models appear while it runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator

import pytest

from server.state import read_worker_states
from server.target import read_failed, read_target
from tests.support.harness import Server, wait_until
from tests.support.metrics import samples, value

HANDLER = '''
import numpy as np


class Handler:
    example = {"x": [0.5] * 20}

    def preprocess(self, body):
        return {"features": np.asarray([body["x"]], dtype="float32")}
'''
FEATURES = {"instances": [[0.5] * 20]}


@pytest.fixture(scope="module")
def repo(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with the test MLP as model `a`."""
    root = tmp_path_factory.mktemp("unservable-models")
    shutil.copytree(model_repo / "mlp" / "1", root / "a" / "1")
    return root


@pytest.fixture(scope="module")
def server(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run_dir = tmp_path_factory.mktemp("unservable-run")
    conf = run_dir / "models.toml"
    conf.write_text("")
    instance = Server(models_dir=repo, run_dir=run_dir, conf_path=conf, workers=2,
                      env={"FORKSERVE_POLL_INTERVAL": "0.5", "FORKSERVE_ROLLOUT_BACKOFF": "1"}).start()
    yield instance
    instance.stop()


def staged(repo: Path, name: str, build: dict[str, bytes]) -> None:
    """A model directory written aside, then renamed into place (as a copy tool that renames would)."""
    staging = repo / f".staging-{name}"
    for relative, data in build.items():
        (staging / relative).parent.mkdir(parents=True, exist_ok=True)
        (staging / relative).write_bytes(data)
    staging.rename(repo / name)


def corrupt_keras(good: bytes) -> bytes:
    """The same number of bytes with the zip's end-of-directory record wiped: not a .keras file any more."""
    return good[:-22] + b"\0" * 22


@pytest.fixture(scope="module")
def broken_models(server: Server, repo: Path) -> dict[str, int]:
    """Four new models that cannot be served, added while the server runs; returns the workers' pids meanwhile."""
    good = (repo / "a" / "1" / "model.keras").read_bytes()
    pids = server.worker_pids()
    staged(repo, "stray", {"1/model.keras": good, "1/handler.py": HANDLER.encode()})  # handlers are off for it
    staged(repo, "broken", {"1/model.keras": corrupt_keras(good)})
    staged(repo, "flat", {"model.keras": good})  # no version directory
    staged(repo, "vname", {"v2/model.keras": good})  # a version directory not named by a number

    def reported() -> bool:
        target = read_target(server.run_dir)
        failed = read_failed(server.run_dir)
        return (target is not None and {"stray", "broken", "flat", "vname"} <= set(target.unservable)
                and 1 in failed.get("stray", {}) and 1 in failed.get("broken", {}))

    wait_until(reported, 240, "the four models reported unservable")
    return {"pids": pids}


def test_a_model_with_nothing_to_serve_never_makes_the_workers_unready(server: Server, broken_models: dict) -> None:
    ready = server.get("/readyz")
    assert ready.status_code == 200, ready.text
    models = ready.json()["models"]
    assert models["a"]["serving"] == [1]
    assert "handlers are off" in models["stray"]["failed"]["1"] and models["stray"]["serving"] == []
    assert "not a valid .keras file" in models["broken"]["failed"]["1"]
    assert "a model file goes in a version directory (flat/1/model.keras)" in models["flat"]["reason"]
    assert "did you mean vname/2?" in models["vname"]["reason"]
    assert server.get("/v2/health/ready").status_code == 200
    for _ in range(10):  # both workers
        assert server.post("/v1/models/a:predict", json=FEATURES).status_code == 200
    assert server.worker_pids() == broken_models["pids"]  # no worker was replaced for models that serve nothing


def test_a_version_that_failed_in_a_rollout_answers_end_with_its_reason_on_every_api(server: Server, broken_models: dict) -> None:
    for path in ("/v1/models/stray", "/v1/models/stray/versions/1"):
        status = server.get(path).json()["model_version_status"]
        assert [s["version"] for s in status] == ["1"] and status[0]["state"] == "END"
        assert "handlers are off" in status[0]["status"]["error_message"]
        assert "tried again when the files of stray/1 or the settings of model stray" in status[0]["status"]["error_message"]
    ready = server.get("/v2/models/stray/ready")
    assert ready.status_code == 400 and ready.json()["ready"] is False and "handlers are off" in ready.json()["error"]
    metadata = server.get("/v2/models/stray")
    assert metadata.status_code == 503 and "handlers are off" in metadata.json()["error"]
    predict = server.post("/v1/models/broken:predict", json=FEATURES)
    assert predict.status_code == 503 and "not a valid .keras file" in predict.json()["error"]
    missing = server.get("/v1/models/flat")
    assert missing.status_code == 404 and "a model file goes in a version directory" in missing.json()["error"]
    assert value(samples(server), "forkserve_rollout_failed_versions_total", model="stray", version="1") == 1


def test_layout_mistakes_are_logged_once_with_what_was_expected(server: Server, broken_models: dict) -> None:
    log = server.log()
    assert log.count("model vname: v2 ignored: version directories are named by a positive integer (did you mean vname/2?)") == 1
    assert log.count("model flat: model.keras ignored: a model file goes in a version directory") == 1


def test_a_failed_version_comes_back_when_its_cause_is_fixed(server: Server, repo: Path, broken_models: dict) -> None:
    assert server.conf_path is not None
    server.conf_path.write_text("[models.stray]\nhandler = true\n")  # what the reason says to do
    good = (repo / "a" / "1" / "model.keras").read_bytes()
    replacement = repo / "broken" / "1" / ".model.keras.tmp"
    replacement.write_bytes(good)  # the same name and size as the broken file, other bytes
    replacement.rename(repo / "broken" / "1" / "model.keras")

    def both_served_by_every_worker() -> bool:
        states = read_worker_states(server.run_dir)
        pids = server.worker_pids()
        return len(pids) == 2 and all(states[pid].serving(m) == [1] for pid in pids for m in ("stray", "broken"))

    wait_until(both_served_by_every_worker, 240, "stray/1 and broken/1 served by every worker")
    assert server.post("/v1/models/stray:predict", json={"x": [0.5] * 20}).status_code == 200
    assert server.post("/v1/models/broken:predict", json=FEATURES).status_code == 200
    wait_until(lambda: all("failed" not in server.get("/readyz").json()["models"][m] for m in ("stray", "broken")),
               30, "the failed entries gone from /readyz")
    wait_until(lambda: set(read_failed(server.run_dir)) <= {"flat", "vname"}, 30, "the master to forget the recovered versions")


def test_strict_readiness_waits_for_every_model(repo: Path, tmp_path: Path) -> None:
    strict_repo = tmp_path / "models"
    shutil.copytree(repo / "a", strict_repo / "a")
    shutil.copytree(repo / "flat", strict_repo / "flat")
    strict = Server(models_dir=strict_repo, run_dir=tmp_path / "run", workers=1,
                    env={"FORKSERVE_STRICT_READINESS": "1"}).start()
    try:
        ready = strict.get("/readyz")
        assert ready.status_code == 503 and ready.json()["models"]["a"]["serving"] == [1]
        assert "no version directory" in ready.json()["models"]["flat"]["reason"]
        assert strict.get("/v2/health/ready").status_code == 400
        assert strict.post("/v1/models/a:predict", json=FEATURES).status_code == 200  # it answers; it is not ready
    finally:
        strict.stop()
