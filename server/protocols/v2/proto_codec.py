"""V2 gRPC tensors (InferTensorContents or raw_input_contents) to numpy and back."""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from server.errors import InvalidArgument
from server.protocols.v2.json_codec import DATATYPES, bytes_elements, v2_datatype
from server.signature import DEFAULT_SIGNATURE, SignatureInfo, TensorInfo
from server.tensors.declared import check_shape, check_strings

# V2 datatype -> the InferTensorContents field that holds its values (the protocol's table)
CONTENTS = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}

# each field's protobuf type, as numpy
FIELD_DTYPES = {
    "bool_contents": "bool", "int_contents": "int32", "int64_contents": "int64", "uint_contents": "uint32",
    "uint64_contents": "uint64", "fp32_contents": "float32", "fp64_contents": "float64",
}


def to_array(tensor: Any, raw: bytes | None, info: TensorInfo, max_rows: int) -> np.ndarray:
    """One InferInputTensor as numpy, from its typed contents or its raw bytes.

    Its datatype and declared shape (rank, fixed sizes, at most `max_rows` rows) are checked against
    the signature input before anything is built.
    """
    name, datatype = tensor.name, tensor.datatype
    if datatype not in DATATYPES:
        raise InvalidArgument(f"input {name!r}: unknown datatype {datatype!r}; one of {sorted(DATATYPES)}")
    dtype = DATATYPES[datatype]
    if dtype != info.dtype:
        raise InvalidArgument(f"input {name!r} is {datatype}; the model takes {v2_datatype(info.dtype)}")
    shape = check_shape(name, tensor.shape, info, max_rows)
    count = math.prod(shape)
    if raw is not None:
        if tensor.HasField("contents"):
            raise InvalidArgument(f"input {name!r} has both contents and raw_input_contents; send one of them")
        if dtype == "string":
            return bytes_elements(raw, count, name).reshape(shape)
        itemsize = np.dtype(dtype).itemsize
        if len(raw) != count * itemsize:
            raise InvalidArgument(f"input {name!r}: {len(raw)} raw bytes for shape {list(shape)} of {datatype} "
                                  f"({count * itemsize} expected)")
        if dtype == "bool" and raw.translate(None, b"\x00\x01"):
            raise InvalidArgument(f"input {name!r}: raw BOOL bytes must be 0 or 1")
        # NOTE: no copy on a little-endian host (a read-only view of the message's bytes)
        return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
    field = CONTENTS.get(datatype)
    if field is None:
        raise InvalidArgument(f"input {name!r}: {datatype} has no typed contents field; send it in raw_input_contents")
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise InvalidArgument(f"input {name!r}: {len(values)} {field} values for shape {list(shape)} ({count} expected)")
    if dtype == "string":
        check_strings(name, count, 0)  # NOTE: 2 bytes of the message each, 64 once decoded
        check_strings(name, count, sum(map(len, values)))
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    # exact (the field's own type holds every value sent); fromiter: 1.5x np.array's speed on a repeated field
    wide = np.fromiter(values, dtype=FIELD_DTYPES[field], count=count)
    array = wide.astype(dtype, copy=False)
    if array.dtype.kind in "iu" and array.dtype != wide.dtype and not np.array_equal(array, wide):
        raise InvalidArgument(f"input {name!r}: value out of range for {datatype}")
    return array.reshape(shape)


def raw_bytes(array: np.ndarray) -> bytes:
    """An output's raw_output_contents: little-endian values, BYTES as length-prefixed elements."""
    if array.dtype == object:
        return b"".join(struct.pack("<I", len(x)) + x for x in (
            v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)))
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def signature_name(request: Any) -> str:
    """The signature a ModelInferRequest names in its `signature_name` parameter (serving_default when none)."""
    parameters = request.parameters
    return parameters["signature_name"].string_param if "signature_name" in parameters else DEFAULT_SIGNATURE


def decode_inputs(request: Any, signature: SignatureInfo, max_rows: int) -> dict[str, np.ndarray]:
    """A ModelInferRequest's tensors (typed contents or raw_input_contents) as numpy of the signature's inputs."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs; send one per input")
    inputs = {}
    for index, tensor in enumerate(request.inputs):
        info = signature.inputs.get(tensor.name)
        if info is None:
            raise InvalidArgument(f"unknown input {tensor.name!r}; the model takes {sorted(signature.inputs)}")
        if tensor.name in inputs:
            raise InvalidArgument(f"input {tensor.name!r} is given twice")
        inputs[tensor.name] = to_array(tensor, raw[index] if raw else None, info, max_rows)
    if not inputs:
        raise InvalidArgument("'inputs' is empty: send at least one input tensor")
    return inputs


def requested_outputs(request: Any, signature: SignatureInfo) -> list[str]:
    """The outputs a ModelInferRequest asks for (empty: all), each the signature's, none twice."""
    wanted = [output.name for output in request.outputs]
    for index, name in enumerate(wanted):
        if name not in signature.outputs:
            raise InvalidArgument(f"unknown output {name!r}; the model gives {sorted(signature.outputs)}")
        if name in wanted[:index]:
            raise InvalidArgument(f"output {name!r} is requested twice")
    return wanted


def encode_response(request: Any, response: Any, model: str, version: int, signature: SignatureInfo,
                    outputs: dict[str, np.ndarray], wanted: list[str]) -> None:
    """Fill a ModelInferResponse with the outputs asked for, always in raw_output_contents, as Triton answers.

    The protocol lets the server choose. Clients written against Triton index raw_output_contents
    even when they sent typed contents, and raw is the cheaper form at every size
    (bench/results/v2-outputs.md: 16x less server CPU for 8x1000 floats).
    """
    response.model_name = model
    response.model_version = str(version)
    response.id = request.id
    for name in wanted or list(outputs):
        array = outputs[name]
        info = signature.outputs.get(name)
        datatype = v2_datatype(info.dtype if info else ("string" if array.dtype == object else array.dtype.name))
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        response.raw_output_contents.append(raw_bytes(array))
