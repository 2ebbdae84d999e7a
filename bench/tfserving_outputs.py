"""TF Serving gRPC Predict outputs in the typed fields (float_val, ...) against tensor_content: server encode, bytes, client read.

    .venv/bin/python -m bench.tfserving_outputs [--calls 200]

In-process, no server: for each output it fills a PredictResponse both ways and serializes it
(the worker's CPU per answer): tensor_content (forkserve before), the typed field as forkserve
fills it now (tensor_proto.from_array: packed bytes for floats), and the typed field one Python
value at a time. Then it reads each back with tf.make_ndarray, as TF Serving's clients do.
Medians of --calls rounds, interleaved.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

from bench.common import timed
from server.protocols.tfserving import tensor_proto

CASES = {
    "mlp logits 2x2 float32": (np.float32, (2, 2)),
    "classifier 8x1000 float32": (np.float32, (8, 1000)),
    "image 1x224x224x3 float32": (np.float32, (1, 224, 224, 3)),
    "ids 8x512 int64": (np.int64, (8, 512)),
}


def content(array: np.ndarray) -> bytes:
    """tensor_content: the array's little-endian bytes (forkserve before)."""
    response = predict_pb2.PredictResponse()
    proto = response.outputs["y"]
    proto.dtype = tensor_proto.ENUMS[array.dtype.name]
    proto.tensor_content = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    for size in array.shape:
        proto.tensor_shape.dim.add().size = size
    return response.SerializeToString()


def typed(array: np.ndarray) -> bytes:
    """The typed field, as forkserve fills it now."""
    response = predict_pb2.PredictResponse()
    tensor_proto.from_array(array, response.outputs["y"], "y")
    return response.SerializeToString()


def typed_listed(array: np.ndarray) -> bytes:
    """The typed field filled from a Python list (the obvious way)."""
    response = predict_pb2.PredictResponse()
    proto = response.outputs["y"]
    proto.dtype = tensor_proto.ENUMS[array.dtype.name]
    getattr(proto, tensor_proto.DTYPES[proto.dtype][1]).extend(array.reshape(-1).tolist())
    for size in array.shape:
        proto.tensor_shape.dim.add().size = size
    return response.SerializeToString()


def read(wire: bytes) -> np.ndarray:
    return tf.make_ndarray(predict_pb2.PredictResponse.FromString(wire).outputs["y"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    print("| output | tensor_content encode µs | typed encode µs | typed from a list µs | content bytes | typed bytes "
          "| content read µs | typed read µs |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (dtype, shape) in CASES.items():
        array = np.random.default_rng(7).standard_normal(shape).astype(dtype)
        times: dict[str, list[float]] = {"ce": [], "te": [], "le": [], "cr": [], "tr": []}
        for _ in range(args.calls):
            spent, content_wire = timed(lambda: content(array))
            times["ce"].append(spent)
            spent, typed_wire = timed(lambda: typed(array))
            times["te"].append(spent)
            spent, listed_wire = timed(lambda: typed_listed(array))
            times["le"].append(spent)
            assert listed_wire == typed_wire
            for key, wire in (("cr", content_wire), ("tr", typed_wire)):
                spent, back = timed(lambda: read(wire))
                times[key].append(spent)
                assert np.array_equal(back, array)
        us = {key: statistics.median(values) * 1e6 for key, values in times.items()}
        print(f"| {name} | {us['ce']:.1f} | {us['te']:.1f} | {us['le']:.1f} | {len(content_wire)} | {len(typed_wire)} "
              f"| {us['cr']:.1f} | {us['tr']:.1f} |")


if __name__ == "__main__":
    main()
