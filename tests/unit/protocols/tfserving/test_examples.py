"""TF Serving's Classify/Regress/MultiInference rules (classifier.cc, regressor.cc, multi_inference.cc) without a server."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tensorflow.core.protobuf import meta_graph_pb2

from server.errors import ApiError, InvalidArgument
from server.protocols.tfserving import examples, proto_codec
from server.signature import SignatureInfo, TensorInfo

STRINGS = {"inputs": TensorInfo("inputs", "string", None, "tf_example:0")}
SCORES = TensorInfo("scores", "float32", (None, 1), "y:0")
# TF2's half_plus_two: classify/regress signatures whose method_name is predict
TF2_CLASSIFY = SignatureInfo("classify_x_to_y", "predict", {"inputs": TensorInfo("inputs", "string", (None,), "c:0")},
                             {"scores": SCORES}, method_name="tensorflow/serving/predict")
TF2_REGRESS = SignatureInfo("regress_x_to_y", "predict", {"inputs": TensorInfo("inputs", "string", (None,), "r:0")},
                            {"outputs": TensorInfo("outputs", "float32", (None, 1), "o:0")},
                            method_name="tensorflow/serving/predict")
PREDICT = SignatureInfo("serving_default", "predict", {"x": TensorInfo("x", "float32", (None, 1), "x:0")},
                        {"y": TensorInfo("y", "float32", (None, 1), "y:0")})
INIT = SignatureInfo("__saved_model_init_op", "predict", {}, {"__saved_model_init_op": TensorInfo("i", "invalid", None, "NoOp")},
                     method_name="")
DEFS = {s.name: s for s in (TF2_CLASSIFY, TF2_REGRESS, PREDICT, INIT)}


@pytest.mark.parametrize("signature", [TF2_CLASSIFY, PREDICT, INIT, SignatureInfo(
    "odd", "classify", {"a": TensorInfo("a", "int64", (0, 3)), "b": TensorInfo("b", "string", ())}, {})])
def test_debug_string_is_protobufs_text_format_of_the_signature_def(signature: SignatureInfo) -> None:
    proto = meta_graph_pb2.SignatureDef()
    proto_codec.signature_def(signature, proto)
    assert examples.debug_string(signature) == text_format.MessageToString(proto)


def test_tf2_signatures_of_the_predict_method_are_classified_and_regressed_by_their_keys() -> None:
    assert examples.examples_signature(DEFS, "classify_x_to_y", "classify") is TF2_CLASSIFY
    assert examples.examples_signature(DEFS, "regress_x_to_y", "regress") is TF2_REGRESS


@pytest.mark.parametrize(("name", "method", "message"), [
    ("nope", "classify", "No signature was found with the name: nope"),
    ("", "regress", "No regression inputs found in SignatureDef: inputs {\n  key: \"x\""),  # "": serving_default
    ("__saved_model_init_op", "classify", "Expected one input Tensor."),
    ("regress_x_to_y", "classify", 'Expected classification signature outputs to contain at least one of "classes" or '
                                   '"scores". Signature was: inputs {'),
    ("classify_x_to_y", "regress", "No regression outputs found in SignatureDef: inputs {"),
])
def test_signatures_that_do_not_fit_are_refused_in_tf_servings_words(name: str, method: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        examples.examples_signature(DEFS, name, method)
    assert refused.value.message.startswith(message), refused.value.message


def test_output_counts_and_input_dtype() -> None:
    three = SignatureInfo("s", "classify", STRINGS, {k: SCORES for k in ("scores", "classes", "other")})
    with pytest.raises(InvalidArgument, match="^Expected one or two output Tensors, found 3$"):
        examples.check_takes_examples(three, "classify")
    with pytest.raises(InvalidArgument, match="^Expected one output Tensor.$"):
        examples.check_takes_examples(SignatureInfo("s", "regress", STRINGS, {}), "regress")
    floats = SignatureInfo("s", "classify", {"inputs": TensorInfo("inputs", "float32", (1,))}, {"scores": SCORES})
    with pytest.raises(InvalidArgument, match="takes DT_FLOAT in 'inputs', not serialized tf.Examples"):
        examples.check_takes_examples(floats, "classify")


def test_multi_inference_tasks_are_checked_as_tf_serving_checks_them() -> None:
    classify, regress = "tensorflow/serving/classify", "tensorflow/serving/regress"
    tasks = [("m", "classify_x_to_y", classify), ("m", "regress_x_to_y", regress)]
    assert examples.multi_inference_tasks(tasks, DEFS) == [(TF2_CLASSIFY, "classify"), (TF2_REGRESS, "regress")]
    for given, message in [
        ([("", "classify_x_to_y", classify)], "Found ModelSpec with an empty model name."),
        ([tasks[0], ("n", "regress_x_to_y", regress)], "All ModelSpecs in a MultiInferenceRequest must access the same model name."),
        ([tasks[0], ("m", "classify_x_to_y", regress)], "Duplicate evaluation of signature: classify_x_to_y"),
        ([("m", "", classify)], "No classification inputs found in SignatureDef: inputs {\n  key: \"x\""),  # serving_default
        ([("m", "nope", classify)], "Requested signature not found in model graph: nope"),
        ([("m", "regress_x_to_y", classify)], 'Expected classification signature outputs to contain at least one of'),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            examples.multi_inference_tasks(given, DEFS)
        assert refused.value.message.startswith(message), refused.value.message
    with pytest.raises(ApiError) as unsupported:
        examples.multi_inference_tasks([("m", "classify_x_to_y", "tensorflow/serving/predict")], DEFS)
    assert (unsupported.value.status, unsupported.value.message) == (
        501, "Unsupported signature method_name: tensorflow/serving/predict")  # UNIMPLEMENTED


def test_classifications_pair_labels_and_scores_and_check_the_outputs() -> None:
    classes = np.array([[b"cat", b"dog"], [b"cat", b"dog"]], dtype=object)
    scores = np.array([[0.9, 0.1], [0.2, 0.8]], np.float32)
    got = examples.classifications({"classes": classes, "scores": scores}, 2)
    assert [[(label, round(score, 3)) for label, score in row] for row in got] == [
        [("cat", 0.9), ("dog", 0.1)], [("cat", 0.2), ("dog", 0.8)]]
    assert examples.classifications({"scores": scores[:1, :1]}, 1) == [[(None, pytest.approx(0.9))]]
    assert examples.classifications({"classes": classes[:1]}, 1) == [[("cat", None), ("dog", None)]]
    for outputs, rows, message in [
        ({"scores": np.zeros((2,), np.float32)}, 2, "Expected Tensor shape: [batch_size num_classes] but got [2]"),
        ({"scores": np.zeros((2, 1), np.float64)}, 2, "Expected scores Tensor of DT_FLOAT. Got: DT_DOUBLE"),
        ({"classes": np.zeros((2, 1), np.int64)}, 2, "Expected classes Tensor of DT_STRING. Got: DT_INT64"),
        ({"scores": np.zeros((3, 1), np.float32)}, 2, "Expected scores output batch size of 2. Got: 3"),
        ({"classes": classes, "scores": np.zeros((2, 3), np.float32)}, 2,
         "Tensors class and score should match in dim_size(1). Got 2 vs. 3"),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            examples.classifications(outputs, rows)
        assert refused.value.message == message


def test_regressions_take_n_or_n_by_1_floats() -> None:
    assert examples.regressions({"outputs": np.array([[2.5], [3.0]], np.float32)}, 2) == [2.5, 3.0]
    assert examples.regressions({"outputs": np.array([2.5], np.float32)}, 1) == [2.5]
    for outputs, message in [
        (np.zeros((2, 2), np.float32), "Expected output Tensor shape to be either [batch_size] or [batch_size, 1] but got [2,2]"),
        (np.zeros(3, np.float32), "Input batch size did not match output batch size: 2 vs. 3"),
        (np.zeros(2, np.int32), "Expected output Tensor of DT_FLOAT.  Got: DT_INT32"),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            examples.regressions({"outputs": outputs}, 2)
        assert refused.value.message == message
