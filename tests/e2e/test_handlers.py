"""Model handlers with real gunicorn and TensorFlow: batched like plain requests, failures contained, opt-in, rolled out whole."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import requests

from server.state import read_worker_states
from tests.support.harness import ROOT, Server, wait_until
from tests.support.metrics import samples, settled_samples, value
from tests.support.models import version_dir
from tests.support.traffic import Traffic

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
# A handler that does what a handler should never do, on request: exit, interrupt, hang, read a missing field.
WILD = '''
import os
import sys
import threading
import numpy as np


class Handler:
    example = {"rows": [[0.5] * 20]}

    def preprocess(self, body: dict) -> dict:
        do = body.get("do")
        if do == "exit3":
            sys.exit(3)
        if do == "exit1":
            sys.exit(1)
        if do == "interrupt":
            raise KeyboardInterrupt
        if do == "os_exit3":
            os._exit(3)  # no hook can catch it: the worker goes, the master must not
        if do == "hang":
            threading.Event().wait()
        return {"features": np.asarray(body["rows"], dtype=np.float32)}

    def postprocess(self, outputs: dict, body: dict) -> dict:
        return {"best": outputs["logits"].argmax(axis=1)}
'''
# What a data scientist's postprocess returns, with no example (so nothing checked it before it served).
ENCODINGS = '''
import numpy as np


class Handler:
    def preprocess(self, body: dict) -> dict:
        return {"features": np.asarray(body["rows"], dtype=np.float32)}

    def postprocess(self, outputs: dict, body: dict) -> dict:
        logits = outputs["logits"]
        rows = len(logits)
        return {"second": logits[:, 1], "labels": np.array(["cat", "dog", "cow"])[:rows],
                "raw": np.bytes_(b"barolo"), "missing": np.float32("nan")}
'''
CONF = """
[models.scored]
handler = true
max_batch_delay_ms = 2.0

[models.wild]
handler = true

[models.encodings]
handler = true

[models.broken_import]
handler = true

[models.broken_setup]
handler = true

[models.not_enabled]
"""


@pytest.fixture(scope="module")
def handled(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """2 workers: a model with a working handler and the broken cases beside it."""
    repo = tmp_path_factory.mktemp("handler-models")
    mlp = model_repo / "mlp" / "1" / "model.keras"
    version_dir(repo, "scored", 1, mlp, HANDLER)
    version_dir(repo, "broken_import", 1, mlp, "import not_a_module_anyone_has\n")
    version_dir(repo, "broken_setup", 1, mlp, HANDLER.replace("self.labels = ", "raise OSError('no labels file'); self.labels = "))
    version_dir(repo, "not_enabled", 1, mlp, HANDLER)
    version_dir(repo, "wild", 1, mlp, WILD)
    version_dir(repo, "encodings", 1, mlp, ENCODINGS)
    shutil.copytree(model_repo / "mlp" / "1", repo / "healthy" / "1")  # a plain model beside them
    run_dir = tmp_path_factory.mktemp("handler-run")
    conf = run_dir / "models.toml"
    conf.write_text(CONF)
    server = Server(models_dir=repo, run_dir=run_dir, conf_path=conf, workers=2,
                    env={"FORKSERVE_POLL_INTERVAL": "0.5", "FORKSERVE_ACCESS_LOG": "1"}).start()
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
        assert value(after, "forkserve_request_stage_duration_seconds_count", model="scored", stage=stage, protocol="rest") >= len(rows)


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


def healthy_traffic(server: Server) -> Traffic:
    """Clients of the plain model, started: none of its requests may fail while a handler misbehaves."""
    traffic = Traffic(f"{server.url}/v1/models/healthy:predict")
    traffic.start(3)
    wait_until(lambda: len(traffic.answers) > 10, 30, "traffic to the healthy model")
    return traffic


@pytest.mark.parametrize(("do", "raised"), [
    ("exit3", "SystemExit: 3"),
    ("exit1", "SystemExit: 1"),
    ("interrupt", "KeyboardInterrupt"),
])
def test_a_handler_that_exits_or_is_interrupted_costs_its_request_a_500_and_nothing_else(
    handled: Server, do: str, raised: str,
) -> None:
    workers = handled.worker_pids()
    traffic = healthy_traffic(handled)
    try:
        answers = [requests.post(f"{handled.url}/v1/models/wild:predict", json={"do": do, "rows": [[0.5] * 20]},
                                 headers={"X-Request-Id": f"{do}-{n}"}, timeout=30) for n in range(6)]
        finished = len(traffic.answers)
        wait_until(lambda: len(traffic.answers) > finished + 20, 30, "traffic after the handler's exits")
    finally:
        traffic.finish()
    assert [a.status_code for a in answers] == [500] * 6, [a.text for a in answers]
    assert answers[0].json() == {"error": f"internal error (request id {do}-0)"}
    assert traffic.failures() == [] and len(traffic.answers) > 30
    assert handled.worker_pids() == workers and handled.process.poll() is None  # no worker lost, the master serves
    assert handled.post("/v1/models/wild:predict", json={"rows": [[0.5] * 20]}).status_code == 200
    # NOTE: every line: the six requests may have been answered by both workers, each flushing its own lines every 0.5 s
    wait_until(lambda: all(f"rid={do}-{i} version=1" in handled.log() for i in range(6)), 15, "the access log lines of the 500s")
    log = handled.log()
    assert f"request {do}-0: unexpected error" in log
    assert f"model wild version 1: Handler.preprocess raised {raised} (handler.py line" in log
    assert '"POST /v1/models/wild:predict HTTP/1.1" 500' in log and f"rid={do}-0 version=1" in log


def test_a_field_preprocess_reads_and_the_request_lacks_is_a_400_naming_it(handled: Server) -> None:
    answer = handled.post("/v1/models/wild:predict", json={"features": [0.5] * 20})
    assert answer.status_code == 400, answer.text
    assert answer.json() == {"error": "the request has no field 'rows' (the model's handler needs it)"}


def test_a_hanging_handler_answers_504_within_the_deadline_while_other_models_answer(handled: Server) -> None:
    before = samples(handled)
    traffic = healthy_traffic(handled)
    try:
        def hang() -> tuple[int, float]:
            started = time.monotonic()
            answer = requests.post(f"{handled.url}/v1/models/wild:predict", json={"do": "hang"},
                                   headers={"X-Request-Timeout": "1.5"}, timeout=20)
            return answer.status_code, time.monotonic() - started

        with ThreadPoolExecutor(4) as pool:
            hung = list(pool.map(lambda _: hang(), range(4)))
        finished = len(traffic.answers)
        wait_until(lambda: len(traffic.answers) > finished + 20, 30, "traffic after the hangs")
    finally:
        traffic.finish()
    assert [status for status, _ in hung] == [504] * 4 and all(1.4 < seconds < 4 for _, seconds in hung), hung
    assert traffic.failures() == []
    # while the hung calls held threads of their own, the healthy model kept answering quickly
    assert max(a[4] for a in traffic.answers) < 1.0, max(a[4] for a in traffic.answers)
    assert handled.post("/v1/models/wild:predict", json={"rows": [[0.5] * 20]}).status_code == 200

    def counted(scrape: dict) -> float:
        return (value(scrape, "forkserve_rejected_requests_total", model="wild", reason="deadline")
                - value(before, "forkserve_rejected_requests_total", model="wild", reason="deadline"))

    after = settled_samples(handled, lambda s: counted(s) >= 4, "the 504s counted")
    assert counted(after) == 4
    assert ("forkserve_rejected_requests_total", frozenset({"model": "wild", "reason": "handler_stuck"}.items())) in after


def test_postprocess_results_of_several_rows_strings_bytes_and_nan_are_written(handled: Server) -> None:
    answer = handled.post("/v1/models/encodings:predict", json={"rows": [[0.5] * 20, [0.25] * 20]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert len(body["second"]) == 2 and all(isinstance(x, float) for x in body["second"])
    assert body["labels"] == ["cat", "dog"] and body["raw"] == "barolo" and body["missing"] is None
    assert "model encodings version 1: its handler has no example" in handled.log()


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


def _versions(model_dir: Path) -> list[str]:
    """A model directory's entries but the publish lock."""
    return sorted(p.name for p in model_dir.iterdir() if p.name != ".publish.lock")


def test_publish_refuses_a_broken_handler_and_leaves_nothing(handled: Server, model_repo: Path, tmp_path: Path) -> None:
    source = version_dir(tmp_path, "candidate", 1, model_repo / "mlp" / "1" / "model.keras",
                         HANDLER.replace('example = {"features": [0.5] * 20}', 'example = {"features": [0.5] * 3}'))
    before = _versions(handled.models_dir / "scored")
    done = subprocess.run([sys.executable, "-m", "server", "publish", "scored", str(source), "--models", str(handled.models_dir),
                           "--conf", str(handled.conf_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "invalid model: handler: Handler.example failed" in done.stderr, done.stderr
    assert _versions(handled.models_dir / "scored") == before  # whichever ran first, the rollout test or this one


def test_a_rollout_to_a_new_handler_never_mixes_versions_and_publishes_the_handler_s_files(
    handled: Server, model_repo: Path, tmp_path: Path
) -> None:
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
    published = handled.models_dir / "scored" / "2"
    assert sorted(p.name for p in published.iterdir()) == ["assets", "handler.py", "model.keras"]
    assert (published / "assets" / "labels.txt").read_text() == "red blue"
    assert handled.get("/v1/models/scored/versions/2/metadata").json()["model_spec"]["version"] == "2"


EXITS_IN_SETUP = HANDLER.replace("self.labels = ", "raise SystemExit(3); self.labels = ")


@pytest.fixture(scope="module")
def exits_in_setup(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """1 worker: a model whose only version's setup raises SystemExit(3), a handler model to roll out, a plain one."""
    repo = tmp_path_factory.mktemp("exit-models")
    mlp = model_repo / "mlp" / "1" / "model.keras"
    version_dir(repo, "exits", 1, mlp, EXITS_IN_SETUP)
    version_dir(repo, "rolled", 1, mlp, HANDLER)
    shutil.copytree(model_repo / "mlp" / "1", repo / "healthy" / "1")
    run_dir = tmp_path_factory.mktemp("exit-run")
    conf = run_dir / "models.toml"
    conf.write_text("[models.exits]\nhandler = true\n\n[models.rolled]\nhandler = true\n")
    server = Server(models_dir=repo, run_dir=run_dir, conf_path=conf, workers=1,
                    env={"FORKSERVE_POLL_INTERVAL": "0.5"}).start()
    yield server
    server.stop()


def end_reason(server: Server, model: str, version: int) -> str:
    """The error message of a version whose state is END ("" while it is not)."""
    statuses = server.get(f"/v1/models/{model}").json().get("model_version_status", [])
    found = [s for s in statuses if s["version"] == str(version) and s["state"] == "END"]
    return found[0]["status"]["error_message"] if found else ""


def test_a_setup_raising_systemexit_3_at_boot_fails_its_version_and_the_server_serves(exits_in_setup: Server) -> None:
    assert "Handler setup failed: SystemExit: 3 (handler.py line" in end_reason(exits_in_setup, "exits", 1)
    assert exits_in_setup.post("/v1/models/healthy:predict", json={"instances": [[0.5] * 20]}).status_code == 200
    assert exits_in_setup.post("/v1/models/rolled:predict", json={"features": [0.5] * 20}).status_code == 200
    assert exits_in_setup.process.poll() is None


def test_a_version_whose_setup_raises_systemexit_3_fails_at_its_rollout_and_the_master_keeps_serving(
    exits_in_setup: Server, model_repo: Path, tmp_path: Path,
) -> None:
    server = exits_in_setup
    source = version_dir(tmp_path, "rolled", 2, model_repo / "mlp" / "1" / "model.keras", EXITS_IN_SETUP)
    traffic = Traffic(f"{server.url}/v1/models/rolled:predict", body={"features": [0.25] * 20})
    traffic.start(2)
    try:
        wait_until(lambda: len(traffic.answers) > 10, 30, "traffic to the served version")
        staging = server.models_dir / "rolled" / ".incoming-2"  # copied by other tooling than publish, renamed in
        shutil.copytree(source, staging)
        os.rename(staging, server.models_dir / "rolled" / "2")
        reason = wait_until(lambda: end_reason(server, "rolled", 2), 180, "version 2 marked failed")
        finished = len(traffic.answers)
        wait_until(lambda: len(traffic.answers) > finished + 20, 30, "traffic after the failed rollout")
    finally:
        traffic.finish()
    assert "Handler setup failed: SystemExit: 3 (handler.py line" in reason, reason
    # NOTE: the rollout's extra worker may still be leaving (its REST and gRPC drains) when the mark is written
    wait_until(lambda: len(server.worker_pids()) == 1, 60, "the rollout's extra worker to leave")
    assert server.process.poll() is None
    assert traffic.failures() == [] and {a[2] for a in traffic.answers} == {"1"}


def test_a_handler_that_calls_os_exit_3_costs_its_worker_not_the_server(handled: Server) -> None:
    """os._exit(3) skips every hook: the worker goes, and the master (which reads 3 as a boot error) stays."""
    workers = handled.worker_pids()
    with pytest.raises(requests.ConnectionError):
        requests.post(f"{handled.url}/v1/models/wild:predict", json={"do": "os_exit3", "rows": [[0.5] * 20]}, timeout=30)
    wait_until(lambda: len(set(handled.worker_pids()) - set(workers)) == 1 and len(handled.worker_pids()) == 2, 120,
               "a replacement worker")
    assert handled.process.poll() is None, handled.log()
    assert handled.post("/v1/models/scored:predict", json={"features": [0.5] * 20}).status_code == 200
    assert "exited with code 3" in handled.log() and "Worker failed to boot" not in handled.log()


# NOTE: last in the module: the tracebacks it lets through fill this second's allowance in the workers
def test_a_burst_of_bugs_logs_a_few_tracebacks_a_second_and_counts_the_rest(handled: Server) -> None:
    sent = 0
    before = len(handled.log())  # NOTE: earlier tests of the module logged tracebacks of the same bug
    started = time.monotonic()

    def burst_reported() -> bool:
        nonlocal sent
        for _ in range(20):
            bug = handled.post("/v1/models/scored:predict", json={"fail": "bug"}, headers={"X-Request-Id": f"burst-{sent}"})
            assert bug.status_code == 500
            sent += 1
        return "more unexpected errors were not logged (at most 5 tracebacks a second)" in handled.log()[before:]

    wait_until(burst_reported, 30, "the count of the tracebacks not logged")  # logged with the next one let through
    seconds = time.monotonic() - started
    log = handled.log()[before:]
    logged = sum(log.count(f"request burst-{n}: unexpected error") for n in range(sent))
    assert 0 < logged < sent, (logged, sent)
    # At most 5 a second in each worker (the burst's seconds, each started one counted whole).
    assert logged <= 5 * handled.workers * (int(seconds) + 2), (logged, seconds)
