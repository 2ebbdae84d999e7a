"""Payload logging against a real gunicorn: JSON-lines files (rotation, full disk, redaction, the CLI) and CloudEvents to a real receiver."""

from __future__ import annotations

import base64
import csv
import io
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from server.cli.payloads import log_files, records
from tests.support.filesystems import filled, tmpfs
from tests.support.harness import ROOT, Server, free_port, memory_kib, wait_until
from tests.support.hostile_receiver import HostileReceiver
from tests.support.metrics import samples, settled_samples, value
from tests.support.models import version_dir

ROW = [0.5] * 20
MAX_MB = 0.01  # about 30 records per file: rotation within a test
# preprocess mutates the body it is given (the log must show it as it came); redact hides the user.
REDACTING = '''
import numpy as np


class Handler:
    def preprocess(self, body: dict) -> dict:
        body.pop("user", None)
        return {"features": np.asarray([body.pop("features")], dtype=np.float32)}

    def postprocess(self, outputs: dict, body: dict) -> dict:
        return {"score": float(outputs["logits"][0][0])}

    def redact(self, body: dict) -> dict:
        return {**body, "user": "REDACTED"}
'''
RAISING = REDACTING.replace('return {**body, "user": "REDACTED"}', 'raise KeyError("no such field")')
# redact_tensors masks the first feature of every row, whatever protocol brought the tensors.
MASKING = REDACTING + '''
    def redact_tensors(self, inputs: dict) -> dict:
        inputs["features"][:, 0] = -1.0
        return {"features": inputs["features"]}
'''
SECRET = 0.987654  # a first feature that no record of a redacting model may show
SECRET_ROW = [SECRET] + ROW[1:]
MASKED_ROW = [-1.0] + ROW[1:]
CONF = """
[models.logged]
payload_log = { sample = 1.0 }

[models.redacted]
handler = true
payload_log = { sample = 1.0 }

[models.leaky]
handler = true
payload_log = { sample = 1.0 }

[models.masked]
handler = true
payload_log = { sample = 1.0 }

[models.regressed]
handler = true
payload_log = { sample = 1.0 }

[models.half_plus_two]
payload_log = { sample = 1.0 }
"""


@pytest.fixture(scope="module")
def payload_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A small tmpfs: the payload files, to fill on demand."""
    with tmpfs(tmp_path_factory.mktemp("payload-fs"), "2m") as where:
        yield where / "payloads"


@pytest.fixture(scope="module")
def file_server(model_repo: Path, payload_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """1 worker logging to file:DIR: sampled models (plain, handlers, half_plus_two) and an unsampled one."""
    repo = tmp_path_factory.mktemp("payload-models")
    mlp = model_repo / "mlp" / "1" / "model.keras"
    for name in ("logged", "quiet"):
        shutil.copytree(model_repo / "mlp" / "1", repo / name / "1")
    shutil.copytree(model_repo / "half_plus_two", repo / "half_plus_two")
    version_dir(repo, "redacted", 1, mlp, REDACTING)
    version_dir(repo, "leaky", 1, mlp, RAISING)
    version_dir(repo, "masked", 1, mlp, MASKING)
    shutil.copytree(model_repo / "half_plus_two" / "00000123", repo / "regressed" / "1")  # has a regress signature
    (repo / "regressed" / "1" / "handler.py").write_text(REDACTING)
    run_dir = tmp_path_factory.mktemp("payload-run")
    (run_dir / "models.toml").write_text(CONF)
    server = Server(models_dir=repo, run_dir=run_dir, conf_path=run_dir / "models.toml", workers=1, env={
        "FORKSERVE_PAYLOAD_LOG": f"file:{payload_dir}", "FORKSERVE_PAYLOAD_LOG_MAX_MB": str(MAX_MB)}).start()
    yield server
    server.stop()


def logged(directory: Path, request_id: str, count: int = 1) -> list[dict]:
    """The records of one request id, once `count` of them are written."""
    return wait_until(lambda: [r for r in records(directory) if r["request_id"] == request_id][:count] or None
                      if len([r for r in records(directory) if r["request_id"] == request_id]) >= count else None,
                      15, f"{count} record(s) of {request_id}")


def test_a_fast_path_predict_is_logged_with_every_field(file_server: Server, payload_dir: Path) -> None:
    body = {"instances": [ROW]}
    response = file_server.post("/v1/models/logged:predict", json=body, headers={"X-Request-Id": "fast-1"})
    assert response.status_code == 200
    [record] = logged(payload_dir, "fast-1")
    assert {k: record[k] for k in ("model", "version", "api", "protocol", "status", "trace_id", "error")} == {
        "model": "logged", "version": "1", "api": "tfserving_predict", "protocol": "rest", "status": 200,
        "trace_id": "", "error": None}
    assert record["inputs"] == body and record["outputs"] == response.json()
    assert record["time"].endswith("Z") and 0 < record["latency_ms"] < 10_000
    assert (payload_dir.stat().st_mode & 0o777) == 0o750
    assert {path.stat().st_mode & 0o777 for path in log_files(payload_dir)} == {0o600}


def test_the_flask_view_v2_and_regress_are_logged(file_server: Server, payload_dir: Path) -> None:
    chunked = file_server.post("/v1/models/logged:predict", data=iter([json.dumps({"instances": [ROW]}).encode()]),
                               headers={"X-Request-Id": "flask-1", "Content-Type": "application/json"})
    v2_body = {"inputs": [{"name": "features", "shape": [1, 20], "datatype": "FP32", "data": ROW}]}
    v2 = file_server.post("/v2/models/logged/infer", json=v2_body, headers={"X-Request-Id": "v2-1"})
    regress_body = {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}]}
    regress = file_server.post("/v1/models/half_plus_two:regress", json=regress_body, headers={"X-Request-Id": "regress-1"})
    assert (chunked.status_code, v2.status_code, regress.status_code) == (200, 200, 200), regress.text
    [flask] = logged(payload_dir, "flask-1")
    assert flask["outputs"] == chunked.json() and flask["inputs"] == {"instances": [ROW]}
    [infer] = logged(payload_dir, "v2-1")
    assert infer["api"] == "v2_infer" and infer["inputs"] == v2_body and infer["outputs"] == v2.json()
    [regressed] = logged(payload_dir, "regress-1")
    assert regressed["api"] == "tfserving_regress" and regressed["outputs"] == {"results": [2.5]}


def test_a_failed_request_is_logged_with_its_error(file_server: Server, payload_dir: Path) -> None:
    response = file_server.post("/v1/models/logged:predict", json={"instances": [[1.0, 2.0]]}, headers={"X-Request-Id": "bad-1"})
    assert response.status_code == 400
    [record] = logged(payload_dir, "bad-1")
    assert record["status"] == 400 and record["outputs"] is None
    assert record["error"] == {"status": 400, "message": response.json()["error"]}
    assert record["inputs"] == {"instances": [[1.0, 2.0]]}


def test_an_unsampled_model_is_not_logged(file_server: Server, payload_dir: Path) -> None:
    for number in range(5):
        assert file_server.post("/v1/models/quiet:predict", json={"instances": [ROW]},
                                headers={"X-Request-Id": f"quiet-{number}"}).status_code == 200
    file_server.post("/v1/models/logged:predict", json={"instances": [ROW]}, headers={"X-Request-Id": "after-quiet"})
    logged(payload_dir, "after-quiet")  # written after the quiet ones would have been: one writer, in order
    assert not [r for r in records(payload_dir) if r["model"] == "quiet"]


def test_redact_applies_to_the_inputs_as_they_came(file_server: Server, payload_dir: Path) -> None:
    body = {"features": ROW, "user": "alice@example.com"}
    assert file_server.post("/v1/models/redacted:predict", json=body, headers={"X-Request-Id": "redact-1"}).status_code == 200
    [record] = logged(payload_dir, "redact-1")
    assert record["inputs"] == {"features": ROW, "user": "REDACTED"}  # preprocess popped both: captured before
    assert "score" in record["outputs"]


def test_a_raising_redact_logs_the_record_without_inputs(file_server: Server, payload_dir: Path) -> None:
    before = value(samples(file_server), "forkserve_payload_log_dropped_total", reason="redact_failed")
    body = {"features": ROW, "user": "alice@example.com"}
    assert file_server.post("/v1/models/leaky:predict", json=body, headers={"X-Request-Id": "leak-1"}).status_code == 200
    [record] = logged(payload_dir, "leak-1")
    assert record["inputs"] is None and "KeyError" in record["redact_error"] and "score" in record["outputs"]
    assert "alice" not in "".join(path.read_text() for path in log_files(payload_dir))
    wait_until(lambda: value(samples(file_server), "forkserve_payload_log_dropped_total", reason="redact_failed") > before,
               15, "redact_failed counted")


def grpc_predict(server: Server, model: str, request_id: str, row: list[float]) -> None:
    """TF Serving's gRPC Predict of one row."""
    grpc = pytest.importorskip("grpc")
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from server.protocols.tfserving import tensor_proto

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    tensor_proto.from_array(np.asarray([row], dtype=np.float32), request.inputs["features"], "features")
    with grpc.insecure_channel(server.grpc_target) as channel:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10,
                                                                           metadata=[("x-request-id", request_id)])


def grpc_model_infer(server: Server, model: str, request_id: str, row: list[float]) -> None:
    """V2 gRPC ModelInfer of one row (tritonclient's messages: this process never imports server.protocols.v2.protos)."""
    grpc = pytest.importorskip("grpc")
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="features", datatype="FP32", shape=[1, len(row)]).contents.fp32_contents.extend(row)
    with grpc.insecure_channel(server.grpc_target) as channel:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10,
                                                                     metadata=[("x-request-id", request_id)])


def bypassing_requests(server: Server, model: str, prefix: str, row: list[float]) -> list[str]:
    """The requests that reach a handler model without its handler: V2 REST, gRPC Predict, gRPC ModelInfer; their ids."""
    v2_body = {"inputs": [{"name": "features", "shape": [1, len(row)], "datatype": "FP32", "data": row}]}
    assert server.post(f"/v2/models/{model}/infer", json=v2_body, headers={"X-Request-Id": f"{prefix}-v2"}).ok
    grpc_predict(server, model, f"{prefix}-grpc", row)
    grpc_model_infer(server, model, f"{prefix}-grpc-v2", row)
    return [f"{prefix}-v2", f"{prefix}-grpc", f"{prefix}-grpc-v2"]


def test_grpc_classify_and_regress_are_logged_with_their_examples_and_outputs(file_server: Server, payload_dir: Path) -> None:
    grpc = pytest.importorskip("grpc")
    from tensorflow.core.example import example_pb2, feature_pb2
    from tensorflow_serving.apis import classification_pb2, prediction_service_pb2_grpc, regression_pb2

    example = example_pb2.Example(features=feature_pb2.Features(
        feature={"x": feature_pb2.Feature(float_list=feature_pb2.FloatList(value=[1.0]))}))
    calls = [("Classify", classification_pb2.ClassificationRequest(), "classify_x_to_y", "tfserving_classify"),
             ("Regress", regression_pb2.RegressionRequest(), "regress_x_to_y", "tfserving_regress")]
    with grpc.insecure_channel(file_server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        for method, request, signature, _ in calls:
            request.model_spec.name, request.model_spec.signature_name = "half_plus_two", signature
            request.input.example_list.examples.append(example)
            getattr(stub, method)(request, timeout=10, metadata=[("x-request-id", f"grpc-{method}")])
    for method, _, _, api in calls:
        [record] = logged(payload_dir, f"grpc-{method}")
        assert (record["api"], record["protocol"], record["status"], record["error"]) == (api, "grpc", 200, None)
        assert record["inputs"] == {"inputs": {"inputs": [{"b64": base64.b64encode(example.SerializeToString()).decode()}]}}
        [values] = record["outputs"]["outputs"].values()
        assert np.ravel(values).tolist() == [2.5]  # half_plus_two of 1.0


def test_grpc_multi_inference_is_logged_with_each_tasks_outputs(file_server: Server, payload_dir: Path) -> None:
    grpc = pytest.importorskip("grpc")
    from tensorflow.core.example import example_pb2, feature_pb2
    from tensorflow_serving.apis import inference_pb2, prediction_service_pb2_grpc

    example = example_pb2.Example(features=feature_pb2.Features(
        feature={"x": feature_pb2.Feature(float_list=feature_pb2.FloatList(value=[1.0]))}))
    request = inference_pb2.MultiInferenceRequest()
    for signature, method in (("classify_x_to_y", "classify"), ("regress_x_to_y2", "regress")):
        task = request.tasks.add()
        task.model_spec.name, task.model_spec.signature_name = "half_plus_two", signature
        task.method_name = f"tensorflow/serving/{method}"
    request.input.example_list.examples.append(example)
    with grpc.insecure_channel(file_server.grpc_target) as channel:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).MultiInference(
            request, timeout=10, metadata=[("x-request-id", "grpc-MultiInference")])
    [record] = logged(payload_dir, "grpc-MultiInference")
    assert (record["api"], record["protocol"], record["status"], record["error"]) == (
        "tfserving_multi_inference", "grpc", 200, None)
    assert record["inputs"]["inputs"] == {"inputs": [{"b64": base64.b64encode(example.SerializeToString()).decode()}]}
    assert {key: np.ravel(values).tolist() for key, values in record["outputs"]["outputs"].items()} == {
        "classify_x_to_y/scores": [2.5], "regress_x_to_y2/outputs": [3.5]}  # 0.5 x + 2, 0.5 x + 3


def test_requests_that_bypass_a_redacting_handler_are_logged_without_inputs(file_server: Server, payload_dir: Path) -> None:
    ids = bypassing_requests(file_server, "redacted", "bypass", SECRET_ROW)
    regress = file_server.post("/v1/models/regressed:regress", headers={"X-Request-Id": "bypass-regress"},
                               json={"signature_name": "regress_x_to_y", "examples": [{"x": SECRET}]})
    assert regress.status_code == 200, regress.text
    for request_id in [*ids, "bypass-regress"]:
        [record] = logged(payload_dir, request_id)
        assert record["status"] == 200 and record["outputs"] is not None, record
        assert record["inputs"] is None and "not redact_tensors" in record["inputs_omitted"], record
    assert {r["protocol"] for r in records(payload_dir) if r["request_id"].startswith("bypass-")} == {"rest", "grpc"}
    assert str(SECRET) not in "".join(path.read_text() for path in log_files(payload_dir))


def test_redact_tensors_redacts_every_request_that_bypasses_the_handler(file_server: Server, payload_dir: Path) -> None:
    for request_id in bypassing_requests(file_server, "masked", "masked", SECRET_ROW):
        [record] = logged(payload_dir, request_id)
        assert record["inputs"] == {"inputs": {"features": [MASKED_ROW]}} and "inputs_omitted" not in record, record
    body = {"features": ROW, "user": "alice@example.com"}  # through the handler: redact(body)
    assert file_server.post("/v1/models/masked:predict", json=body, headers={"X-Request-Id": "masked-rest"}).ok
    assert logged(payload_dir, "masked-rest")[0]["inputs"] == {"features": ROW, "user": "REDACTED"}
    assert str(SECRET) not in "".join(path.read_text() for path in log_files(payload_dir))


def test_the_cli_reads_the_files_into_a_table(file_server: Server, payload_dir: Path) -> None:
    logged(payload_dir, "fast-1")
    command = [sys.executable, "-m", "server", "payloads", str(payload_dir)]
    table = subprocess.run(command + ["--model", "logged"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    rows = list(csv.DictReader(io.StringIO(table)))
    assert rows and {row["model"] for row in rows} == {"logged"}
    fast = next(row for row in rows if row["request_id"] == "fast-1")
    assert json.loads(fast["inputs"]) == {"instances": [ROW]} and fast["status"] == "200"
    lines = subprocess.run(command + ["--format", "jsonl"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert {"logged", "redacted", "half_plus_two"} <= {json.loads(line)["model"] for line in lines.splitlines()}


def test_a_full_disk_fails_no_request_and_is_counted(file_server: Server, payload_dir: Path) -> None:
    before = value(samples(file_server), "forkserve_payload_log_dropped_total", reason="write_failed")
    with filled(payload_dir):
        for number in range(10):
            started = time.monotonic()
            response = file_server.post("/v1/models/logged:predict", json={"instances": [ROW] * 8},
                                        headers={"X-Request-Id": f"full-{number}"})
            assert response.status_code == 200 and time.monotonic() - started < 1.0
        wait_until(lambda: value(samples(file_server), "forkserve_payload_log_dropped_total", reason="write_failed") > before,
                   15, "write_failed counted")
    assert file_server.post("/v1/models/logged:predict", json={"instances": [ROW]}, headers={"X-Request-Id": "after-full"}).ok
    logged(payload_dir, "after-full")  # the disk has room again: logging resumes


def test_files_rotate_by_size_and_stay_bounded(file_server: Server, payload_dir: Path) -> None:
    for number in range(200):
        assert file_server.post("/v1/models/logged:predict", json={"instances": [ROW]},
                                headers={"X-Request-Id": f"rotate-{number}"}).status_code == 200
    logged(payload_dir, "rotate-199")
    files = log_files(payload_dir)
    rotated = [path for path in files if not path.name.endswith(".jsonl")]
    assert [path.name.rsplit(".", 1)[-1] for path in rotated] == ["5", "4", "3", "2", "1"] and len(files) <= 6
    line = 2_000  # generous bound of one record
    assert all(MAX_MB * 2**20 <= path.stat().st_size < MAX_MB * 2**20 + line for path in rotated)


def test_a_symlink_planted_at_a_workers_file_is_refused_never_followed(file_server: Server, payload_dir: Path,
                                                                       tmp_path: Path) -> None:
    assert file_server.post("/v1/models/logged:predict", json={"instances": [ROW]}, headers={"X-Request-Id": "link-0"}).ok
    logged(payload_dir, "link-0")
    [current] = [path for path in log_files(payload_dir) if path.name.endswith(".jsonl")]
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    failed = value(samples(file_server), "forkserve_payload_log_dropped_total", reason="write_failed")
    current.unlink()
    current.symlink_to(victim)  # another user of DIR planting a link where the worker writes
    sent = iter(range(1, 1000))

    def refused() -> bool:  # the worker looks at its path once a second: send until it has
        assert file_server.post("/v1/models/logged:predict", json={"instances": [ROW]},
                                headers={"X-Request-Id": f"link-{next(sent)}"}).ok
        return value(samples(file_server), "forkserve_payload_log_dropped_total", reason="write_failed") > failed

    wait_until(refused, 15, "the planted link refused", interval=0.2)
    assert victim.read_text() == "precious\n"
    assert "is a symbolic link: not followed" in file_server.log()
    current.unlink()
    assert file_server.post("/v1/models/logged:predict", json={"instances": [ROW]}, headers={"X-Request-Id": "link-after"}).ok
    logged(payload_dir, "link-after")  # the link gone: a file of its own again


HUGE = 256 << 20
ZEROS = b"\0" * (1 << 20)


class Receiver:
    """A CloudEvents receiver in this process: records every POST's headers and body; answers 200, 500, hangs, answers
    slowly, with a huge body, or a redirect to `location`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.mode = "ok"
        self.events: list[tuple[dict[str, str], bytes]] = []
        self.answered: list[str] = []  # ce-ids of response events answered 200 (the record arrived whole)
        self.release = threading.Event()
        self.slow_answers = 0  # "slow": this many POSTs are answered after 0.3 s, later ones hang until release
        self.location = ""
        self.open()

    def open(self) -> None:
        receiver = self

        class Handle(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.events.append(({k.lower(): v for k, v in self.headers.items()}, body))
                if receiver.mode == "hang" or (receiver.mode == "slow" and receiver.slow_answers <= 0):
                    receiver.release.wait(30)
                elif receiver.mode == "slow":
                    receiver.slow_answers -= 1
                    time.sleep(0.3)
                if receiver.mode == "redirect":
                    self.send_response(307)
                    self.send_header("Location", receiver.location)
                else:
                    self.send_response(500 if receiver.mode == "500" else 200)
                self.send_header("Content-Length", str(HUGE if receiver.mode == "huge" else 0))
                self.end_headers()
                if receiver.mode == "huge":  # what a worker must never read: it stops at a few KB and closes
                    try:
                        for _ in range(HUGE // len(ZEROS)):
                            self.wfile.write(ZEROS)
                    except OSError:
                        return
                if receiver.mode != "500" and self.headers.get("ce-type", "").endswith(".response"):
                    receiver.answered.append(self.headers["ce-id"])

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handle)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    instance = Receiver()
    yield instance
    instance.close()


@pytest.fixture(scope="module")
def http_server(model_repo: Path, receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """1 worker sending CloudEvents to the receiver, with a queue of 4 records."""
    repo = tmp_path_factory.mktemp("payload-http-models")
    shutil.copytree(model_repo / "mlp" / "1", repo / "logged" / "1")
    run_dir = tmp_path_factory.mktemp("payload-http-run")
    (run_dir / "models.toml").write_text("[defaults]\npayload_log = { sample = 1.0 }\n")
    server = Server(models_dir=repo, run_dir=run_dir, conf_path=run_dir / "models.toml", workers=1, env={
        "FORKSERVE_PAYLOAD_LOG": f"http://127.0.0.1:{receiver.port}/events", "FORKSERVE_PAYLOAD_LOG_QUEUE": "4"}).start()
    yield server
    server.stop()


def events_of(receiver: Receiver, request_id: str) -> list[tuple[dict[str, str], bytes]]:
    return wait_until(lambda: (found := [e for e in receiver.events if e[0].get("ce-id") == request_id])[1:] and found,
                      15, f"both events of {request_id}")


def test_cloudevents_headers_and_bodies(http_server: Server, receiver: Receiver) -> None:
    body = {"instances": [ROW]}
    response = http_server.post("/v1/models/logged:predict", json=body, headers={"X-Request-Id": "ce-1"})
    assert response.status_code == 200
    (request_headers, request_body), (response_headers, response_body) = events_of(receiver, "ce-1")
    for headers in (request_headers, response_headers):
        assert headers["ce-specversion"] == "1.0" and headers["ce-id"] == "ce-1"
        assert headers["ce-source"].startswith("http://") and headers["ce-source"].endswith("/forkserve")
        assert headers["ce-inferenceservicename"] == "logged" and headers["ce-modelversion"] == "1"
        assert headers["content-type"] == "application/json" and headers["ce-time"].endswith("Z")
    assert request_headers["ce-type"] == "org.kubeflow.serving.inference.request"
    assert response_headers["ce-type"] == "org.kubeflow.serving.inference.response"
    assert response_headers["ce-statuscode"] == "200"
    assert json.loads(request_body) == body and json.loads(response_body) == response.json()


def timed_requests(server: Server, count: int, prefix: str) -> float:
    """Send `count` predicts one after another; every one must answer 200; the slowest one's seconds."""
    slowest = 0.0
    for number in range(count):
        started = time.monotonic()
        response = server.post("/v1/models/logged:predict", json={"instances": [ROW]}, headers={"X-Request-Id": f"{prefix}-{number}"})
        assert response.status_code == 200
        slowest = max(slowest, time.monotonic() - started)
    return slowest


def dropped(server: Server, reason: str) -> float:
    return value(samples(server), "forkserve_payload_log_dropped_total", reason=reason)


@pytest.mark.parametrize("mode", ["500", "hang", "closed"])
def test_a_failing_receiver_never_fails_or_slows_a_request(http_server: Server, receiver: Receiver, mode: str) -> None:
    before = {reason: dropped(http_server, reason) for reason in ("write_failed", "queue_full")}
    receiver.mode, receiver.release = mode, threading.Event()
    if mode == "closed":
        receiver.close()  # connection refused from now on
    try:
        assert timed_requests(http_server, 20, f"mode-{mode}") < 0.5
        reason = "queue_full" if mode == "hang" else "write_failed"  # a hanging receiver holds the writer: the queue fills
        wait_until(lambda: dropped(http_server, reason) > before[reason], 15, f"{reason} counted")
    finally:
        receiver.release.set()
        receiver.mode = "ok"
        if mode == "closed":
            receiver.open()
    sent = iter(range(1000))

    def recovered() -> bool:  # the queue may still be full of the failed mode's records: send until one gets through
        assert http_server.post("/v1/models/logged:predict", json={"instances": [ROW]},
                                headers={"X-Request-Id": f"after-{mode}-{next(sent)}"}).ok
        return any(e[0].get("ce-id", "").startswith(f"after-{mode}-") for e in receiver.events)

    wait_until(recovered, 15, "the writer to recover", interval=0.2)


def test_a_bad_sink_stops_the_master_at_start_with_one_line(tmp_path: Path) -> None:
    server = Server(models_dir=tmp_path / "models", run_dir=tmp_path / "run", workers=1,
                    env={"FORKSERVE_PAYLOAD_LOG": "s3://bucket/payloads"}).start(timeout=0)
    assert server.process is not None and server.process.wait(60) != 0
    assert "FORKSERVE_PAYLOAD_LOG must be file:DIR, http://URL or https://URL, got 's3://bucket/payloads'" in server.log()


def test_a_grpc_predict_is_logged_with_its_tensors_as_lists(http_server: Server, receiver: Receiver) -> None:
    grpc = pytest.importorskip("grpc")
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    from server.protocols.tfserving import tensor_proto

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "logged"
    tensor_proto.from_array(np.asarray([ROW], dtype=np.float32), request.inputs["features"], "features")
    with grpc.insecure_channel(http_server.grpc_target) as channel:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10,
                                                                           metadata=[("x-request-id", "grpc-1")])
    (request_headers, request_body), (response_headers, response_body) = events_of(receiver, "grpc-1")
    assert request_headers["ce-endpoint"] == "tfserving_predict" and response_headers["ce-statuscode"] == "200"
    assert json.loads(request_body) == {"inputs": {"features": [ROW]}}
    assert len(json.loads(response_body)["outputs"]["logits"][0]) > 0


def test_a_receivers_redirect_is_a_failed_write_never_followed(http_server: Server, receiver: Receiver) -> None:
    with HostileReceiver() as elsewhere:
        receiver.mode, receiver.location = "redirect", elsewhere.url
        try:
            failed = dropped(http_server, "write_failed")
            for number in range(2):
                assert http_server.post("/v1/models/logged:predict", json={"instances": [ROW]},
                                        headers={"X-Request-Id": f"redirected-{number}"}).ok
            wait_until(lambda: dropped(http_server, "write_failed") >= failed + 2, 15, "the 307s counted as failed writes")
        finally:
            receiver.mode = "ok"
        assert elsewhere.posts == 0  # the payload never went where the receiver pointed


def test_a_receivers_huge_answer_costs_the_worker_no_memory(http_server: Server, receiver: Receiver) -> None:
    [pid] = http_server.worker_pids()
    receiver.mode = "huge"
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the RSS now
    rss = memory_kib(pid, "VmRSS")
    started = time.monotonic()
    for number in range(2):
        assert http_server.post("/v1/models/logged:predict", json={"instances": [ROW]},
                                headers={"X-Request-Id": f"huge-{number}"}).ok
    events_of(receiver, "huge-1")
    receiver.mode = "ok"
    assert http_server.post("/v1/models/logged:predict", json={"instances": [ROW]},
                            headers={"X-Request-Id": "after-huge"}).ok
    events_of(receiver, "after-huge")  # one writer, in order: the huge answers are behind it
    assert (memory_kib(pid, "VmHWM") - rss) < 64 * 1024, "the worker read the 256 MiB answers"
    assert time.monotonic() - started < 10


def test_a_stopping_worker_drains_its_queue_then_counts_what_is_left(http_server: Server, receiver: Receiver) -> None:
    reasons = ("shutdown", "queue_full", "write_failed")
    before = {reason: dropped(http_server, reason) for reason in reasons}
    [pid] = http_server.worker_pids()
    # 4 POSTs (2 records) answered in 0.3 s each, then the receiver hangs: the drain's 2 s end on a write in flight
    receiver.mode, receiver.release, receiver.slow_answers = "slow", threading.Event(), 4
    sent = 8  # one being written, 4 queued (FORKSERVE_PAYLOAD_LOG_QUEUE), 3 dropped at once
    try:
        for number in range(sent):
            assert http_server.post("/v1/models/logged:predict", json={"instances": [ROW]},
                                    headers={"X-Request-Id": f"drain-{number}"}).ok
        http_server.restart_worker()
    finally:
        receiver.release.set()
        receiver.mode = "ok"
    after = settled_samples(http_server, lambda scrape: value(scrape, "forkserve_payload_log_dropped_total",
                                                              reason="shutdown") > before["shutdown"], "shutdown counted")
    lost = {reason: value(after, "forkserve_payload_log_dropped_total", reason=reason) - before[reason] for reason in reasons}
    arrived = {request_id for request_id in receiver.answered if request_id.startswith("drain-")}
    assert len(arrived) + sum(lost.values()) == sent, (arrived, lost)
    assert len(arrived) >= 1 and lost["shutdown"] >= 1
    lines = [line for line in http_server.log().splitlines() if f"forkserve worker {pid} stopped with" in line]
    assert len(lines) == 1 and f"with {int(lost['shutdown'])} payload records not written" in lines[0], lines
