"""Per-request metric updates, buffered in memory and written to the multiprocess files in bulk.

Runs in workers. A prometheus_client write in multiprocess mode takes one process-wide lock, and
forkserve makes about a dozen per request: a large share of an MLP request's CPU under several
request threads (bench/results/code-notes.md#metric-buffer). Appending to a deque is far cheaper
and takes no lock. A flusher thread sums what was buffered once per interval and writes
one update per series; /metrics flushes the answering worker first and the worker_exit hook
flushes a worker on its way out.

The cost: a scrape can miss up to one interval of another worker's updates, and a SIGKILLed
worker loses its last interval. Rare updates (rejections, loads, exits) stay synchronous.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from server import compat
from server.telemetry import metrics
from server.telemetry.flusher import Flusher

FLUSH_INTERVAL_S = 0.5

Series = tuple[Any, tuple[str, ...]]  # (metric, label values)


class MetricBuffer:
    """Buffered inc/dec/observe for the request path; flush() applies them."""

    def __init__(self, interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._events: collections.deque[tuple[Any, tuple[str, ...], float]] = collections.deque()
        self._children: dict[Series, Any] = {}
        self._latest: dict[Series, float] = {}  # gauges set, not added to: the last value wins
        self._vectors: collections.deque[tuple[Any, tuple[str, ...], tuple[str, ...], tuple[float, ...]]] = collections.deque()
        self._flushing = threading.Lock()  # the flusher thread and a scrape may flush at once
        self._flusher = Flusher("metrics-flusher", self.flush, interval_s)

    def add(self, metric: Any, labels: tuple[str, ...], value: float) -> None:
        """Counter or gauge: add `value` (negative to decrease); histogram: observe `value`."""
        self._events.append((metric, labels, value))  # deque.append is atomic: no lock needed
        self._flusher.ensure_started()

    def add_vector(self, metric: Any, labels: tuple[str, ...], last_labels: tuple[str, ...], values: tuple[float, ...]) -> None:
        """Counter: add values[i] to the series labels + (last_labels[i],), as one event (a fifth of add()'s cost for 5)."""
        self._vectors.append((metric, labels, last_labels, values))
        self._flusher.ensure_started()

    def latest(self, metric: Any, labels: tuple[str, ...], value: float) -> None:
        """Gauge: set to `value` at the next flush (a later call before it wins)."""
        self._latest[(metric, labels)] = value  # NOTE: one dict store, atomic under the GIL: no lock
        self._flusher.ensure_started()

    def flush(self) -> None:
        """Write what is buffered: one update per counter or gauge series, one per histogram bucket."""
        with self._flushing:
            latest, self._latest = self._latest, {}
            for series, value in latest.items():
                metrics.record(lambda series=series, value=value: self._child(series).set(value))
            events = self._events
            sums: dict[Series, float] = collections.defaultdict(float)
            observed: dict[Series, list[float]] = collections.defaultdict(list)
            for _ in range(len(events)):  # what is there now; later appends wait for the next flush
                metric, labels, value = events.popleft()
                if compat.is_histogram(metric):
                    observed[(metric, labels)].append(value)
                else:
                    sums[(metric, labels)] += value
            vectors = self._vectors
            for _ in range(len(vectors)):
                metric, labels, last_labels, values = vectors.popleft()
                for last, value in zip(last_labels, values):
                    sums[(metric, labels + (last,))] += value
            for series, total in sums.items():
                metrics.record(lambda series=series, total=total: self._child(series).inc(total))
            for series, values in observed.items():
                metrics.record(lambda series=series, values=values: compat.observe_many(self._child(series), values))

    def _child(self, series: Series) -> Any:
        """The labelled child of a series, looked up once."""
        child = self._children.get(series)
        if child is None:
            metric, labels = series
            child = self._children[series] = metric.labels(*labels) if labels else metric
        return child


BUFFER = MetricBuffer()
