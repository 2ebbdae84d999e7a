"""Model handlers with real gunicorn and TensorFlow: batched like plain requests, failures contained, opt-in, rolled out whole."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import requests

from server.state import read_worker_states
from tests.e2e.harness import ROOT, Server, wait_until
from tests.e2e.test_metrics import samples, settled_samples, value

# A handler in the style a Flask app's own code would have: named fields in, a label and a score out.
HANDLER = '''
from pathlib import Path
import numpy as np


class Handler:
    example = {"features": [0.5] * 20}
    request_schema = {"type": "object", "required": ["features"],
                      "properties": {"features": {"type": "array", "items": {"type": "number"}}}}

    def setup(self, version_dir: Path) -> None:
        self.labels = (version_dir / "assets" / "labels.txt").read_text().split()

    def preprocess(self, body: dict) -> dict:
        if body.get("fail") == "value":
            raise ValueError("features must be 20 numbers between 0 and 1")
        if body.get("fail") == "bug":
            raise RuntimeError("a bug in the handler")
        features = body.get("features")
        if not isinstance(features, list) or len(features) != 20:
            raise ValueError("send {\\"features\\": [20 numbers]}")
        return {"features": np.asarray([features], dtype=np.float32)}

    def postprocess(self, outputs: dict, body: dict) -> dict:
        logits = outputs["logits"][0]
        best = int(np.argmax(logits))
        return {"label": self.labels[best], "score": float(logits[best])}
'''
CONF = """
[models.scored]
handler = true
max_batch_delay_ms = 2.0

[models.broken_import]
handler = true

[models.broken_setup]
handler = true

[models.not_enabled]
"""


def version_dir(root: Path, name: str, version: int, model_file: Path, handler: str, labels: str = "cat dog") -> Path:
    """A version directory: the model file, handler.py and assets/labels.txt."""
    directory = root / name / str(version)
    (directory / "assets").mkdir(parents=True)
    shutil.copy(model_file, directory / "model.keras")
    (directory / "handler.py").write_text(handler)
    (directory / "assets" / "labels.txt").write_text(labels)
    return directory


@pytest.fixture(scope="module")
def handled(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """2 workers: a model with a working handler and the broken cases beside it."""
    repo = tmp_path_factory.mktemp("handler-models")
    mlp = model_repo / "mlp" / "1" / "model.keras"
    version_dir(repo, "scored", 1, mlp, HANDLER)
    version_dir(repo, "broken_import", 1, mlp, "import not_a_module_anyone_has\n")
    version_dir(repo, "broken_setup", 1, mlp, HANDLER.replace("self.labels = ", "raise OSError('no labels file'); self.labels = "))
    version_dir(repo, "not_enabled", 1, mlp, HANDLER)
    run_dir = tmp_path_factory.mktemp("handler-run")
    conf = run_dir / "models.toml"
    conf.write_text(CONF)
    server = Server(models_dir=repo, run_dir=run_dir, conf_path=conf, workers=2,
                    env={"FORKSERVE_POLL_INTERVAL": "0.5"}).start()
    yield server
    server.stop()


def expected(keras_model, features: list[float], labels: list[str]) -> tuple[str, float]:
    """The in-process model plus the handler's own logic."""
    logits = np.asarray(keras_model(np.asarray([features], dtype=np.float32), training=False))[0]
    return labels[int(np.argmax(logits))], float(logits.max())


def test_requests_through_a_handler_are_batched_and_answer_as_in_process(handled: Server, keras_models: dict) -> None:
    rng = np.random.default_rng(5)
    rows = [rng.random(20).round(3).tolist() for _ in range(400)]
    before = samples(handled)

    def ask(features: list[float]) -> tuple[list[float], requests.Response]:
        return features, requests.post(f"{handled.url}/v1/models/scored:predict", json={"features": features}, timeout=30)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, rows))
    for features, answer in answers:
        assert answer.status_code == 200, answer.text
        label, score = expected(keras_models["mlp"], features, ["cat", "dog"])
        assert answer.json()["label"] == label and abs(answer.json()["score"] - score) < 1e-5
    after = settled_samples(handled, lambda s: value(s, "forkserve_batch_size_rows_count", model="scored")
                            - value(before, "forkserve_batch_size_rows_count", model="scored") > 0, "batches counted")
    calls = value(after, "forkserve_batch_size_rows_count", model="scored") - value(before, "forkserve_batch_size_rows_count", model="scored")
    rows_run = value(after, "forkserve_batch_size_rows_sum", model="scored") - value(before, "forkserve_batch_size_rows_sum", model="scored")
    assert rows_run == len(rows)
    assert calls < len(rows), (calls, rows_run)  # some calls carried several requests: batches > 1
    for stage in ("preprocess", "postprocess", "queue", "compute"):
        assert value(after, "forkserve_request_stage_duration_seconds_count", model="scored", stage=stage) >= len(rows)


def test_a_value_error_is_a_400_with_its_message_and_a_bug_a_500_with_the_request_id(handled: Server) -> None:
    refused = handled.post("/v1/models/scored:predict", json={"fail": "value"})
    assert refused.status_code == 400 and refused.json() == {"error": "features must be 20 numbers between 0 and 1"}
    bug = handled.post("/v1/models/scored:predict", json={"fail": "bug"}, headers={"X-Request-Id": "handler-bug-1"})
    assert bug.status_code == 500 and bug.json() == {"error": "internal error (request id handler-bug-1)"}
    assert handled.post("/v1/models/scored:predict", json={"features": [0.5] * 20}).status_code == 200
    wait_until(lambda: "handler-bug-1" in handled.log(), 10, "the logged traceback")
    log = handled.log()
    assert log.count("request handler-bug-1: unexpected error") == 1 and "RuntimeError: a bug in the handler" in log
    not_json = handled.post("/v1/models/scored:predict", json=[1, 2])
    assert not_json.status_code == 400 and "JSON object" in not_json.json()["error"]


@pytest.mark.parametrize(("model", "reason"), [
    ("broken_import", "handler.py failed to import: ModuleNotFoundError"),
    ("broken_setup", "Handler setup failed: OSError: no labels file (handler.py line"),
    ("not_enabled", "has a handler.py, but handlers are off for model not_enabled (set handler = true"),
])
def test_a_handler_that_cannot_be_used_fails_its_version(handled: Server, model: str, reason: str) -> None:
    status = handled.get(f"/v1/models/{model}").json()["model_version_status"][0]
    assert status["state"] == "END" and reason in status["status"]["error_message"], status
    assert handled.post(f"/v1/models/{model}:predict", json={"features": [0.5] * 20}).status_code == 503
    assert handled.process.poll() is None


def test_metadata_openapi_and_v2_say_what_a_handler_model_takes(handled: Server) -> None:
    described = handled.get("/v1/models/scored/metadata").json()["metadata"]["handler"]
    assert described["request_schema"]["required"] == ["features"] and described["response_schema"] == "free-form"
    spec = handled.get("/openapi.json").json()
    operation = spec["paths"]["/v1/models/scored:predict"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["required"] == ["features"]
    assert "free-form" in operation["responses"]["200"]["description"]
    # V2 speaks tensors: the model's own input and output, without the handler.
    infer = handled.post("/v2/models/scored/infer", json={"inputs": [
        {"name": "features", "shape": [1, 20], "datatype": "FP32", "data": [0.5] * 20}]})
    assert infer.status_code == 200 and infer.json()["outputs"][0]["name"] == "logits"


def test_publish_refuses_a_broken_handler_and_leaves_nothing(handled: Server, model_repo: Path, tmp_path: Path) -> None:
    source = version_dir(tmp_path, "candidate", 1, model_repo / "mlp" / "1" / "model.keras",
                         HANDLER.replace('example = {"features": [0.5] * 20}', 'example = {"features": [0.5] * 3}'))
    done = subprocess.run([sys.executable, "-m", "server", "publish", "scored", str(source), "--models", str(handled.models_dir),
                           "--conf", str(handled.conf_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "invalid model: handler: Handler.example failed" in done.stderr, done.stderr
    assert sorted(p.name for p in (handled.models_dir / "scored").iterdir() if p.name != ".publish.lock") == ["1"]


def test_a_rollout_to_a_new_handler_never_mixes_versions(handled: Server, model_repo: Path, tmp_path: Path) -> None:
    source = version_dir(tmp_path, "candidate", 2, model_repo / "mlp" / "1" / "model.keras", HANDLER, labels="red blue")
    labels = {"1": {"cat", "dog"}, "2": {"red", "blue"}}
    answers: list[tuple[int, str, str]] = []
    stop = threading.Event()

    def client() -> None:
        session = requests.Session()
        while not stop.is_set():
            answer = session.post(f"{handled.url}/v1/models/scored:predict", json={"features": [0.25] * 20}, timeout=30)
            answers.append((answer.status_code, answer.headers.get("X-Model-Version", ""), answer.json().get("label", "")))

    def rolled_out() -> bool:
        states = read_worker_states(handled.run_dir)
        return len(handled.worker_pids()) == 2 and all(
            pid in states and states[pid].serving("scored") == [2] for pid in handled.worker_pids())

    with ThreadPoolExecutor(6) as pool:
        clients = [pool.submit(client) for _ in range(6)]
        try:
            done = subprocess.run([sys.executable, "-m", "server", "publish", "scored", str(source), "--models",
                                   str(handled.models_dir), "--conf", str(handled.conf_path)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0 and done.stdout.strip() == "2", done.stderr
            wait_until(rolled_out, 180, "the rollout of version 2")
            finished = len(answers)
            wait_until(lambda: len(answers) > finished + 50, 30, "answers after the rollout")
        finally:
            stop.set()
        for future in clients:
            future.result()
    assert answers and all(status == 200 for status, _, _ in answers), [a for a in answers if a[0] != 200][:5]
    assert {version for _, version, _ in answers} == {"1", "2"}
    assert all(label in labels[version] for _, version, label in answers)  # v1's handler with v1's model, never across
    assert {version for _, version, _ in answers[finished + 10:]} == {"2"}


def test_the_published_version_directory_holds_the_handler_and_its_files(handled: Server) -> None:
    published = handled.models_dir / "scored" / "2"
    assert sorted(p.name for p in published.iterdir()) == ["assets", "handler.py", "model.keras"]
    assert (published / "assets" / "labels.txt").read_text() == "red blue"
    assert handled.get("/v1/models/scored/versions/2/metadata").json()["model_spec"]["version"] == "2"
