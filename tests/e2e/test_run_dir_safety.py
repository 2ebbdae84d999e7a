"""Symlinks planted in the run directory are removed, never followed: what they point at survives start and stop."""

from __future__ import annotations

from pathlib import Path

from tests.support.harness import Server
from tests.support.models import copy_models


def test_planted_symlinks_in_the_run_dir_survive_start_and_stop(model_repo: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    for name in ("metrics", "workers"):
        (victim / name).mkdir(parents=True)
        (victim / name / "keep.txt").write_text("mine")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("metrics", "workers"):
        (run_dir / name).symlink_to(victim / name)
    (run_dir / "target.json").symlink_to(victim / "metrics" / "keep.txt")
    server = Server(models_dir=copy_models(model_repo, tmp_path / "models", "mlp"), run_dir=run_dir, workers=1)
    server.log_path = tmp_path / "gunicorn.log"
    try:
        server.start()
        assert server.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 20]}).status_code == 200
        assert server.get("/metrics").status_code == 200
        for name in ("metrics", "workers"):
            assert (run_dir / name).is_dir() and not (run_dir / name).is_symlink()
    finally:
        assert server.stop() == 0, server.log()[-3000:]
    assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == [
        "metrics", "metrics/keep.txt", "workers", "workers/keep.txt"]
    assert (victim / "metrics" / "keep.txt").read_text() == "mine"
    assert not run_dir.exists()  # what the server made is gone, and so is the directory it emptied
