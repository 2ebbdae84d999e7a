"""A removed metrics directory costs metrics, never predictions or model loading, and heals."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

from tests.e2e.harness import Server


def test_missing_metrics_directory_leaves_serving_intact(model_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    shutil.copytree(model_repo / "mlp" / "1", repo / "mlp" / "1")
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
        assert 'forkserve_requests_total{api="tfserving_predict",code="200",model="mlp",version="1"} 3.0' in scrape.text
        assert server.process.poll() is None
    finally:
        server.stop()


def test_unusable_metrics_directory_never_stops_a_worker_from_booting(model_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    shutil.copytree(model_repo / "mlp" / "1", repo / "mlp" / "1")
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
