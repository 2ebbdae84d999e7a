"""server.telemetry.buffer: buffered updates reach prometheus_client exactly as direct writes would."""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from server.telemetry.buffer import MetricBuffer

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float | None:
    """One sample's value from a registry."""
    return registry.get_sample_value(name, labels or {})


def test_counter_and_gauge_deltas_are_summed_per_series() -> None:
    registry = CollectorRegistry()
    requests = Counter("requests", "r", ["code"], registry=registry)
    inflight = Gauge("inflight", "i", ["model"], registry=registry)
    buffer = MetricBuffer()
    for _ in range(5):
        buffer.add(requests, ("200",), 1)
    buffer.add(requests, ("500",), 1)
    buffer.add(inflight, ("m",), 1)
    buffer.add(inflight, ("m",), 1)
    buffer.add(inflight, ("m",), -1)
    assert sample(registry, "requests_total", {"code": "200"}) is None  # nothing written before a flush
    buffer.flush()
    assert sample(registry, "requests_total", {"code": "200"}) == 5
    assert sample(registry, "requests_total", {"code": "500"}) == 1
    assert sample(registry, "inflight", {"model": "m"}) == 1


def test_a_series_whose_deltas_cancel_still_appears_at_zero() -> None:
    registry = CollectorRegistry()
    inflight = Gauge("inflight", "i", ["model"], registry=registry)
    buffer = MetricBuffer()
    buffer.add(inflight, ("m",), 1)
    buffer.add(inflight, ("m",), -1)
    buffer.flush()
    assert sample(registry, "inflight", {"model": "m"}) == 0


def test_histogram_buckets_match_direct_observations() -> None:
    registry = CollectorRegistry()
    buffered = Histogram("buffered", "b", ["stage"], buckets=BUCKETS, registry=registry)
    direct = Histogram("direct", "d", ["stage"], buckets=BUCKETS, registry=registry)
    buffer = MetricBuffer()
    values = [0.0005, 0.001, 0.0010001, 0.05, 0.1, 0.7, 1.0, 3.0, 0.0]  # bounds themselves included
    for value in values:
        buffer.add(buffered, ("decode",), value)
        direct.labels("decode").observe(value)
    buffer.flush()
    for bound in [*map(str, BUCKETS), "+Inf"]:
        labels = {"stage": "decode", "le": bound}
        assert sample(registry, "buffered_bucket", labels) == sample(registry, "direct_bucket", labels), bound
    assert sample(registry, "buffered_count", {"stage": "decode"}) == len(values)
    assert sample(registry, "buffered_sum", {"stage": "decode"}) == sample(registry, "direct_sum", {"stage": "decode"})


def test_concurrent_adds_lose_nothing() -> None:
    registry = CollectorRegistry()
    requests = Counter("requests", "r", registry=registry)
    buffer = MetricBuffer(interval_s=0.01)  # the flusher runs while the threads add

    def add_many() -> None:
        for _ in range(20000):
            buffer.add(requests, (), 1)

    threads = [threading.Thread(target=add_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    buffer.flush()
    assert sample(registry, "requests_total") == 8 * 20000


def test_the_flusher_thread_writes_without_an_explicit_flush() -> None:
    registry = CollectorRegistry()
    requests = Counter("requests", "r", registry=registry)
    buffer = MetricBuffer(interval_s=0.05)
    buffer.add(requests, (), 3)
    deadline = time.monotonic() + 10
    while sample(registry, "requests_total") != 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # polling a background thread, not waiting for a server
    assert sample(registry, "requests_total") == 3
