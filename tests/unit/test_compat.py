"""Private-API paths of pinned libraries: verified against the pins, and equal to the public paths."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from server import compat

ROOT = Path(__file__).resolve().parents[2]


def test_the_verified_versions_are_the_pinned_ones_and_installed() -> None:
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.txt").read_text(), re.M))
    for distribution, version in compat.VERIFIED.items():
        assert pins[distribution] == version, distribution
        assert compat.verified(distribution), distribution


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict, float]]:
    """Every sample but the creation times."""
    return [(s.name, s.labels, s.value) for family in registry.collect() for s in family.samples
            if not s.name.endswith("_created")]


@pytest.mark.parametrize("private", [True, False], ids=["private", "public"])
def test_observe_many_writes_what_observe_would(private: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    values = [0.00005, 0.0003, 0.0003, 0.2, 7.0, 12.0]
    expected, got = CollectorRegistry(), CollectorRegistry()
    one = Histogram("h", "", ["m"], buckets=(0.0001, 0.001, 0.5, 10.0), registry=expected).labels("x")
    for value in values:
        one.observe(value)
    many = Histogram("h", "", ["m"], buckets=(0.0001, 0.001, 0.5, 10.0), registry=got).labels("x")
    monkeypatch.setattr(compat, "verified", lambda distribution: private)
    compat.observe_many(many, values)
    assert _samples(got) == _samples(expected)
    assert compat.is_histogram(many) and not compat.is_histogram(Counter("c", "", registry=got))


def test_metric_files_get_their_blocks_reserved(tmp_path: Path) -> None:
    from prometheus_client.mmap_dict import MmapedDict

    assert compat.reserve_metric_file_blocks()
    path = tmp_path / "counter_1.db"
    values = MmapedDict(str(path))
    for index in range(400):  # enough keys to grow the file past its first page
        values.write_value(f"key-{index}-" + "x" * 64, float(index), 0.0)
    size = os.stat(path).st_size
    assert size > 4096 and os.stat(path).st_blocks * 512 >= size  # allocated, not sparse
    values.close()
