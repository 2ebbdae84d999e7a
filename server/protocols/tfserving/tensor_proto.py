"""TensorFlow's TensorProto (TF Serving's gRPC tensors) to numpy and back, without TensorFlow's slow helpers.

NOTE: tf.make_tensor_proto / tf.make_ndarray run tens of microseconds of Python per tensor; a
numeric tensor here is one np.frombuffer over `tensor_content` (what tf.make_tensor_proto writes
for numbers) or one np.asarray over the typed `*_val` field (what it writes for bool and uint16,
and for a scalar broadcast to a shape). A `*_val` field holds as many values as the shape has
elements, or one value that fills the whole shape; TensorFlow would also pad a short list with its
last value or fill an empty one with zeros, which from a client is a bug: refused here.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from server.errors import ApiError, InvalidArgument
from server.settings import Settings
from server.tensors.declared import check_dims, check_strings

# DataType enum value -> (numpy dtype name, the TensorProto field holding its values)
DTYPES: dict[int, tuple[str, str]] = {
    1: ("float32", "float_val"), 2: ("float64", "double_val"), 3: ("int32", "int_val"), 4: ("uint8", "int_val"),
    5: ("int16", "int_val"), 6: ("int8", "int_val"), 7: ("string", "string_val"), 9: ("int64", "int64_val"),
    10: ("bool", "bool_val"), 17: ("uint16", "int_val"), 19: ("float16", "half_val"), 22: ("uint32", "uint32_val"),
    23: ("uint64", "uint64_val"),
}
ENUMS = {name: number for number, (name, _) in DTYPES.items()}
ENUM_NAMES = {1: "DT_FLOAT", 2: "DT_DOUBLE", 3: "DT_INT32", 4: "DT_UINT8", 5: "DT_INT16", 6: "DT_INT8", 7: "DT_STRING",
              8: "DT_COMPLEX64", 9: "DT_INT64", 10: "DT_BOOL", 14: "DT_BFLOAT16", 17: "DT_UINT16", 18: "DT_COMPLEX128",
              19: "DT_HALF", 22: "DT_UINT32", 23: "DT_UINT64"}
TF_NAMES = {name: ENUM_NAMES[number] for name, number in ENUMS.items()}
# tensor_content is little-endian whatever the host; on a little-endian host these are the native dtypes
WIRE = {number: np.dtype(name).newbyteorder("<") for number, (name, _) in DTYPES.items() if name != "string"}
NATIVE = {number: np.dtype(name) for number, (name, _) in DTYPES.items() if name != "string"}
LITTLE_ENDIAN = sys.byteorder == "little"
PACKED_FIXED = {1: 5, 2: 6}  # DT_FLOAT -> float_val's field number, DT_DOUBLE -> double_val's


def dtype_name(number: int) -> str:
    """A DataType enum value as TF names it (DT_FLOAT), or its number when unknown."""
    return ENUM_NAMES.get(number, f"DataType {number}")


def dtype_of(proto: Any, name: str) -> str:
    """A TensorProto's dtype as numpy names it ("string" for DT_STRING); unsupported ones are refused."""
    if proto.dtype not in DTYPES:
        raise InvalidArgument(f"input {name!r}: dtype {dtype_name(proto.dtype)} is not supported")
    return DTYPES[proto.dtype][0]


def shape_of(proto: Any, name: str) -> tuple[int, ...]:
    """A TensorProto's shape; unknown rank, negative sizes and shapes no array can have are refused."""
    if proto.tensor_shape.unknown_rank:
        raise InvalidArgument(f"input {name!r}: the tensor's shape has an unknown rank; send its dims")
    return check_dims(name, [d.size for d in proto.tensor_shape.dim])


def to_array(proto: Any, name: str) -> np.ndarray:
    """One request tensor as numpy: its dtype and shape as sent (validation against the signature comes later).

    Numbers from tensor_content are a read-only view of the message's bytes (no copy); strings are
    an object array of bytes.
    """
    dtype, field = dtype_of(proto, name), DTYPES[proto.dtype][1]
    shape = shape_of(proto, name)
    count = math.prod(shape)
    content = proto.tensor_content
    if dtype == "string":
        if content:
            raise InvalidArgument(f"input {name!r}: a DT_STRING tensor carries its values in string_val, not tensor_content")
        values = proto.string_val
        check_strings(name, len(values), 0)  # NOTE: 2 bytes of the message each, 64 once decoded
        check_strings(name, len(values), sum(map(len, values)))
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
    elif content:
        wire = WIRE[proto.dtype]
        if len(content) != count * wire.itemsize:
            raise InvalidArgument(f"input {name!r}: {len(content)} bytes of tensor_content for shape {list(shape)} of "
                                  f"{dtype_name(proto.dtype)} ({count * wire.itemsize} expected)")
        array = np.frombuffer(content, dtype=wire)
        if not LITTLE_ENDIAN:
            array = array.astype(NATIVE[proto.dtype])
        return array.reshape(shape)
    elif dtype == "float16":
        try:  # the IEEE half bits, one per int32 value
            values = proto.half_val
            array = np.fromiter(values, dtype=np.uint16, count=len(values)).view(np.float16)
        except (OverflowError, ValueError):
            raise InvalidArgument(f"input {name!r}: half_val holds a value that is not a 16-bit pattern") from None
    else:
        try:
            values = getattr(proto, field)
            array = np.fromiter(values, dtype=NATIVE[proto.dtype], count=len(values))
        except (OverflowError, ValueError):
            raise InvalidArgument(f"input {name!r}: a value in {field} is out of range for "
                                  f"{dtype_name(proto.dtype)}") from None
    if array.size == count:
        return array.reshape(shape)
    if array.size == 1 and count:  # TF's rule: one value fills the whole shape
        # NOTE: a 30-byte request can name a shape of terabytes: the filled tensor is held to the size
        # limit a request's bytes have (FORKSERVE_MAX_BODY_BYTES), before anything is allocated; a
        # string by its length and what Python holds per element (check_strings).
        if array.dtype == object:
            check_strings(name, count, count * len(array[0]))
        elif count * array.itemsize > (limit := Settings.current().max_body_bytes):
            raise InvalidArgument(f"input {name!r}: one value filling shape {list(shape)} makes a tensor larger than "
                                  f"the request size limit ({limit} bytes, FORKSERVE_MAX_BODY_BYTES)")
        return np.full(shape, array[0], dtype=array.dtype)
    raise InvalidArgument(f"input {name!r}: {array.size} values in {field} for shape {list(shape)} "
                          f"({count} expected, or 1 to fill the shape)")


def _varint(value: int) -> bytes:
    """A protobuf varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fill_typed(array: np.ndarray, proto: Any, number: int) -> None:
    """The values into the dtype's typed field, as TF Serving's Tensor::AsProtoField writes them.

    NOTE: float_val and double_val are packed fixed-width fields: their bytes are the array's
    little-endian bytes, merged in as one field (a list of Python floats cost 27x more for 8000 values).
    """
    flat = array.reshape(-1)
    if number in PACKED_FIXED:
        data = flat.astype(WIRE[number], copy=False).tobytes()
        proto.MergeFromString(bytes([PACKED_FIXED[number] << 3 | 2]) + _varint(len(data)) + data)
    elif number == ENUMS["float16"]:
        proto.half_val.extend(flat.view(np.uint16).tolist())  # the half's bits, as TF writes them
    else:
        getattr(proto, DTYPES[number][1]).extend(flat.tolist())


def from_array(array: np.ndarray, proto: Any, name: str = "") -> None:
    """Fill an empty TensorProto with an output array: values in the dtype's typed field (float_val, ...), as TF Serving."""
    kind = array.dtype.kind
    if kind in "OSU":
        proto.dtype = ENUMS["string"]
        items = array.reshape(-1).tolist()
        if kind != "S":
            items = [x if isinstance(x, bytes) else str(x).encode() for x in items]
        proto.string_val.extend(items)
    else:
        number = ENUMS.get(array.dtype.name)
        if number is None:
            raise ApiError(f"output {name!r} is {array.dtype.name}, which forkserve cannot send as a TensorProto",
                           status=500)
        proto.dtype = number
        _fill_typed(array, proto, number)
    dims = proto.tensor_shape.dim
    for size in array.shape:
        dims.add().size = size
