"""inference.GRPCInferenceService (Open Inference Protocol V2 over gRPC) against a real server, with tritonclient.grpc unmodified.

Answers are compared with the same server's REST /v2 API. NOTE: this process imports tritonclient's
`inference.*` messages, so it never imports server.protocols.v2.protos (the two clash in protobuf's pool).
"""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path
from typing import Any, Iterator

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as triton
import tritonclient.http as triton_http
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support.harness import Server, free_port, wait_until
from tests.support.metrics import quiet_samples, require_tool, settled_samples, target_health, value

MODELS = ("mlp", "k3cnn", "cnn_h5", "half_plus_two", "digits", "fallback")
SERVICE = "/inference.GRPCInferenceService"


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[triton.InferenceServerClient]:
    """tritonclient's gRPC client, default settings."""
    instance = triton.InferenceServerClient(url=server.grpc_target)
    yield instance
    instance.close()


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """The service's generated stub (tritonclient's), for messages built by hand and exact status codes."""
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def rest_infer(server: Server, model: str, inputs: dict[str, np.ndarray], version: str = "",
               parameters: dict | None = None) -> dict[str, np.ndarray]:
    """The REST /v2 answer for the same tensors (tritonclient.http: JSON floats, binary BYTES), as numpy."""
    rest = triton_http.InferenceServerClient(url=server.url.removeprefix("http://"), network_timeout=60)
    tensors = []
    for name, array in inputs.items():
        tensor = triton_http.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "FP32")
        tensor.set_data_from_numpy(array, binary_data=array.dtype == object)
        tensors.append(tensor)
    result = rest.infer(model, tensors, model_version=version, parameters=parameters)
    return {output["name"]: result.as_numpy(output["name"]) for output in result.get_response()["outputs"]}


def sample_inputs(server: Server, model: str, rows: int = 3) -> dict[str, np.ndarray]:
    """Random float32 tensors of the shapes REST's metadata gives (any size: `rows`)."""
    rng = np.random.default_rng(11)
    metadata = server.get(f"/v2/models/{model}").json()
    return {tensor["name"]: rng.uniform(0, 1, [rows if d == -1 else d for d in tensor["shape"]]).astype(np.float32)
            for tensor in metadata["inputs"]}


def triton_inputs(arrays: dict[str, np.ndarray]) -> list[triton.InferInput]:
    inputs = []
    for name, array in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def typed_request(model: str, arrays: dict[str, np.ndarray], version: str = "") -> service_pb2.ModelInferRequest:
    """A ModelInferRequest with typed contents (fp32_contents / bytes_contents), no raw_input_contents."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, array in arrays.items():
        tensor = request.inputs.add(name=name, datatype="BYTES" if array.dtype == object else "FP32", shape=list(array.shape))
        if array.dtype == object:
            tensor.contents.bytes_contents.extend(array.reshape(-1).tolist())
        else:
            tensor.contents.fp32_contents.extend(array.reshape(-1).tolist())
    return request


def raw_outputs(response: service_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    """The answer's outputs read from raw_output_contents, as a client written against Triton reads them."""
    assert len(response.raw_output_contents) == len(response.outputs)  # raw always, typed inputs or not
    assert not any(output.HasField("contents") for output in response.outputs)
    found = {}
    for output, raw in zip(response.outputs, response.raw_output_contents):
        if output.datatype == "BYTES":  # each element: a 4-byte little-endian length, then its bytes
            elements, at = [], 0
            while at < len(raw):
                size = int.from_bytes(raw[at:at + 4], "little")
                elements.append(raw[at + 4:at + 4 + size])
                at += 4 + size
            array = np.array(elements, dtype=object)
        else:
            array = np.frombuffer(raw, dtype="<f4")
        found[output.name] = array.reshape(list(output.shape))
    return found


def assert_same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert set(got) == set(expected)
    for name, array in expected.items():
        assert got[name].shape == array.shape, name
        if array.dtype == object:
            assert got[name].tolist() == array.tolist(), name
        else:
            np.testing.assert_allclose(got[name], array, rtol=1e-6, atol=1e-6, err_msg=name)


def code_of(call: Any) -> grpc.StatusCode:
    """The status a failing stub call ends with (with its details)."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code()


def test_health_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("half_plus_two", "123")
    assert not client.is_model_ready("fallback", "2")  # a failed version: not ready, not an error
    assert client.is_model_ready("fallback", "1")
    with pytest.raises(InferenceServerException) as caught:
        client.is_model_ready("nope")
    assert caught.value.status() == "StatusCode.NOT_FOUND" and "nope" in caught.value.message()
    metadata = client.get_server_metadata()
    assert metadata.name == "forkserve" and metadata.version


@pytest.mark.parametrize("model", [*MODELS[:5], "words"])
def test_model_metadata_is_rest_s(client: triton.InferenceServerClient, server: Server, model: str) -> None:
    rest = server.get(f"/v2/models/{model}").json()
    metadata = client.get_model_metadata(model)
    assert (metadata.name, list(metadata.versions), metadata.platform) == (rest["name"], rest["versions"], rest["platform"])
    for kind in ("inputs", "outputs"):
        assert [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in getattr(metadata, kind)] == rest[kind]


@pytest.mark.parametrize("model", MODELS[:5])
def test_infer_raw_and_typed_equal_rest(client: triton.InferenceServerClient, stub: Any, server: Server, model: str) -> None:
    arrays = sample_inputs(server, model)
    expected = rest_infer(server, model, arrays)
    # tritonclient sends raw_input_contents by default
    inputs = triton_inputs(arrays)
    assert all(tensor._get_content() is not None and not tensor._get_tensor().HasField("contents") for tensor in inputs)
    result = client.infer(model, inputs, request_id="r-1")
    response = result.get_response()
    assert len(response.raw_output_contents) == len(response.outputs) == len(expected)
    assert response.id == "r-1" and response.model_name == model
    assert_same({name: result.as_numpy(name) for name in expected}, expected)
    # the protocol's typed contents, built by hand, get raw outputs back, as from Triton
    assert_same(raw_outputs(stub.ModelInfer(typed_request(model, arrays), timeout=30)), expected)


def test_model_version_and_requested_outputs(client: triton.InferenceServerClient, stub: Any, server: Server) -> None:
    arrays = sample_inputs(server, "mlp", rows=2)
    expected = rest_infer(server, "mlp", arrays, version="1")
    result = client.infer("mlp", triton_inputs(arrays), model_version="1", outputs=[triton.InferRequestedOutput("logits")])
    assert result.get_response().model_version == "1"
    np.testing.assert_allclose(result.as_numpy("logits"), expected["logits"], rtol=1e-6, atol=1e-6)
    request = typed_request("fallback", arrays)  # its version 2 failed: the latest that serves is 1
    response, call = stub.ModelInfer.with_call(request, metadata=[("x-request-id", "grpc-version-1")], timeout=30)
    assert response.model_version == "1"
    assert dict(call.trailing_metadata()) == {"x-request-id": "grpc-version-1", "x-model-version": "1",
                                              "x-forkserve-worker": dict(call.trailing_metadata())["x-forkserve-worker"]}


def test_signature_name_parameter_and_bytes_tensors(client: triton.InferenceServerClient, stub: Any, server: Server) -> None:
    from tensorflow.core.example import example_pb2

    examples = []
    for x in (1.0, 4.0):
        example = example_pb2.Example()
        example.features.feature["x"].float_list.value.append(x)
        examples.append(example.SerializeToString())
    arrays = {"inputs": np.array(examples, dtype=object)}
    for signature, outputs in (("regress_x_to_y", {"outputs"}), ("classify_x_to_y", {"scores"})):
        parameters = {"signature_name": signature}
        expected = rest_infer(server, "half_plus_two", arrays, parameters=parameters)
        assert set(expected) == outputs
        result = client.infer("half_plus_two", triton_inputs(arrays), parameters=parameters)
        assert_same({name: result.as_numpy(name) for name in outputs}, expected)
        request = typed_request("half_plus_two", arrays)
        request.parameters["signature_name"].string_param = signature
        assert_same(raw_outputs(stub.ModelInfer(request, timeout=30)), expected)
    np.testing.assert_array_equal(expected["scores"], [[2.5], [4.0]])  # classify's scores: x / 2 + 2


def test_a_string_input_model_raw_and_typed(client: triton.InferenceServerClient, stub: Any, server: Server) -> None:
    arrays = {"text": np.array([[b"cat"], [b"fish"], [b""], [b"dog"]], dtype=object)}
    expected = rest_infer(server, "words", arrays)
    request = triton_inputs(arrays)
    raw = request[0]._get_content()
    assert raw[:7] == struct.pack("<I", 3) + b"cat"  # BYTES go raw as 4-byte little-endian lengths + bytes
    result = client.infer("words", request)
    assert_same({"score": result.as_numpy("score")}, expected)
    assert_same(raw_outputs(stub.ModelInfer(typed_request("words", arrays), timeout=30)), expected)
    np.testing.assert_array_equal(expected["score"][1], expected["score"][2])  # both out of the vocabulary


@pytest.mark.parametrize("method,request_type", [
    ("SystemSharedMemoryStatus", service_pb2.SystemSharedMemoryStatusRequest),
    ("CudaSharedMemoryStatus", service_pb2.CudaSharedMemoryStatusRequest),
    ("TraceSetting", service_pb2.TraceSettingRequest), ("LogSettings", service_pb2.LogSettingsRequest),
])
def test_triton_extensions_forkserve_lacks_are_unimplemented(stub: Any, method: str, request_type: Any) -> None:
    assert code_of(lambda: getattr(stub, method)(request_type(), timeout=10)) == grpc.StatusCode.UNIMPLEMENTED


def test_triton_extensions_forkserve_lacks_through_tritonclient(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.get_system_shared_memory_status()
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "system_shared_memory" not in client.get_server_metadata(as_json=True)["extensions"]


def _raw_request(model: str, tensors: list[tuple[str, str, list[int]]], raw: list[bytes],
                 outputs: tuple[str, ...] = (), version: str = "") -> service_pb2.ModelInferRequest:
    """A ModelInferRequest with raw_input_contents, built by hand."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, raw_input_contents=raw)
    for name, datatype, shape in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
    for name in outputs:
        request.outputs.add(name=name)
    return request


FLOATS = np.array([[1.0], [2.0]], dtype=np.float32).tobytes()
ERRORS = [
    ("unknown model", _raw_request("nope", [("x", "FP32", [2, 1])], [FLOATS]), grpc.StatusCode.NOT_FOUND, "nope"),
    ("unknown version", _raw_request("mlp", [("features", "FP32", [1, 20])], [b"\0" * 80], version="9"),
     grpc.StatusCode.NOT_FOUND, "Specific(mlp, 9)"),
    ("datatype mismatch", _raw_request("half_plus_two", [("x", "INT32", [2, 1])], [FLOATS]), grpc.StatusCode.INVALID_ARGUMENT,
     "input 'x' is INT32; the model takes FP32"),
    ("byte count", _raw_request("half_plus_two", [("x", "FP32", [3, 1])], [FLOATS]), grpc.StatusCode.INVALID_ARGUMENT,
     "8 raw bytes for shape [3, 1] of FP32 (12 expected)"),
    ("raw count", _raw_request("half_plus_two", [("x", "FP32", [2, 1])], [FLOATS, FLOATS]), grpc.StatusCode.INVALID_ARGUMENT,
     "2 raw_input_contents for 1 inputs"),
    ("unknown input", _raw_request("half_plus_two", [("z", "FP32", [2, 1])], [FLOATS]), grpc.StatusCode.INVALID_ARGUMENT,
     "unknown input 'z'"),
    ("unknown output", _raw_request("half_plus_two", [("x", "FP32", [2, 1])], [FLOATS], ("w",)), grpc.StatusCode.INVALID_ARGUMENT,
     "unknown output 'w'"),
    ("no inputs", _raw_request("half_plus_two", [], []), grpc.StatusCode.INVALID_ARGUMENT, "'inputs' is empty"),
]


@pytest.mark.parametrize("name,request_message,code,words", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_requests_get_the_status_rest_maps_to(stub: Any, server: Server, name: str, request_message: Any,
                                                  code: grpc.StatusCode, words: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request_message, timeout=30)
    assert caught.value.code() == code and words in caught.value.details(), caught.value.details()
    good = stub.ModelInfer(_raw_request("half_plus_two", [("x", "FP32", [2, 1])], [FLOATS]), timeout=30)
    assert np.frombuffer(good.raw_output_contents[0], dtype="<f4").tolist() == [2.5, 3.0]


def test_a_failed_version_is_failed_precondition(client: triton.InferenceServerClient, server: Server) -> None:
    arrays = sample_inputs(server, "fallback", rows=1)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("fallback", triton_inputs(arrays), model_version="2")
    assert caught.value.status() == "StatusCode.FAILED_PRECONDITION"
    rest = server.post("/v2/models/fallback/versions/2/infer", json={"inputs": [
        {"name": "features", "shape": [1, 20], "datatype": "FP32", "data": [0.0] * 20}]})
    assert rest.status_code == 503 and rest.json()["error"] == caught.value.message()


def test_one_access_log_line_per_call_with_the_client_s_request_id(stub: Any, server: Server) -> None:
    request = _raw_request("half_plus_two", [("x", "FP32", [2, 1])], [FLOATS])
    _, call = stub.ModelInfer.with_call(request, metadata=[("x-request-id", "grpc-trace-77")], timeout=30)
    assert dict(call.trailing_metadata())["x-request-id"] == "grpc-trace-77"
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(_raw_request("nope", [("x", "FP32", [2, 1])], [FLOATS]), metadata=[("x-request-id", "grpc-trace-78")])
    assert dict(caught.value.trailing_metadata())["x-request-id"] == "grpc-trace-78"
    stub.ServerLive(service_pb2.ServerLiveRequest(), metadata=[("x-request-id", "grpc-trace-79")], timeout=10)
    wait_until(lambda: all(f"rid=grpc-trace-{n}" in server.log() for n in (77, 78, 79)), 10, "the access log lines")
    lines = server.log().splitlines()
    expected = {
        77: rf'^127\.0\.0\.1 "POST {SERVICE}/ModelInfer HTTP/2" 200 \d+ \d+ms rid=grpc-trace-77 version=123 grpc=OK$',
        78: rf'^127\.0\.0\.1 "POST {SERVICE}/ModelInfer HTTP/2" 404 0 \d+ms rid=grpc-trace-78 version=- grpc=NOT_FOUND$',
        79: rf'^127\.0\.0\.1 "POST {SERVICE}/ServerLive HTTP/2" 200 2 \d+ms rid=grpc-trace-79 version=- grpc=OK$',
    }
    for number, pattern in expected.items():
        found = [line for line in lines if f"rid=grpc-trace-{number} " in line]
        assert len(found) == 1 and re.match(pattern, found[0]), found


def test_prometheus_sees_grpc_and_rest_requests_by_protocol(tmp_path: Path, stub: Any, server: Server) -> None:
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    prometheus = require_tool("prometheus")
    before = quiet_samples(server)
    sent = {"v2_infer": 7, "tfserving_predict": 5, "rest": 3}
    for _ in range(sent["v2_infer"]):
        stub.ModelInfer(_raw_request("half_plus_two", [("x", "FP32", [2, 1])], [FLOATS]), timeout=30)
    code_of(lambda: stub.ModelInfer(_raw_request("half_plus_two", [("z", "FP32", [2, 1])], [FLOATS]), timeout=30))
    with grpc.insecure_channel(server.grpc_target) as channel:
        predict = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "half_plus_two"
        request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0], [2.0]], dtype=np.float32)))
        for _ in range(sent["tfserving_predict"]):
            assert tf.make_ndarray(predict(request, timeout=30).outputs["y"]).tolist() == [[2.5], [3.0]]
    for _ in range(sent["rest"]):
        assert server.post("/v2/models/half_plus_two/infer", json={"inputs": [
            {"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [1.0, 2.0]}]}).status_code == 200

    series = {
        ("forkserve_requests_total", ("half_plus_two", "123", "v2_infer", "200", "grpc")): sent["v2_infer"],
        ("forkserve_requests_total", ("half_plus_two", "123", "v2_infer", "400", "grpc")): 1,
        ("forkserve_requests_total", ("half_plus_two", "123", "tfserving_predict", "200", "grpc")): sent["tfserving_predict"],
        ("forkserve_requests_total", ("half_plus_two", "123", "v2_infer", "200", "rest")): sent["rest"],
    }

    def labels(key: tuple) -> dict[str, str]:
        return dict(zip(("model", "version", "api", "code", "protocol"), key[1]))

    def counted(scrape: dict) -> dict:
        return {key: value(scrape, key[0], **labels(key)) - value(before, key[0], **labels(key)) for key in series}

    timed = {"grpc": sent["v2_infer"] + 1, "rest": sent["rest"]}

    def durations(scrape: dict) -> dict[str, float]:
        name = "forkserve_request_duration_seconds_count"
        return {protocol: value(scrape, name, model="half_plus_two", api="v2_infer", protocol=protocol)
                - value(before, name, model="half_plus_two", api="v2_infer", protocol=protocol) for protocol in timed}

    # NOTE: a request's counter and histogram are buffered one after the other (server.telemetry.buffer): a flush, or
    # a scrape in the middle of one, can carry one without the other. Settle on both.
    after = settled_samples(server, lambda scrape: counted(scrape) == series and durations(scrape) == timed,
                            "the requests counted and timed by protocol")
    for protocol in timed:
        for stage in ("decode", "queue", "compute", "encode"):
            name = "forkserve_request_stage_duration_seconds_count"
            assert value(after, name, model="half_plus_two", stage=stage, protocol=protocol) > value(
                before, name, model="half_plus_two", stage=stage, protocol=protocol), (protocol, stage)

    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: forkserve\n    static_configs:\n"
                      f"      - targets: ['{server.url.removeprefix('http://')}']\n")
    process = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = f"http://127.0.0.1:{port}/api/v1/query"

    def query(expression: str) -> dict[tuple, float] | None:
        try:
            result = requests.get(api, params={"query": expression}, timeout=5).json()["data"]["result"]
        except (requests.RequestException, ValueError, KeyError):
            return None
        return {tuple(sorted(item["metric"].items())): float(item["value"][1]) for item in result}

    try:
        wait_until(lambda: query("up") is not None, 60, "Prometheus to answer queries")
        wait_until(lambda: target_health(port) == "up", 60, "the first successful scrape")
        now = quiet_samples(server)
        for key in series:
            selector = ", ".join(f'{name}="{label}"' for name, label in labels(key).items())
            total = value(now, key[0], **labels(key))
            assert wait_until(lambda: (query(f"sum({key[0]}{{{selector}}})") or {}).get(()) == total, 30, selector)
        by_protocol = query('sum by (protocol) (forkserve_request_duration_seconds_count{model="half_plus_two"})')
        stages = query('sum by (protocol) (forkserve_request_stage_duration_seconds_count{model="half_plus_two", stage="compute"})')
        assert {dict(k)["protocol"] for k in by_protocol} == {dict(k)["protocol"] for k in stages} == {"grpc", "rest"}
    finally:
        process.terminate()
        process.wait(30)


def _bytes_request(shape: list[int], raw: bytes) -> service_pb2.ModelInferRequest:
    """half_plus_two's tf.Example signature (of any rank) fed BYTES elements in raw_input_contents."""
    request = _raw_request("half_plus_two", [("inputs", "BYTES", shape)], [raw])
    request.parameters["signature_name"].string_param = "regress_x_to_y"
    return request


def _twice_the_input() -> service_pb2.ModelInferRequest:
    return _raw_request("half_plus_two", [("x", "FP32", [2, 1]), ("x", "FP32", [2, 1])], [FLOATS, FLOATS])


LIMITS = [
    ("rows before data", _raw_request("half_plus_two", [("x", "FP32", [2000, 1])], [b""]),
     "request has 2000 rows; the limit is 1024 (max_request_rows)"),
    ("rows before typed data", _raw_request("half_plus_two", [("x", "FP32", [2000, 1])], []),
     "request has 2000 rows; the limit is 1024 (max_request_rows)"),
    ("a shape no array can have", _raw_request("half_plus_two", [("x", "FP32", [0, 2**62, 2**62, 1])], [b""]),
     "input 'x': shape [0, 4611686018427387904, 4611686018427387904, 1] is larger than any tensor can be"),
    ("rank 70", _raw_request("half_plus_two", [("x", "FP32", [1] * 70)], [b"\0" * 4]), "input 'x' has rank 70"),
    ("an output twice", _raw_request("half_plus_two", [("x", "FP32", [2, 1])], [FLOATS], ("y", "y")),
     "output 'y' is requested twice"),
    ("an input twice", _twice_the_input(), "input 'x' is given twice"),
    ("zero-length BYTES over the row limit", _bytes_request([200_000], b"\0" * 800_000),
     "request has 200000 rows; the limit is 1024"),
    # in one row, 200,000 zero-length elements: 0.8 MB of the request, 12.8 MB once decoded (the shared server's
    # 1 MiB limit, MAX_BODY_BYTES): counted, not parsed
    ("zero-length BYTES past the size limit", _bytes_request([1, 200_000], b"\0" * 800_000),
     "input 'inputs': 200000 strings of 0 bytes in all make a tensor of 12800000 bytes"),
    ("BYTES past the shape's count", _bytes_request([2], b"\0" * 12), "input 'inputs': 4 bytes of BYTES data after the 2 elements"),
]


@pytest.mark.parametrize("name,request_message,words", LIMITS, ids=[e[0] for e in LIMITS])
def test_declared_shapes_sizes_and_names_are_checked_before_decoding(stub: Any, server: Server, name: str,
                                                                     request_message: Any, words: str) -> None:
    rid = "limits-" + re.sub(r"[^A-Za-z0-9]+", "-", name)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request_message, metadata=[("x-request-id", rid)], timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in caught.value.details(), caught.value.details()
    wait_until(lambda: f"rid={rid} " in server.log(), 10, "the call's access line")
    assert f"request {rid}: unexpected error" not in server.log()  # a client's error: no traceback


@pytest.mark.parametrize("name", ["../x", "..", "a/b"])
def test_an_invalid_model_name_is_invalid_argument_on_every_call(stub: Any, name: str) -> None:
    for method, request in (("ModelInfer", _raw_request(name, [("x", "FP32", [2, 1])], [FLOATS])),
                            ("ModelMetadata", service_pb2.ModelMetadataRequest(name=name)),
                            ("ModelReady", service_pb2.ModelReadyRequest(name=name))):
        with pytest.raises(grpc.RpcError) as caught:
            getattr(stub, method)(request, timeout=30)
        assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, f"invalid model name {name!r}"), method
