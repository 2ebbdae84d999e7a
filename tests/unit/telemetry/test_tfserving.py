"""TF Serving's families written from forkserve's multiprocess files: names, labels, status names, bounds, sums."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.telemetry import measure, metrics, tfserving
from server.telemetry.buffer import BUFFER
from server.telemetry.files import collect, scrape
from tests.support.harness import ROOT

# What two workers record: forkserve's own request counts and batch times, and the TF Serving histograms
WORKER = """
from server.telemetry import metrics as m
for labels, count in {requests}:
    m.REQUESTS.labels(*labels).inc(count)
for value in {latencies}:
    m.TFSERVING_REQUEST_LATENCY.labels("mlp", "predict", "REST").observe(value)
m.TFSERVING_RUNTIME_LATENCY.labels("mlp", "Predict", "TF1").observe(250.0)
m.TFSERVING_QUEUING_LATENCY.labels("model_server_batch_threads").observe(130.0)
m.BATCH_EXECUTIONS.labels("mlp", "1", "4").inc(3)
m.BATCH_SECONDS.labels("mlp", "1", "4", "compute_infer").inc(0.0015)
m.BATCH_SECONDS.labels("mlp", "1", "4", "compute_input").inc(7.0)
"""


def run_worker(directory: Path, requests: list, latencies: list[float]) -> None:
    """A process writing forkserve's metrics into `directory` in multiprocess mode, as a worker does."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    code = WORKER.format(requests=requests, latencies=latencies)
    subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("metrics")
    run_worker(directory, [
        (("mlp", "1", "tfserving_predict", "200", "rest"), 3),
        (("mlp", "1", "tfserving_predict", "200", "grpc"), 2),
        (("mlp", "1", "tfserving_classify", "400", "rest"), 1),
        (("mlp", "1", "v2_infer", "200", "rest"), 5),  # not a TF Serving API: not counted there
    ], [5.0, 15.0])
    run_worker(directory, [
        (("mlp", "1", "tfserving_predict", "200", "rest"), 4),
        (("_unknown", "", "tfserving_other", "404", "rest"), 1),
        (("mlp", "1", "tfserving_regress", "503", "grpc"), 2),
        (("mlp", "1", "tfserving_predict", "499", "grpc"), 1),
    ], [1e12])
    return directory


def exposed(directory: Path) -> str:
    return tfserving.exposition(collect(directory)).decode()


def test_request_count_sums_rest_and_grpc_by_model_and_status_name(two_workers: Path) -> None:
    lines = [line for line in exposed(two_workers).splitlines() if line.startswith(":tensorflow:serving:request_count")]
    assert sorted(lines) == [
        ':tensorflow:serving:request_count{model_name="_unknown",status="NOT_FOUND"} 1',
        ':tensorflow:serving:request_count{model_name="mlp",status="CANCELLED"} 1',
        ':tensorflow:serving:request_count{model_name="mlp",status="INVALID_ARGUMENT"} 1',
        ':tensorflow:serving:request_count{model_name="mlp",status="OK"} 9',
        ':tensorflow:serving:request_count{model_name="mlp",status="UNAVAILABLE"} 2',
    ]


def test_request_latency_has_tf_servings_bounds_labels_and_counts(two_workers: Path) -> None:
    text = exposed(two_workers)
    prefix = ':tensorflow:serving:request_latency_bucket{model_name="mlp",API="predict",entrypoint="REST",le='
    buckets = [line.removeprefix(prefix) for line in text.splitlines() if line.startswith(prefix)]
    assert len(buckets) == 34  # Buckets::Exponential(10, 1.8, 33) and DBL_MAX, written as +Inf
    assert buckets[:6] == ['"10"} 1', '"18"} 2', '"32.4"} 2', '"58.32"} 2', '"104.976"} 2', '"188.957"} 2']
    assert buckets[-2:] == ['"1.47476e+09"} 2', '"+Inf"} 3']
    assert ':tensorflow:serving:request_latency_count{model_name="mlp",API="predict",entrypoint="REST"} 3' in text
    assert ':tensorflow:serving:request_latency_sum{model_name="mlp",API="predict",entrypoint="REST"} 1000000000020.0' in text
    assert ':tensorflow:serving:runtime_latency_bucket{model_name="mlp",API="Predict",runtime="TF1",le="340.122"} 2' in text
    queued = ':tensorflow:serving:batching_session:queuing_latency_bucket{thread_pool_name="model_server_batch_threads",le='
    queuing = [line.removeprefix(queued) for line in text.splitlines() if line.startswith(queued)]
    assert len(queuing) == 53 and queuing[:4] == ['"100"} 0', '"120"} 0', '"144"} 2', '"172.8"} 2'], queuing
    assert queuing[-2:] == ['"1.09205e+06"} 2', '"+Inf"} 2']  # Buckets::Exponential(100, 1.2, 52): ~1 s


def test_graph_runs_and_their_time_come_from_the_executors_batches(two_workers: Path) -> None:
    lines = exposed(two_workers).splitlines()
    assert ":tensorflow:core:graph_runs 6" in lines
    assert ":tensorflow:core:graph_run_time_usecs 3000" in lines  # compute_infer only, in microseconds
    assert ":tensorflow:serving:batching_session:wrapped_run_count 6" in lines


def test_the_exposition_parses_as_tf_servings_types(two_workers: Path) -> None:
    families = {family.name: family for family in text_string_to_metric_families(exposed(two_workers))}
    assert {name: family.type for name, family in families.items()} == {
        ":tensorflow:serving:request_count": "counter",
        ":tensorflow:serving:request_latency": "histogram",
        ":tensorflow:serving:runtime_latency": "histogram",
        ":tensorflow:core:graph_runs": "counter",
        ":tensorflow:core:graph_run_time_usecs": "counter",
        ":tensorflow:serving:batching_session:wrapped_run_count": "counter",
        ":tensorflow:serving:batching_session:queuing_latency": "histogram",
    }


def test_metrics_keeps_only_forkserves_families(two_workers: Path) -> None:
    text = scrape(two_workers).decode()
    assert "forkserve_requests_total" in text
    assert tfserving.INTERNAL_PREFIX not in text and ":tensorflow:" not in text


def test_an_empty_directory_gives_empty_families_and_zero_graph_runs(tmp_path: Path) -> None:
    lines = exposed(tmp_path).splitlines()
    assert [line for line in lines if not line.startswith("#")] == [
        ":tensorflow:core:graph_runs 0", ":tensorflow:core:graph_run_time_usecs 0",
        ":tensorflow:serving:batching_session:wrapped_run_count 0"]


def test_status_names_are_the_grpc_codes_forkserve_answers_with() -> None:
    from server.rpc.calls import STATUS_CODES

    for status, code in STATUS_CODES.items():
        assert tfserving.status_name(str(status)) == code.name, status
    assert tfserving.status_name("200") == "OK"
    assert (tfserving.status_name("502"), tfserving.status_name("418")) == ("INTERNAL", "INVALID_ARGUMENT")


def test_label_values_are_escaped() -> None:
    assert tfserving._labels([("model_name", 'a"b\\c\nd')]) == '{model_name="a\\"b\\\\c\\nd"}'


def _sums(histogram: object, suffix: str = "_sum") -> dict[tuple[str, ...], float]:
    """A histogram's _sum (or _count) per label values, in this process."""
    return {
        tuple(v for k, v in s.labels.items()): s.value
        for family in histogram.collect() for s in family.samples if s.name.endswith(suffix)  # type: ignore[attr-defined]
    }


def _request(api: str, protocol: str, status: int) -> None:
    """One measured request of 2 ms, 1 ms of it computing, answered with `status`."""
    measure.begin("m-unit", api, protocol=protocol)
    inference = measure.current()
    assert inference is not None
    inference.started -= 0.002
    measure.stage("compute", 0.001)
    measure.record(status)
    measure.release()
    BUFFER.flush()


@pytest.mark.parametrize(("api", "protocol", "labels", "runtime"), [
    ("tfserving_predict", "rest", ("m-unit", "predict", "REST"), ("m-unit", "Predict", "TF1")),
    ("tfserving_regress", "grpc", ("m-unit", "Regress", "GRPC"), ("m-unit", "Regress", "TF1")),
])
def test_a_successful_request_is_timed_in_microseconds_only_when_on(
        monkeypatch: pytest.MonkeyPatch, api: str, protocol: str, labels: tuple[str, ...], runtime: tuple[str, ...]) -> None:
    pool = (tfserving.BATCH_THREAD_POOL,)
    _request(api, protocol, 200)  # off: nothing recorded
    assert labels not in _sums(metrics.TFSERVING_REQUEST_LATENCY)
    queued = _sums(metrics.TFSERVING_QUEUING_LATENCY, "_count").get(pool, 0.0)
    monkeypatch.setattr(measure, "TFSERVING", True)
    _request(api, protocol, 200)
    _request(api, protocol, 400)  # TF Serving times successes only
    _request("v2_infer", protocol, 200)  # not a TF Serving API
    assert 2000 <= _sums(metrics.TFSERVING_REQUEST_LATENCY)[labels] < 2000 + 1e5  # microseconds, of one request
    assert _sums(metrics.TFSERVING_RUNTIME_LATENCY)[runtime] == pytest.approx(1000)
    assert _sums(metrics.TFSERVING_REQUEST_LATENCY, "_count")[labels] == 1
    assert _sums(metrics.TFSERVING_QUEUING_LATENCY, "_count")[pool] == queued + 3  # every request that reached the model
