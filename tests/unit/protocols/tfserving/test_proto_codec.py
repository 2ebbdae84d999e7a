"""TF Serving's protobuf wire form without a server: examples in, classifications and regressions out, specs."""

from __future__ import annotations

import numpy as np
import pytest
from tensorflow.core.example import example_pb2, feature_pb2
from tensorflow_serving.apis import classification_pb2, input_pb2, model_pb2, regression_pb2

from server.errors import InvalidArgument
from server.protocols.tfserving import proto_codec


def example(**features: float) -> example_pb2.Example:
    """A tf.Example of float features."""
    return example_pb2.Example(features=feature_pb2.Features(feature={
        name: feature_pb2.Feature(float_list=feature_pb2.FloatList(value=[value])) for name, value in features.items()}))


def test_examples_with_a_context_are_the_context_then_each_example_and_counted_first() -> None:
    given = input_pb2.Input()
    given.example_list_with_context.context.CopyFrom(example(x=5.0, z=1.0))
    given.example_list_with_context.examples.extend([example(), example(x=1.0)])
    serialized = proto_codec.serialized_examples(given, max_rows=2)
    merged = [example_pb2.Example.FromString(s).features.feature for s in serialized]
    assert [(f["x"].float_list.value[0], f["z"].float_list.value[0]) for f in merged] == [(5.0, 1.0), (1.0, 1.0)]
    with pytest.raises(InvalidArgument, match="request has 2 rows; the limit is 1"):
        proto_codec.serialized_examples(given, max_rows=1)
    with pytest.raises(InvalidArgument, match=r"^Input is empty\.$"):  # TF Serving's words (util.cc)
        proto_codec.serialized_examples(input_pb2.Input(), max_rows=2)
    empty = input_pb2.Input()
    empty.example_list.SetInParent()
    with pytest.raises(InvalidArgument, match=r"^Input is empty\.$"):
        proto_codec.serialized_examples(empty, max_rows=2)


def test_classifications_carry_labels_and_scores_per_example() -> None:
    result = classification_pb2.ClassificationResult()
    proto_codec.fill_classifications(result, {"scores": np.array([[0.9, 0.1], [0.2, 0.8]], np.float32),
                                              "classes": np.array([[b"cat", b"dog"], [b"cat", b"dog"]], object)}, 2)
    assert [[(c.label, round(c.score, 3)) for c in r.classes] for r in result.classifications] == [
        [("cat", 0.9), ("dog", 0.1)], [("cat", 0.2), ("dog", 0.8)]]
    scores_only = classification_pb2.ClassificationResult()
    proto_codec.fill_classifications(scores_only, {"scores": np.array([[2.5]], np.float32)}, 1)
    assert [(c.label, c.score) for c in scores_only.classifications[0].classes] == [("", 2.5)]


def test_regressions_are_one_value_per_example_or_invalid() -> None:
    result = regression_pb2.RegressionResult()
    proto_codec.fill_regressions(result, {"outputs": np.array([[2.5], [3.0]], np.float32)}, 2)
    assert [r.value for r in result.regressions] == [2.5, 3.0]
    with pytest.raises(InvalidArgument, match="Input batch size did not match output batch size: 2 vs. 3"):
        proto_codec.fill_regressions(regression_pb2.RegressionResult(), {"outputs": np.zeros(3, np.float32)}, 2)


def test_the_model_spec_names_the_version_that_answered() -> None:
    spec = model_pb2.ModelSpec()
    proto_codec.fill_spec(spec, "half_plus_two", 123, "regress_x_to_y")
    assert (spec.name, spec.version.value, spec.signature_name) == ("half_plus_two", 123, "regress_x_to_y")
