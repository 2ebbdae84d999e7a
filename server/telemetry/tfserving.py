"""TF Serving's Prometheus families, written from forkserve's merged multiprocess metrics when a scrape asks.

Imported by workers (the FORKSERVE_TFSERVING_METRICS_PATH view, the request path's labels) and by
server.telemetry.metrics for the bucket bounds; no TensorFlow, no grpc. Names, labels, units,
buckets and text form are TF Serving's (tensorflow_serving/servables/tensorflow/util.cc,
tensorflow/core/framework/metrics.cc, tensorflow_serving/util/prometheus_exporter.cc): a monitoring
name "/tensorflow/serving/request_count" is exposed as ":tensorflow:serving:request_count", a counter
without a "_total" suffix, histogram bounds printed as absl prints a double (six significant digits).
"""

from __future__ import annotations

import collections
from typing import Iterable

from prometheus_client import Metric

INTERNAL_PREFIX = "forkserve_tfserving_"  # families recorded only to be written here, never on /metrics themselves


def exponential_bounds(scale: float, growth: float, count: int) -> tuple[float, ...]:
    """monitoring::Buckets::Exponential's finite bounds, multiplied as TensorFlow does (the last bucket is +Inf)."""
    bounds, bound = [], scale
    for _ in range(count):
        bounds.append(bound)
        bound *= growth
    return tuple(bounds)


LATENCY_BOUNDS_US = exponential_bounds(10, 1.8, 33)  # request_latency and runtime_latency: 10 µs .. ~25 min
QUEUING_BOUNDS_US = exponential_bounds(100, 1.2, 52)  # batching_session/queuing_latency: 100 µs .. ~1 s
# the thread_pool_name TF Serving's batching session gets from --enable_batching without a batching parameters file
BATCH_THREAD_POOL = "model_server_batch_threads"

# (forkserve's api label, protocol) -> request_latency's (API, entrypoint): REST's API is the URL's verb, gRPC's the method
REQUEST_LATENCY_LABELS = {
    ("tfserving_predict", "rest"): ("predict", "REST"),
    ("tfserving_classify", "rest"): ("classify", "REST"),
    ("tfserving_regress", "rest"): ("regress", "REST"),
    ("tfserving_predict", "grpc"): ("Predict", "GRPC"),
    ("tfserving_classify", "grpc"): ("Classify", "GRPC"),
    ("tfserving_regress", "grpc"): ("Regress", "GRPC"),
}
# forkserve's api label -> runtime_latency's (API, runtime); "TF1" is TF Serving's name for TensorFlow's own runtime (not TFRT)
RUNTIME_LATENCY_LABELS = {
    "tfserving_predict": ("Predict", "TF1"),
    "tfserving_classify": ("Classify", "TF1"),
    "tfserving_regress": ("Regress", "TF1"),
}

# forkserve_requests_total's code (the HTTP status; for gRPC the one REST would answer) -> the status name TF Serving counts.
# The same mapping server.rpc.calls.STATUS_CODES answers gRPC calls with (a unit test keeps them equal).
STATUS_NAMES = {
    200: "OK", 400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 405: "INVALID_ARGUMENT",
    408: "DEADLINE_EXCEEDED", 413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
    501: "UNIMPLEMENTED", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}

REQUEST_COUNT = ":tensorflow:serving:request_count"
REQUEST_LATENCY = ":tensorflow:serving:request_latency"
RUNTIME_LATENCY = ":tensorflow:serving:runtime_latency"
GRAPH_RUNS = ":tensorflow:core:graph_runs"
GRAPH_RUN_TIME = ":tensorflow:core:graph_run_time_usecs"
WRAPPED_RUNS = ":tensorflow:serving:batching_session:wrapped_run_count"
QUEUING_LATENCY = ":tensorflow:serving:batching_session:queuing_latency"
HELP = {  # TF Serving's own descriptions (its exporter prints none; promtool asks for them)
    REQUEST_COUNT: "The total number of requests.",
    REQUEST_LATENCY: "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
    RUNTIME_LATENCY: "Distribution of wall time (in microseconds) for Tensorflow runtime.",
    GRAPH_RUNS: "The number of graph executions used to collect /tensorflow/core/graph_run_time_usecs",
    GRAPH_RUN_TIME: "The total time spent on executing graphs in microseconds.",
    WRAPPED_RUNS: "Total count of run calls on the wrapped session",
    QUEUING_LATENCY: "Distribution of wall time spent (in microseconds) in queuing",
}
# the internal histograms (server.telemetry.metrics) each TF Serving histogram is written from
HISTOGRAMS = {
    REQUEST_LATENCY: INTERNAL_PREFIX + "request_latency_microseconds",
    RUNTIME_LATENCY: INTERNAL_PREFIX + "runtime_latency_microseconds",
    QUEUING_LATENCY: INTERNAL_PREFIX + "queuing_latency_microseconds",
}
LABELS = {  # in TF Serving's order (the multiprocess files sort them)
    REQUEST_LATENCY: ("model_name", "API", "entrypoint"),
    RUNTIME_LATENCY: ("model_name", "API", "runtime"),
    QUEUING_LATENCY: ("thread_pool_name",),
}


def status_name(code: str) -> str:
    """TF Serving's status label for a forkserve code label; an unlisted code maps as gRPC answers it (5xx: INTERNAL)."""
    try:
        status = int(code)
    except ValueError:
        return "UNKNOWN"
    return STATUS_NAMES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")


def forkserve_families(metrics: Iterable[Metric]) -> list[Metric]:
    """forkserve's own families: what /metrics shows (the internal TF Serving histograms left out)."""
    return [metric for metric in metrics if not metric.name.startswith(INTERNAL_PREFIX)]


def exposition(metrics: Iterable[Metric]) -> bytes:
    """TF Serving's families in its own text form, from forkserve's merged metrics."""
    by_name = {metric.name: metric for metric in metrics}
    lines: list[str] = []
    lines += _counter(REQUEST_COUNT, _request_counts(by_name.get("forkserve_requests")))
    for name, internal in HISTOGRAMS.items():
        lines += _histogram(name, by_name.get(internal))
    runs = _total(by_name.get("forkserve_batch_executions"), "forkserve_batch_executions_total")
    lines += _counter(GRAPH_RUNS, {(): runs})
    batch_seconds = by_name.get("forkserve_batch_stats_seconds")
    seconds = _total(batch_seconds, "forkserve_batch_stats_seconds_total", kind="compute_infer")
    lines += _counter(GRAPH_RUN_TIME, {(): seconds * 1e6})
    lines += _counter(WRAPPED_RUNS, {(): runs})  # forkserve always batches: every model execution runs one batch
    return ("\n".join(lines) + "\n").encode()


def _request_counts(requests: Metric | None) -> dict[tuple[tuple[str, str], ...], float]:
    """request_count's series: TF Serving's REST and gRPC API requests by model and status name."""
    counts: dict[tuple[tuple[str, str], ...], float] = collections.defaultdict(float)
    for sample in requests.samples if requests is not None else ():
        labels = sample.labels
        if sample.name.endswith("_total") and labels.get("api", "").startswith("tfserving_"):
            counts[(("model_name", labels["model"]), ("status", status_name(labels["code"])))] += sample.value
    return counts


def _total(metric: Metric | None, sample_name: str, **wanted: str) -> float:
    """The sum of a family's samples of that name whose labels include `wanted`."""
    if metric is None:
        return 0.0
    return sum(sample.value for sample in metric.samples if sample.name == sample_name
               and all(sample.labels.get(key) == value for key, value in wanted.items()))


def _counter(name: str, series: dict[tuple[tuple[str, str], ...], float]) -> list[str]:
    """A counter as TF Serving writes one: its bare name, integer values."""
    lines = [f"# HELP {name} {HELP[name]}", f"# TYPE {name} counter"]
    for labels, total in sorted(series.items()):
        lines.append(f"{name}{_labels(labels)} {int(total)}")
    return lines


def _histogram(name: str, internal: Metric | None) -> list[str]:
    """A histogram as TF Serving writes one, from the internal histogram recorded with the same bounds."""
    lines = [f"# HELP {name} {HELP[name]}", f"# TYPE {name} histogram"]
    buckets: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = collections.defaultdict(list)
    sums: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in internal.samples if internal is not None else ():
        labels = tuple((key, sample.labels[key]) for key in LABELS[name])
        if sample.name.endswith("_bucket"):
            buckets[labels].append((float(sample.labels["le"]), sample.value))
        elif sample.name.endswith("_sum"):
            sums[labels] = sample.value
    for labels, counts in sorted(buckets.items()):
        for bound, count in sorted(counts):
            le = "+Inf" if bound == float("inf") else _six_digits(bound)
            lines.append(f"{name}_bucket{_labels(labels + (('le', le),))} {int(count)}")
        lines.append(f"{name}_sum{_labels(labels)} {sums.get(labels, 0.0)!r}")
        lines.append(f"{name}_count{_labels(labels)} {int(max(counts)[1])}")
    return lines


def _six_digits(value: float) -> str:
    """A double as absl::StrCat prints it ("%.6g"): TF Serving's `le` values, which alerts may match as strings."""
    return f"{value:.6g}"


def _labels(labels: Iterable[tuple[str, str]]) -> str:
    """{name="value",...} with the text format's escapes ("" when there are none)."""
    parts = [f'{key}="{_escape(value)}"' for key, value in labels]
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(value: str) -> str:
    """A label value escaped for the text format."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
