"""The order test modules are handed out in: `make test` runs two pytest-xdist processes, a module each at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

# The longest end-to-end modules (serial seconds, `pytest --durations`, 2026-12-07) go first, so that neither
# process starts a long one while the other runs out of work; the rest of tests/e2e/ follows in collection order,
# and the unit tests (many short modules) come last, to fill in. An unlisted or renamed module only runs later.
LONGEST_FIRST = (
    "test_rollout",  # 147 s
    "test_grpc_rollout",  # 132
    "test_handlers",  # 105
    "test_tfserving_flags",  # 105
    "test_validate",  # 90
    "test_repository_control",  # 89
    "test_publish",  # 85
    "test_faults",  # 77
    "test_grpc_nginx",  # 77
    "test_lifecycle",  # 77
    "test_rollout_failures",  # 73
    "test_grpc_lifecycle",  # 72
    "test_warmup_records",  # 65
    "test_run_dir_faults",  # 62
    "test_unservable_models",  # 53
    "test_tracing",  # 52
    "test_tls",  # 44
    "test_metrics_faults",  # 43
    "test_config_reload",  # 37
    "test_payload_log",  # 33
    "test_metrics_restarts",  # 33
)


def _rank(path: Path) -> int:
    if path.parent.name != "e2e":
        return len(LONGEST_FIRST) + 1
    return LONGEST_FIRST.index(path.stem) if path.stem in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest end-to-end modules first, unit tests last; a module's own tests keep their order (a stable sort)."""
    items.sort(key=lambda item: _rank(item.path))
