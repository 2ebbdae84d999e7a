"""gRPC clients of the unmodified libraries (tensorflow-serving-api, tritonclient.grpc) that record every answer.

Importing this imports tritonclient, so a module that does never imports server.protocols.v2.protos.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
import tensorflow as tf
import tritonclient.grpc as triton
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tritonclient.utils import InferenceServerException

FEATURES = np.array([[0.5] * 20, [-0.25] * 20], dtype=np.float32)  # two rows for mlp


@dataclass
class Answer:
    """One call: when it started and ended, which client made it, and how it went."""

    started: float
    ended: float
    client: str  # "tfs<n>" or "triton<n>"
    code: str  # "OK", the gRPC status name (TF Serving's client) or tritonclient's status ("StatusCode.UNAVAILABLE")
    version: str = ""  # the model version that answered
    worker: str = ""  # x-forkserve-worker (TF Serving's client only: tritonclient does not expose trailing metadata)
    details: str = ""


def loopback_clients(port: int, per_library: int, with_triton: bool = True) -> list[tuple[str, str]]:
    """(library, target) of each client, each on its own loopback address: grpcio shares one connection between a
    process's channels to the same address with the same arguments, and separate clients would not."""
    clients = [("tfs", f"127.0.0.{index + 1}:{port}") for index in range(per_library)]
    if with_triton:
        clients += [("triton", f"127.0.0.{index + 1 + per_library}:{port}") for index in range(per_library)]
    return clients


@dataclass
class GrpcTraffic:
    """One thread per client, each on one channel kept until stop, calling mlp `pause` seconds apart; every answer recorded."""

    clients: list[tuple[str, str]]  # (library: "tfs" or "triton", target)
    stop: threading.Event = field(default_factory=threading.Event)
    answers: list[Answer] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)
    pause: float = 0.05  # each client's think time between calls, as tests.support.traffic.Traffic's

    def _record(self, answer: Answer) -> None:
        with self.lock:
            self.answers.append(answer)

    def _tfserving(self, name: str, target: str) -> None:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "mlp"
        request.inputs["features"].CopyFrom(tf.make_tensor_proto(FEATURES))
        with grpc.insecure_channel(target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    response, call = stub.Predict.with_call(request, timeout=30)
                    self._record(Answer(started, time.monotonic(), name, "OK", str(response.model_spec.version.value),
                                        dict(call.trailing_metadata())["x-forkserve-worker"]))
                except grpc.RpcError as exc:
                    self._record(Answer(started, time.monotonic(), name, exc.code().name, details=exc.details() or ""))
                self.stop.wait(self.pause)

    def _triton(self, name: str, target: str) -> None:
        client = triton.InferenceServerClient(target)
        features = triton.InferInput("features", list(FEATURES.shape), "FP32")
        features.set_data_from_numpy(FEATURES)
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    version = client.infer("mlp", [features], client_timeout=30).get_response().model_version
                    self._record(Answer(started, time.monotonic(), name, "OK", version))
                except InferenceServerException as exc:
                    self._record(Answer(started, time.monotonic(), name, str(exc.status() or "?"), details=exc.message()))
                self.stop.wait(self.pause)
        finally:
            client.close()

    def start(self) -> None:
        """Start every client's thread."""
        counts: dict[str, int] = {}
        for library, target in self.clients:
            index = counts[library] = counts.get(library, -1) + 1
            loop = self._tfserving if library == "tfs" else self._triton
            self.threads.append(threading.Thread(target=loop, args=(f"{library}{index}", target), daemon=True))
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        """Stop the clients and wait for their last answers."""
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def between(self, start: float, end: float) -> list[Answer]:
        """Calls that overlapped [start, end]."""
        with self.lock:
            return [a for a in self.answers if a.ended >= start and a.started <= end]

    def failures(self) -> list[Answer]:
        with self.lock:
            return [a for a in self.answers if a.code != "OK"]
