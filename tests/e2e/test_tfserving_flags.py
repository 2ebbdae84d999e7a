"""A server started with tensorflow_model_server's flags and its model config file, used as TF Serving's users do.

One 2-worker server, started by `python -m server tfserving --model_config_file=...` with TF Serving's
own test models anywhere on disk, is edited while it runs (a poll that adds a model and a label, a
malformed edit) and reloaded over gRPC (HandleReloadConfigRequest adding and dropping models under
load, a model that cannot load, a label on a version not served), with tensorflow-serving-api's
stubs unmodified. The tests run in order: each starts from the set the one before left.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
from google.protobuf import text_format
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from tests.support.harness import Server, wait_until
from tests.support.models import TFSERVING_TESTDATA

HALF = TFSERVING_TESTDATA / "saved_model_half_plus_two_cpu"
TF2 = TFSERVING_TESTDATA / "saved_model_half_plus_two_tf2_cpu"


def model_config(models: dict[str, Path], labels: dict[str, dict[str, int]] | None = None) -> str:
    """A ModelServerConfig's text form, as TF Serving's users write models.config."""
    entries = []
    for name, base_path in models.items():
        label_lines = "".join(f'    version_labels {{ key: "{label}" value: {version} }}\n'
                              for label, version in (labels or {}).get(name, {}).items())
        entries.append(f'  config {{\n    name: "{name}"\n    base_path: "{base_path}"\n'
                       f'    model_platform: "tensorflow"\n{label_lines}  }}\n')
    return "model_config_list {\n" + "".join(entries) + "}\n"


@pytest.fixture(scope="module")
def disk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TF Serving's test models copied where a model config names them (not a forkserve repository)."""
    root = tmp_path_factory.mktemp("tfserving-models")
    shutil.copytree(HALF, root / "exports" / "half_plus_two")
    shutil.copytree(TF2, root / "elsewhere" / "tf2")
    return root


@pytest.fixture(scope="module")
def server(disk: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    config = disk / "models.config"
    config.write_text(model_config({"half_plus_two": disk / "exports" / "half_plus_two"}))
    (disk / "batching.txt").write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 1500 }\n"
                                       "allowed_batch_sizes: 4\nallowed_batch_sizes: 8\n")
    (disk / "monitoring.txt").write_text('prometheus_config {\n  enable: true\n  path: "/monitoring/prometheus/metrics"\n}\n')
    run_dir = tmp_path_factory.mktemp("tfserving-run")
    instance = Server(disk / "unused", run_dir, tfserving_flags=[
        f"--model_config_file={config}", "--model_config_file_poll_wait_seconds=1", "--file_system_poll_wait_seconds=1",
        "--rest_api_timeout_in_ms=20000", "--enable_batching", f"--batching_parameters_file={disk / 'batching.txt'}",
        f"--monitoring_config_file={disk / 'monitoring.txt'}"])
    instance.start()
    yield instance
    instance.stop()


def predict(server: Server, model: str, values: list[float], label: str = "") -> list[float]:
    """TF Serving's Predict with its own stub, read the way its clients read it (float_val)."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if label:
        request.model_spec.version_label = label
    request.inputs["x"].CopyFrom(_tensor(values))
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    return list(response.outputs["y"].float_val)


def _tensor(values: list[float]) -> object:
    """A float TensorProto of `values` (the TF2 model takes exactly one)."""
    import tensorflow as tf

    return tf.make_tensor_proto(np.array(values, dtype=np.float32))


def reload(server: Server, text: str) -> model_management_pb2.ReloadConfigResponse:
    """HandleReloadConfigRequest with TF Serving's stub and the ModelServerConfig of `text`."""
    request = model_management_pb2.ReloadConfigRequest()
    text_format.Parse(text, request.config)
    with grpc.insecure_channel(server.grpc_target) as channel:
        return model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(request, timeout=300)


def status(server: Server, model: str) -> int:
    return requests.get(f"{server.url}/v1/models/{model}", timeout=10).status_code


def test_the_models_of_the_config_file_serve_to_tf_servings_clients(server: Server) -> None:
    assert predict(server, "half_plus_two", [1.0, 2.0, 5.0]) == [2.5, 3.0, 4.5]
    answer = server.post("/v1/models/half_plus_two:predict", json={"instances": [1.0, 2.0]})
    assert answer.json() == {"predictions": [2.5, 3.0]}
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "half_plus_two"
    with grpc.insecure_channel(server.grpc_target) as channel:
        statuses = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=30)
    assert [(s.version, s.state) for s in statuses.model_version_status] == [(123, 30)]  # AVAILABLE
    assert server.get("/readyz").status_code == 200
    assert "from TF Serving's model config" in server.log()


def test_the_batching_and_monitoring_files_apply(server: Server) -> None:
    config = server.get("/v2/models/half_plus_two/config").json()
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"] == {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 1500,
                                         "preserve_ordering": False}
    assert predict(server, "half_plus_two", [0.0]) == [2.0]
    counted = ':tensorflow:serving:request_count{model_name="half_plus_two",status="OK"}'
    # NOTE: polled: a worker's counts reach the files at its next flush (0.5 s), and either worker answers a scrape
    scraped = wait_until(lambda: (r := server.get("/monitoring/prometheus/metrics")).status_code == 200
                         and counted in r.text and r, 30, "TF Serving's request count at its metrics path")
    assert "forkserve_requests_total" in scraped.text


def test_a_poll_of_the_file_adds_a_model_and_a_label(server: Server, disk: Path) -> None:
    (disk / "models.config").write_text(model_config(
        {"half_plus_two": disk / "exports" / "half_plus_two", "tf2": disk / "elsewhere" / "tf2"},
        labels={"half_plus_two": {"stable": 123}}))
    wait_until(lambda: server.all_serve("tf2", [123]), 180, "every worker to serve the added model")
    assert predict(server, "tf2", [3.0]) == [3.5]
    assert predict(server, "half_plus_two", [4.0], label="stable") == [4.0]
    assert server.post("/v1/models/half_plus_two/labels/stable:predict", json={"instances": [2.0]}).json() == {
        "predictions": [3.0]}


def test_a_malformed_edit_is_named_with_line_and_column_and_the_models_keep_serving(server: Server, disk: Path) -> None:
    config = disk / "models.config"
    good = config.read_text()
    config.write_text(good.replace("base_path", "base_pth", 1))
    wait_until(lambda: f"{config}:4:5 : " in server.log(), 30, "the master to refuse the malformed file")
    assert "keeping the models configured before" in server.log()
    assert predict(server, "tf2", [1.0]) == [2.5] and status(server, "half_plus_two") == 200
    config.write_text(good)
    wait_until(lambda: "the model configuration is valid again" in server.log(), 30, "the file to be taken again")


def test_reload_adds_and_drops_models_under_load_without_a_failed_call(server: Server, disk: Path) -> None:
    shutil.copytree(HALF, disk / "third")
    failures: list[str] = []
    calls = [0]
    stop = threading.Event()

    def traffic() -> None:
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "tf2"
            request.inputs["x"].CopyFrom(_tensor([1.0]))
            while not stop.is_set():
                try:
                    if list(stub.Predict(request, timeout=30).outputs["y"].float_val) != [2.5]:
                        failures.append("wrong answer")
                except grpc.RpcError as exc:
                    failures.append(f"{exc.code()}: {exc.details()}")
                calls[0] += 1

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        answer = reload(server, model_config({"tf2": disk / "elsewhere" / "tf2", "third": disk / "third"}))
        assert answer.status.error_code == 0
        # every worker a client can reach serves it once the call answered (the caller's old one is leaving)
        assert all(predict(server, "third", [2.0]) == [3.0] for _ in range(10))
        wait_until(lambda: status(server, "half_plus_two") == 404, 180, "the dropped model to go")
        # NOTE: the rollout that drops it ends before the next test's reload: a call on a retiring worker answers 503
        wait_until(lambda: len(server.children()) == server.workers and server.all_serve("third", [123])
                   and not any(server.serving("half_plus_two").values()), 180, "the rollout dropping it to end")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert calls[0] > 50 and failures == []


def test_a_reload_whose_model_cannot_load_fails_and_the_set_before_keeps_serving(server: Server, disk: Path) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        reload(server, model_config({"tf2": disk / "elsewhere" / "tf2", "missing": disk / "nowhere"}))
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    assert "failed to load model missing: no version directory" in failed.value.details()
    assert predict(server, "third", [2.0]) == [3.0] and predict(server, "tf2", [3.0]) == [3.5]
    assert status(server, "missing") == 404


def test_a_reload_refuses_a_label_on_a_version_not_served_and_a_malformed_config(server: Server, disk: Path) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        reload(server, model_config({"tf2": disk / "elsewhere" / "tf2"}, labels={"tf2": {"canary": 124}}))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == ("Request to assign label to version 124 of model tf2, which is not currently "
                                       "available for inference")
    with pytest.raises(grpc.RpcError) as malformed:
        reload(server, 'model_config_list { config { name: "x" base_path: "relative" model_platform: "tensorflow" } }')
    assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Expected model x to have an absolute path or URI" in malformed.value.details()
    assert predict(server, "third", [2.0]) == [3.0]


def test_one_model_by_name_and_base_path_and_a_wrong_path_never_looks_ready(tmp_path: Path) -> None:
    good = Server(tmp_path / "unused", tmp_path / "good", workers=1,
                  tfserving_flags=["--model_name=half", f"--model_base_path={HALF}"]).start()
    try:
        assert predict(good, "half", [2.0]) == [3.0] and good.get("/readyz").status_code == 200
    finally:
        good.stop()
    wrong = Server(tmp_path / "unused", tmp_path / "wrong", workers=1,
                   tfserving_flags=["--model_name=half", f"--model_base_path={tmp_path / 'typo'}"]).start()
    try:
        assert wrong.get("/readyz").status_code == 503
        assert "half" in wrong.get("/readyz").text
    finally:
        wrong.stop()


def test_the_tensors_are_what_tensorflow_reads(server: Server) -> None:
    """The typed output tf.make_ndarray reads, as TF Serving's clients do."""
    import tensorflow as tf

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "tf2"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([2.0], dtype=np.float32)))
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    assert tf.make_ndarray(response.outputs["y"]).tolist() == [3.0]
