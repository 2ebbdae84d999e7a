"""What a request says it holds (a tensor's shape, a list's length, a string tensor's size), checked before anything is built.

NOTE: every decoder calls these first: REST's TF Serving JSON (rows and columns), V2 JSON and
binary tensors, TensorProtos (TF Serving gRPC) and V2 gRPC tensors (typed and raw). A shape is a
few bytes of the request, and what is built from it can cost far more than the request did: a
fill of one PNG over [250000] decoded 250,000 images (30 s of CPU), 8M zero-length BYTES elements
in 32 MB became a list of 8M objects, and a shape such as [0, 2**62, 2**62, 1] made numpy raise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from server.errors import InvalidArgument
from server.settings import Settings
from server.signature import TensorInfo

# What Python holds per element of a string tensor besides its bytes (measured, CPython 3.11 with
# tracemalloc): a bytes object is 33 + n bytes (sys.getsizeof; pymalloc rounds it up to 16), its pointer in
# the object array 8, and the list it is built from 8 more while the array is made: 49 + n, 64 + n rounded.
STRING_ELEMENT_BYTES = 64
MAX_RANK = 32  # numpy's own limit is 64; no model takes more than a handful of dimensions
# numpy refuses an array whose nonzero sizes multiply past 2**63 bytes, even an empty one ([0, 2**62, 2**62]);
# an element is 8 bytes at most here
MAX_ELEMENTS = 2**59


def check_rows(rows: int, max_rows: int) -> None:
    """The request's rows (its batch, a list's length, its tf.Examples) against max_request_rows."""
    if rows > max_rows:
        raise InvalidArgument(f"request has {rows} rows; the limit is {max_rows} (max_request_rows)")


def fitted_shape(name: str, shape: tuple[int, ...], info: TensorInfo) -> tuple[int, ...]:
    """`shape` as the signature takes it (trailing size-1 dimensions left out are added back), or InvalidArgument."""
    expected = info.shape
    if expected is None:
        return shape
    if len(shape) < len(expected) and all(d == 1 for d in expected[len(shape):]):
        # [1.0, 2.0] for an input of shape [-1, 1] (TF Serving's own half_plus_two example).
        if _dims_match(shape, expected[: len(shape)]):
            return shape + (1,) * (len(expected) - len(shape))
    if len(shape) != len(expected):
        raise InvalidArgument(
            f"input {name!r} has rank {len(shape)} (shape {list(shape)}), the model takes rank {len(expected)} "
            f"{info.describe_shape()}"
        )
    if not _dims_match(shape, expected):
        raise InvalidArgument(f"input {name!r} has shape {list(shape)}, the model takes {info.describe_shape()}")
    return shape


def _dims_match(actual: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    """Every fixed dimension of `expected` equals the actual size."""
    return all(e is None or e == a for a, e in zip(actual, expected))


def check_dims(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """A shape any array can have: no negative size, at most MAX_RANK dimensions, at most MAX_ELEMENTS elements."""
    shape = tuple(shape)
    if len(shape) > MAX_RANK:
        raise InvalidArgument(f"input {name!r} has rank {len(shape)}; forkserve takes at most {MAX_RANK} dimensions")
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"input {name!r}: shape {list(shape)} has a negative size")
    if math.prod(d for d in shape if d) > MAX_ELEMENTS:
        raise InvalidArgument(f"input {name!r}: shape {list(shape)} is larger than any tensor can be")
    return shape


def check_shape(name: str, shape: Sequence[int], info: TensorInfo, max_rows: int) -> tuple[int, ...]:
    """A tensor's declared shape against its signature input (rank, fixed sizes, rows), before any array is built."""
    shape = check_dims(name, shape)
    fitted_shape(name, shape, info)
    if shape:
        check_rows(shape[0], max_rows)
    return shape


def check_strings(name: str, count: int, length: int) -> None:
    """A string tensor of `count` elements and `length` bytes in all, as Python holds it, against the request size limit.

    NOTE: call it with length 0 first when the lengths are not known yet: summing them costs a pass
    over every element. A zero-length element costs 2 bytes of a TensorProto's string_val or of V2's
    bytes_contents and 4 of V2's raw BYTES, and STRING_ELEMENT_BYTES once decoded.
    """
    limit = Settings.current().max_body_bytes
    size = length + count * STRING_ELEMENT_BYTES
    if size > limit:
        raise InvalidArgument(
            f"input {name!r}: {count} strings of {length} bytes in all make a tensor of {size} bytes "
            f"({STRING_ELEMENT_BYTES} bytes per string besides its own), larger than the request size limit "
            f"({limit} bytes, FORKSERVE_MAX_BODY_BYTES)"
        )
