"""V2 gRPC outputs typed (`contents`) against raw (`raw_output_contents`): server encode, bytes on the wire, client read.

    .venv/bin/python -m bench.v2_outputs [--calls 200]

In-process, no server: for each output shape it fills a ModelInferResponse both ways the way the
worker does and serializes it (the server's CPU per answer), counts the serialized bytes, and
reads the values back into numpy the way a client does (typed: the repeated field into an array;
raw: np.frombuffer, as tritonclient's as_numpy). Medians of --calls rounds, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np

from bench.common import timed
from server.protocols.v2 import proto_codec
from server.protocols.v2.messages import protos

CASES = {  # name: (datatype, numpy dtype, shape)
    "mlp logits 2x2 FP32": ("FP32", np.float32, (2, 2)),
    "classifier 8x1000 FP32": ("FP32", np.float32, (8, 1000)),
    "image 1x224x224x3 FP32": ("FP32", np.float32, (1, 224, 224, 3)),
    "ids 8x512 INT64": ("INT64", np.int64, (8, 512)),
}
CONTENTS = {"FP32": "fp32_contents", "INT64": "int64_contents"}


def typed(messages: Any, array: np.ndarray, datatype: str) -> bytes:
    """The answer with typed contents (forkserve before raw-always): one value at a time into the repeated field."""
    response = messages.ModelInferResponse(model_name="m", model_version="1")
    tensor = response.outputs.add(name="y", datatype=datatype, shape=list(array.shape))
    getattr(tensor.contents, CONTENTS[datatype]).extend(array.reshape(-1).tolist())
    return response.SerializeToString()


def raw(messages: Any, array: np.ndarray, datatype: str) -> bytes:
    """The answer with raw_output_contents: the array's little-endian bytes."""
    response = messages.ModelInferResponse(model_name="m", model_version="1")
    response.outputs.add(name="y", datatype=datatype, shape=list(array.shape))
    response.raw_output_contents.append(proto_codec.raw_bytes(array))
    return response.SerializeToString()


def read_typed(messages: Any, wire: bytes, dtype: Any) -> np.ndarray:
    response = messages.ModelInferResponse.FromString(wire)
    output = response.outputs[0]
    return np.array(getattr(output.contents, CONTENTS[output.datatype]), dtype=dtype).reshape(list(output.shape))


def read_raw(messages: Any, wire: bytes, dtype: Any) -> np.ndarray:
    response = messages.ModelInferResponse.FromString(wire)
    return np.frombuffer(response.raw_output_contents[0], dtype=np.dtype(dtype).newbyteorder("<")).reshape(
        list(response.outputs[0].shape))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    messages = protos()
    print("| output | typed encode µs | raw encode µs | typed bytes | raw bytes | typed read µs | raw read µs |")
    print("|---|---|---|---|---|---|---|")
    for name, (datatype, dtype, shape) in CASES.items():
        array = np.random.default_rng(7).standard_normal(shape).astype(dtype)
        times: dict[str, list[float]] = {"te": [], "re": [], "tr": [], "rr": []}
        for _ in range(args.calls):
            spent, typed_wire = timed(lambda: typed(messages, array, datatype))
            times["te"].append(spent)
            spent, raw_wire = timed(lambda: raw(messages, array, datatype))
            times["re"].append(spent)
            spent, back = timed(lambda: read_typed(messages, typed_wire, dtype))
            times["tr"].append(spent)
            assert np.array_equal(back, array)
            spent, back = timed(lambda: read_raw(messages, raw_wire, dtype))
            times["rr"].append(spent)
            assert np.array_equal(back, array)
        us = {key: statistics.median(values) * 1e6 for key, values in times.items()}
        print(f"| {name} | {us['te']:.1f} | {us['re']:.1f} | {len(typed_wire)} | {len(raw_wire)} | "
              f"{us['tr']:.1f} | {us['rr']:.1f} |")


if __name__ == "__main__":
    main()
