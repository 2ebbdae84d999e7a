"""TensorFlow's TensorProto (TF Serving's gRPC tensors) to numpy and back, without TensorFlow's slow helpers.

NOTE: tf.make_tensor_proto / tf.make_ndarray run tens of microseconds of Python per tensor; a
numeric tensor here is one np.frombuffer over `tensor_content` (what TF Serving's clients send)
or one np.asarray over the typed `*_val` field, which TF Serving broadcasts when it holds one value.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from server.errors import InvalidArgument

# DataType enum value -> (numpy dtype name, the TensorProto field holding its values)
DTYPES: dict[int, tuple[str, str]] = {
    1: ("float32", "float_val"), 2: ("float64", "double_val"), 3: ("int32", "int_val"), 4: ("uint8", "int_val"),
    5: ("int16", "int_val"), 6: ("int8", "int_val"), 7: ("string", "string_val"), 9: ("int64", "int64_val"),
    10: ("bool", "bool_val"), 17: ("uint16", "int_val"), 19: ("float16", "half_val"), 22: ("uint32", "uint32_val"),
    23: ("uint64", "uint64_val"),
}
ENUMS = {name: number for number, (name, _) in DTYPES.items()}
ENUM_NAMES = {1: "DT_FLOAT", 2: "DT_DOUBLE", 3: "DT_INT32", 4: "DT_UINT8", 5: "DT_INT16", 6: "DT_INT8", 7: "DT_STRING",
              9: "DT_INT64", 10: "DT_BOOL", 17: "DT_UINT16", 19: "DT_HALF", 22: "DT_UINT32", 23: "DT_UINT64"}


def to_array(proto: Any, name: str) -> np.ndarray:
    """One request tensor as numpy: its dtype and shape as sent (validation against the signature comes later)."""
    if proto.dtype not in DTYPES:
        raise InvalidArgument(f"input {name!r}: dtype {ENUM_NAMES.get(proto.dtype, proto.dtype)} is not supported")
    dtype, field = DTYPES[proto.dtype]
    if proto.tensor_shape.unknown_rank:
        raise InvalidArgument(f"input {name!r}: the tensor's shape has an unknown rank")
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"input {name!r}: shape {list(shape)} has a negative size")
    count = math.prod(shape)
    if dtype == "string":
        values = list(proto.string_val)
        array = np.empty(len(values), dtype=object)
        array[:] = values
    elif proto.tensor_content:
        itemsize = np.dtype(dtype).itemsize
        if len(proto.tensor_content) != count * itemsize:
            raise InvalidArgument(f"input {name!r}: {len(proto.tensor_content)} bytes of tensor_content for shape "
                                  f"{list(shape)} of {dtype} ({count * itemsize} expected)")
        return np.frombuffer(proto.tensor_content, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
    elif dtype == "float16":
        array = np.asarray(proto.half_val, dtype=np.uint16).view(np.float16)
    else:
        array = np.asarray(getattr(proto, field), dtype=dtype)
    if array.size == count:
        return array.reshape(shape)
    if array.size == 1 and count:  # TF Serving's rule: one value fills the whole shape
        return np.full(shape, array[0], dtype=array.dtype)
    raise InvalidArgument(f"input {name!r}: {array.size} values for shape {list(shape)} ({count} expected)")


def from_array(array: np.ndarray, proto: Any) -> None:
    """Fill `proto` (a TensorProto) with an output array: numbers as tensor_content, strings as string_val (as TF Serving)."""
    dtype = "string" if array.dtype == object or array.dtype.kind in "SU" else array.dtype.name
    if dtype not in ENUMS:
        raise InvalidArgument(f"output dtype {array.dtype.name} has no TensorProto type")
    proto.dtype = ENUMS[dtype]
    for size in array.shape:
        proto.tensor_shape.dim.add().size = size
    if dtype == "string":
        proto.string_val.extend(x if isinstance(x, bytes) else str(x).encode() for x in array.reshape(-1))
    else:
        proto.tensor_content = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
