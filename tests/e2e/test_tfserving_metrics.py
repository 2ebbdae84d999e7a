"""TF Serving's metrics path (FORKSERVE_TFSERVING_METRICS_PATH) on a real 2-worker server: REST and gRPC counted exactly,
TF Serving's names, labels and bounds, promtool, and a real Prometheus scraping it as it scrapes TF Serving."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc, regression_pb2

from tests.support.harness import Server, wait_until
from tests.support.metrics import prometheus_scraping, require_tool
from tests.support.models import copy_models

PATH = "/monitoring/prometheus/metrics"  # TF Serving's default prometheus_config path
MODEL = "half_plus_two"
Scrape = dict[tuple[str, frozenset], float]


@pytest.fixture(scope="module")
def tfs_server(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A 2-worker server of its own with TF Serving's metrics path on (these tests count exactly)."""
    repo = copy_models(model_repo, tmp_path_factory.mktemp("tfs-metrics-models"), MODEL)
    instance = Server(models_dir=repo, run_dir=tmp_path_factory.mktemp("tfs-metrics-run"), workers=2,
                      env={"FORKSERVE_TFSERVING_METRICS_PATH": PATH}).start()
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def stub(tfs_server: Server) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with grpc.insecure_channel(tfs_server.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def scrape(server: Server, path: str = PATH) -> Scrape:
    """One scrape parsed by prometheus_client: {(sample name, labels): value} (its parser adds _total to counters)."""
    response = server.get(path)
    assert response.status_code == 200, response.text
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


def scrape_with(server: Server, pattern: str) -> str | None:
    """The path's text when a line matches `pattern` (None until then)."""
    text = server.get(PATH).text
    return text if re.search(pattern, text, re.MULTILINE) else None


def total(scrape: Scrape, name: str, **labels: str) -> float:
    """The sum of the samples of that name whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (sample, have), v in scrape.items() if sample == name and wanted <= have)


def settled(server: Server) -> Scrape:
    """A scrape once every worker has flushed: equal to the one taken a second (two flush intervals) before."""
    previous: Scrape | None = None

    def unchanged() -> Scrape | None:
        nonlocal previous
        full = scrape(server)
        current = {key: v for key, v in full.items() if key[0].startswith(":tensorflow:")}
        same, previous = current == previous, current
        return full if same else None

    return wait_until(unchanged, 15, "TF Serving's metrics to settle", interval=1.0)


def grpc_predict(stub: Any, version: int | None = None) -> Any:
    """Predict half_plus_two's x = [[1.0], [2.0]] over gRPC."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    if version is not None:
        request.model_spec.version.value = version
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[1.0, 2.0], tensor_shape=tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=2), tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
    request.inputs["x"].CopyFrom(tensor)
    return stub.Predict(request, timeout=30)


def grpc_regress(stub: Any) -> Any:
    """Regress one tf.Example x = 3.0 with half_plus_two's regress_x_to_y signature over gRPC."""
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = MODEL
    request.model_spec.signature_name = "regress_x_to_y"
    example = request.input.example_list.examples.add()
    example.features.feature["x"].float_list.value.append(3.0)
    return stub.Regress(request, timeout=30)


def test_rest_and_grpc_requests_are_counted_and_timed_exactly(tfs_server: Server, stub: Any) -> None:
    before = settled(tfs_server)
    rest_ok, grpc_ok, rest_regress, grpc_regress_ok = 5, 4, 2, 3
    for _ in range(rest_ok):
        assert tfs_server.post(f"/v1/models/{MODEL}:predict", json={"instances": [1.0, 2.0]}).status_code == 200
    for _ in range(grpc_ok):
        assert list(grpc_predict(stub).outputs["y"].float_val) == [2.5, 3.0]
    for _ in range(rest_regress):
        body = {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}]}
        assert tfs_server.post(f"/v1/models/{MODEL}:regress", json=body).status_code == 200
    for _ in range(grpc_regress_ok):
        assert list(grpc_regress(stub).result.regressions)[0].value == 3.5
    assert tfs_server.post(f"/v1/models/{MODEL}:predict", json={"instances": ["not a number"]}).status_code == 400
    with pytest.raises(grpc.RpcError) as failed:
        grpc_predict(stub, version=77)
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND

    ok = rest_ok + grpc_ok + rest_regress + grpc_regress_ok
    count = ":tensorflow:serving:request_count_total"

    def delta(after: Scrape, name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    def all_counted() -> Scrape | None:
        current = settled(tfs_server)
        return current if delta(current, count, status="OK") >= ok else None

    after = wait_until(all_counted, 30, f"{ok} successful requests counted")
    assert delta(after, count, model_name=MODEL, status="OK") == ok
    assert delta(after, count, model_name=MODEL, status="INVALID_ARGUMENT") == 1
    assert delta(after, count, model_name=MODEL, status="NOT_FOUND") == 1
    assert delta(after, count) == ok + 2
    latency = ":tensorflow:serving:request_latency_count"
    assert delta(after, latency, model_name=MODEL, API="predict", entrypoint="REST") == rest_ok  # successes only
    assert delta(after, latency, model_name=MODEL, API="Predict", entrypoint="GRPC") == grpc_ok
    assert delta(after, latency, model_name=MODEL, API="regress", entrypoint="REST") == rest_regress
    assert delta(after, latency, model_name=MODEL, API="Regress", entrypoint="GRPC") == grpc_regress_ok
    assert delta(after, latency) == ok
    runtime = ":tensorflow:serving:runtime_latency_count"
    assert delta(after, runtime, model_name=MODEL, API="Predict", runtime="TF1") == rest_ok + grpc_ok
    assert delta(after, runtime, model_name=MODEL, API="Regress", runtime="TF1") == rest_regress + grpc_regress_ok
    queuing = ":tensorflow:serving:batching_session:queuing_latency_count"
    assert delta(after, queuing, thread_pool_name="model_server_batch_threads") == ok  # the failures never reached the model
    # microseconds: each request took more than 10 µs and less than the test's own time
    assert 10 * ok < delta(after, ":tensorflow:serving:request_latency_sum") < 60e6
    # the same scrape's own families agree: TF Serving's are forkserve's, renamed
    assert total(after, count) == sum(v for (name, labels), v in after.items()
                                      if name == "forkserve_requests_total" and dict(labels)["api"].startswith("tfserving_"))
    assert total(after, ":tensorflow:core:graph_runs_total") == total(after, "forkserve_batch_executions_total") > 0
    assert total(after, ":tensorflow:serving:batching_session:wrapped_run_count_total") == total(after, ":tensorflow:core:graph_runs_total")
    compute = total(after, "forkserve_batch_stats_seconds_total", kind="compute_infer")
    assert total(after, ":tensorflow:core:graph_run_time_usecs_total") == int(compute * 1e6)


def test_latency_buckets_are_tf_servings(tfs_server: Server) -> None:
    assert tfs_server.post(f"/v1/models/{MODEL}:predict", json={"instances": [1.0]}).status_code == 200
    pattern = re.compile(r'^:tensorflow:serving:request_latency_bucket\{model_name="half_plus_two",API="predict",'
                         r'entrypoint="REST",le="([^"]+)"\} \d+$', re.MULTILINE)
    text = wait_until(lambda: scrape_with(tfs_server, pattern.pattern), 15, "a REST predict timed")
    bounds = pattern.findall(text)
    assert len(bounds) == 34 and bounds[:4] == ["10", "18", "32.4", "58.32"] and bounds[-1] == "+Inf", bounds
    assert re.search(r"^:tensorflow:serving:request_count\{", text, re.MULTILINE)  # no _total, as TF Serving writes it


def test_metrics_is_unchanged_and_the_path_carries_it_too(tfs_server: Server) -> None:
    plain = tfs_server.get("/metrics").text
    assert ":tensorflow:" not in plain and "forkserve_tfserving_" not in plain
    both = scrape(tfs_server)
    forkserve = {name for name, _ in both if name.startswith("forkserve_")}
    assert "forkserve_requests_total" in forkserve and not [name for name in forkserve if name.startswith("forkserve_tfserving_")]
    assert tfs_server.get(PATH + "/").status_code == 404  # exactly the path, as TF Serving registers it


def test_the_path_passes_promtool_but_for_tf_servings_own_names(tfs_server: Server) -> None:
    promtool = require_tool("promtool")
    assert tfs_server.post(f"/v1/models/{MODEL}:predict", json={"instances": [1.0]}).status_code == 200
    body = wait_until(lambda: scrape_with(tfs_server, r"^:tensorflow:serving:request_count\{"), 15, "a request counted").encode()
    lint = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=False, timeout=30)
    problems = lint.stderr.decode().splitlines()
    assert lint.returncode == 3 and b"error while linting" not in lint.stderr, lint  # 3: lint problems only, no parse error
    assert ":tensorflow:serving:request_count metric names should not contain ':'" in problems
    # TF Serving's names have colons, and its counters no _total suffix (its own exporter writes them so)
    inherent = ("metric names should not contain ':'", 'counter metrics should have "_total" suffix',
                'non-histogram and non-summary metrics should not have "_count" suffix')
    assert [p for p in problems if not (p.startswith(":tensorflow:") and p.endswith(inherent))] == [], problems


def test_prometheus_scrapes_the_path_and_histogram_quantile_works(tmp_path: Path, tfs_server: Server) -> None:
    counted = f'sum(:tensorflow:serving:request_count{{model_name="{MODEL}", status="OK"}}) or vector(0)'
    with prometheus_scraping(tmp_path, tfs_server, PATH) as query:
        before = settled(tfs_server)
        wait_until(lambda: query(counted) == total(before, ":tensorflow:serving:request_count_total", model_name=MODEL, status="OK"),
                   30, "Prometheus to see the settled count")
        sent = 7
        for _ in range(sent):
            assert tfs_server.post(f"/v1/models/{MODEL}:predict", json={"instances": [3.0]}).status_code == 200
        expected = total(before, ":tensorflow:serving:request_count_total", model_name=MODEL, status="OK") + sent
        assert wait_until(lambda: query(counted) == expected, 30, f"Prometheus to count {sent} more requests")
        # a TF Serving dashboard's latency panel: a quantile over the _bucket series, in microseconds
        median = query(f'histogram_quantile(0.5, sum by (le) (:tensorflow:serving:request_latency_bucket{{model_name="{MODEL}"}}))')
        assert median is not None and 10 <= median < 10e6, median
