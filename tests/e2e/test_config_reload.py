"""conf/models.toml edited while the server runs: a broken edit never halts it, a good one rolls out."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support.harness import Server, wait_until
from tests.support.metrics import samples, value
from tests.support.models import copy_models

ROW = [0.5] * 20


def test_a_broken_edit_and_a_killed_worker_keep_serving_then_the_fix_rolls_out(model_repo: Path, tmp_path: Path) -> None:
    conf = tmp_path / "models.toml"
    conf.write_text("[models.mlp]\nmax_request_rows = 8\n")
    server = Server(models_dir=copy_models(model_repo, tmp_path / "models", "mlp"), run_dir=tmp_path / "run",
                    conf_path=conf, workers=2, env={"FORKSERVE_POLL_INTERVAL": "0.5"}).start()
    try:
        conf.write_text('[models.mlp]\nmax_request_rows = 8\nmax_batch_size = "eight"\n')
        wait_until(lambda: value(samples(server), "forkserve_config_last_reload_successful") == 0, 30, "the bad edit seen")
        victim = server.worker_pids()[0]
        os.kill(victim, signal.SIGTERM)  # a crash, an OOM kill or a rollout: any worker boot
        server.wait_reaped(victim)
        server.wait_workers_loaded(2)
        assert server.process.poll() is None, server.log()
        ready = server.get("/readyz")
        assert ready.status_code == 200
        assert "max_batch_size must be an integer" in ready.json()["models"]["mlp"]["config_error"]
        assert server.post("/v1/models/mlp:predict", json={"instances": [ROW] * 3}).status_code == 200
        assert server.log().count("keeping the last good configuration") == 1  # once, not every poll
        before = set(server.worker_pids())
        conf.write_text("[models.mlp]\nmax_request_rows = 2\n")  # fixed, and a real change
        wait_until(lambda: not before & set(server.worker_pids()) and len(server.worker_pids()) == 2, 120,
                   "the configuration to roll out")
        refused = server.post("/v1/models/mlp:predict", json={"instances": [ROW] * 3})
        assert refused.status_code == 400 and "max_request_rows" in refused.json()["error"]
        assert "config_error" not in server.get("/readyz").json()["models"]["mlp"]
        assert value(samples(server), "forkserve_config_last_reload_successful") == 1
    finally:
        server.stop()
