"""Triton's statistics per model version, read from the multiprocess metric files: the whole server, not one worker.

Runs in a worker (the statistics calls). The numbers are the ones /metrics exposes, summed over
every live worker's file and the archives of the dead ones (server.telemetry.files); another
worker's last half second may still be in its buffer (server.telemetry.buffer).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from server.telemetry import files

NS = 1_000_000_000
KINDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
BATCH_KINDS = ("compute_input", "compute_infer", "compute_output")
CACHE_KINDS = ("cache_hit", "cache_miss")  # Triton's response cache: forkserve has none, always 0


@dataclass
class Duration:
    """A count and the nanoseconds it took, as Triton's StatisticDuration."""

    count: int = 0
    ns: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class VersionStatistics:
    """What one model version has done, on every worker."""

    last_inference_ms: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # by kind
    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # "success" / "fail"
    executions: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # by batch size
    batch_seconds: dict[tuple[int, str], float] = field(default_factory=lambda: defaultdict(float))

    def as_triton(self, name: str, version: str) -> dict[str, object]:
        """Triton's ModelStatistics, JSON-shaped (the gRPC message has the same fields)."""
        successes = self.requests["success"]
        counts = {"success": successes, "fail": self.requests["fail"]}
        inference_stats = {
            kind: Duration(counts.get(kind, successes), round(self.seconds[kind] * NS)).as_dict() for kind in KINDS
        }
        inference_stats.update({kind: Duration().as_dict() for kind in CACHE_KINDS})
        batch_stats = [
            {"batch_size": size, **{kind: Duration(runs, round(self.batch_seconds[(size, kind)] * NS)).as_dict()
                                    for kind in BATCH_KINDS}}
            for size, runs in sorted(self.executions.items())
        ]
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": sum(size * runs for size, runs in self.executions.items()),
            "execution_count": sum(self.executions.values()),
            "inference_stats": inference_stats,
            "batch_stats": batch_stats,
            "memory_usage": [],
        }


def read(directory: Path) -> dict[tuple[str, str], VersionStatistics]:
    """Every (model, version) the metric files know, with its statistics; raises OSError when they cannot be read."""
    found: dict[tuple[str, str], VersionStatistics] = defaultdict(VersionStatistics)
    for family in files.families(directory, ("counter", "gauge_max")):
        for sample in family.samples:
            labels = sample.labels
            if "model" not in labels or not labels.get("version"):
                continue
            stats = found[(labels["model"], labels["version"])]
            if sample.name == "forkserve_requests_total":
                stats.requests["success" if labels["code"] == "200" else "fail"] += int(sample.value)
            elif sample.name == "forkserve_inference_stats_seconds_total":
                stats.seconds[labels["kind"]] += sample.value
            elif sample.name == "forkserve_batch_executions_total":
                stats.executions[int(labels["batch_size"])] += int(sample.value)
            elif sample.name == "forkserve_batch_stats_seconds_total":
                stats.batch_seconds[(int(labels["batch_size"]), labels["kind"])] += sample.value
            elif sample.name == "forkserve_last_inference_timestamp_seconds":
                stats.last_inference_ms = max(stats.last_inference_ms, int(sample.value * 1000))
    return found
