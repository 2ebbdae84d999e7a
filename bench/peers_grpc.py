"""The gRPC side of bench.peers: the requests (serialized once), their answers as arrays, idle memory with gRPC on and off.

Every gRPC cell sends binary tensors: float32 bytes in TF Serving's TensorProto.tensor_content
(PredictionService/Predict) or in V2's raw_input_contents (GRPCInferenceService/ModelInfer). The
CNN's input is the benchmark's JPEG decoded as forkserve decodes it (RGB, scaled to [0, 1]), so
every answer can be held against forkserve's REST answer to the JPEG.
"""

from __future__ import annotations

import base64
import io
import statistics
import time
from typing import Any

import numpy as np
import orjson
from PIL import Image

from bench.common import rss_mib

V2_INFER = "/inference.GRPCInferenceService/ModelInfer"
V2_METADATA = "/inference.GRPCInferenceService/ModelMetadata"
TFS_PREDICT = "/tensorflow.serving.PredictionService/Predict"
DT_FLOAT = 1  # tensorflow.DataType


def input_arrays(v1: dict[str, bytes]) -> dict[str, np.ndarray]:
    """Each workload's REST request as the float32 batch a server computes on (the JPEG decoded to [0, 1])."""
    arrays = {}
    for workload, body in v1.items():
        instance = orjson.loads(body)["instances"][0]
        if isinstance(instance, dict):
            with Image.open(io.BytesIO(base64.b64decode(instance["b64"]))) as image:
                pixels = np.asarray(image.convert("RGB"), dtype=np.float32) * np.float32(1 / 255)
            arrays[workload] = pixels[np.newaxis]
        else:
            arrays[workload] = np.asarray([instance], dtype=np.float32)
    return arrays


def _v2():
    from server.protocols.v2.protos import open_inference_pb2

    return open_inference_pb2


def _tfs():
    from tensorflow_serving.apis import predict_pb2

    return predict_pb2


def v2_request(model: str, input_name: str, array: np.ndarray) -> bytes:
    """A ModelInferRequest with one FP32 input in raw_input_contents."""
    request = _v2().ModelInferRequest(model_name=model)
    request.inputs.add(name=input_name, datatype="FP32", shape=list(array.shape))
    request.raw_input_contents.append(np.ascontiguousarray(array, dtype="<f4").tobytes())
    return request.SerializeToString()


def tfs_request(model: str, input_name: str, array: np.ndarray) -> bytes:
    """A PredictRequest with one DT_FLOAT input in tensor_content."""
    request = _tfs().PredictRequest()
    request.model_spec.name = model
    tensor = request.inputs[input_name]
    tensor.dtype = DT_FLOAT
    for size in array.shape:
        tensor.tensor_shape.dim.add(size=size)
    tensor.tensor_content = np.ascontiguousarray(array, dtype="<f4").tobytes()
    return request.SerializeToString()


def v2_answer(raw: bytes) -> np.ndarray:
    """The first output of a serialized ModelInferResponse (raw or typed contents)."""
    response = _v2().ModelInferResponse.FromString(raw)
    output = response.outputs[0]
    if response.raw_output_contents:
        values = np.frombuffer(response.raw_output_contents[0], dtype="<f4")
    else:
        values = np.asarray(output.contents.fp32_contents, dtype=np.float32)
    return values.astype(np.float64).reshape(list(output.shape))


def tfs_answer(raw: bytes) -> np.ndarray:
    """The only output of a serialized PredictResponse."""
    (tensor,) = _tfs().PredictResponse.FromString(raw).outputs.values()
    shape = [dim.size for dim in tensor.tensor_shape.dim]
    values = np.frombuffer(tensor.tensor_content, dtype="<f4") if tensor.tensor_content else np.asarray(tensor.float_val)
    return values.astype(np.float64).reshape(shape)


def input_name(target: str, model: str) -> str:
    """The model's first input, from forkserve's V2 ModelMetadata."""
    from bench.grpc_load import call_once

    raw = call_once(target, V2_METADATA, _v2().ModelMetadataRequest(name=model).SerializeToString())
    return _v2().ModelMetadataResponse.FromString(raw).inputs[0].name


def idle_rss(servers: dict[str, Any], samples: int = 5, interval: float = 1.0) -> dict[str, list[float]]:
    """RSS (MiB) of each worker of each server, the median of `samples` taken `interval` apart."""
    taken: dict[str, list[list[float]]] = {name: [] for name in servers}
    for _ in range(samples):
        for name, server in servers.items():
            taken[name].append([rss_mib([pid]) for pid in sorted(server.worker_pids())])
        time.sleep(interval)  # NOTE: spacing samples of an idle server, not waiting for one
    return {name: [statistics.median(column) for column in zip(*rows)] for name, rows in taken.items()}
