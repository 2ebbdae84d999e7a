"""A request slower than FORKSERVE_SLOW_REQUEST_MS leaves one log line saying where its time went."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tests.e2e.conftest import copy_models
from tests.e2e.harness import Server, wait_until


def test_a_slow_request_logs_its_stage_times(model_repo: Path, tmp_path: Path) -> None:
    repo = copy_models(model_repo, tmp_path / "models", "mlp", "slow")
    server = Server(models_dir=repo, run_dir=tmp_path / "run", workers=1,
                    env={"FORKSERVE_SLOW_REQUEST_MS": "0.001"}).start()  # every request is "slow"
    try:
        answer = server.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 20]}, headers={"X-Request-Id": "slow-1"})
        assert answer.status_code == 200
        line = wait_until(lambda: re.search(r"slow request slow-1: mlp tfserving_predict version=1 status=200 (.*)", server.log()),
                          10, "the slow-request line")[1]
        times = {name: float(value) for name, value in re.findall(r"(\w+)=([\d.]+)", line)}
        assert {"total_ms", "decode", "queue", "compute", "encode", "other"} <= times.keys(), line
        stages = sum(value for name, value in times.items() if name != "total_ms")
        assert abs(stages - times["total_ms"]) < 0.05 and times["compute"] > 0  # the stages and the rest add up
        refused = server.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 3]}, headers={"X-Request-Id": "slow-2"})
        assert refused.status_code == 400
        wait_until(lambda: "slow request slow-2: mlp tfserving_predict version=1 status=400" in server.log(), 10, "the 400's line")
        late = server.post("/v1/models/slow:predict", json={"instances": [np.zeros((192, 192, 3)).tolist()]},
                           headers={"X-Request-Id": "slow-3", "X-Request-Timeout": "0.01"})  # 0.1-0.3 s a row
        assert late.status_code == 504, late.text
        line = wait_until(lambda: re.search(r"slow request slow-3: slow tfserving_predict version=1 status=504 (.*)", server.log()),
                          10, "the timed-out request's line")[1]
        assert "queue=" in line, line  # it gave up while queued (or running): that wait is shown, not lumped into other
    finally:
        server.stop()
