"""Triton's statistics extension, the same on every transport: the served versions with the whole server's numbers."""

from __future__ import annotations

from typing import Any

from server.errors import ApiError
from server.models.registry import ModelRegistry, ModelVersion
from server.settings import Settings
from server.telemetry import statistics
from server.telemetry.buffer import BUFFER


def v2_statistics(registry: ModelRegistry, name: str | None, version: int | None) -> dict[str, Any]:
    """ModelStatistics: every served version (of `name`; the one `version`) as Triton reports it; 503 when unreadable."""
    if name:
        model = registry.get(name)
        versions = [model.resolve(version)] if version is not None else model.available()
    else:
        versions = [served for _, model in sorted(registry.models.items()) for served in model.available()]
    BUFFER.flush()  # this worker's own updates; the others' are at most one flush interval old
    try:
        found = statistics.read(Settings.current().metrics_dir)
    except (OSError, ValueError) as exc:
        raise ApiError(f"statistics unavailable: {exc}", status=503) from None
    return {"model_stats": [_one(found, served) for served in versions]}


def _one(found: dict[tuple[str, str], statistics.VersionStatistics], served: ModelVersion) -> dict[str, Any]:
    """One version's statistics (zeros before its first request)."""
    number = str(served.version)
    return found.get((served.name, number), statistics.VersionStatistics()).as_triton(served.name, number)
