"""Hostile gRPC clients against a real server: calls that never send their message, more calls than a worker serves, junk bytes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest
import tensorflow as tf
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.support.harness import Server
from tests.support.metrics import samples, settled_samples, value
from tests.support.models import copy_models

REFUSED = "forkserve_grpc_refused_calls_total"

PREDICT = "/tensorflow.serving.PredictionService/Predict"
RECEIVE_TIMEOUT = 2  # FORKSERVE_CLIENT_TIMEOUT: how long a call may take to send its message
MAX_CALLS = 3  # FORKSERVE_GRPC_MAX_CALLS: calls at work at once in the one worker


def predict(model: str, name: str, array: np.ndarray) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    return request


MLP = predict("mlp", "features", np.full((2, 20), 0.5, np.float32))
SLOW = predict("slow", "image", np.zeros((2, 192, 192, 3), np.float32))  # 2 rows, one at a time: 0.2-0.6 s


@pytest.fixture(scope="module")
def server(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """1 worker (32 threads) over mlp and slow; a call may take 2 s to send its message; 3 calls at work at once."""
    repo = copy_models(model_repo, tmp_path_factory.mktemp("grpc-hostile-models"), "mlp", "slow")
    run_dir = tmp_path_factory.mktemp("grpc-hostile-run")
    conf = run_dir / "models.toml"
    conf.write_text("[models.slow]\nmax_batch_size = 1\nmax_queue_rows = 64\n")
    instance = Server(models_dir=repo, run_dir=run_dir, conf_path=conf, workers=1,
                      env={"FORKSERVE_CLIENT_TIMEOUT": str(RECEIVE_TIMEOUT), "FORKSERVE_GRPC_MAX_CALLS": str(MAX_CALLS)}).start()
    yield instance
    instance.stop()


@pytest.fixture()
def channel(server: Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_target) as instance:
        yield instance


def stalled_calls(channel: grpc.Channel, count: int, release: threading.Event) -> list[grpc.Future]:
    """`count` Predict calls that send their headers and then nothing until `release` is set (a client that stalls)."""

    def nothing() -> Iterator[bytes]:
        release.wait(60)
        return
        yield b""  # a generator that never yields a message

    stub = channel.stream_unary(PREDICT, request_serializer=None, response_deserializer=None)
    return [stub.future(nothing(), timeout=60) for _ in range(count)]


def test_calls_that_never_send_their_message_hold_no_thread_and_end_at_the_receive_deadline(
        server: Server, channel: grpc.Channel) -> None:
    """More stalled calls than the worker has threads: a new client's Predict and health Check answer at once."""
    release = threading.Event()
    stalled_channel = grpc.insecure_channel(server.grpc_target, options=[("grpc.primary_user_agent", "stalling")])
    before = value(samples(server), REFUSED, reason="receive_timeout")
    try:
        started = time.monotonic()
        calls = stalled_calls(stalled_channel, 40, release)  # the worker has 32 pool threads
        health = health_pb2_grpc.HealthStub(channel)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        assert stub.Predict(MLP, timeout=5).outputs["logits"].tensor_shape.dim[0].size == 2
        errors = [call.exception(timeout=30) for call in calls]
        ended = time.monotonic() - started
        assert {error.code() for error in errors} == {grpc.StatusCode.DEADLINE_EXCEEDED}, errors[0]
        assert f"did not arrive within {RECEIVE_TIMEOUT}s" in errors[0].details()
        assert ended < RECEIVE_TIMEOUT + 8  # the server's deadline, not the client's 60 s
        assert stub.Predict(MLP, timeout=5).model_spec.name == "mlp"
        settled_samples(server, lambda scrape: value(scrape, REFUSED, reason="receive_timeout") == before + 40,
                        "the 40 calls counted as refused for their receive deadline")
    finally:
        release.set()
        stalled_channel.close()


def test_calls_beyond_the_worker_s_limit_are_refused_at_once_and_the_others_served(
        server: Server, channel: grpc.Channel) -> None:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    stub.Predict(SLOW, timeout=60)  # warm, and proof that one call fits
    before = value(samples(server), REFUSED, reason="busy")
    started = time.monotonic()
    futures = [stub.Predict.future(SLOW, timeout=60) for _ in range(8)]
    health = health_pb2_grpc.HealthStub(channel)  # answered from capacity no call takes, while the slow calls work
    assert health.Check(health_pb2.HealthCheckRequest(service="slow"), timeout=2).status == health_pb2.HealthCheckResponse.SERVING
    assert not all(future.done() for future in futures)
    refused: list[float] = []
    answered = 0
    for future in futures:
        error = future.exception(timeout=60)
        if error is None:
            answered += 1
            continue
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        assert f"at its limit of {MAX_CALLS} gRPC calls at once" in error.details()
        refused.append(time.monotonic() - started)
    assert answered >= MAX_CALLS and len(refused) >= 8 - MAX_CALLS - 1, (answered, refused)
    settled_samples(server, lambda scrape: value(scrape, REFUSED, reason="busy") == before + len(refused),
                    "the refused calls counted as busy")


def test_bytes_that_are_not_a_request_message_are_invalid_argument(server: Server, channel: grpc.Channel) -> None:
    call = channel.unary_unary(PREDICT, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as caught:
        call(b"\xff\xff\xff\xff", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid tensorflow.serving.PredictRequest message" in caught.value.details()
    settled_samples(server, lambda scrape: value(scrape, REFUSED, reason="invalid_message") == 1,
                    "the junk counted as an invalid message")
