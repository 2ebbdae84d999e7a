"""OpenTelemetry traces from a real gunicorn to a real OTLP/HTTP receiver (tests/e2e/otlp_receiver.py).

One traced server for the module; its receiver switches mode (200, 503, hanging, closed port) in
the later tests, so they run in file order. The untraced server is the session's shared one.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import secrets
import signal
import time
from pathlib import Path
from typing import Iterator

import grpc
import pytest
import requests
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tritonclient.grpc.service_pb2 import InferTensorContents, ModelInferRequest
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceStub

from tests.support.models import copy_models
from tests.support.harness import Server, memory_kib, wait_until
from tests.support.nginx import Nginx
from tests.support.otlp_receiver import Receiver, Span
from server.cli.payloads import records
from tests.support.metrics import samples, value

ROW = [0.5] * 20
CONF = """
[models.mlp]
max_batch_delay_ms = 40.0
labels = { stable = 1 }
"""
DROPPED = "forkserve_trace_spans_dropped_total"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    opened = Receiver()
    yield opened
    opened.close()


def mlp_server(model_repo: Path, tmp_path: Path, conf_text: str, env: dict[str, str]) -> Server:
    """One worker serving a copy of mlp with `conf_text` as its models.toml (started)."""
    repo = copy_models(model_repo, tmp_path / "models", "mlp")
    conf = tmp_path / "models.toml"
    conf.write_text(conf_text)
    return Server(models_dir=repo, run_dir=tmp_path / "run", conf_path=conf, workers=1, env=env).start()


@pytest.fixture(scope="module")
def traced(model_repo: Path, receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One worker exporting to `receiver` every 50 ms, a 1 s export timeout and a small queue."""
    server = mlp_server(model_repo, tmp_path_factory.mktemp("tracing"), CONF, {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "forkserve-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_BSP_MAX_QUEUE_SIZE": "64", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "32",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1", "FORKSERVE_ACCESS_LOG": "1",
    })
    yield server
    server.stop()


def traceparent() -> tuple[str, str, str]:
    """(header, trace id, parent span id) of a sampled client span."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def server_span(receiver: Receiver, trace_id: str) -> Span:
    """The SERVER span of the request of `trace_id` (waited for)."""
    return wait_until(lambda: next((s for s in receiver.in_trace(trace_id) if s.kind == 2), None), 10,
                      f"the server span of {trace_id}")


def children(receiver: Receiver, parent: Span) -> dict[str, Span]:
    return {span.name: span for span in receiver.in_trace(parent.trace_id) if span.parent_id == parent.span_id}


def test_a_rest_predict_continues_the_clients_trace(traced: Server, receiver: Receiver) -> None:
    header, trace_id, parent_id = traceparent()
    answer = traced.post("/v1/models/mlp:predict", json={"instances": [ROW]},
                         headers={"traceparent": header, "X-Request-Id": "trace-rest-1"})
    assert answer.status_code == 200 and answer.headers["X-Trace-Id"] == trace_id
    span = server_span(receiver, trace_id)
    assert span.parent_id == parent_id and span.name == "POST /v1/models/{model}:predict"
    assert span.service == "forkserve-test"
    assert {"http.request.method": "POST", "url.path": "/v1/models/mlp:predict", "http.route": "/v1/models/{model}:predict",
            "http.response.status_code": 200, "url.scheme": "http", "network.protocol.name": "http", "network.protocol.version": "1.1",
            "server.address": "127.0.0.1", "server.port": traced.port, "client.address": "127.0.0.1",
            "forkserve.model": "mlp", "forkserve.model.version": "1", "forkserve.rows": 1,
            "forkserve.signature": "serving_default", "forkserve.request_id": "trace-rest-1"}.items() <= span.attributes.items()
    stages = wait_until(lambda: (found := children(receiver, span)) and {"decode", "queue", "compute", "encode"} <= found.keys()
                        and found, 10, "the stage spans")
    for stage in stages.values():  # inside the request (1 ms of slack: two clocks meet here)
        assert span.start_ns - 1_000_000 <= stage.start_ns <= stage.end_ns <= span.end_ns + 1_000_000, stage
    assert stages["queue"].end_ns <= stages["compute"].start_ns + 1_000_000
    wait_until(lambda: re.search(rf"rid=trace-rest-1 version=1 trace={trace_id}$", traced.log(), re.M), 10, "the access line")


def test_flask_views_and_v2_are_traced_too(traced: Server, receiver: Receiver) -> None:
    header, trace_id, parent_id = traceparent()
    answer = traced.post("/v1/models/mlp/labels/stable:predict", json={"instances": [ROW]}, headers={"traceparent": header})
    assert answer.status_code == 200 and answer.headers["X-Trace-Id"] == trace_id
    span = server_span(receiver, trace_id)
    assert span.parent_id == parent_id and span.name == "POST /v1/models/{model}/labels/{label}:predict"
    header, trace_id, parent_id = traceparent()
    body = {"inputs": [{"name": "features", "shape": [1, 20], "datatype": "FP32", "data": ROW}]}
    answer = traced.post("/v2/models/mlp/versions/1/infer", json=body, headers={"traceparent": header})
    assert answer.status_code == 200 and answer.headers["X-Trace-Id"] == trace_id
    span = server_span(receiver, trace_id)
    assert span.parent_id == parent_id and span.attributes["http.route"] == "/v2/models/{model}/versions/{version}/infer"
    assert {"decode", "queue", "compute", "encode"} <= wait_until(lambda: children(receiver, span).keys(), 10, "children")


@pytest.mark.parametrize(("path", "status", "name"), [
    ("/v1/models/mlp/versions/1:predict", 200, "POST /v1/models/{model}/versions/{version}:predict"),  # the fast path
    ("/v1/models/nope-123/versions/7:regress", 404, "POST /v1/models/{model}/versions/{version}:regress"),
    ("/v2/models/nope-123/infer", 404, "POST /v2/models/{model}/infer"),
    ("/v1/models/m-123:frobnicate-456", 404, "POST"),  # the catch-all view, api "tfserving_other"
    ("/v1/models/mlp:" + "frobnicate" * 300, 404, "POST"),
    ("/v1/models/mlp/metadata", 405, "POST"),
    ("/v1/models/a/b/c:predict", 404, "POST"),
])
def test_span_names_are_route_templates_and_a_path_of_no_route_is_named_by_its_method(
        traced: Server, receiver: Receiver, path: str, status: int, name: str) -> None:
    """OpenTelemetry's HTTP conventions: "{method} {http.route}", or "{method}" and no http.route; never the raw path."""
    header, trace_id, _ = traceparent()
    body = {"inputs": [{"name": "features", "shape": [1, 20], "datatype": "FP32", "data": ROW}]} if path.startswith("/v2") \
        else {"instances": [ROW]}
    answer = traced.post(path, json=body, headers={"traceparent": header})
    assert answer.status_code == status and answer.headers["X-Trace-Id"] == trace_id
    span = server_span(receiver, trace_id)
    assert span.name == name and span.attributes["url.path"] == path
    assert span.attributes.get("http.route") == (name.partition(" ")[2] or None)


def test_grpc_span_names_are_registered_methods_only(traced: Server, receiver: Receiver) -> None:
    """A method grpcio has no handler for is UNIMPLEMENTED before forkserve's code: no span; V2 is named as TF Serving is."""
    header, unknown_trace, _ = traceparent()
    with grpc.insecure_channel(traced.grpc_target) as channel:
        frobnicate = channel.unary_unary("/tensorflow.serving.PredictionService/Frobnicate-456")
        with pytest.raises(grpc.RpcError) as refused:
            frobnicate(b"", metadata=(("traceparent", header),), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        request = ModelInferRequest(model_name="mlp", inputs=[ModelInferRequest.InferInputTensor(
            name="features", datatype="FP32", shape=[1, 20], contents=InferTensorContents(fp32_contents=ROW))])
        header, trace_id, _ = traceparent()
        _, call = GRPCInferenceServiceStub(channel).ModelInfer.with_call(request, metadata=(("traceparent", header),), timeout=30)
    assert dict(call.trailing_metadata())["x-trace-id"] == trace_id
    span = server_span(receiver, trace_id)  # NOTE: one worker exports its spans in the order they ended
    assert span.name == "inference.GRPCInferenceService/ModelInfer" and span.attributes["rpc.method"] == "ModelInfer"
    assert not receiver.in_trace(unknown_trace)
    assert not [s.name for s in receiver.spans if "Frobnicate" in s.name]


def test_without_traceparent_a_request_starts_a_trace(traced: Server, receiver: Receiver) -> None:
    answer = traced.post("/v1/models/mlp:predict", json={"instances": [ROW]})
    trace_id = answer.headers["X-Trace-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", trace_id) and server_span(receiver, trace_id).parent_id == ""


def grpc_predict(server: Server, metadata: tuple, rows: list) -> tuple[grpc.Call | grpc.RpcError, dict]:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mlp"
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(rows, dtype=tf.float32))
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        try:
            _, call = stub.Predict.with_call(request, metadata=metadata, timeout=30)
        except grpc.RpcError as error:
            call = error
    return call, dict(call.trailing_metadata() or ())


def test_a_grpc_predict_continues_the_clients_trace(traced: Server, receiver: Receiver) -> None:
    header, trace_id, parent_id = traceparent()
    call, trailing = grpc_predict(traced, (("traceparent", header), ("x-request-id", "trace-grpc-1")), [ROW])
    assert call.code() == grpc.StatusCode.OK and trailing["x-trace-id"] == trace_id
    span = server_span(receiver, trace_id)
    assert span.parent_id == parent_id and span.name == "tensorflow.serving.PredictionService/Predict"
    assert {"rpc.system": "grpc", "rpc.service": "tensorflow.serving.PredictionService", "rpc.method": "Predict",
            "rpc.grpc.status_code": 0, "forkserve.model": "mlp", "forkserve.rows": 1}.items() <= span.attributes.items()
    assert {"decode", "queue", "compute"} <= wait_until(lambda: children(receiver, span).keys(), 10, "children")
    wait_until(lambda: re.search(rf"rid=trace-grpc-1 version=1 grpc=OK trace={trace_id}$", traced.log(), re.M), 10, "the line")


def test_failed_requests_carry_the_error(traced: Server, receiver: Receiver) -> None:
    header, trace_id, _ = traceparent()
    answer = traced.post("/v1/models/mlp:predict", json={"instances": [[0.5] * 3]}, headers={"traceparent": header})
    assert answer.status_code == 400 and answer.headers["X-Trace-Id"] == trace_id
    span = server_span(receiver, trace_id)
    assert span.status_code == 2 and span.status_message == answer.json()["error"]
    assert span.attributes["http.response.status_code"] == 400 and span.attributes["error.type"] == "InvalidArgument"
    assert [name for name, _ in span.events] == ["exception"]
    header, trace_id, _ = traceparent()
    call, trailing = grpc_predict(traced, (("traceparent", header),), [[0.5] * 3])
    assert call.code() == grpc.StatusCode.INVALID_ARGUMENT and trailing["x-trace-id"] == trace_id
    span = server_span(receiver, trace_id)
    assert span.status_code == 2 and span.attributes["rpc.grpc.status_code"] == 3
    assert span.attributes["error.type"] == "InvalidArgument"


def test_a_batch_span_links_every_request_it_served(traced: Server, receiver: Receiver) -> None:
    parents = [traceparent() for _ in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: traced.post("/v1/models/mlp:predict", json={"instances": [ROW, ROW]},
                                                      headers={"traceparent": p[0]}), parents))
    assert all(answer.status_code == 200 for answer in answers)
    requests_ = {trace_id: server_span(receiver, trace_id) for _, trace_id, _ in parents}
    wanted = {(span.trace_id, span.span_id) for span in requests_.values()}

    def batches() -> list[Span]:
        found = [span for span in receiver.spans if span.name == "batch" and set(span.links) & wanted]
        return found if wanted <= {link for span in found for link in span.links} else []

    found = wait_until(batches, 10, "batch spans linking every request")
    assert max(len(span.links) for span in found) >= 2, found  # 40 ms of delay: some requests shared a call
    for span in found:
        first = span.links[0]
        assert (span.trace_id, span.parent_id) == first  # a child of the first request it served
        assert span.attributes["forkserve.batch.rows"] == 2 * span.attributes["forkserve.batch.jobs"]
        assert span.attributes["forkserve.model"] == "mlp" and span.start_ns <= span.end_ns


def predict_fast(server: Server, count: int) -> float:
    """The slowest of `count` predicts, each of which must answer 200."""
    slowest = 0.0
    for _ in range(count):
        started = time.monotonic()
        assert server.post("/v1/models/mlp:predict", json={"instances": [ROW]}).status_code == 200
        slowest = max(slowest, time.monotonic() - started)
    return slowest


@pytest.mark.parametrize("mode", ["503", "hang"])
def test_an_exporter_refusing_or_hanging_never_slows_a_request(traced: Server, receiver: Receiver, mode: str) -> None:
    before = samples(traced)
    receiver.mode = mode
    try:
        assert predict_fast(traced, 40) < 0.5
        reason = "queue_full" if mode == "hang" else "export_failed"  # hanging: the small queue fills while it waits
        wait_until(lambda: value(samples(traced), DROPPED, reason=reason) > value(before, DROPPED, reason=reason), 15,
                   f"spans dropped ({reason})")
    finally:
        receiver.mode = "ok"


def test_a_stopping_worker_waits_for_a_hanging_endpoint_briefly(traced: Server, receiver: Receiver) -> None:
    receiver.mode = "hang"
    try:
        assert predict_fast(traced, 5) < 0.5
        wait_until(lambda: receiver.posts and time.sleep(0.2) is None, 5, "an export in flight")
        worker = traced.worker_pids()[0]
        started = time.monotonic()
        os.kill(worker, signal.SIGTERM)
        traced.wait_reaped(worker)
        assert time.monotonic() - started < 6  # gunicorn's own stop plus EXIT_FLUSH_S, not the 1 s timeout per retry
    finally:
        receiver.mode = "ok"
        traced.wait_workers_loaded(1)  # the module's next tests need the replacement


def test_a_collectors_huge_answer_costs_the_worker_no_memory(traced: Server, receiver: Receiver) -> None:
    [pid] = traced.worker_pids()
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the RSS now
    rss = memory_kib(pid, "VmRSS")
    receiver.mode = "huge"
    try:
        posts = receiver.posts
        assert predict_fast(traced, 5) < 0.5
        wait_until(lambda: receiver.posts > posts, 10, "an export to the huge answer")
    finally:
        receiver.mode = "ok"
    header, trace_id, _ = traceparent()
    assert traced.post("/v1/models/mlp:predict", json={"instances": [ROW]}, headers={"traceparent": header}).ok
    server_span(receiver, trace_id)  # one exporter thread, in order: the huge answer is behind it
    assert memory_kib(pid, "VmHWM") - rss < 64 * 1024, "the exporter read the 256 MiB answer"


def test_an_exporter_that_is_down_never_slows_a_request(traced: Server, receiver: Receiver) -> None:
    before = samples(traced)
    receiver.close()  # the port refuses until it is opened again
    try:
        assert predict_fast(traced, 20) < 0.5
        wait_until(lambda: value(samples(traced), DROPPED, reason="export_failed") > value(before, DROPPED, reason="export_failed"),
                   15, "spans dropped (export_failed)")
    finally:
        receiver.open()
    assert "trace export to " in traced.log()  # reported once a minute, not each retry as the SDK would
    assert "Transient error" not in traced.log() and "Failed to export" not in traced.log()


def test_the_master_never_loads_the_sdk(traced: Server) -> None:
    assert traced.process is not None
    master_maps = Path(f"/proc/{traced.process.pid}/maps").read_text()
    worker_maps = Path(f"/proc/{traced.worker_pids()[0]}/maps").read_text()
    assert "_upb" in worker_maps and "_upb" not in master_maps  # protobuf (OTLP's, gRPC's): worker-only
    assert "exports traces to" in traced.log()


def test_tracing_off_adds_nothing(server: Server) -> None:
    header, _, _ = traceparent()
    answer = server.post("/v1/models/mlp:predict", json={"instances": [ROW]}, headers={"traceparent": header})
    assert answer.status_code == 200 and "X-Trace-Id" not in answer.headers
    assert "exports traces to" not in server.log() and " trace=" not in server.log()


@pytest.fixture(scope="module")
def sparse_receiver() -> Iterator[Receiver]:
    opened = Receiver()
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def sparse(model_repo: Path, sparse_receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Sampler ratio 0 (only a sampled parent is traced) and every request's payload logged to a file."""
    tmp_path = tmp_path_factory.mktemp("tracing-sparse")
    server = mlp_server(model_repo, tmp_path, "[models.mlp]\npayload_log = { sample = 1.0 }\n", {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sparse_receiver.port}", "OTEL_TRACES_SAMPLER_ARG": "0",
        "OTEL_BSP_SCHEDULE_DELAY": "50", "FORKSERVE_ACCESS_LOG": "1",
        "FORKSERVE_PAYLOAD_LOG": f"file:{tmp_path / 'payloads'}",
    })
    server.payloads = tmp_path / "payloads"  # type: ignore[attr-defined]
    yield server
    server.stop()


def test_unsampled_requests_get_a_trace_id_and_export_nothing(sparse: Server, sparse_receiver: Receiver) -> None:
    roots = [sparse.post("/v1/models/mlp:predict", json={"instances": [ROW]}, headers={"X-Request-Id": f"sparse-{n}"})
             for n in range(10)]
    root_ids = [answer.headers["X-Trace-Id"] for answer in roots]
    assert all(answer.status_code == 200 for answer in roots) and len(set(root_ids)) == 10
    assert all(re.fullmatch(r"[0-9a-f]{32}", trace_id) for trace_id in root_ids)
    unsampled_parent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"
    answer = sparse.post("/v1/models/mlp:predict", json={"instances": [ROW]}, headers={"traceparent": unsampled_parent})
    assert answer.headers["X-Trace-Id"] == unsampled_parent[3:35]  # the client's trace, not recorded here either
    header, trace_id, parent_id = traceparent()  # a sampled parent is followed whatever the ratio
    assert sparse.post("/v1/models/mlp:predict", json={"instances": [ROW]}, headers={"traceparent": header}).status_code == 200
    assert server_span(sparse_receiver, trace_id).parent_id == parent_id
    # the exporter sends in order: the sampled request's spans arrived, so the earlier requests had none
    assert {span.trace_id for span in sparse_receiver.spans} == {trace_id}
    wait_until(lambda: re.search(rf"rid=sparse-9 version=1 trace={root_ids[9]}$", sparse.log(), re.M), 10, "the access line")
    payloads = sparse.payloads  # type: ignore[attr-defined]
    logged = wait_until(lambda: (found := {r["request_id"]: r for r in records(payloads)}) and len(found) >= 12 and found,
                        10, "the payload records")
    assert [logged[f"sparse-{n}"]["trace_id"] for n in range(10)] == root_ids  # a record quotes the trace id the client got


def test_nginx_passes_the_trace_through_and_can_start_one(sparse: Server, sparse_receiver: Receiver, tmp_path: Path) -> None:
    shipped = Nginx(tmp_path / "shipped", [sparse.port])
    try:
        header, trace_id, parent_id = traceparent()
        answer = requests.post(f"{shipped.url}/v1/models/mlp:predict", json={"instances": [ROW]},
                               headers={"traceparent": header, "tracestate": "vendor=1"}, timeout=30)
        assert answer.ok and answer.headers["X-Trace-Id"] == trace_id
        assert server_span(sparse_receiver, trace_id).parent_id == parent_id
        assert requests.post(f"{shipped.url}/v1/models/mlp:predict", json={"instances": [ROW]}, timeout=30).ok
    finally:
        shipped.stop()
    starting = Nginx(tmp_path / "starting", [sparse.port], edits={  # the config's commented lines, uncommented
        "    # map $request_id": "    map $request_id", "    # map $http_traceparent": "    map $http_traceparent",
        "# proxy_set_header traceparent": "proxy_set_header traceparent"})
    try:
        answer = requests.post(f"{starting.url}/v1/models/mlp:predict", json={"instances": [ROW]}, timeout=30)
        trace_id = answer.headers["X-Trace-Id"]
        assert answer.ok and trace_id == answer.headers["X-Request-Id"]  # nginx's $request_id is both
        span = server_span(sparse_receiver, trace_id)  # flag 01: recorded although the server's ratio is 0
        assert span.parent_id == trace_id[:16]
        header, client_trace, _ = traceparent()
        answer = requests.post(f"{starting.url}/v1/models/mlp:predict", json={"instances": [ROW]},
                               headers={"traceparent": header}, timeout=30)
        assert answer.headers["X-Trace-Id"] == client_trace  # a client's own trace still wins
    finally:
        starting.stop()


def test_the_sdk_is_frozen_with_the_loaded_heap(traced: Server) -> None:
    log = traced.log()  # the SDK's imports out of full collections: tracing starts before the freeze
    for pid in traced.worker_pids():
        assert log.index(f"forkserve worker {pid} exports traces to") < log.index(f"forkserve worker {pid} froze")


def test_a_retiring_worker_exports_what_it_still_holds(model_repo: Path, tmp_path: Path) -> None:
    receiver = Receiver()  # the SDK's 5 s delay made long: only the exit flush can deliver the span
    server = mlp_server(model_repo, tmp_path, CONF, {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
                                                     "OTEL_BSP_SCHEDULE_DELAY": "600000"})
    try:
        header, trace_id, _ = traceparent()
        answer = server.post("/v1/models/mlp:predict", json={"instances": [ROW]}, headers={"traceparent": header})
        assert answer.status_code == 200 and not receiver.in_trace(trace_id)
        worker = server.worker_pids()[0]
        os.kill(worker, signal.SIGTERM)  # as a rollout retires it
        server.wait_reaped(worker)
        assert server_span(receiver, trace_id).attributes["http.response.status_code"] == 200
        assert "Traceback" not in server.log()
    finally:
        server.stop()
        receiver.close()
