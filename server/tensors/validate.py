"""The decoded inputs against the signature: names, shapes, batch size, finiteness and the row limit, on every API."""

from __future__ import annotations

from typing import Any

import numpy as np

from server.config import ModelConfig
from server.errors import InvalidArgument
from server.signature import SignatureInfo, TensorInfo
from server.tensors.declared import check_rows, fitted_shape


def _fit_shape(array: np.ndarray, info: TensorInfo, strict: bool) -> np.ndarray:
    """Check the array against the signature shape; add trailing size-1 dimensions it left out."""
    shape = fitted_shape(info.name, array.shape, info)
    return array.reshape(shape) if strict and shape != array.shape else array


def check_names(given: Any, signature: SignatureInfo) -> None:
    """Every input the signature takes is given, and nothing else (`given`: the names, or a mapping of them)."""
    missing = sorted(set(signature.inputs) - set(given))
    if missing:
        raise InvalidArgument(f"missing input(s) {missing}; signature {signature.name!r} takes {sorted(signature.inputs)}")
    unknown = sorted(set(given) - set(signature.inputs))
    if unknown:
        raise InvalidArgument(f"unknown input(s) {unknown}; signature {signature.name!r} takes {sorted(signature.inputs)}")


def validate_inputs(
    arrays: dict[str, np.ndarray], signature: SignatureInfo, config: ModelConfig
) -> tuple[dict[str, np.ndarray], int]:
    """Check names, shapes, batch size and finiteness; return the arrays to feed and the batch size."""
    check_names(arrays, signature)
    fed: dict[str, np.ndarray] = {}
    batch_sizes = set()
    for name, info in signature.inputs.items():
        array = _fit_shape(arrays[name], info, signature.strict_shapes)
        if array.ndim == 0:
            if signature.batchable:
                raise InvalidArgument(f"input {name!r} is a scalar; the model takes a batch {info.describe_shape()}")
        else:
            batch_sizes.add(array.shape[0])
        if array.dtype.kind == "f" and not config.allow_non_finite and not np.isfinite(array).all():
            raise InvalidArgument(f"input {name!r} holds NaN or Infinity (or a number too large for {info.dtype})")
        fed[name] = array
    if len(batch_sizes) > 1:
        raise InvalidArgument(f"inputs disagree on the batch size: {sorted(batch_sizes)}")
    batch = batch_sizes.pop() if batch_sizes else 1
    if batch == 0:
        raise InvalidArgument("empty batch: send at least one instance")
    check_rows(batch, config.max_request_rows)
    return fed, batch
