"""A removed metrics directory costs metrics, never predictions or model loading, and heals."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

from tests.support.harness import Server, wait_until
from tests.support.metrics import quiet_samples, settled_samples, value
from tests.support.models import copy_models


def test_missing_metrics_directory_leaves_serving_intact(model_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    server = Server(models_dir=repo, run_dir=tmp_path / "run", workers=1).start()
    try:
        body = {"instances": [[0.5] * 20]}
        assert server.post("/v1/models/mlp:predict", json=body).status_code == 200
        shutil.rmtree(tmp_path / "run" / "metrics")  # a tmp cleaner, an operator's mistake
        assert server.post("/v1/models/mlp:predict", json=body).status_code == 200
        assert server.get("/metrics").status_code == 503  # nothing to scrape, and the answer says so
        # The master (folding the dead worker's files) and the replacement recreate the directory.
        server.restart_worker(signal.SIGKILL)
        for _ in range(3):
            assert server.post("/v1/models/mlp:predict", json=body).status_code == 200
        assert server.get("/readyz").status_code == 200
        scrape = server.get("/metrics")
        assert scrape.status_code == 200
        assert 'forkserve_requests_total{api="tfserving_predict",code="200",model="mlp",protocol="rest",version="1"} 3.0' in scrape.text
        assert server.process.poll() is None
    finally:
        server.stop()


def test_unusable_metrics_directory_never_stops_a_worker_from_booting(model_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    server = Server(models_dir=repo, run_dir=tmp_path / "run", workers=1).start()
    try:
        metrics_dir = tmp_path / "run" / "metrics"
        shutil.rmtree(metrics_dir)
        metrics_dir.write_text("not a directory")  # nothing can be created there
        server.restart_worker(signal.SIGKILL)
        answer = server.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 20]})
        assert answer.status_code == 200, answer.text
        assert server.get("/metrics").status_code == 503
        assert server.process.poll() is None
    finally:
        server.stop()


def test_full_disk_is_logged_and_counted_and_costs_no_worker_and_no_request_count(model_repo: Path, tmp_path: Path) -> None:
    """The run directory on a small tmpfs, filled up after start: requests that add metric series still succeed.

    The metric files' blocks were reserved when they were created (compat.reserve_metric_file_blocks), so
    every request is still counted; the master's probe of the run directory fails, is logged and counted.
    """
    import os
    import subprocess

    import pytest

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(run_dir)], capture_output=True)
    if mounted.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs: {mounted.stderr!r}")
        pytest.skip("mounting a tmpfs needs root")
    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    server = Server(models_dir=repo, run_dir=run_dir, workers=1)
    server.log_path = tmp_path / "gunicorn.log"
    try:
        server.start()
        worker = server.worker_pids()
        predicted = ("forkserve_requests_total", {"api": "tfserving_predict", "code": "200", "model": "mlp",
                                                  "protocol": "rest", "version": "1"})
        before = quiet_samples(server)
        with open(run_dir / "filler", "wb") as filler:  # fill the disk to the last block
            chunk = b"\0" * (1 << 20)
            try:
                while True:
                    filler.write(chunk)
                    filler.flush()
            except OSError:
                pass
        body = {"instances": [[0.5] * 20]}
        for index in range(40):  # new series: APIs, codes, stages, versions
            assert server.post("/v1/models/mlp:predict", json=body).status_code == 200
            assert server.post("/v1/models/mlp:regress", json={"examples": [{"x": 1.0}]}).status_code == 400
            assert server.post(f"/v1/models/absent{index}:predict", json=body).status_code == 404
            v2 = {"inputs": [{"name": "features", "shape": [1, 20], "datatype": "FP32", "data": [0.5] * 20}]}
            assert server.post("/v2/models/mlp/infer", json=v2).status_code == 200
        assert server.worker_pids() == worker  # no SIGBUS, no restart
        assert server.process.poll() is None
        full = f"cannot write {run_dir / 'target.json'} (target): [Errno 28] No space left on device"
        wait_until(lambda: full in server.log(), 30, "the master to log the full run directory")
        (run_dir / "filler").unlink()

        def counted(scrape: dict) -> float:
            return value(scrape, predicted[0], **predicted[1]) - value(before, predicted[0], **predicted[1])

        after = settled_samples(server, lambda scrape: counted(scrape) >= 40, "the 40 predictions counted")
        assert counted(after) == 40
        assert value(after, "forkserve_run_dir_write_errors_total", file="target") >= 1
    finally:
        server.stop()
        subprocess.run(["umount", "-l", str(run_dir)], capture_output=True)
