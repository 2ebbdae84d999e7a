"""TF Serving's REST JSON bodies: predict request decoding and predict/classify/regress encoding."""

from __future__ import annotations

import base64
from typing import Any, Callable

import numpy as np
import pytest

from server.config import ModelConfig
from server.errors import InvalidArgument, NotFound
from server.protocols.tfserving.json_codec import (
    DEFAULT_SIGNATURE,
    PredictRequest,
    decode_examples,
    decode_predict,
    encode_classify,
    encode_predict,
    encode_regress,
)
from server.signature import SignatureInfo, TensorInfo
from server.tensors import jsonio

CONFIG = ModelConfig()
SINGLE = SignatureInfo(
    "serving_default",
    "predict",
    {"x": TensorInfo("x", "float32", (None, 3))},
    {"y": TensorInfo("y", "float32", (None, 1))},
)
MULTI = SignatureInfo(
    "serving_default",
    "predict",
    {"tag": TensorInfo("tag", "int64", (None, 2)), "signal": TensorInfo("signal", "float32", (None, 3))},
    {"score": TensorInfo("score", "float32", (None, 2))},
)
IMAGE = SignatureInfo(
    "serving_default",
    "predict",
    {"image": TensorInfo("image", "float32", (None, 8, 8, 1))},
    {"probs": TensorInfo("probs", "float32", (None, 3))},
)


class Lookup:
    """signature_lookup stand-in: returns one signature and records the names asked for."""

    def __init__(self, signature: SignatureInfo) -> None:
        self.signature = signature
        self.names: list[str] = []

    def __call__(self, name: str) -> SignatureInfo:
        """Record `name`, answer the signature."""
        self.names.append(name)
        return self.signature


def decode(body: Any, signature: SignatureInfo = SINGLE) -> PredictRequest:
    """decode_predict against one signature with default settings."""
    return decode_predict(body, Lookup(signature), CONFIG)


def png_b64(encode_image: Callable[..., bytes], value: int) -> dict[str, str]:
    """An 8x8 grayscale PNG of one gray level as a {"b64"} value."""
    return {"b64": base64.b64encode(encode_image(np.full((8, 8), value, np.uint8))).decode()}


# --- decode_predict -------------------------------------------------------------------------------


def test_row_format_single_input() -> None:
    request = decode({"instances": [[1, 2, 3], [4, 5, 6]]})
    assert request.row_format is True
    assert request.signature_name == DEFAULT_SIGNATURE == "serving_default"
    assert list(request.inputs) == ["x"]
    assert request.inputs["x"].dtype == np.float32
    np.testing.assert_array_equal(request.inputs["x"], [[1, 2, 3], [4, 5, 6]])


def test_row_format_single_input_named_in_each_instance() -> None:
    request = decode({"instances": [{"x": [1, 2, 3]}, {"x": [4, 5, 6]}]})
    np.testing.assert_array_equal(request.inputs["x"], [[1, 2, 3], [4, 5, 6]])


def test_row_format_named_multi_input() -> None:
    body = {"instances": [{"tag": [1, 2], "signal": [0.5, 1, 2]}, {"signal": [3, 4, 5], "tag": [3, 4]}]}
    request = decode(body, MULTI)
    assert request.row_format is True
    assert request.inputs["tag"].dtype == np.int64 and request.inputs["signal"].dtype == np.float32
    np.testing.assert_array_equal(request.inputs["tag"], [[1, 2], [3, 4]])
    np.testing.assert_array_equal(request.inputs["signal"], [[0.5, 1, 2], [3, 4, 5]])


def test_row_format_multi_input_needs_objects() -> None:
    with pytest.raises(InvalidArgument, match=r"signature takes named inputs \['signal', 'tag'\]: each instance must be an object"):
        decode({"instances": [[1, 2], [3, 4]]}, MULTI)


def test_row_format_instances_must_name_the_same_inputs() -> None:
    body = {"instances": [{"tag": [1, 2], "signal": [1, 2, 3]}, {"tag": [3, 4]}]}
    with pytest.raises(InvalidArgument, match="every instance must name the same inputs"):
        decode(body, MULTI)


def test_columnar_single_input() -> None:
    request = decode({"inputs": [[1, 2, 3]]})
    assert request.row_format is False
    np.testing.assert_array_equal(request.inputs["x"], [[1, 2, 3]])


def test_columnar_single_input_by_name() -> None:
    request = decode({"inputs": {"x": [[1, 2, 3], [4, 5, 6]]}})
    assert request.row_format is False
    assert request.inputs["x"].shape == (2, 3)


def test_columnar_named_multi_input() -> None:
    request = decode({"inputs": {"tag": [[1, 2]], "signal": [[1.5, 2, 3]]}}, MULTI)
    assert request.row_format is False
    np.testing.assert_array_equal(request.inputs["tag"], [[1, 2]])
    np.testing.assert_array_equal(request.inputs["signal"], [[1.5, 2, 3]])


def test_columnar_multi_input_needs_an_object() -> None:
    with pytest.raises(InvalidArgument, match="'inputs' must be an object"):
        decode({"inputs": [[1, 2]]}, MULTI)


def test_unknown_input_name_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"unknown input 'z'; signature 'serving_default' takes \['x'\]"):
        decode({"inputs": {"z": [[1, 2, 3]]}})
    with pytest.raises(InvalidArgument, match="unknown input 'z'"):
        decode({"instances": [{"z": [1, 2, 3]}]})


def test_both_instances_and_inputs_is_an_error() -> None:
    with pytest.raises(InvalidArgument, match="both 'instances' and 'inputs'"):
        decode({"instances": [[1, 2, 3]], "inputs": [[1, 2, 3]]})


def test_neither_instances_nor_inputs_is_an_error() -> None:
    with pytest.raises(InvalidArgument, match="neither 'instances'.*nor 'inputs'"):
        decode({"signature_name": "serving_default"})


def test_unknown_body_fields_are_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"unknown field\(s\) in predict request: \['instance'\]"):
        decode({"inputs": [[1, 2, 3]], "instance": 1})


@pytest.mark.parametrize("body", [[], "x", None, 1])
def test_body_must_be_an_object(body: Any) -> None:
    with pytest.raises(InvalidArgument, match="request body must be a JSON object"):
        decode(body)


def test_instances_must_be_a_non_empty_list() -> None:
    with pytest.raises(InvalidArgument, match="'instances' must be a list"):
        decode({"instances": {"x": [1, 2, 3]}})
    with pytest.raises(InvalidArgument, match="empty batch"):
        decode({"instances": []})


def test_signature_name_is_passed_to_the_lookup() -> None:
    lookup = Lookup(SINGLE)
    request = decode_predict({"signature_name": "predict_images", "inputs": [[1, 2, 3]]}, lookup, CONFIG)
    assert lookup.names == ["predict_images"]
    assert request.signature_name == "predict_images"


def test_default_signature_is_looked_up_when_none_is_named() -> None:
    lookup = Lookup(SINGLE)
    decode_predict({"instances": [[1, 2, 3]]}, lookup, CONFIG)
    assert lookup.names == ["serving_default"]


@pytest.mark.parametrize("name", ["", 5, None, ["a"]])
def test_signature_name_must_be_a_non_empty_string(name: Any) -> None:
    with pytest.raises(InvalidArgument, match="signature_name must be a non-empty string"):
        decode({"signature_name": name, "instances": [[1, 2, 3]]})


def test_lookup_errors_propagate() -> None:
    def missing(name: str) -> SignatureInfo:
        raise NotFound(f"signature {name!r} not found")

    with pytest.raises(NotFound, match="'nope' not found"):
        decode_predict({"signature_name": "nope", "instances": [[1, 2, 3]]}, missing, CONFIG)


def test_b64_image_instances_for_an_image_input(encode_image: Callable[..., bytes]) -> None:
    request = decode({"instances": [png_b64(encode_image, 255), png_b64(encode_image, 0)]}, IMAGE)
    image = request.inputs["image"]
    assert image.shape == (2, 8, 8, 1) and image.dtype == np.float32
    assert image[0].min() == 1.0 and image[1].max() == 0.0


def test_named_b64_image_instances(encode_image: Callable[..., bytes]) -> None:
    request = decode({"instances": [{"image": png_b64(encode_image, 255)}]}, IMAGE)
    assert request.inputs["image"].shape == (1, 8, 8, 1)


def test_columnar_b64_images(encode_image: Callable[..., bytes]) -> None:
    request = decode({"inputs": {"image": [png_b64(encode_image, 0)] * 3}}, IMAGE)
    assert request.inputs["image"].shape == (3, 8, 8, 1)


def test_b64_for_a_numeric_non_image_input_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="b64 values are not accepted"):
        decode({"instances": [{"b64": "AAAA"}]})
    with pytest.raises(InvalidArgument, match="b64 values are not accepted"):
        decode({"inputs": {"b64": "AAAA"}})


def test_image_scale_setting_reaches_the_decoder(encode_image: Callable[..., bytes]) -> None:
    body = {"instances": [png_b64(encode_image, 255)]}
    request = decode_predict(body, Lookup(IMAGE), ModelConfig(image_scale="symmetric"))
    assert request.inputs["image"].max() == 1.0
    request = decode_predict({"instances": [png_b64(encode_image, 0)]}, Lookup(IMAGE), ModelConfig(image_scale="symmetric"))
    assert request.inputs["image"].min() == -1.0


# --- encode_predict ---------------------------------------------------------------------------------


def test_encode_row_format_single_output_leaves_the_name_out() -> None:
    body = encode_predict({"y": np.array([[1.5], [2.5]], np.float32)}, row_format=True)
    assert jsonio.dumps(body) == b'{"predictions":[[1.5],[2.5]]}'


def test_encode_row_format_multi_output_gives_an_object_per_instance() -> None:
    outputs = {"a": np.array([[1, 2], [3, 4]], np.int32), "b": np.array([0.5, 1.5], np.float32)}
    assert jsonio.dumps(encode_predict(outputs, row_format=True)) == (
        b'{"predictions":[{"a":[1,2],"b":0.5},{"a":[3,4],"b":1.5}]}'
    )


def test_encode_columnar_single_output_leaves_the_name_out() -> None:
    body = encode_predict({"y": np.array([[1.5], [2.5]], np.float32)}, row_format=False)
    assert jsonio.dumps(body) == b'{"outputs":[[1.5],[2.5]]}'


def test_encode_columnar_multi_output_gives_an_object_of_outputs() -> None:
    outputs = {"a": np.array([[1, 2], [3, 4]], np.int32), "b": np.array([0.5, 1.5], np.float32)}
    assert jsonio.dumps(encode_predict(outputs, row_format=False)) == b'{"outputs":{"a":[[1,2],[3,4]],"b":[0.5,1.5]}}'


def test_encode_bytes_outputs_as_b64_and_other_strings_as_text() -> None:
    outputs = {
        "image_bytes": np.array([[b"\x00\xff"], [b"hi"]], dtype=object),
        "label": np.array([[b"cat"], [b"dog"]], dtype=object),
    }
    assert jsonio.dumps(encode_predict(outputs, row_format=False)) == (
        b'{"outputs":{"image_bytes":[[{"b64":"AP8="}],[{"b64":"aGk="}]],"label":[["cat"],["dog"]]}}'
    )


def test_encode_single_bytes_output_in_row_format() -> None:
    outputs = {"png_bytes": np.array([b"\x89PNG"], dtype=object)}
    assert jsonio.dumps(encode_predict(outputs, row_format=True)) == b'{"predictions":[{"b64":"iVBORw=="}]}'


def test_encode_invalid_utf8_text_output_is_replaced_not_raised() -> None:
    outputs = {"label": np.array([b"caf\xe9"], dtype=object)}
    assert jsonio.dumps(encode_predict(outputs, row_format=False)) == '{"outputs":["caf\ufffd"]}'.encode()


def test_encode_row_format_multi_output_with_a_rank_one_string_output() -> None:
    outputs = {"label": np.array([b"cat", b"dog"], dtype=object), "score": np.array([0.5, 0.25], np.float32)}
    assert jsonio.dumps(encode_predict(outputs, row_format=True)) == (
        b'{"predictions":[{"label":"cat","score":0.5},{"label":"dog","score":0.25}]}'
    )


# --- classify / regress -------------------------------------------------------------------------------


def test_encode_classify_pairs_labels_with_scores() -> None:
    outputs = {
        "classes": np.array([[b"cat", b"dog"], [b"cat", b"dog"]], dtype=object),
        "scores": np.array([[0.75, 0.25], [0.125, 0.875]], np.float32),
    }
    body = encode_classify(outputs, batch=2)
    assert body == {"results": [[["cat", 0.75], ["dog", 0.25]], [["cat", 0.125], ["dog", 0.875]]]}
    assert jsonio.dumps(body) == b'{"results":[[["cat",0.75],["dog",0.25]],[["cat",0.125],["dog",0.875]]]}'


def test_encode_classify_with_scores_only_gives_empty_labels() -> None:
    body = encode_classify({"scores": np.array([[0.5, 0.5]], np.float32)}, batch=1)
    assert body == {"results": [[["", 0.5], ["", 0.5]]]}


def test_encode_classify_with_classes_only_gives_zero_scores() -> None:
    body = encode_classify({"classes": np.array([[b"a", b"b"]], dtype=object)}, batch=1)
    assert body == {"results": [[["a", 0.0], ["b", 0.0]]]}


def test_encode_classify_refuses_numeric_classes_as_tf_serving_does() -> None:
    with pytest.raises(InvalidArgument, match="^Expected classes Tensor of DT_STRING. Got: DT_INT64$"):
        encode_classify({"classes": np.array([[3, 7]], np.int64), "scores": np.array([[0.5, 0.25]], np.float32)}, batch=1)


def test_encode_regress_gives_one_value_per_example() -> None:
    body = encode_regress({"outputs": np.array([[0.5], [1.5], [-2.0]], np.float32)}, batch=3)
    assert body == {"results": [0.5, 1.5, -2.0]}
    assert jsonio.dumps(body) == b'{"results":[0.5,1.5,-2.0]}'


@pytest.mark.parametrize(
    ("outputs", "message"),
    [({}, "Could not find output tensor 'outputs'"),
     ({"outputs": np.zeros((2, 2), np.float32)}, r"\[batch_size, 1\] but got \[2,2\]"),
     ({"scores": np.zeros(2, np.float32)}, "Could not find output tensor 'outputs'")],
    ids=["no-outputs", "two-values-each", "wrong-name"],
)
def test_encode_regress_refuses_other_output_shapes(outputs: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        encode_regress(outputs, batch=2)


def test_rows_over_the_limit_are_refused_before_a_row_is_decoded() -> None:
    config = ModelConfig(max_request_rows=4)
    junk = {"b64": base64.b64encode(b"not an image").decode()}  # decoding any row would fail on it
    for body in ({"instances": [junk] * 5}, {"inputs": [junk] * 5}, {"inputs": {"image": [junk] * 5}}):
        with pytest.raises(InvalidArgument, match=r"request has 5 rows; the limit is 4 \(max_request_rows\)"):
            decode_predict(body, Lookup(IMAGE), config)
    with pytest.raises(InvalidArgument, match="cannot decode image"):
        decode_predict({"instances": [junk] * 4}, Lookup(IMAGE), config)


def test_examples_over_the_row_limit_are_refused_before_one_is_built() -> None:
    with pytest.raises(InvalidArgument, match=r"request has 5 rows; the limit is 4 \(max_request_rows\)"):
        decode_examples({"examples": [{"x": None}] * 5}, max_rows=4)  # building one would refuse the null
    with pytest.raises(InvalidArgument, match="^Feature: x has element with unexpected JSON type: Null$"):
        decode_examples({"examples": [{"x": None}] * 4}, max_rows=4)
    name, serialized = decode_examples({"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}] * 4}, max_rows=4)
    assert name == "regress_x_to_y" and serialized.shape == (4,)


def parsed(body: dict) -> list[dict[str, tuple[str, list]]]:
    """decode_examples' tf.Examples as {feature: (kind, values)}."""
    from tensorflow.core.example import example_pb2

    _, serialized = decode_examples(body, max_rows=10)
    examples = [example_pb2.Example.FromString(item).features.feature for item in serialized]
    return [{k: (f.WhichOneof("kind"), list(getattr(f, f.WhichOneof("kind")).value) if f.WhichOneof("kind") else [])
             for k, f in e.items()} for e in examples]


def test_example_features_are_typed_as_tf_serving_types_them() -> None:
    """json_tensor.cc's AddValueToFeature: the first value sets the kind; booleans are int64, 1 is int64, 1.0 float."""
    body = {"examples": [{"b": True, "i": [1, -2], "f": 1.5, "s": ["a", {"b64": "AAE="}], "e": [], "big": 10**20}]}
    assert parsed(body) == [{"b": ("int64_list", [1]), "i": ("int64_list", [1, -2]), "f": ("float_list", [1.5]),
                             "s": ("bytes_list", [b"a", b"\x00\x01"]), "e": (None, []), "big": ("float_list", [pytest.approx(1e20, rel=1e-7)])}]
    context = parsed({"context": {"x": 5.0, "z": 1}, "examples": [{}, {"x": 1.0}]})
    assert [(e["x"][1], e["z"][1]) for e in context] == [([5.0], [1]), ([1.0], [1])]  # an example's feature wins
    for body, message in [
        ({"examples": [{"x": [1, 2.5]}]}, "Unexpected element type in feature: x expecting type: int64"),
        ({"examples": [{"x": ["a", 1.0]}]}, "Unexpected element type in feature: x expecting type: bytes"),
        ({"examples": [{"x": [[1.0]]}]}, "Feature: x has element with unexpected JSON type: Array"),
        ({"examples": [{"x": {"y": 1}}]}, "Feature: x has element with unexpected JSON type: Object"),
        ({"examples": [{"x": 2**63}]}, "Feature: x has uint64_t element. Only int64_t is supported."),
        ({"examples": [3]}, "Example must be JSON object but got JSON Number"),
        ({"context": [], "examples": [{}]}, "Example must be JSON object but got JSON Array"),
        ({"signature_name": 3, "examples": [{}]},
         'JSON Value: {"signature_name":3,"examples":[{}]} not formatted correctly. '
         "'signature_name' key must be a string value."),
        ({"context": {}}, """JSON Value: {"context":{}} When method is classify, key 'examples' is expected and was not found"""),
        ({"examples": {"x": 1}}, """JSON Value: {"examples":{"x":1}} Expecting 'examples' value to be an list/array"""),
        ({"examples": []}, """JSON Value: {"examples":[]} 'examples' value is an empty array"""),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            decode_examples(body, max_rows=10)
        assert refused.value.message == message
    assert decode_examples({"signature_name": "", "examples": [{}]}, max_rows=1)[0] == "serving_default"
