"""The image run as TensorFlow Serving's is: MODEL_NAME and a model at /models/NAME, REST on 8501, gRPC on 8500.

`make image-test` runs this (FORKSERVE_IMAGE_TEST=1). The model is TF Serving's own half_plus_two
(tests/data/tfserving), with the command line TF Serving's docs give, but for the image's name.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Iterator

import grpc
import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.image.container import Container
from tests.support.harness import ROOT, wait_until

HALF_PLUS_TWO = ROOT / "tests" / "data" / "tfserving" / "saved_model_half_plus_two_cpu"  # its version 00000123


@pytest.fixture(scope="module")
def tfserving(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    """`docker run -v .../half_plus_two:/models/half_plus_two -e MODEL_NAME=half_plus_two IMAGE`, ports 8500 and 8501."""
    started = time.monotonic()
    running = Container(image, tmp_path_factory.mktemp("tfserving"), volumes={"/models/half_plus_two": HALF_PLUS_TWO},
                        env={"MODEL_NAME": "half_plus_two"}, tfserving=True)
    wait_until(running.ready, 300, "the container's /readyz on its REST port (8501)")
    print(f"ready {time.monotonic() - started:.1f} s after the start ({running.runner})", file=sys.stderr)
    yield running
    running.stop()


def test_tf_serving_s_rest_api_answers_on_8501(tfserving: Container) -> None:
    answer = requests.post(f"{tfserving.url}/v1/models/half_plus_two:predict", json={"instances": [1.0, 2.0, 5.0]}, timeout=30)
    assert answer.status_code == 200 and answer.json() == {"predictions": [2.5, 3.0, 4.5]}
    status = requests.get(f"{tfserving.url}/v1/models/half_plus_two", timeout=30).json()
    assert [(v["version"], v["state"]) for v in status["model_version_status"]] == [("123", "AVAILABLE")]


def test_tf_serving_s_grpc_api_answers_on_8500(tfserving: Container) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "half_plus_two"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0], [2.0], [5.0]], dtype=np.float32)))
    with grpc.insecure_channel(tfserving.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    assert tf.make_ndarray(response.outputs["y"]).ravel().tolist() == [2.5, 3.0, 4.5]
    assert response.model_spec.name == "half_plus_two" and response.model_spec.version.value == 123


def test_the_server_is_pid_1_as_the_image_s_user_and_healthy(tfserving: Container) -> None:
    """entrypoint -> tensorflow_model_server -> the launcher -> gunicorn, each exec'd: signals reach gunicorn."""
    pid = tfserving.pid()
    assert "gunicorn" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    assert re.search(r"^Uid:\s+10001\s", Path(f"/proc/{pid}/status").read_text(), re.M)
    assert tfserving.healthcheck() == 0  # the HEALTHCHECK finds /healthz on 8501


def test_sigterm_stops_it_with_exit_0(tfserving: Container) -> None:
    tfserving.terminate()
    assert tfserving.process.wait(60) == 0, tfserving.log.read_text()[-3000:]
