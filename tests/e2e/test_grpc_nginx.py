"""gRPC through the shipped conf/nginx-grpc.conf (real nginx, HTTP/2 cleartext both ways) in front of a real forkserve.

The clients are the unmodified tensorflow-serving-api and tritonclient.grpc (this module imports
tritonclient, so it never imports server.protocols.v2.protos).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest
import tensorflow as tf
import tritonclient.grpc as triton
from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc
from tritonclient.utils import InferenceServerException

from server.settings import DEFAULT_MAX_BODY_BYTES
from tests.support.grpc_traffic import GrpcTraffic
from tests.support.harness import ROOT, Server, free_port, wait_until
from tests.support.models import copy_models
from tests.support.nginx import Nginx

FEATURES = np.array([[0.5] * 20, [-0.25] * 20], dtype=np.float32)
CLIENTS = 8  # half TF Serving Predict, half V2 ModelInfer, each with its own channel to nginx
MIN_SECONDS = 20


@pytest.fixture(scope="module")
def fleet(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Nginx]]:
    """A 2-worker forkserve over half_plus_two and mlp (version 1), its gRPC port behind conf/nginx-grpc.conf."""
    repo = copy_models(model_repo, tmp_path_factory.mktemp("grpc-nginx-models"), "half_plus_two", "mlp")
    server = Server(models_dir=repo, run_dir=tmp_path_factory.mktemp("grpc-nginx-run"), workers=2,
                    env={"FORKSERVE_POLL_INTERVAL": "0.5", "FORKSERVE_BOOT_TIMEOUT": "90"}).start()
    nginx = Nginx(tmp_path_factory.mktemp("nginx-grpc"), [server.grpc_port], conf_name="nginx-grpc.conf")
    yield server, nginx
    nginx.stop()
    server.stop()


def tfserving_predict(target: str, model: str, inputs: dict[str, np.ndarray],
                      metadata: tuple[tuple[str, str], ...] = ()) -> tuple[predict_pb2.PredictResponse, dict[str, str]]:
    """TF Serving's Predict over a new channel: the response and the trailing metadata."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response, call = stub.Predict.with_call(request, timeout=30, metadata=metadata)
    return response, dict(call.trailing_metadata())


def tfserving_error(target: str, model: str) -> grpc.RpcError:
    """The error a Predict of `model` fails with."""
    with pytest.raises(grpc.RpcError) as failed:
        tfserving_predict(target, model, {"x": np.array([1.0], dtype=np.float32)})
    return failed.value


def triton_infer(client: triton.InferenceServerClient, model: str = "mlp") -> triton.InferResult:
    """V2 ModelInfer of FEATURES (tritonclient.grpc always sends raw_input_contents)."""
    features = triton.InferInput("features", list(FEATURES.shape), "FP32")
    features.set_data_from_numpy(FEATURES)
    return client.infer(model, [features], outputs=[triton.InferRequestedOutput("logits")], client_timeout=30)


def test_tfserving_and_v2_clients_get_the_same_answers_through_nginx_as_directly(fleet: tuple[Server, Nginx]) -> None:
    server, nginx = fleet
    halves = {"x": np.array([1.0, 2.0, 5.0], dtype=np.float32)}
    direct, _ = tfserving_predict(server.grpc_target, "half_plus_two", halves)
    proxied, trailing = tfserving_predict(nginx.grpc_target, "half_plus_two", halves, (("x-request-id", "grpc-nginx-1"),))
    assert tf.make_ndarray(proxied.outputs["y"]).tolist() == tf.make_ndarray(direct.outputs["y"]).tolist() == [2.5, 3.0, 4.5]
    assert proxied.model_spec == direct.model_spec
    assert trailing["x-request-id"] == "grpc-nginx-1" and trailing["x-model-version"] == str(direct.model_spec.version.value)
    _, trailing = tfserving_predict(nginx.grpc_target, "half_plus_two", halves)
    assert re.fullmatch(r"[0-9a-f]{32}", trailing["x-request-id"])  # nginx's $request_id, handed to forkserve and echoed

    through, straight = triton.InferenceServerClient(nginx.grpc_target), triton.InferenceServerClient(server.grpc_target)
    try:
        answers = [triton_infer(client) for client in (through, straight)]
        assert np.array_equal(answers[0].as_numpy("logits"), answers[1].as_numpy("logits"))
        assert answers[0].as_numpy("logits").shape == (2, 2)
        assert answers[0].get_response().model_version == answers[1].get_response().model_version == "1"
        assert through.is_server_ready() and through.is_model_ready("mlp")
        assert through.get_model_metadata("mlp") == straight.get_model_metadata("mlp")
    finally:
        through.close()
        straight.close()
    log = nginx.access_log()
    assert '"POST /tensorflow.serving.PredictionService/Predict HTTP/2.0" 200' in log
    assert "rid=grpc-nginx-1 grpc=0 version=123" in log
    assert re.search(r'"POST /inference\.GRPCInferenceService/ModelInfer HTTP/2\.0" 200 .* grpc=0 version=1\n', log)


def test_an_unknown_model_s_not_found_passes_through_nginx_with_its_message(fleet: tuple[Server, Nginx]) -> None:
    server, nginx = fleet
    proxied, direct = tfserving_error(nginx.grpc_target, "nope"), tfserving_error(server.grpc_target, "nope")
    assert proxied.code() == direct.code() == grpc.StatusCode.NOT_FOUND
    assert proxied.details() == direct.details() and "nope" in proxied.details()
    messages = []
    for target in (nginx.grpc_target, server.grpc_target):
        client = triton.InferenceServerClient(target)
        try:
            with pytest.raises(InferenceServerException) as failed:
                triton_infer(client, model="nope")
        finally:
            client.close()
        assert failed.value.status() == "StatusCode.NOT_FOUND"
        messages.append(failed.value.message())
    assert messages[0] == messages[1] and "nope" in messages[0]
    assert re.search(r"ModelInfer HTTP/2\.0\" 200 .* grpc=5 version=-\n", nginx.access_log())


def test_the_repository_calls_and_the_config_reload_are_refused_through_nginx(fleet: tuple[Server, Nginx]) -> None:
    """Admin calls: PERMISSION_DENIED through the proxy, answered on the server's own port."""
    server, nginx = fleet
    proxied = triton.InferenceServerClient(nginx.grpc_target)
    direct = triton.InferenceServerClient(server.grpc_target)
    try:
        for call in (proxied.get_model_repository_index, lambda: proxied.unload_model("mlp")):
            with pytest.raises(InferenceServerException) as refused:
                call()
            assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
            assert "not served through this proxy" in refused.value.message()
        assert {"name": "mlp", "version": "1", "state": "READY"} in direct.get_model_repository_index(as_json=True)["models"]
    finally:
        proxied.close()
        direct.close()
    with grpc.insecure_channel(nginx.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as reload_refused:
            model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest(
                model_management_pb2.ReloadConfigRequest(), timeout=30)
    assert reload_refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "not served through this proxy" in reload_refused.value.details()


def test_nginx_s_own_failures_reach_clients_as_grpc_statuses(fleet: tuple[Server, Nginx], tmp_path: Path) -> None:
    """No upstream: UNAVAILABLE; an upstream that never answers: DEADLINE_EXCEEDED; a body over the limit: RESOURCE_EXHAUSTED."""
    nobody = Nginx(tmp_path / "nobody", [free_port()], conf_name="nginx-grpc.conf")
    try:
        refused = tfserving_error(nobody.grpc_target, "half_plus_two")
    finally:
        nobody.stop()
    assert refused.code() == grpc.StatusCode.UNAVAILABLE and refused.details() == "nginx: no forkserve worker could be reached"

    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts the connection, never says a word
        hung = Nginx(tmp_path / "hung", [silent.getsockname()[1]], conf_name="nginx-grpc.conf",
                     edits={"grpc_read_timeout 35s;": "grpc_read_timeout 1s;"})
        try:
            started = time.monotonic()
            waited = tfserving_error(hung.grpc_target, "half_plus_two")
            assert time.monotonic() - started < 10
        finally:
            hung.stop()
    assert waited.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "grpc_read_timeout" in waited.details()

    # nginx's limit equals forkserve's, whose own RESOURCE_EXHAUSTED usually comes first; a copy with a
    # 1 MiB limit shows nginx's answer in the same status.
    small = Nginx(tmp_path / "small", [fleet[0].grpc_port], conf_name="nginx-grpc.conf",
                  edits={"client_max_body_size 32m;": "client_max_body_size 1m;"})
    try:
        with pytest.raises(grpc.RpcError) as failed:
            tfserving_predict(small.grpc_target, "half_plus_two", {"x": np.ones(512 * 1024, dtype=np.float32)})
    finally:
        small.stop()
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "client_max_body_size" in failed.value.details()
    conf = (ROOT / "conf" / "nginx-grpc.conf").read_text()
    assert int(re.search(r"client_max_body_size (\d+)m;", conf)[1]) * 1024 * 1024 == DEFAULT_MAX_BODY_BYTES


def test_a_publish_under_grpc_load_through_nginx_fails_no_rpc(fleet: tuple[Server, Nginx], model_repo: Path) -> None:
    server, nginx = fleet
    traffic = GrpcTraffic([("triton" if i % 2 else "tfs", nginx.grpc_target) for i in range(CLIENTS)])
    logged_before = len(nginx.access_log())
    started = time.monotonic()
    traffic.start()
    try:
        wait_until(lambda: len(traffic.answers) > 100, 60, "gRPC traffic through nginx")
        publish = subprocess.run(
            [sys.executable, "-m", "server", "publish", "mlp", str(model_repo / "mlp" / "1" / "model.keras"),
             "--models", str(server.models_dir)],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )
        assert publish.returncode == 0 and publish.stdout.strip() == "2", publish.stderr
        wait_until(lambda: server.all_serve("mlp", [2]), 120, "the rollout to version 2")
        rolled_out = time.monotonic()
        wait_until(lambda: time.monotonic() - started >= MIN_SECONDS and time.monotonic() - rolled_out > 3, 60,
                   "the minimum traffic time", interval=0.5)
    finally:
        traffic.finish()
    answers = traffic.answers
    assert len(answers) > CLIENTS * MIN_SECONDS, len(answers)
    logged = nginx.access_log()[logged_before:]
    # On failure: who answered it (nginx itself, or a worker: upstream=) and how.
    assert traffic.failures() == [], [line for line in logged.splitlines() if " grpc=0 " not in line]
    assert {a.version for a in answers} == {"1", "2"}
    late = [a for a in answers if a.started > rolled_out + 1.0]
    assert late and {a.version for a in late} == {"2"}
    assert set(re.findall(r" grpc=(\S+) ", logged)) == {"0"}
