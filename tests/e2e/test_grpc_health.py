"""grpc.health.v1.Health (Kubernetes' gRPC probe) and server reflection against a real server, with grpcio's own clients."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from tests.support.models import copy_models
from tests.support.harness import Server

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def server(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """2 workers: `mlp` serves; `corrupt` (its only version fails) and `flat` (no version directory) have nothing to serve."""
    repo = copy_models(model_repo, tmp_path_factory.mktemp("grpc-health-models"), "mlp", "corrupt")
    (repo / "flat").mkdir()
    (repo / "flat" / "model.keras").write_bytes((repo / "mlp" / "1" / "model.keras").read_bytes())
    instance = Server(models_dir=repo, run_dir=tmp_path_factory.mktemp("grpc-health-run"), workers=2).start()
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def channel(server: Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_target) as instance:
        yield instance


@pytest.mark.parametrize("service,status", [("", SERVING), ("mlp", SERVING), ("corrupt", NOT_SERVING), ("flat", NOT_SERVING)])
def test_check_the_server_and_each_model(channel: grpc.Channel, server: Server, service: str, status: int) -> None:
    assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == status
    ready = server.get("/readyz").json()
    if service:  # what /readyz says of the model
        assert bool(ready["models"][service]["serving"]) == (status == SERVING)
    else:
        assert ready["status"] == "ready"


def test_an_unknown_name_is_not_found(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in caught.value.details()


def test_reflection_lists_the_services_and_resolves_a_method_s_types(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {"tensorflow.serving.PredictionService", "tensorflow.serving.ModelService", "inference.GRPCInferenceService",
            "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services, services
    pool = descriptor_pool.DescriptorPool(database)  # NOTE: a pool of its own, fed by the server only
    infer = pool.FindServiceByName("inference.GRPCInferenceService").FindMethodByName("ModelInfer")
    assert infer.input_type.full_name == "inference.ModelInferRequest"
    assert infer.input_type.fields_by_name["raw_input_contents"].number == 7
    predict = pool.FindServiceByName("tensorflow.serving.PredictionService").FindMethodByName("Predict")
    assert predict.input_type.full_name == "tensorflow.serving.PredictRequest"
    assert predict.input_type.fields_by_name["inputs"].message_type.fields_by_name["value"].message_type.full_name == "tensorflow.TensorProto"
    status = pool.FindServiceByName("tensorflow.serving.ModelService").FindMethodByName("GetModelStatus")
    assert status.output_type.full_name == "tensorflow.serving.GetModelStatusResponse"
    check = pool.FindServiceByName("grpc.health.v1.Health").FindMethodByName("Check")
    assert check.input_type.full_name == "grpc.health.v1.HealthCheckRequest"


def test_a_stopping_worker_turns_not_serving_before_it_goes(channel: grpc.Channel, server: Server) -> None:
    """Last in this module: it stops the server. Watch streams hear NOT_SERVING as the workers' graceful stop begins."""
    stub = health_pb2_grpc.HealthStub(channel)
    watches = {name: stub.Watch(health_pb2.HealthCheckRequest(service=name), timeout=60) for name in ("", "mlp")}
    assert {name: next(stream).status for name, stream in watches.items()} == {"": SERVING, "mlp": SERVING}
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)  # the master passes it to its workers (gunicorn's graceful stop)
    try:
        assert {name: next(stream).status for name, stream in watches.items()} == {"": NOT_SERVING, "mlp": NOT_SERVING}
    finally:
        for stream in watches.values():
            stream.cancel()  # the streams are RPCs in flight: let the workers finish now
    assert server.stop() == 0
