"""The session's model repository and one shared 2-worker server over it."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.harness import Server
from tests.support.models import CONF, MAX_BODY_BYTES, build_repository

# Servers a test starts without the harness stay off TF Serving's gRPC port 8500 (another run may hold it);
# the harness gives each server a free one (Server.grpc_port).
os.environ.setdefault("FORKSERVE_GRPC_BIND", "")


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared model repository (built once per session)."""
    return build_repository(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def server(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One forkserve with 2 workers over the shared repository, for the whole session."""
    run_dir = tmp_path_factory.mktemp("run")
    conf = run_dir / "models.toml"
    conf.write_text(CONF)
    instance = Server(
        models_dir=model_repo,
        run_dir=run_dir,
        conf_path=conf,
        workers=2,
        env={"FORKSERVE_MAX_BODY_BYTES": str(MAX_BODY_BYTES)},
    ).start()
    yield instance
    instance.stop()


@pytest.fixture()
def restores_workers(server: Server) -> Iterator[None]:
    """For tests that stop or kill the shared server's workers: every worker loaded before, and again after, even on failure."""
    server.wait_workers_loaded(server.workers)
    yield
    for pid in server.children():
        os.kill(pid, signal.SIGCONT)  # a worker a failed test left stopped
    server.wait_workers_loaded(server.workers)


@pytest.fixture(scope="session")
def keras_models(model_repo: Path) -> dict:
    """The repository's Keras models loaded in this process: the reference answers."""
    import keras

    return {
        name: keras.saving.load_model(next((model_repo / name / "1").iterdir()), compile=False)
        for name in ("mlp", "k3cnn", "digits", "cnn_h5", "multi_h5")
    }
