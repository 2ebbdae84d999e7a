"""Open Inference Protocol (KServe V2 / Triton) tensors: JSON and the binary tensor extension."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.errors import InvalidArgument
from server.signature import DEFAULT_SIGNATURE, SignatureInfo, TensorInfo
from server.tensors import jsonio
from server.tensors.arrays import numeric_array, utf8
from server.tensors.declared import check_shape, check_strings

# V2 datatype -> numpy dtype name used in signatures ("string" holds bytes objects).
DATATYPES = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "FP32": "float32", "FP64": "float64", "BYTES": "string",
}
V2_NAMES = {dtype: name for name, dtype in DATATYPES.items()}
HEADER_LENGTH = "Inference-Header-Content-Length"


def v2_datatype(dtype: str) -> str:
    """The V2 datatype of a signature dtype."""
    return V2_NAMES.get(dtype, "BYTES" if dtype == "string" else dtype.upper())


def v2_shape(info: TensorInfo) -> list[int]:
    """Signature shape with -1 for any size (unknown rank: [-1])."""
    if info.shape is None:
        return [-1]
    return [-1 if d is None else int(d) for d in info.shape]


def tensor_metadata(info: TensorInfo) -> dict[str, Any]:
    """One input or output in the model metadata response."""
    return {"name": info.name, "datatype": v2_datatype(info.dtype), "shape": v2_shape(info)}


@dataclass(frozen=True)
class InferRequest:
    """A decoded infer request."""

    id: str | None
    signature_name: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, bool]  # requested output name -> binary
    binary_default: bool


def split_body(raw: bytes, header_length: str | None) -> tuple[Any, bytes]:
    """(JSON header, binary rest) of a request; without the header length all of it is JSON."""
    if header_length is None:
        return jsonio.loads(raw), b""
    try:
        length = int(header_length)
    except ValueError:
        raise InvalidArgument(f"{HEADER_LENGTH} must be an integer, got {header_length!r}") from None
    if not 0 < length <= len(raw):
        raise InvalidArgument(f"{HEADER_LENGTH} is {length} but the body has {len(raw)} bytes")
    return jsonio.loads(raw[:length]), raw[length:]


def _shape(value: Any, name: str) -> tuple[int, ...]:
    """A tensor shape from JSON: a list of non-negative integers."""
    if not isinstance(value, list) or not all(type(d) is int and d >= 0 for d in value):
        raise InvalidArgument(f"input {name!r}: shape must be a list of non-negative integers, got {value!r}")
    return tuple(value)


def bytes_elements(data: bytes, count: int, name: str) -> np.ndarray:
    """BYTES tensor data (REST's binary extension, gRPC's raw contents): each element a 4-byte little-endian length and its bytes.

    NOTE: the shape's count is checked against the bytes there are (4 a zero-length element) and
    the size its elements take once decoded (check_strings) before one is read, and the parse stops
    at the count: 32 MB of zeros would otherwise be 8M elements.
    """
    if count * 4 > len(data):
        raise InvalidArgument(f"input {name!r}: {len(data)} bytes of BYTES data cannot hold the {count} elements of its "
                              "shape (4 length bytes each at least)")
    check_strings(name, count, len(data) - 4 * count)
    elements, offset = np.empty(count, dtype=object), 0
    for index in range(count):
        if offset + 4 > len(data):
            raise InvalidArgument(f"input {name!r}: truncated BYTES element length")
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + length > len(data):
            raise InvalidArgument(f"input {name!r}: BYTES element of {length} bytes runs past the data")
        elements[index] = data[offset : offset + length]
        offset += length
    if offset != len(data):
        raise InvalidArgument(f"input {name!r}: {len(data) - offset} bytes of BYTES data after the {count} elements of "
                              "its shape")
    return elements


def _flatten(data: Any) -> list[Any]:
    """Row-major flattening of nested JSON lists."""
    if not isinstance(data, list):
        return [data]
    if all(not isinstance(x, list) for x in data):
        return data
    flat: list[Any] = []
    for item in data:
        flat.extend(_flatten(item))
    return flat


def _input_array(spec: dict[str, Any], binary: bytes, offset: int, info: TensorInfo, max_rows: int
                 ) -> tuple[np.ndarray, int]:
    """One input tensor, and the offset after its binary data; its datatype and declared shape are checked first."""
    name = spec["name"]
    shape = _shape(spec.get("shape"), name)
    datatype = spec.get("datatype")
    if datatype not in DATATYPES:
        raise InvalidArgument(f"input {name!r}: unknown datatype {datatype!r}; one of {sorted(DATATYPES)}")
    dtype = DATATYPES[datatype]
    if dtype != info.dtype:
        raise InvalidArgument(f"input {name!r} is {datatype}; the model takes {v2_datatype(info.dtype)}")
    check_shape(name, shape, info, max_rows)
    count = math.prod(shape)
    parameters = spec.get("parameters") or {}
    size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
    if size is not None:
        if type(size) is not int or size < 0 or offset + size > len(binary):
            raise InvalidArgument(f"input {name!r}: binary_data_size {size!r} runs past the {len(binary)} binary bytes")
        chunk = binary[offset : offset + size]
        offset += size
        if dtype == "string":
            return bytes_elements(chunk, count, name).reshape(shape), offset
        itemsize = np.dtype(dtype).itemsize
        if size != count * itemsize:
            raise InvalidArgument(f"input {name!r}: {size} bytes of data for shape {list(shape)} of {datatype} ({count * itemsize} expected)")
        return np.frombuffer(chunk, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape), offset
    if "data" not in spec:
        raise InvalidArgument(f"input {name!r} has neither 'data' nor parameters.binary_data_size")
    if dtype == "string":
        flat = _flatten(spec["data"])
        if len(flat) != count:
            raise InvalidArgument(f"input {name!r}: {len(flat)} data elements for shape {list(shape)} ({count} expected)")
        if not all(isinstance(x, str) for x in flat):
            raise InvalidArgument(f"input {name!r}: BYTES data must be strings")
        check_strings(name, count, 0)
        check_strings(name, count, sum(map(len, flat)))
        return np.array([utf8(x, name) for x in flat], dtype=object).reshape(shape), offset
    array = numeric_array(spec["data"], info)
    if array.size != count:
        raise InvalidArgument(f"input {name!r}: {array.size} data elements for shape {list(shape)} ({count} expected)")
    return array.reshape(shape), offset


def decode_infer(header: Any, binary: bytes, signature_lookup: Any, max_rows: int) -> InferRequest:
    """Parse an infer request against the signature `signature_lookup(name)` returns (at most `max_rows` rows)."""
    if not isinstance(header, dict):
        raise InvalidArgument("infer request must be a JSON object")
    parameters = header.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidArgument("'parameters' must be an object")
    signature_name = parameters.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(signature_name, str):
        raise InvalidArgument("parameters.signature_name must be a string")
    signature: SignatureInfo = signature_lookup(signature_name)
    specs = header.get("inputs")
    if not isinstance(specs, list) or not specs or not all(isinstance(s, dict) and isinstance(s.get("name"), str) for s in specs):
        raise InvalidArgument("'inputs' must be a non-empty list of objects with a 'name'")
    arrays, offset = {}, 0
    for spec in specs:
        info = signature.inputs.get(spec["name"])
        if info is None:
            raise InvalidArgument(f"unknown input {spec['name']!r}; the model takes {sorted(signature.inputs)}")
        if spec["name"] in arrays:
            raise InvalidArgument(f"input {spec['name']!r} is given twice")
        arrays[spec["name"]], offset = _input_array(spec, binary, offset, info, max_rows)
    if offset != len(binary):
        raise InvalidArgument(f"{len(binary) - offset} binary bytes after the last input")
    binary_default = bool(parameters.get("binary_data_output", False))
    requested: dict[str, bool] = {}
    for output in header.get("outputs") or []:
        if not isinstance(output, dict) or output.get("name") not in signature.outputs:
            raise InvalidArgument(f"unknown output {output!r}; the model gives {sorted(signature.outputs)}")
        if output["name"] in requested:
            raise InvalidArgument(f"output {output['name']!r} is requested twice")
        output_parameters = output.get("parameters") or {}
        requested[output["name"]] = bool(output_parameters.get("binary_data", binary_default))
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidArgument("'id' must be a string")
    return InferRequest(request_id, signature.name, arrays, requested, binary_default)


def _binary(array: np.ndarray) -> bytes:
    """Raw little-endian bytes of a tensor (BYTES: length-prefixed elements)."""
    if array.dtype == object:
        return b"".join(struct.pack("<I", len(x)) + x for x in array.reshape(-1))
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def encode_infer(
    request: InferRequest, outputs: dict[str, np.ndarray], signature: SignatureInfo, model: str, version: int
) -> tuple[bytes, int | None]:
    """(body, JSON header length or None): outputs as JSON data or appended binary."""
    wanted = request.outputs or {name: request.binary_default for name in outputs}
    described, chunks = [], []
    for name, binary in wanted.items():
        array = outputs[name]
        info = signature.outputs.get(name)
        datatype = v2_datatype(info.dtype if info else ("string" if array.dtype == object else array.dtype.name))
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            chunk = _binary(array)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        elif array.dtype == object:
            entry["data"] = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in array.reshape(-1)]
        else:
            entry["data"] = array.reshape(-1)
        described.append(entry)
    response: dict[str, Any] = {"model_name": model, "model_version": str(version), "outputs": described}
    if request.id is not None:
        response["id"] = request.id
    header = jsonio.dumps(response)
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)
