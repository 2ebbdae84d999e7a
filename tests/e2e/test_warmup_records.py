"""TF Serving's warm-up records with a real server, gRPC client and command line.

Versions of TF Serving's half_plus_two carry `assets.extra/tf_serving_warmup_requests` files written
with tensorflow-serving-api's messages; a worker replays them at load (and in a rollout), and
`python -m server validate` / `publish` replay them in their checking child.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from server.models.warmup_records import WARMUP_FILE
from server.target import read_failed
from tests.support.cli import forkserve
from tests.support.harness import Server, wait_until
from tests.support.models import TFSERVING_TESTDATA
from tests.support.traffic import Traffic

HALF_PLUS_TWO = TFSERVING_TESTDATA / "saved_model_half_plus_two_cpu" / "00000123"
WRONG_DTYPE = "input 'x' is DT_INT32; signature 'serving_default' takes DT_FLOAT"
WRONG_NAME = "missing input(s) ['x']; signature 'serving_default' takes ['x']"


def predict_request(name: str = "x", dtype: Any = tf.float32) -> predict_pb2.PredictRequest:
    """TF Serving's PredictRequest for half_plus_two, as its clients build it (tf.make_tensor_proto)."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "hp2"
    values = [[1.0], [2.0], [5.0]] if dtype == tf.float32 else [[1], [2], [5]]
    request.inputs[name].CopyFrom(tf.make_tensor_proto(values, dtype=dtype))
    return request


def good_logs() -> list[prediction_log_pb2.PredictionLog]:
    """A predict, a classify and a regress record, all of which half_plus_two answers."""
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.signature_name = "classify_x_to_y"
    classify.input.example_list.examples.add().features.feature["x"].float_list.value.append(1.0)
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.signature_name = "regress_x_to_y"
    regress.input.example_list.examples.add().features.feature["x"].float_list.value.append(2.0)
    return [
        prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=predict_request())),
        prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(request=classify)),
        prediction_log_pb2.PredictionLog(regress_log=prediction_log_pb2.RegressLog(request=regress)),
    ]


def bad_logs(request: predict_pb2.PredictRequest) -> list[prediction_log_pb2.PredictionLog]:
    """A good record, then `request` as record 2."""
    return [good_logs()[0], prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))]


def version_with(target: Path, logs: list[prediction_log_pb2.PredictionLog]) -> Path:
    """half_plus_two at `target` with a warm-up file of `logs`."""
    shutil.copytree(HALF_PLUS_TWO, target)
    (target / WARMUP_FILE).parent.mkdir()
    with tf.io.TFRecordWriter(str(target / WARMUP_FILE)) as writer:
        for entry in logs:
            writer.write(entry.SerializeToString())
    return target


def reason(record: int, error: str) -> str:
    return f"{WARMUP_FILE}: record {record} (predict_log) was refused: {error}"


def status_of(server: Server, version: int) -> dict[str, Any]:
    """The version's model_version_status entry; {} while the server does not know it (404)."""
    answer = server.get(f"/v1/models/hp2/versions/{version}").json()
    return answer["model_version_status"][0] if "model_version_status" in answer else {}


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One worker over hp2: version 1 with 3 good records, version 2 whose record 2 has the wrong dtype."""
    repo = tmp_path_factory.mktemp("warmup-models")
    version_with(repo / "hp2" / "1", good_logs())
    version_with(repo / "hp2" / "2", bad_logs(predict_request(dtype=tf.int32)))
    server = Server(models_dir=repo, run_dir=tmp_path_factory.mktemp("warmup-run"), workers=1,
                    env={"FORKSERVE_POLL_INTERVAL": "0.5", "FORKSERVE_BOOT_TIMEOUT": "90",
                         "FORKSERVE_ROLLOUT_BACKOFF": "1"}).start()
    yield server
    server.stop()


def test_a_refused_record_fails_its_version_and_the_older_one_serves(warm: Server) -> None:
    log = warm.log()
    assert "model hp2 version 1 (savedmodel) loaded and warmed (" in log
    assert " calls, 3 warm-up records replayed) in " in log
    assert "model hp2 version 2 failed to load after" in log and reason(2, WRONG_DTYPE) in log
    # REST: version 2 is END with the reason, version 1 AVAILABLE and answering.
    failed = status_of(warm, 2)
    assert failed["state"] == "END"
    assert failed["status"]["error_message"] == f"failed to load: WarmupRecordFailed: {reason(2, WRONG_DTYPE)}"
    assert status_of(warm, 1)["state"] == "AVAILABLE"
    answer = warm.post("/v1/models/hp2:predict", json={"instances": [1.0, 2.0, 5.0]})
    assert answer.status_code == 200 and answer.json() == {"predictions": [2.5, 3.0, 4.5]}
    assert answer.headers["X-Model-Version"] == "1"
    refused = warm.post("/v1/models/hp2/versions/2:predict", json={"instances": [1.0]})
    assert refused.status_code == 503 and "END" in refused.json()["error"] and WRONG_DTYPE in refused.json()["error"]


def test_the_reason_is_the_error_a_grpc_client_gets_for_that_request(warm: Server) -> None:
    with grpc.insecure_channel(warm.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(predict_request(dtype=tf.int32), timeout=30)  # record 2 of version 2, sent to version 1
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and refused.value.details() == WRONG_DTYPE
        answer = stub.Predict(predict_request(), timeout=30)
        assert tf.make_ndarray(answer.outputs["y"]).reshape(-1).tolist() == [2.5, 3.0, 4.5]
        assert answer.model_spec.version.value == 1
        # The classify and regress records, sent by the client: the answers half_plus_two gives.
        _, classify, regress = good_logs()
        classify.classify_log.request.model_spec.name = regress.regress_log.request.model_spec.name = "hp2"
        classes = stub.Classify(classify.classify_log.request, timeout=30).result.classifications
        assert [c.score for c in classes[0].classes] == [2.5]
        assert [r.value for r in stub.Regress(regress.regress_log.request, timeout=30).result.regressions] == [3.0]
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "hp2", "version": {"value": 2}}), timeout=30)
    (entry,) = status.model_version_status
    assert entry.state == get_model_status_pb2.ModelVersionStatus.END and reason(2, WRONG_DTYPE) in entry.status.error_message


def test_a_rollout_fails_a_version_with_a_refused_record_and_serves_the_next_good_one(warm: Server) -> None:
    models = warm.models_dir / "hp2"
    traffic = Traffic(f"{warm.url}/v1/models/hp2:predict", body={"instances": [1.0, 2.0]})
    traffic.start(2)
    try:
        os.rename(version_with(models / ".incoming-3", bad_logs(predict_request(name="z"))), models / "3")
        wait_until(lambda: 3 in read_failed(warm.run_dir).get("hp2", {}), 120, "the master to mark version 3 failed")
        assert reason(2, WRONG_NAME) in read_failed(warm.run_dir)["hp2"][3].reason
        failed = status_of(warm, 3)  # every worker's answer once the master marked it
        assert failed["state"] == "END" and reason(2, WRONG_NAME) in failed["status"]["error_message"]
        os.rename(version_with(models / ".incoming-4", good_logs()), models / "4")
        wait_until(lambda: status_of(warm, 4).get("state") == "AVAILABLE"
                   and warm.post("/v1/models/hp2:predict", json={"instances": [1.0]}).headers["X-Model-Version"] == "4",
                   120, "version 4 to serve")
    finally:
        traffic.finish()
    assert traffic.failures() == [] and {a[2] for a in traffic.answers} <= {"1", "4"}
    assert "model hp2 version 4 (savedmodel) loaded and warmed (" in warm.log()


# --- publish and validate replay them too ---------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return forkserve(*args, conf=Path("/nonexistent/models.toml"))


def test_validate_and_publish_refuse_a_refused_record_and_accept_a_good_file(tmp_path: Path) -> None:
    bad = version_with(tmp_path / "bad", bad_logs(predict_request(dtype=tf.int32)))
    good = version_with(tmp_path / "good", good_logs())
    models = tmp_path / "models"
    for command in ("validate", "publish"):
        refused = _cli(command, "hp2", str(bad), "--models", str(models))
        assert refused.returncode == 1 and refused.stdout == "", refused.stderr
        assert refused.stderr.splitlines()[-1] == (f"{command}{' failed' if command == 'publish' else ''}: {bad}: "
                                                  f"invalid model: warm-up records: {reason(2, WRONG_DTYPE)}")
    assert not (models / "hp2" / "1").exists()
    accepted = _cli("validate", "hp2", str(good), "--models", str(models))
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["warmup_records"] == 3
    published = _cli("publish", "hp2", str(good), "--models", str(models))
    assert published.returncode == 0 and published.stdout.strip() == "1", published.stderr
    assert (models / "hp2" / "1" / WARMUP_FILE).read_bytes() == (good / WARMUP_FILE).read_bytes()


def test_a_corrupt_file_is_refused_with_the_record_it_breaks_at(tmp_path: Path) -> None:
    source = version_with(tmp_path / "corrupt", good_logs())
    data = bytearray((source / WARMUP_FILE).read_bytes())
    data[-6] ^= 0xFF  # in the last record's data: its CRC no longer matches
    (source / WARMUP_FILE).write_bytes(bytes(data))
    refused = _cli("validate", "hp2", str(source), "--models", str(tmp_path / "models"))
    assert refused.returncode == 1
    assert (f"invalid model: warm-up records: {WARMUP_FILE}: record 3 cannot be read (corrupted record at"
            in refused.stderr), refused.stderr
