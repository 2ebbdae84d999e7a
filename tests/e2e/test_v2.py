"""Open Inference Protocol V2 against the real server, with tritonclient.http unmodified."""

from __future__ import annotations

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.support.harness import Server
from tests.support.models import KERAS2


@pytest.fixture(scope="module")
def client(server: Server) -> triton.InferenceServerClient:
    """tritonclient's HTTP client pointed at the shared server."""
    return triton.InferenceServerClient(url=server.url.removeprefix("http://"), connection_timeout=30, network_timeout=60)


def test_server_and_model_health(client: triton.InferenceServerClient, server: Server) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()  # the broken models of the shared repository do not make it unready
    assert client.is_model_ready("mlp")
    assert client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("corrupt")
    metadata = client.get_server_metadata()
    assert metadata["name"] == "forkserve" and "binary_tensor_data" in metadata["extensions"]


def test_model_metadata_reports_datatypes_and_variable_dims(client: triton.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("half_plus_two")
    assert metadata["name"] == "half_plus_two" and metadata["versions"] == ["123"]
    assert metadata["platform"] == "tensorflow_savedmodel"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}]
    assert metadata["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}]
    keras = client.get_model_metadata("k3cnn", "1")
    assert keras["platform"] == "keras" and keras["inputs"][0]["shape"] == [-1, 10, 12, 3]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_half_plus_two_binary_and_json(client: triton.InferenceServerClient, binary: bool) -> None:
    x = np.array([[1.0], [2.0], [5.0]], dtype=np.float32)
    tensor = triton.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    result = client.infer("half_plus_two", [tensor], outputs=[triton.InferRequestedOutput("y", binary_data=binary)], request_id="r-7")
    np.testing.assert_array_equal(result.as_numpy("y"), x / 2 + 2)
    response = result.get_response()
    assert response["model_name"] == "half_plus_two" and response["model_version"] == "123" and response["id"] == "r-7"


def test_infer_keras_model_matches_in_process(client: triton.InferenceServerClient, keras_models: dict) -> None:
    x = np.random.default_rng(5).normal(size=(4, 20)).astype(np.float32)
    tensor = triton.InferInput("features", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("mlp", [tensor], model_version="1")
    np.testing.assert_allclose(result.as_numpy("logits"), keras_models["mlp"](x, training=False).numpy(), atol=1e-5)


def test_infer_named_inputs(client: triton.InferenceServerClient) -> None:
    reference = np.load(KERAS2 / "reference.npz")
    inputs = []
    for name in ("tag", "signal"):
        array = reference[f"multi_{name}"].astype(np.float32)
        tensor = triton.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=name == "tag")
        inputs.append(tensor)
    result = client.infer("multi_h5", inputs)
    np.testing.assert_allclose(result.as_numpy("score"), reference["multi_y"], atol=1e-5)


def test_bytes_tensors_reach_a_tf_example_signature(client: triton.InferenceServerClient) -> None:
    from tensorflow.core.example import example_pb2

    examples = []
    for value in (1.0, 4.0):
        example = example_pb2.Example()
        example.features.feature["x"].float_list.value.append(value)
        examples.append(example.SerializeToString())
    tensor = triton.InferInput("inputs", [2], "BYTES")
    tensor.set_data_from_numpy(np.array(examples, dtype=object))
    result = client.infer("half_plus_two", [tensor], parameters={"signature_name": "regress_x_to_y"})
    np.testing.assert_array_equal(result.as_numpy("outputs"), [[2.5], [4.0]])


def test_client_sees_a_clear_error(client: triton.InferenceServerClient) -> None:
    tensor = triton.InferInput("x", [2, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="model takes FP32"):
        client.infer("half_plus_two", [tensor])


BAD = [
    ("shape and data disagree", {"inputs": [{"name": "x", "shape": [3, 1], "datatype": "FP32", "data": [1.0, 2.0]}]}, {}, b"", 400, "3 expected"),
    ("unknown datatype", {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP128", "data": [1.0]}]}, {}, b"", 400, "unknown datatype"),
    ("negative dimension", {"inputs": [{"name": "x", "shape": [-1, 1], "datatype": "FP32", "data": [1.0]}]}, {}, b"", 400, "non-negative"),
    ("strings for FP32", {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": ["a"]}]}, {}, b"", 400, "float32"),
    ("unknown input", {"inputs": [{"name": "z", "shape": [1], "datatype": "FP32", "data": [1.0]}]}, {}, b"", 400, "unknown input"),
    ("no inputs", {"inputs": []}, {}, b"", 400, "non-empty list"),
    ("binary size past the body", {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "parameters": {"binary_data_size": 40}}]}, {"binary": True}, b"\x00" * 4, 400, "runs past"),
    ("binary size disagrees with shape", {"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}, {"binary": True}, b"\x00" * 4, 400, "8 expected"),
    ("header length past the body", {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}, {"header_length": 10_000}, b"", 400, "Inference-Header-Content-Length"),
    ("NaN in data", None, {}, b'{"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [NaN]}]}', 400, "NaN"),
    ("rows before data", {"inputs": [{"name": "x", "shape": [2000, 1], "datatype": "FP32", "data": []}]}, {}, b"", 400, "request has 2000 rows; the limit is 1024"),
    ("a shape no array can have", {"inputs": [{"name": "x", "shape": [0, 2**62, 2**62, 1], "datatype": "FP32", "data": []}]}, {}, b"", 400,
     "input 'x': shape [0, 4611686018427387904, 4611686018427387904, 1] is larger than any tensor can be"),
    ("rank 70", {"inputs": [{"name": "x", "shape": [1] * 70, "datatype": "FP32", "data": [1.0]}]}, {}, b"", 400, "input 'x' has rank 70"),
    ("an input twice", {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}] * 2}, {}, b"", 400, "input 'x' is given twice"),
    ("an output twice", {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}], "outputs": [{"name": "y"}, {"name": "y"}]},
     {}, b"", 400, "output 'y' is requested twice"),
    ("zero-length BYTES past the size limit", {"parameters": {"signature_name": "regress_x_to_y"}, "inputs": [
        {"name": "inputs", "shape": [1, 20_000], "datatype": "BYTES", "parameters": {"binary_data_size": 80_000}}]},
     {"binary": True}, b"\xff" * 80_000, 400, "larger than the request size limit (1048576 bytes"),
]


@pytest.mark.parametrize("name,header,options,extra,status,words", BAD, ids=[b[0] for b in BAD])
def test_bad_v2_requests_get_a_clear_4xx(server: Server, name: str, header: dict | None, options: dict, extra: bytes, status: int, words: str) -> None:
    import orjson

    body = orjson.dumps(header) if header is not None else extra
    headers = {"Content-Type": "application/json"}
    if options.get("binary") or options.get("header_length"):
        headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(options.get("header_length", len(body)))}
        body = body + extra
    response = requests.post(f"{server.url}/v2/models/half_plus_two/infer", data=body, headers=headers, timeout=30)
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error"} and words.lower() in response.json()["error"].lower()
    good = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [3.0]}]}
    after = requests.post(f"{server.url}/v2/models/half_plus_two/infer", json=good, timeout=30)
    assert after.json()["outputs"][0]["data"] == [3.5]


def test_unknown_model_and_version_are_404(server: Server) -> None:
    assert requests.get(f"{server.url}/v2/models/nope", timeout=10).status_code == 404
    assert requests.get(f"{server.url}/v2/models/mlp/versions/9", timeout=10).status_code == 404
    assert requests.post(f"{server.url}/v2/models/nope/infer", json={"inputs": []}, timeout=10).status_code == 404
