"""Ask the demo "digits" model what examples/digit.png shows over gRPC, with TensorFlow Serving's own client.

    .venv/bin/python examples/predict_digit_grpc.py [IMAGE] [--target 127.0.0.1:8500]

Sends the PNG's bytes as a DT_STRING tensor to version 1 (the plain model: forkserve decodes the
image as REST's {"b64": ...}) and prints the digit and its probability. gRPC bypasses version 2's
handler, so it asks version 1.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import grpc  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", nargs="?", default=Path(__file__).with_name("digit.png"), type=Path)
    parser.add_argument("--target", default=os.environ.get("FORKSERVE_GRPC", "127.0.0.1:8500"))
    args = parser.parse_args()
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    request.model_spec.version.value = 1
    request.inputs["image"].CopyFrom(tf.make_tensor_proto([args.image.read_bytes()]))
    with grpc.insecure_channel(args.target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
    probabilities = tf.make_ndarray(response.outputs["probabilities"])[0]
    digit = int(probabilities.argmax())
    print(f"digit {digit} probability {probabilities[digit]:.8f} (version {response.model_spec.version.value})")


if __name__ == "__main__":
    main()
