"""Declared shapes against a signature before anything is built, and a string tensor's decoded size."""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import pytest

import server.settings
from server.errors import InvalidArgument
from server.settings import Settings
from server.signature import TensorInfo
from server.tensors.declared import (
    MAX_RANK,
    STRING_ELEMENT_BYTES,
    check_dims,
    check_rows,
    check_shape,
    check_strings,
    fitted_shape,
)

IMAGE = TensorInfo("pixels", "float32", (None, 10, 12, 3))
COLUMN = TensorInfo("x", "float32", (None, 1))  # TF Serving's half_plus_two: [2] is taken as [2, 1]
ANY = TensorInfo("x", "float32", None)  # unknown rank


@pytest.fixture
def body_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """FORKSERVE_MAX_BODY_BYTES of 1 MiB for this test."""
    limit = 1024 * 1024
    monkeypatch.setattr(server.settings, "_current", dataclasses.replace(Settings.current(), max_body_bytes=limit))
    yield limit


@pytest.mark.parametrize(("shape", "info", "fitted"), [
    ((2, 10, 12, 3), IMAGE, (2, 10, 12, 3)),
    ((0, 10, 12, 3), IMAGE, (0, 10, 12, 3)),  # an empty batch is validate_inputs's to refuse, with its own message
    ((3,), COLUMN, (3, 1)),
    ((3, 1), COLUMN, (3, 1)),
    ((5, 6, 7), ANY, (5, 6, 7)),
    ((), ANY, ()),
])
def test_shapes_that_fit_the_signature(shape: tuple[int, ...], info: TensorInfo, fitted: tuple[int, ...]) -> None:
    assert check_shape(info.name, shape, info, max_rows=1024) == shape
    assert fitted_shape(info.name, shape, info) == fitted


@pytest.mark.parametrize(("shape", "info", "says"), [
    ((2, 10, 12), IMAGE, "input 'pixels' has rank 3 (shape [2, 10, 12]), the model takes rank 4 [-1, 10, 12, 3]"),
    ((2, 10, 12, 4), IMAGE, "input 'pixels' has shape [2, 10, 12, 4], the model takes [-1, 10, 12, 3]"),
    ((0, 2**62, 2**62, 1), IMAGE, "input 'pixels': shape [0, 4611686018427387904, 4611686018427387904, 1] is larger"),
    ((0, 2**20, 2**20, 1), IMAGE, "has shape [0, 1048576, 1048576, 1], the model takes [-1, 10, 12, 3]"),
    ((0, 2**62, 2**62, 1), ANY, "is larger than any tensor can be"),
    ((1, 2**40, 2**40, 0), ANY, "is larger than any tensor can be"),
    ((1,) * 70, ANY, f"input 'x' has rank 70; forkserve takes at most {MAX_RANK} dimensions"),
    ((1,) * 70, IMAGE, "has rank 70"),
    ((2, -1), ANY, "shape [2, -1] has a negative size"),
    ((1025, 1), COLUMN, "request has 1025 rows; the limit is 1024 (max_request_rows)"),
    ((1025,), ANY, "request has 1025 rows"),
])
def test_shapes_refused_before_an_array_is_built(shape: tuple[int, ...], info: TensorInfo, says: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_shape(info.name, shape, info, max_rows=1024)
    assert says in refused.value.message and refused.value.status == 400


def test_every_shape_check_dims_passes_is_one_numpy_can_make() -> None:
    for shape in [(0, 2**58, 2), (0,) + (1,) * (MAX_RANK - 1), (2**30, 0, 2**29)]:
        assert np.empty(0, np.float64).reshape(check_dims("x", shape)).shape == shape
    with pytest.raises(InvalidArgument, match="larger than any tensor"):
        check_dims("x", (0, 2**59, 2))


def test_rows_over_the_limit() -> None:
    check_rows(1024, 1024)
    with pytest.raises(InvalidArgument, match=r"request has 1025 rows; the limit is 1024 \(max_request_rows\)"):
        check_rows(1025, 1024)


def test_a_string_tensor_counts_its_lengths_and_a_fixed_cost_per_element(body_limit: int) -> None:
    elements = body_limit // STRING_ELEMENT_BYTES
    check_strings("text", elements, 0)
    with pytest.raises(InvalidArgument) as refused:
        check_strings("text", elements + 1, 0)  # zero-length elements: a few bytes of a request each
    assert "input 'text'" in refused.value.message and "FORKSERVE_MAX_BODY_BYTES" in refused.value.message
    check_strings("text", 1, body_limit - STRING_ELEMENT_BYTES)
    with pytest.raises(InvalidArgument, match="larger than the request size limit"):
        check_strings("text", 1, body_limit)
