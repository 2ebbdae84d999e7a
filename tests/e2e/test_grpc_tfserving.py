"""TF Serving's gRPC API with its unmodified client (tensorflow-serving-api) against REST's answers, on a real 2-worker server."""

from __future__ import annotations

import base64
import io
import time
from typing import Any, Callable, Iterator

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import json_format
from PIL import Image
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from tests.support.harness import Server
from tests.support.metrics import quiet_samples, samples, settled_samples, value
from tests.support.models import KERAS2, MAX_BODY_BYTES, REPO_ROOT

STATES = {"START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}


@pytest.fixture(scope="module")
def served(server: Server) -> Server:
    """The session's shared server: 2 workers over every model, the demo with its handler and a model of three outputs."""
    return server


@pytest.fixture(scope="module")
def channel(served: Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(served.grpc_target) as opened:  # the client's default channel settings
        yield opened


@pytest.fixture(scope="module")
def predictions(channel: grpc.Channel) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def models(channel: grpc.Channel) -> model_service_pb2_grpc.ModelServiceStub:
    return model_service_pb2_grpc.ModelServiceStub(channel)


def spec(message: Any, name: str, version: int | None = None, label: str | None = None, signature: str = "") -> Any:
    """Fill a request's model_spec."""
    message.model_spec.name = name
    if version is not None:
        message.model_spec.version.value = version
    if label is not None:
        message.model_spec.version_label = label
    if signature:
        message.model_spec.signature_name = signature
    return message


def predict_request(name: str, inputs: dict[str, Any], output_filter: tuple[str, ...] = (), **address: Any
                    ) -> predict_pb2.PredictRequest:
    """A PredictRequest as TF Serving's docs build one: tf.make_tensor_proto per input."""
    request = spec(predict_pb2.PredictRequest(), name, **address)
    for key, array in inputs.items():
        request.inputs[key].CopyFrom(array if isinstance(array, type(request.inputs[key])) else tf.make_tensor_proto(array))
    request.output_filter.extend(output_filter)
    return request


def outputs_of(response: predict_pb2.PredictResponse) -> dict[str, np.ndarray]:
    return {key: tf.make_ndarray(tensor) for key, tensor in response.outputs.items()}


def refused(call: Callable[..., Any], request: Any, **kwargs: Any) -> grpc.RpcError:
    """The error a call ends with (it must fail)."""
    with pytest.raises(grpc.RpcError) as failed:
        call(request, **kwargs)
    return failed.value


def rest_error(served: Server, path: str, body: Any) -> tuple[int, str]:
    """REST's status and message for the same request."""
    response = served.post(path, json=body) if body is not None else served.get(path)
    return response.status_code, response.json()["error"]


def rest_metadata(served: Server, name: str) -> dict[str, Any]:
    response = served.get(f"/v1/models/{name}/metadata")
    assert response.status_code == 200, response.text
    return response.json()


def example_input(served: Server, name: str, rows: int = 3) -> dict[str, np.ndarray]:
    """Seeded inputs of the serving signature's shapes (free dimensions get `rows`)."""
    rng = np.random.default_rng(11)
    signature = rest_metadata(served, name)["metadata"]["signature_def"]["signature_def"]["serving_default"]
    inputs = {}
    for key, info in signature["inputs"].items():
        assert info["dtype"] == "DT_FLOAT", (name, info)
        shape = [rows if int(d["size"]) < 0 else int(d["size"]) for d in info["tensor_shape"]["dim"]]
        inputs[key] = rng.random(shape, dtype=np.float32)
    return inputs


def encoded(image: Image.Image, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["half_plus_two", "half_plus_two_tf2", "cnn_h5", "mlp", "k3cnn", "digits"])
def test_predict_gives_the_numbers_rest_gives(served: Server, predictions: Any, name: str) -> None:
    inputs = example_input(served, name)
    if name == "cnn_h5":
        inputs = {key: np.load(KERAS2 / "reference.npz")["cnn_x"].astype(np.float32) for key in inputs}
    rest = served.post(f"/v1/models/{name}:predict", json={"inputs": {k: v.tolist() for k, v in inputs.items()}})
    assert rest.status_code == 200, rest.text
    response, call = predictions.Predict.with_call(predict_request(name, inputs))
    got = outputs_of(response)
    expected = rest.json()["outputs"]
    if len(got) == 1:
        expected = {next(iter(got)): expected}
    assert set(got) == set(expected)
    for key, array in got.items():
        assert array.dtype == np.float32
        np.testing.assert_allclose(array, np.array(expected[key], dtype=np.float32), rtol=1e-6, atol=1e-7)
        # the values in float_val, as TF Serving answers: the line most of its clients read
        tensor = response.outputs[key]
        assert not tensor.tensor_content and len(tensor.float_val) == array.size
        np.testing.assert_array_equal(np.array(tensor.float_val, dtype=np.float32).reshape(array.shape), array)
    version = int(rest.headers["X-Model-Version"])
    assert (response.model_spec.name, response.model_spec.version.value) == (name, version)
    assert response.model_spec.signature_name == "serving_default"
    assert dict(call.trailing_metadata())["x-model-version"] == str(version)
    if name == "cnn_h5":
        np.testing.assert_allclose(got[next(iter(got))], np.load(KERAS2 / "reference.npz")["cnn_y"], atol=1e-5)


def test_documented_half_plus_two_example(predictions: Any) -> None:
    response = predictions.Predict(predict_request("half_plus_two", {"x": np.array([[1.0], [2.0], [5.0]], np.float32)}),
                                   timeout=30)
    np.testing.assert_array_equal(outputs_of(response)["y"], [[2.5], [3.0], [4.5]])
    assert list(response.outputs["y"].float_val) == [2.5, 3.0, 4.5]
    assert response.model_spec.version.value == 123


def test_version_label_and_signature_behave_as_rest(served: Server, predictions: Any) -> None:
    features = np.random.default_rng(2).random((2, 20), dtype=np.float32)
    by_label = outputs_of(predictions.Predict(predict_request("mlp", {"features": features}, label="stable")))
    by_version = predictions.Predict(predict_request("mlp", {"features": features}, version=1))
    np.testing.assert_array_equal(by_label["logits"], outputs_of(by_version)["logits"])
    assert by_version.model_spec.version.value == 1
    x = np.array([[1.0], [2.0]], np.float32)
    other = predictions.Predict(predict_request("half_plus_two", {"inputs": x}, signature="regress_x2_to_y3"))
    rest = served.post("/v1/models/half_plus_two:predict", json={"signature_name": "regress_x2_to_y3", "instances": [[1.0], [2.0]]})
    (y3,) = outputs_of(other).values()
    np.testing.assert_array_equal(y3, rest.json()["predictions"])
    assert other.model_spec.signature_name == "regress_x2_to_y3"
    cases = [
        (predict_request("half_plus_two", {"x": x}, version=7), "/v1/models/half_plus_two/versions/7:predict", {}),
        (predict_request("nope", {"x": x}), "/v1/models/nope:predict", {}),
    ]
    for request, path, extra in cases:
        error = refused(predictions.Predict, request)
        status, message = rest_error(served, path, {"instances": [[1.0]], **extra})
        assert (error.code(), status) == (grpc.StatusCode.NOT_FOUND, 404), path
        assert error.details() == message
    error = refused(predictions.Predict, predict_request("mlp", {"features": features}, label="canary"))
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized servable version label: canary")
    assert rest_error(served, "/v1/models/mlp/labels/canary:predict", {"instances": [[1.0]]}) == (400, error.details())
    # TF Serving's own words, which differ between its gRPC (predict_util.cc) and REST (http_rest_api_handler.cc) paths
    error = refused(predictions.Predict, predict_request("half_plus_two", {"x": x}, signature="nope"))
    assert (error.code(), error.details()) == (grpc.StatusCode.FAILED_PRECONDITION, 'Serving signature key "nope" not found.')
    assert rest_error(served, "/v1/models/half_plus_two:predict", {"instances": [[1.0]], "signature_name": "nope"}) == (
        400, 'Serving signature name: "nope" not found in signature def')
    for call, message in ((predictions.Predict, predict_pb2.PredictRequest), (predictions.Regress, regression_pb2.RegressionRequest),
                          (predictions.Classify, classification_pb2.ClassificationRequest),
                          (predictions.GetModelMetadata, get_model_metadata_pb2.GetModelMetadataRequest)):
        error = refused(call, message())  # no model_spec at all
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Missing ModelSpec")
    error = refused(predictions.Predict, predict_pb2.PredictRequest(model_spec={"signature_name": "serving_default"}))
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "ModelSpec has no name specified.")


def test_output_filter_picks_outputs(predictions: Any) -> None:
    x = np.array([1.0, 2.0], np.float32)
    both = predictions.Predict(predict_request("heads", {"x": x}, ("plus_one", "double")))
    assert sorted(both.outputs) == ["double", "plus_one"]
    np.testing.assert_array_equal(outputs_of(both)["double"], [2.0, 4.0])
    only = predictions.Predict(predict_request("heads", {"x": x}, ("plus_one",)))
    assert list(only.outputs) == ["plus_one"] and tf.make_ndarray(only.outputs["plus_one"]).tolist() == [2.0, 3.0]
    for wanted, says in ((("double", "nope"), "output_filter names 'nope'; signature 'serving_default' gives"),
                         (("double", "double"), "names an output twice")):
        error = refused(predictions.Predict, predict_request("heads", {"x": x}, wanted))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and says in error.details(), error.details()


def test_request_ids_travel_in_metadata(predictions: Any) -> None:
    request = predict_request("half_plus_two", {"x": np.ones((1, 1), np.float32)})
    _, call = predictions.Predict.with_call(request, metadata=(("x-request-id", "client-abc.1"),))
    assert dict(call.trailing_metadata()) == {"x-request-id": "client-abc.1", "x-model-version": "123",
                                              "x-forkserve-worker": dict(call.trailing_metadata())["x-forkserve-worker"]}
    _, call = predictions.Predict.with_call(request)
    assert len(dict(call.trailing_metadata())["x-request-id"]) >= 16
    error = refused(predictions.Predict, predict_request("nope", {"x": np.ones((1, 1), np.float32)}),
                    metadata=(("x-request-id", "client-abc.2"),))
    assert dict(error.trailing_metadata())["x-request-id"] == "client-abc.2"


def tf_example(**features: float) -> tf.train.Example:
    return tf.train.Example(features=tf.train.Features(feature={
        key: tf.train.Feature(float_list=tf.train.FloatList(value=[value])) for key, value in features.items()}))


def test_classify_and_regress_give_rest_answers(served: Server, predictions: Any) -> None:
    request = spec(classification_pb2.ClassificationRequest(), "half_plus_two", signature="classify_x_to_y")
    request.input.example_list.examples.extend([tf_example(x=1.0), tf_example(x=2.0)])
    response = predictions.Classify(request)
    rest = served.post("/v1/models/half_plus_two:classify",
                       json={"signature_name": "classify_x_to_y", "examples": [{"x": 1.0}, {"x": 2.0}]}).json()
    got = [[[c.label, c.score] for c in result.classes] for result in response.result.classifications]
    assert got == rest["results"] == [[["", 2.5]], [["", 3.0]]]
    assert (response.model_spec.version.value, response.model_spec.signature_name) == (123, "classify_x_to_y")

    request = spec(regression_pb2.RegressionRequest(), "half_plus_two", signature="regress_x_to_y")
    request.input.example_list.examples.extend([tf_example(x=1.0), tf_example(x=2.0)])
    rest = served.post("/v1/models/half_plus_two:regress",
                       json={"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}, {"x": 2.0}]}).json()
    assert [r.value for r in predictions.Regress(request).result.regressions] == rest["results"] == [2.5, 3.0]

    request = spec(regression_pb2.RegressionRequest(), "half_plus_two", signature="regress_x_to_y")
    request.input.example_list_with_context.context.CopyFrom(tf_example(x=5.0))
    request.input.example_list_with_context.examples.extend([tf.train.Example(), tf_example(x=1.0)])
    rest = served.post("/v1/models/half_plus_two:regress", json={
        "signature_name": "regress_x_to_y", "context": {"x": 5.0}, "examples": [{}, {"x": 1.0}]}).json()
    assert [r.value for r in predictions.Regress(request).result.regressions] == rest["results"] == [4.5, 2.5]


def test_classify_and_regress_refuse_as_tf_serving_with_rest_s_words(served: Server, predictions: Any) -> None:
    cases = [  # (model, method, signature, examples, message TF Serving gives)
        ("half_plus_two", "Classify", "", [1.0], 'No classification inputs found in SignatureDef: inputs {\n  key: "x"\n'),
        ("half_plus_two", "Regress", "nope", [1.0], "No signature was found with the name: nope"),
        ("half_plus_two_tf2", "Classify", "regress_x_to_y", [1.0], "Expected classification signature outputs to contain"),
        ("half_plus_two_tf2", "Classify", "classify_x2_to_y3", [1.0], "signature 'classify_x2_to_y3' takes DT_FLOAT"),
        ("half_plus_two", "Regress", "regress_x_to_y", [], "Input is empty."),
    ]
    for model, method, signature, xs, message in cases:
        message_class = classification_pb2.ClassificationRequest if method == "Classify" else regression_pb2.RegressionRequest
        request = spec(message_class(), model, signature=signature)
        request.input.example_list.examples.extend([tf_example(x=x) for x in xs])
        error = refused(getattr(predictions, method), request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and error.details().startswith(message), error.details()
        if xs:
            body = {"examples": [{"x": x} for x in xs], **({"signature_name": signature} if signature else {})}
            assert rest_error(served, f"/v1/models/{model}:{method.lower()}", body) == (400, error.details())


def test_tf2_classify_and_regress_signatures_answer_as_rest(served: Server, predictions: Any) -> None:
    request = spec(classification_pb2.ClassificationRequest(), "half_plus_two_tf2", signature="classify_x_to_y")
    request.input.example_list.examples.extend([tf_example(x=1.0), tf_example(x=2.0)])
    response = predictions.Classify(request)
    assert [[(c.label, c.score) for c in r.classes] for r in response.result.classifications] == [[("", 2.5)], [("", 3.0)]]
    assert (response.model_spec.name, response.model_spec.version.value, response.model_spec.signature_name) == (
        "half_plus_two_tf2", 123, "classify_x_to_y")
    request = spec(regression_pb2.RegressionRequest(), "half_plus_two_tf2", signature="regress_x_to_y")
    request.input.example_list_with_context.context.CopyFrom(tf_example(x=5.0))
    request.input.example_list_with_context.examples.extend([tf.train.Example(), tf_example(x=1.0)])
    rest = served.post("/v1/models/half_plus_two_tf2:regress", json={
        "signature_name": "regress_x_to_y", "context": {"x": 5.0}, "examples": [{}, {"x": 1.0}]}).json()
    assert [r.value for r in predictions.Regress(request).result.regressions] == rest["results"] == [4.5, 2.5]


def requests_counted(scrape: dict, **labels: str) -> float:
    """forkserve_requests_total summed over the series that carry these labels."""
    return sum(count for (name, series), count in scrape.items()
               if name == "forkserve_requests_total" and set(labels.items()) <= series)


def multi_inference_request(model: str, tasks: list[tuple[str, str]], xs: list[float]) -> inference_pb2.MultiInferenceRequest:
    """A MultiInferenceRequest of (signature, method) tasks of one model on examples of feature x."""
    request = inference_pb2.MultiInferenceRequest()
    for signature, method in tasks:
        task = request.tasks.add()
        task.model_spec.name = model
        task.model_spec.signature_name = signature
        task.method_name = f"tensorflow/serving/{method}"
    request.input.example_list.examples.extend([tf_example(x=x) for x in xs])
    return request


@pytest.mark.parametrize("model", ["half_plus_two", "half_plus_two_tf2"])
def test_multi_inference_answers_each_task_as_its_own_call(served: Server, predictions: Any, model: str) -> None:
    before = requests_counted(samples(served), model=model, api="tfserving_multi_inference", protocol="grpc", code="200")
    request = multi_inference_request(model, [("classify_x_to_y", "classify"), ("regress_x_to_y2", "regress"),
                                              ("", "regress") if model == "half_plus_two" else ("regress_x_to_y", "regress")],
                                      [1.0, 2.0])
    if model == "half_plus_two":  # serving_default has no regression tensors: TF Serving refuses the whole request
        error = refused(predictions.MultiInference, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith("No regression inputs found in SignatureDef: "), error.details()
        del request.tasks[2]
    response = predictions.MultiInference(request)
    single = spec(classification_pb2.ClassificationRequest(), model, signature="classify_x_to_y")
    single.input.CopyFrom(request.input)
    assert response.results[0].classification_result == predictions.Classify(single).result
    single = spec(regression_pb2.RegressionRequest(), model, signature="regress_x_to_y2")
    single.input.CopyFrom(request.input)
    assert response.results[1].regression_result == predictions.Regress(single).result
    assert [r.value for r in response.results[1].regression_result.regressions] == [3.5, 4.0]  # y2 = 0.5 x + 3
    assert [(r.model_spec.name, r.model_spec.version.value, r.model_spec.signature_name) for r in response.results][:2] == [
        (model, 123, "classify_x_to_y"), (model, 123, "regress_x_to_y2")]
    if model == "half_plus_two_tf2":
        assert [r.value for r in response.results[2].regression_result.regressions] == [2.5, 3.0]
    settled_samples(served, lambda scrape: requests_counted(scrape, model=model, api="tfserving_multi_inference",
                                                            protocol="grpc", code="200") > before,
                    "MultiInference counted under its own api label")


def test_multi_inference_refuses_as_tf_serving(predictions: Any) -> None:
    good = [("classify_x_to_y", "classify")]
    other_model = multi_inference_request("half_plus_two", good + [("regress_x_to_y", "regress")], [1.0])
    other_model.tasks[1].model_spec.name = "half_plus_two_tf2"
    unnamed = multi_inference_request("half_plus_two", good + [("regress_x_to_y", "regress")], [1.0])
    unnamed.tasks[1].model_spec.name = ""
    cases = [
        (inference_pb2.MultiInferenceRequest(), grpc.StatusCode.INVALID_ARGUMENT, "ModelSpec has no name specified."),
        (multi_inference_request("nope", good, [1.0]), grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(nope)"),
        (other_model, grpc.StatusCode.INVALID_ARGUMENT,
         "All ModelSpecs in a MultiInferenceRequest must access the same model name."),
        (unnamed, grpc.StatusCode.INVALID_ARGUMENT, "Found ModelSpec with an empty model name."),
        (multi_inference_request("half_plus_two", good * 2, [1.0]), grpc.StatusCode.INVALID_ARGUMENT,
         "Duplicate evaluation of signature: classify_x_to_y"),
        (multi_inference_request("half_plus_two", [("nope", "classify")], [1.0]), grpc.StatusCode.INVALID_ARGUMENT,
         "Requested signature not found in model graph: nope"),
        (multi_inference_request("half_plus_two", [("classify_x_to_y", "predict")], [1.0]), grpc.StatusCode.UNIMPLEMENTED,
         "Unsupported signature method_name: tensorflow/serving/predict"),
        (multi_inference_request("half_plus_two", good, []), grpc.StatusCode.INVALID_ARGUMENT, "Input is empty."),
    ]
    for request, code, details in cases:
        error = refused(predictions.MultiInference, request)
        assert (error.code(), error.details()) == (code, details)


@pytest.mark.parametrize("name", ["half_plus_two", "mlp", "k3cnn", "cnn_h5"])
def test_metadata_matches_rest(served: Server, predictions: Any, name: str) -> None:
    request = spec(get_model_metadata_pb2.GetModelMetadataRequest(), name)
    request.metadata_field.append("signature_def")
    response = predictions.GetModelMetadata(request)
    rest = rest_metadata(served, name)
    assert (response.model_spec.name, str(response.model_spec.version.value)) == (name, rest["model_spec"]["version"])
    assert response.model_spec.signature_name == ""
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_map)
    got = json_format.MessageToDict(signature_map)["signatureDef"]
    expected = rest["metadata"]["signature_def"]["signature_def"]
    assert set(got) == set(expected)
    for key, signature in expected.items():
        assert got[key]["methodName"] == signature["method_name"]
        for kind in ("inputs", "outputs"):
            assert set(got[key][kind]) == set(signature[kind])
            for tensor, info in signature[kind].items():
                mine = got[key][kind][tensor]
                assert (mine["name"], mine["dtype"]) == (info["name"], info["dtype"])
                assert [d["size"] for d in mine["tensorShape"].get("dim", [])] == [d["size"] for d in info["tensor_shape"]["dim"]]
                assert mine["tensorShape"].get("unknownRank", False) == info["tensor_shape"]["unknown_rank"]


@pytest.mark.parametrize("name", ["half_plus_two", "half_plus_two_tf2"])
def test_metadata_sends_the_savedmodels_signature_defs(predictions: Any, model_repo: Any, name: str) -> None:
    from tensorflow.core.protobuf import saved_model_pb2

    request = spec(get_model_metadata_pb2.GetModelMetadataRequest(), name)
    request.metadata_field.append("signature_def")
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert predictions.GetModelMetadata(request).metadata["signature_def"].Unpack(signature_map)
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((model_repo / name / "00000123" / "saved_model.pb").read_bytes())
    (meta,) = saved.meta_graphs
    assert dict(signature_map.signature_def) == dict(meta.signature_def)  # as TF Serving copies them


def test_metadata_fields_other_than_signature_def_are_invalid(predictions: Any) -> None:
    for fields, details in (([], "GetModelMetadataRequest must specify at least one metadata_field"),
                            (["signature_def", "nope"], "Metadata field nope is not supported")):
        request = spec(get_model_metadata_pb2.GetModelMetadataRequest(), "half_plus_two")
        request.metadata_field.extend(fields)
        error = refused(predictions.GetModelMetadata, request)
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, details)


@pytest.mark.parametrize(("name", "version", "label"), [
    ("half_plus_two", None, None), ("half_plus_two", 123, None), ("mlp", None, "stable"), ("fallback", None, None),
    ("fallback", 2, None),
])
def test_model_status_matches_rest(served: Server, models: Any, name: str, version: int | None, label: str | None) -> None:
    path = f"/v1/models/{name}" + (f"/versions/{version}" if version else "") + (f"/labels/{label}" if label else "")
    rest = served.get(path).json()["model_version_status"]
    response = models.GetModelStatus(spec(get_model_status_pb2.GetModelStatusRequest(), name, version, label))
    got = [(s.version, s.state, s.status.error_code, s.status.error_message) for s in response.model_version_status]
    codes = {"OK": 0, "UNKNOWN": 2}
    assert got == [(int(s["version"]), STATES[s["state"]], codes[s["status"]["error_code"]], s["status"]["error_message"])
                   for s in rest]
    if name == "fallback":
        assert any(state == STATES["END"] and message for _, state, _, message in got)


def test_model_status_errors_match_rest(served: Server, models: Any) -> None:
    for name, version, label, path in (("nope", None, None, "/v1/models/nope"),
                                       ("half_plus_two", 7, None, "/v1/models/half_plus_two/versions/7"),
                                       ("mlp", None, "canary", "/v1/models/mlp/labels/canary")):
        error = refused(models.GetModelStatus, spec(get_model_status_pb2.GetModelStatusRequest(), name, version, label))
        status, message = rest_error(served, path, None)
        assert (error.code(), status, error.details()) == (grpc.StatusCode.NOT_FOUND, 404, message)


def test_reload_config_is_unimplemented_on_a_server_of_its_own_repository(models: Any) -> None:
    error = refused(models.HandleReloadConfigRequest, model_management_pb2.ReloadConfigRequest())
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED and "publish" in error.details()


def test_invalid_inputs_answer_rests_messages(served: Server, predictions: Any) -> None:
    rows = np.random.default_rng(5).random((2, 20), dtype=np.float32)
    cases = [  # (gRPC inputs, REST columnar inputs or None when JSON cannot say it, what the message says)
        ({"features": rows[:, :19]}, {"features": rows[:, :19].tolist()}, "has shape [2, 19]"),
        ({"features": np.ones((1025, 20), np.float32)}, {"features": np.ones((1025, 20)).tolist()}, "limit is 1024"),
        ({"features": rows.astype(np.float64)}, None, "input 'features' is DT_DOUBLE; signature 'serving_default' takes DT_FLOAT"),
        ({"features": np.where(rows > 0.5, np.nan, rows).astype(np.float32)}, None, "NaN"),
        ({"features": rows, "nope": rows}, None, "unknown input(s) ['nope']"),
        ({}, None, "missing input(s) ['features']"),
        ({"features": tf.make_tensor_proto(rows)}, None, None),  # the valid one, as a control
    ]
    for inputs, rest_inputs, says in cases:
        request = predict_request("mlp", inputs)
        if says is None:
            assert predictions.Predict(request).outputs["logits"].tensor_shape.dim[0].size == 2
            continue
        error = refused(predictions.Predict, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and says in error.details(), error.details()
        if rest_inputs is not None:
            assert rest_error(served, "/v1/models/mlp:predict", {"inputs": rest_inputs}) == (400, error.details())
    truncated = tf.make_tensor_proto(rows)
    truncated.tensor_content = truncated.tensor_content[:-4]
    error = refused(predictions.Predict, predict_request("mlp", {"features": truncated}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "156 bytes of tensor_content" in error.details()


def test_a_failed_version_is_failed_precondition(served: Server, predictions: Any) -> None:
    error = refused(predictions.Predict, predict_request("fallback", {"features": np.ones((1, 20), np.float32)}, version=2))
    status, message = rest_error(served, "/v1/models/fallback/versions/2:predict", {"instances": [[1.0] * 20]})
    assert (error.code(), status, error.details()) == (grpc.StatusCode.FAILED_PRECONDITION, 503, message)


def slow_request() -> predict_pb2.PredictRequest:
    return predict_request("slow", {"image": np.random.default_rng(1).random((1, 192, 192, 3), dtype=np.float32)})


def test_a_full_queue_is_resource_exhausted(predictions: Any) -> None:
    request = slow_request()
    calls = [predictions.Predict.future(request, timeout=60) for _ in range(8)]  # one channel: one worker's queue
    codes = []
    for call in calls:
        try:
            call.result()
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                assert "queue" in exc.details(), exc.details()
    assert grpc.StatusCode.OK in codes and grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes
    assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes


def test_the_clients_deadline_ends_the_call_and_counts_as_rest_does(served: Server, predictions: Any) -> None:
    predictions.Predict(slow_request(), timeout=60)  # warm, so the deadline below cuts the call, not a first trace
    before = value(samples(served), "forkserve_rejected_requests_total", model="slow", reason="deadline")
    started = time.monotonic()
    error = refused(predictions.Predict, slow_request(), timeout=0.05)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 1.0
    settled_samples(served, lambda scrape: value(scrape, "forkserve_rejected_requests_total", model="slow",
                                                 reason="deadline") > before, "the deadline counted as rejected")


def test_a_message_over_the_body_limit_is_resource_exhausted_and_the_server_keeps_serving(
        served: Server, predictions: Any) -> None:
    padding = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"p" * 1000]))

    def padded_examples(count: int) -> regression_pb2.RegressionRequest:
        request = spec(regression_pb2.RegressionRequest(), "half_plus_two", signature="regress_x_to_y")
        for i in range(count):
            example = tf_example(x=float(i))
            example.features.feature["padding"].CopyFrom(padding)
            request.input.example_list.examples.append(example)
        return request

    over, under = padded_examples(1100), padded_examples(1000)
    assert over.ByteSize() > MAX_BODY_BYTES > under.ByteSize() > MAX_BODY_BYTES * 0.9
    error = refused(predictions.Regress, over)
    for _ in range(2):  # NOTE: a 32 MiB upload may cross the connection's max age: UNAVAILABLE, which clients retry
        if not (error.code() == grpc.StatusCode.UNAVAILABLE and "max_age" in (error.details() or "")):
            break
        error = refused(predictions.Regress, over)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert [r.value for r in predictions.Regress(under).result.regressions][:3] == [2.0, 2.5, 3.0]
    assert served.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]}).json() == {"predictions": [2.5]}


def test_a_server_side_failure_is_internal_with_the_request_id(predictions: Any) -> None:
    error = refused(predictions.Predict, predict_request("heads", {"x": np.ones(2, np.float32)}),
                    metadata=(("x-request-id", "rid-internal-1"),))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "output 'complex' is complex64" in error.details() and "(request id rid-internal-1)" in error.details()
    assert dict(error.trailing_metadata())["x-request-id"] == "rid-internal-1"


def test_a_handler_model_is_predicted_without_its_handler(served: Server, predictions: Any) -> None:
    png = (REPO_ROOT / "models" / "digits" / "2" / "assets" / "example.png").read_bytes()
    handled = served.post("/v1/models/handled:predict", json={"image": base64.b64encode(png).decode()})
    assert handled.status_code == 200 and handled.headers["X-Model-Version"] == "2", handled.text
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L").resize((8, 8), Image.Resampling.BOX), np.float32) / 255
    tensors = predictions.Predict(predict_request("handled", {"image": pixels[np.newaxis, :, :, np.newaxis]}))
    assert tensors.model_spec.version.value == 2 and list(tensors.outputs) == ["probabilities"]
    v2 = served.post("/v2/models/handled/versions/2/infer", json={"inputs": [
        {"name": "image", "shape": [1, 8, 8, 1], "datatype": "FP32", "data": pixels.reshape(-1).tolist()}]}).json()
    probabilities = outputs_of(tensors)["probabilities"]
    np.testing.assert_allclose(probabilities.reshape(-1), v2["outputs"][0]["data"], rtol=1e-6)
    assert int(probabilities.argmax()) == handled.json()["digit"]
    from_png = outputs_of(predictions.Predict(predict_request("handled", {"image": np.array([png], dtype=object)})))
    np.testing.assert_allclose(from_png["probabilities"][0].max(), handled.json()["probability"], rtol=1e-6)
    # The handler's own request (base64 text of the image) is not an image to the model's input.
    as_text = np.array([base64.b64encode(png)], dtype=object)
    error = refused(predictions.Predict, predict_request("handled", {"image": as_text}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "cannot decode image for input 'image'" in error.details()


def test_encoded_images_as_strings_decode_as_rests_b64(served: Server, predictions: Any) -> None:
    rng = np.random.default_rng(3)
    image = Image.fromarray(rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8), "RGB")
    for data in (encoded(image, "PNG"), encoded(image, "JPEG", quality=90)):
        rest = served.post("/v1/models/k3cnn:predict", json={"instances": [{"b64": base64.b64encode(data).decode()}] * 2})
        assert rest.status_code == 200, rest.text
        got = outputs_of(predictions.Predict(predict_request("k3cnn", {"pixels": np.array([data, data], dtype=object)})))
        np.testing.assert_allclose(got["scores"], rest.json()["predictions"], rtol=1e-6, atol=1e-7)
    digit = (REPO_ROOT / "examples" / "digit.png").read_bytes()
    rest = served.post("/v1/models/digits:predict", json={"instances": [{"b64": base64.b64encode(digit).decode()}]})
    name = next(iter(rest_metadata(served, "digits")["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]))
    got = outputs_of(predictions.Predict(predict_request("digits", {name: np.array([digit], dtype=object)})))
    (output,) = got.values()
    np.testing.assert_allclose(output, rest.json()["predictions"], rtol=1e-6, atol=1e-7)
    assert int(output.argmax()) == 3
    bad = refused(predictions.Predict, predict_request("k3cnn", {"pixels": np.array([b"not an image"], dtype=object)}))
    status, message = rest_error(served, "/v1/models/k3cnn:predict", {"instances": [{"b64": base64.b64encode(b"not an image").decode()}]})
    assert (bad.code(), status, bad.details()) == (grpc.StatusCode.INVALID_ARGUMENT, 400, message)
    grid = refused(predictions.Predict, predict_request("k3cnn", {"pixels": np.array([[data]], dtype=object)}))
    assert grid.code() == grpc.StatusCode.INVALID_ARGUMENT and "shape [N]" in grid.details()


def string_fill(value: bytes, rows: int) -> Any:
    """A DT_STRING TensorProto of shape [rows] holding one value (TF's fill): a few hundred bytes on the wire."""
    message = tf.make_tensor_proto(value, shape=[rows])
    assert len(message.string_val) == 1
    return message


def test_a_string_fill_is_counted_before_one_image_is_decoded(predictions: Any) -> None:
    png = (REPO_ROOT / "examples" / "digit.png").read_bytes()
    name = "image"  # the digits model's input
    request = predict_request("digits", {name: string_fill(png, 250_000)})
    assert request.ByteSize() < 300
    started = time.monotonic()
    error = refused(predictions.Predict, request, timeout=10)  # before: 250,000 PNGs decoded, 30 s of a worker's CPU
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert error.details() == "request has 250000 rows; the limit is 1024 (max_request_rows)"
    assert time.monotonic() - started < 2
    answer = outputs_of(predictions.Predict(predict_request("digits", {name: string_fill(png, 3)}), timeout=30))
    assert [int(row.argmax()) for row in answer["probabilities"]] == [3, 3, 3]


def test_a_string_fill_is_held_to_the_size_its_strings_take(predictions: Any) -> None:
    example = tf_example(x=1.0)
    example.features.feature["padding"].bytes_list.value.append(b"p" * 2000)
    serialized = example.SerializeToString()

    def regress(rows: int) -> predict_pb2.PredictRequest:
        return predict_request("half_plus_two", {"inputs": string_fill(serialized, rows)}, signature="regress_x_to_y")

    # 1024 rows of 2 KB: 2 MB decoded from a message of 2 KB, over the 1 MiB limit (it counted 8 bytes a row)
    error = refused(predictions.Predict, regress(1024), timeout=30)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'inputs'" in error.details() and "larger than the request size limit (1048576 bytes" in error.details()
    assert tf.make_ndarray(predictions.Predict(regress(400), timeout=30).outputs["outputs"]).reshape(-1).tolist() == [2.5] * 400


@pytest.mark.parametrize("dims", [[0, 2**62, 2**62, 1], [1] * 70, [1025, 20]])
def test_a_shape_the_signature_cannot_take_is_invalid_before_an_array_is_made(predictions: Any, dims: list[int]) -> None:
    message = tf.make_tensor_proto(np.zeros(0, np.float32))
    message.tensor_shape.ClearField("dim")
    for size in dims:
        message.tensor_shape.dim.add().size = size
    error = refused(predictions.Predict, predict_request("mlp", {"features": message}), timeout=30)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()  # before: INTERNAL from numpy's reshape
    assert "input 'features'" in error.details() or "request has 1025 rows" in error.details(), error.details()


def test_classify_and_regress_count_their_examples_against_the_row_limit(served: Server, predictions: Any) -> None:
    for method, message in (("Regress", regression_pb2.RegressionRequest()), ("Classify", classification_pb2.ClassificationRequest())):
        signature = "regress_x_to_y" if method == "Regress" else "classify_x_to_y"
        request = spec(message, "half_plus_two", signature=signature)
        request.input.example_list.examples.extend([tf_example(x=1.0)] * 1025)
        error = refused(getattr(predictions, method), request, timeout=30)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == "request has 1025 rows; the limit is 1024 (max_request_rows)"
        with_context = spec(type(message)(), "half_plus_two", signature=signature)
        with_context.input.example_list_with_context.context.CopyFrom(tf_example(x=5.0))
        with_context.input.example_list_with_context.examples.extend([tf.train.Example()] * 1025)
        assert refused(getattr(predictions, method), with_context, timeout=30).details() == error.details()
        status, rest = rest_error(served, f"/v1/models/half_plus_two:{method.lower()}",
                                  {"signature_name": signature, "examples": [{"x": 1.0}] * 1025})
        assert (status, rest) == (400, error.details())
    request = spec(regression_pb2.RegressionRequest(), "half_plus_two", signature="regress_x_to_y")
    request.input.example_list.examples.extend([tf_example(x=1.0)] * 1024)
    assert len(predictions.Regress(request, timeout=30).result.regressions) == 1024


@pytest.mark.parametrize("name", ["../x", "..", "a/b", "x y"])
def test_an_invalid_model_name_is_invalid_argument_on_every_call(predictions: Any, models: Any, name: str) -> None:
    metadata = spec(get_model_metadata_pb2.GetModelMetadataRequest(), name)
    metadata.metadata_field.append("signature_def")
    regress = spec(regression_pb2.RegressionRequest(), name)
    regress.input.example_list.examples.append(tf_example(x=1.0))
    for call, request in ((predictions.Predict, predict_request(name, {"x": np.ones((1, 1), np.float32)})),
                          (predictions.GetModelMetadata, metadata), (predictions.Regress, regress),
                          (models.GetModelStatus, spec(get_model_status_pb2.GetModelStatusRequest(), name))):
        error = refused(call, request, timeout=30)
        assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, f"invalid model name {name!r}")


def test_a_call_past_its_deadline_stops_at_the_next_chunk_of_its_rows(served: Server, predictions: Any) -> None:
    """The slow model runs one row a call (max_batch_size 1): a call that gave up stops running its rows."""
    predictions.Predict(slow_request(), timeout=60)  # warm
    two_rows = predict_request("slow", {"image": np.random.default_rng(2).random((2, 192, 192, 3), dtype=np.float32)})
    before = quiet_samples(served)
    error = refused(predictions.Predict, two_rows, timeout=0.05)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    predictions.Predict(slow_request(), timeout=60)  # one channel, one worker: queued behind what still runs
    after = quiet_samples(served)
    calls = value(after, "forkserve_batch_size_rows_count", model="slow") - value(before, "forkserve_batch_size_rows_count", model="slow")
    assert 1 <= calls <= 2, calls  # the follow-up's call, and at most the first row of the abandoned call (before: all 3)
