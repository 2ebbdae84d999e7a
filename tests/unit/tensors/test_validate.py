"""Decoded inputs against a signature: names, shapes, batch size, finiteness, rows."""

from __future__ import annotations

import numpy as np
import pytest

from server.config import ModelConfig
from server.errors import InvalidArgument
from server.signature import SignatureInfo, TensorInfo
from server.tensors.arrays import to_array
from server.tensors.validate import validate_inputs
from tests.unit.tensors.test_arrays import CONFIG, info, signature

# --- validate_inputs ----------------------------------------------------------------------------


def test_valid_inputs_pass_with_their_batch_size() -> None:
    sig = signature(info("float32", None, 3, name="a"), info("int64", None, name="b"))
    arrays = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(2, np.int64)}
    fed, batch = validate_inputs(arrays, sig, CONFIG)
    assert batch == 2
    assert fed.keys() == arrays.keys()
    assert fed["a"] is arrays["a"]


def test_missing_inputs_are_named() -> None:
    sig = signature(info("float32", None, name="a"), info("float32", None, name="b"))
    with pytest.raises(InvalidArgument, match=r"missing input\(s\) \['b'\]; signature 'serving_default' takes \['a', 'b'\]"):
        validate_inputs({"a": np.zeros(1, np.float32)}, sig, CONFIG)


def test_unknown_inputs_are_named() -> None:
    sig = signature(info("float32", None, name="a"))
    arrays = {"a": np.zeros(1, np.float32), "c": np.zeros(1, np.float32)}
    with pytest.raises(InvalidArgument, match=r"unknown input\(s\) \['c'\]; signature 'serving_default' takes \['a'\]"):
        validate_inputs(arrays, sig, CONFIG)


def test_rank_mismatch_message_gives_both_shapes() -> None:
    sig = signature(info("float32", None, 3))
    with pytest.raises(InvalidArgument) as caught:
        validate_inputs({"x": np.zeros((2, 3, 1, 5), np.float32)}, sig, CONFIG)
    assert caught.value.message == "input 'x' has rank 4 (shape [2, 3, 1, 5]), the model takes rank 2 [-1, 3]"


def test_too_few_dimensions_are_a_rank_mismatch() -> None:
    sig = signature(info("float32", None, 3))
    with pytest.raises(InvalidArgument, match=r"has rank 1 \(shape \[3\]\), the model takes rank 2 \[-1, 3\]"):
        validate_inputs({"x": np.zeros(3, np.float32)}, sig, CONFIG)


def test_shape_mismatch_message_gives_both_shapes() -> None:
    sig = signature(info("float32", None, 3))
    with pytest.raises(InvalidArgument) as caught:
        validate_inputs({"x": np.zeros((2, 4), np.float32)}, sig, CONFIG)
    assert caught.value.message == "input 'x' has shape [2, 4], the model takes [-1, 3]"


def test_fixed_batch_dimension_is_checked() -> None:
    sig = signature(info("float32", 1, 3))
    with pytest.raises(InvalidArgument, match=r"has shape \[2, 3\], the model takes \[1, 3\]"):
        validate_inputs({"x": np.zeros((2, 3), np.float32)}, sig, CONFIG)


def test_trailing_size_one_dimension_is_added_for_strict_signatures() -> None:
    sig = signature(info("float32", None, 1))
    fed, batch = validate_inputs({"x": np.array([1.0, 2.0, 5.0], np.float32)}, sig, CONFIG)
    assert fed["x"].shape == (3, 1) and batch == 3
    np.testing.assert_array_equal(fed["x"][:, 0], [1.0, 2.0, 5.0])


def test_several_trailing_size_one_dimensions_are_added() -> None:
    sig = signature(info("float32", None, 2, 1, 1))
    fed, _ = validate_inputs({"x": np.zeros((4, 2), np.float32)}, sig, CONFIG)
    assert fed["x"].shape == (4, 2, 1, 1)


def test_trailing_dimension_is_left_alone_for_non_strict_signatures() -> None:
    sig = signature(info("float32", None, 1), strict=False)
    x = np.array([1.0, 2.0, 5.0], np.float32)
    fed, batch = validate_inputs({"x": x}, sig, CONFIG)
    assert fed["x"].shape == (3,) and batch == 3


def test_trailing_dimension_is_not_added_when_other_dimensions_differ() -> None:
    sig = signature(info("float32", None, 3, 1))
    with pytest.raises(InvalidArgument, match="has rank 2"):
        validate_inputs({"x": np.zeros((2, 4), np.float32)}, sig, CONFIG)


def test_inputs_disagreeing_on_the_batch_size_are_refused() -> None:
    sig = signature(info("float32", None, name="a"), info("float32", None, name="b"))
    arrays = {"a": np.zeros(2, np.float32), "b": np.zeros(3, np.float32)}
    with pytest.raises(InvalidArgument, match=r"inputs disagree on the batch size: \[2, 3\]"):
        validate_inputs(arrays, sig, CONFIG)


def test_empty_batch_is_refused() -> None:
    sig = signature(info("float32", None, 3))
    with pytest.raises(InvalidArgument, match="empty batch"):
        validate_inputs({"x": np.zeros((0, 3), np.float32)}, sig, CONFIG)


def test_scalar_for_a_batched_input_is_refused() -> None:
    sig = signature(info("float32", None))
    with pytest.raises(InvalidArgument, match="has rank 0"):
        validate_inputs({"x": np.float32(1.0).reshape(())}, sig, CONFIG)


def test_scalar_input_of_a_scalar_signature_counts_as_one_example() -> None:
    sig = signature(info("float32"))
    fed, batch = validate_inputs({"x": np.array(2.0, np.float32)}, sig, CONFIG)
    assert batch == 1 and fed["x"].shape == ()


def test_unknown_rank_input_takes_any_shape() -> None:
    sig = signature(TensorInfo("x", "float32", None))
    fed, batch = validate_inputs({"x": np.zeros((4, 2, 7), np.float32)}, sig, CONFIG)
    assert batch == 4 and fed["x"].shape == (4, 2, 7)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_refused_by_default(bad: float) -> None:
    sig = signature(info("float32", None, 2))
    with pytest.raises(InvalidArgument, match="input 'x' holds NaN or Infinity"):
        validate_inputs({"x": np.array([[1.0, bad]], np.float32)}, sig, CONFIG)


def test_non_finite_values_pass_when_allowed() -> None:
    sig = signature(info("float32", None, 2))
    fed, _ = validate_inputs({"x": np.array([[np.nan, np.inf]], np.float32)}, sig, ModelConfig(allow_non_finite=True))
    assert np.isnan(fed["x"][0, 0]) and np.isinf(fed["x"][0, 1])


def test_number_too_large_for_float32_is_refused_as_non_finite() -> None:
    x_info = info("float32", None)
    array = to_array([1e300], x_info, CONFIG)
    with pytest.raises(InvalidArgument, match="too large for float32"):
        validate_inputs({"x": array}, signature(x_info), CONFIG)


def test_json_to_validated_arrays_end_to_end() -> None:
    x_info = info("float32", None, 1)
    array = to_array([1.0, 2.0, 5.0], x_info, CONFIG)  # TF Serving's half_plus_two example body
    fed, batch = validate_inputs({"x": array}, signature(x_info), CONFIG)
    assert batch == 3 and fed["x"].dtype == np.float32 and fed["x"].shape == (3, 1)


def test_rows_over_the_request_limit_are_refused() -> None:

    signature = SignatureInfo("s", "predict", {"x": TensorInfo("x", "float32", (None, 2))}, {})
    config = ModelConfig(max_request_rows=3)
    validate_inputs({"x": np.zeros((3, 2), np.float32)}, signature, config)
    with pytest.raises(InvalidArgument, match="4 rows; the limit is 3"):
        validate_inputs({"x": np.zeros((4, 2), np.float32)}, signature, config)
