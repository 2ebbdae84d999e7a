"""TensorFlow Serving REST API against a real 2-worker gunicorn: status, metadata, predict, classify, regress."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.harness import Server
from tests.support.models import KERAS2


def test_documented_half_plus_two_example(server: Server) -> None:
    response = server.post("/v1/models/half_plus_two:predict", json={"instances": [1.0, 2.0, 5.0]})
    assert response.status_code == 200, response.text
    assert response.json() == {"predictions": [2.5, 3.0, 4.5]}
    assert response.headers["X-Model-Version"] == "123"
    assert response.headers["Content-Type"] == "application/json"


def test_curl_default_form_content_type_is_read_as_json(server: Server) -> None:
    response = server.post(
        "/v1/models/half_plus_two:predict",
        data=b'{"instances": [1.0]}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.json() == {"predictions": [2.5]}


def test_columnar_request_answers_outputs(server: Server) -> None:
    response = server.post("/v1/models/half_plus_two:predict", json={"inputs": {"x": [[1.0], [3.0]]}})
    assert response.json() == {"outputs": [[2.5], [3.5]]}
    response = server.post("/v1/models/half_plus_two:predict", json={"inputs": [1.0, 3.0]})
    assert response.json() == {"outputs": [2.5, 3.5]}


def test_status_of_model_and_version(server: Server) -> None:
    expected = {"version": "123", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    assert server.get("/v1/models/half_plus_two").json() == {"model_version_status": [expected]}
    assert server.get("/v1/models/half_plus_two/versions/123").json() == {"model_version_status": [expected]}


def test_unknown_model_and_version_are_404_with_error(server: Server) -> None:
    for path in ("/v1/models/nope", "/v1/models/nope:predict", "/v1/models/half_plus_two/versions/7"):
        method = server.post if path.endswith(":predict") else server.get
        response = method(path, json={"instances": [1.0]}) if method == server.post else method(path)
        assert response.status_code == 404, path
        assert set(response.json()) == {"error"}
    response = server.post("/v1/models/half_plus_two/versions/7:predict", json={"instances": [1.0]})
    assert response.status_code == 404
    assert "half_plus_two" in response.json()["error"]


def saved_signature_defs(path: Path) -> dict[str, Any]:
    """A SavedModel's SignatureDefs read from its saved_model.pb, as TF Serving's REST metadata prints them."""
    from google.protobuf import json_format
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((path / "saved_model.pb").read_bytes())
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    for meta in proto.meta_graphs:
        if "serve" in meta.meta_info_def.tags:
            signature_map.signature_def.MergeFrom(meta.signature_def)
    return json_format.MessageToDict(signature_map, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)["signature_def"]


@pytest.mark.parametrize("name", ["half_plus_two", "half_plus_two_tf2"])
def test_metadata_is_the_savedmodels_signature_defs(server: Server, model_repo: Path, name: str) -> None:
    body = server.get(f"/v1/models/{name}/metadata").json()
    assert body["model_spec"] == {"name": name, "signature_name": "", "version": "123"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    # every SignatureDef as saved (tensor names such as x:0 or serving_default_x:0, defaults, __saved_model_init_op)
    assert signatures == saved_signature_defs(model_repo / name / "00000123")
    if name == "half_plus_two":
        assert signatures["serving_default"]["inputs"]["x"]["name"] == "x:0"
        assert signatures["classify_x_to_y"]["inputs"]["inputs"] == {
            "dtype": "DT_STRING", "tensor_shape": {"dim": [], "unknown_rank": True}, "name": "tf_example:0"}
    else:
        assert signatures["classify_x_to_y"]["method_name"] == "tensorflow/serving/predict"
        assert signatures["__saved_model_init_op"]["outputs"]["__saved_model_init_op"]["name"] == "NoOp"


@pytest.mark.parametrize("name", ["mlp", "multi_h5"])
def test_keras_metadata_names_tensors_as_its_savedmodel_export(server: Server, keras_models: dict, tmp_path: Path,
                                                               name: str) -> None:
    """A .keras/.h5 model reports the tensor names TF Serving gives the same model exported with Keras 3."""
    keras_models[name].export(str(tmp_path / "export"), format="tf_saved_model", verbose=False)
    exported = saved_signature_defs(tmp_path / "export")["serving_default"]
    signature = server.get(f"/v1/models/{name}/metadata").json()["metadata"]["signature_def"]["signature_def"][
        "serving_default"]
    assert signature["inputs"] == exported["inputs"]
    model = keras_models[name]  # forkserve keys outputs by the model's names; the export a list of them by output_<i>
    keys = {k: k if isinstance(model.output, dict) else f"output_{i}" for i, k in enumerate(model.output_names)}
    assert signature["outputs"] == {key: exported["outputs"][keys[key]] for key in keys}


def test_signature_name_selects_another_signature(server: Server) -> None:
    response = server.post(
        "/v1/models/half_plus_two:predict", json={"signature_name": "regress_x2_to_y3", "instances": [[1.0], [2.0]]}
    )
    assert response.status_code == 200, response.text
    # y3 = 0.5 * x + 3 in TF Serving's test model.
    assert response.json() == {"predictions": [[3.5], [4.0]]}
    missing = server.post("/v1/models/half_plus_two:predict", json={"signature_name": "nope", "instances": [1.0]})
    assert (missing.status_code, missing.json()) == (400, {"error": 'Serving signature name: "nope" not found in signature def'})


def test_classify_and_regress_with_tf_examples(server: Server) -> None:
    examples = [{"x": 1.0}, {"x": 2.0}]
    classify = server.post(
        "/v1/models/half_plus_two:classify", json={"signature_name": "classify_x_to_y", "examples": examples}
    )
    assert classify.status_code == 200, classify.text
    assert classify.json() == {"results": [[["", 2.5]], [["", 3.0]]]}
    regress = server.post(
        "/v1/models/half_plus_two:regress", json={"signature_name": "regress_x_to_y", "examples": examples}
    )
    assert regress.json() == {"results": [2.5, 3.0]}
    with_context = server.post(
        "/v1/models/half_plus_two:regress",
        json={"signature_name": "regress_x_to_y", "context": {"x": 5.0}, "examples": [{}, {"x": 1.0}]},
    )
    assert with_context.json() == {"results": [4.5, 2.5]}


def test_classify_on_a_signature_without_its_tensors_is_refused_in_tf_servings_words(server: Server) -> None:
    response = server.post("/v1/models/half_plus_two:classify", json={"examples": [{"x": 1.0}]})
    assert response.status_code == 400
    assert response.json()["error"].startswith('No classification inputs found in SignatureDef: inputs {\n  key: "x"\n')
    for body, message in (({"signature_name": "nope", "examples": [{"x": 1.0}]}, "No signature was found with the name: nope"),
                          ({"signature_name": "classify_x_to_y", "examples": [{"x": 1.0}]},
                           "No regression outputs found in SignatureDef: ")):
        response = server.post("/v1/models/half_plus_two_tf2:regress", json=body)
        assert response.status_code == 400 and response.json()["error"].startswith(message), response.text


def test_tf2_classify_and_regress_signatures_answer_as_tf_serving(server: Server) -> None:
    """TF2's half_plus_two labels them tensorflow/serving/predict; TF Serving classifies and regresses them by their keys."""
    examples = [{"x": 1.0}, {"x": 2.0}]
    classify = server.post("/v1/models/half_plus_two_tf2:classify", json={"signature_name": "classify_x_to_y",
                                                                          "examples": examples})
    assert classify.status_code == 200, classify.text
    assert classify.json() == {"results": [[["", 2.5]], [["", 3.0]]]}
    regress = server.post("/v1/models/half_plus_two_tf2:regress", json={"signature_name": "regress_x_to_y",
                                                                        "examples": examples})
    assert regress.json() == {"results": [2.5, 3.0]}
    floats = server.post("/v1/models/half_plus_two_tf2:classify", json={"signature_name": "classify_x2_to_y3",
                                                                        "examples": examples})
    assert floats.status_code == 400 and "takes DT_FLOAT in 'inputs', not serialized tf.Examples" in floats.json()["error"]


def test_tf2_savedmodel_with_fixed_batch(server: Server) -> None:
    response = server.post("/v1/models/half_plus_two_tf2:predict", json={"instances": [4.0]})
    assert response.json() == {"predictions": [4.0]}


def test_keras3_model_matches_in_process(server: Server, keras_models: dict) -> None:
    x = np.random.default_rng(1).normal(size=(3, 20)).astype(np.float32)
    response = server.post("/v1/models/mlp:predict", json={"instances": x.tolist()})
    assert response.status_code == 200, response.text
    expected = keras_models["mlp"](x, training=False).numpy()
    np.testing.assert_allclose(np.array(response.json()["predictions"]), expected, atol=1e-5)
    assert server.get("/v1/models/mlp/metadata").json()["metadata"]["signature_def"]["signature_def"][
        "serving_default"
    ]["outputs"].keys() == {"logits"}


def test_labels_and_explicit_versions(server: Server) -> None:
    body = {"instances": [[0.5] * 20]}
    by_label = server.post("/v1/models/mlp/labels/stable:predict", json=body)
    by_version = server.post("/v1/models/mlp/versions/1:predict", json=body)
    assert by_label.status_code == by_version.status_code == 200
    assert by_label.json() == by_version.json()
    unknown = server.post("/v1/models/mlp/labels/canary:predict", json=body)  # TF Serving's INVALID_ARGUMENT
    assert (unknown.status_code, unknown.json()) == (400, {"error": "Unrecognized servable version label: canary"})
    assert server.get("/v1/models/mlp/labels/canary/metadata").status_code == 400


def test_keras2_hdf5_and_savedmodel_match_keras2_outputs(server: Server) -> None:
    reference = np.load(KERAS2 / "reference.npz")
    for name in ("cnn_h5", "cnn_savedmodel"):
        response = server.post(f"/v1/models/{name}:predict", json={"instances": reference["cnn_x"].tolist()})
        assert response.status_code == 200, (name, response.text)
        np.testing.assert_allclose(np.array(response.json()["predictions"]), reference["cnn_y"], atol=1e-5)


@pytest.mark.parametrize("form", ["rows", "columns"])
def test_named_multi_input_keras2_model(server: Server, form: str) -> None:
    reference = np.load(KERAS2 / "reference.npz")
    tags, signals = reference["multi_tag"].tolist(), reference["multi_signal"].tolist()
    if form == "rows":
        body = {"instances": [{"tag": t, "signal": s} for t, s in zip(tags, signals)]}
        key = "predictions"
    else:
        body = {"inputs": {"tag": tags, "signal": signals}}
        key = "outputs"
    response = server.post("/v1/models/multi_h5:predict", json=body)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(np.array(response.json()[key]), reference["multi_y"], atol=1e-5)


def test_every_response_carries_a_request_id_and_echoes_the_callers(server: Server) -> None:
    assert len(server.get("/healthz").headers["X-Request-Id"]) >= 16
    echoed = server.get("/healthz", headers={"X-Request-Id": "client-abc.1"})
    assert echoed.headers["X-Request-Id"] == "client-abc.1"
