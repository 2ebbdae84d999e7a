"""The rollout's metrics writes, from the master's rollout thread (no TensorFlow).

NOTE: server.telemetry.metrics is imported at the first write, not here: prometheus_client picks
its value class when first imported, from PROMETHEUS_MULTIPROC_DIR, which the master exports and
wipes in on_starting (server.master.hooks); importing this package must not be what imports it first.
"""

from __future__ import annotations

from typing import Any, Callable


def record_metric(update: Callable[[Any], object]) -> None:
    """Apply `update(metrics module)` (metrics.record holds the fork lock: this thread writes while the main thread forks)."""
    from server.telemetry import metrics

    metrics.record(lambda: update(metrics))
