"""Reading forkserve's /metrics in tests: one scrape as a dict, a series' value, scrapes that wait for flushes."""

from __future__ import annotations

import os
import shutil
from typing import Callable

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import Server, wait_until


def require_tool(tool: str) -> str:
    """Path of a Debian tool the metrics tests need; skipped outside CI when it is missing."""
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{tool} is not installed (.ci/run installs it)")
        pytest.skip(f"{tool} is not installed (apt-get install prometheus)")
    return path


def samples(server: Server) -> dict[tuple[str, frozenset], float]:
    """One scrape of /metrics as {(sample name, labels): value}."""
    response = server.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(scrape: dict, name: str, **labels: str) -> float:
    """The value of one series (0 when absent)."""
    return scrape.get((name, frozenset(labels.items())), 0.0)


def settled_samples(server: Server, done: Callable[[dict], bool], what: str) -> dict:
    """Scrape until `done(scrape)`: workers write request metrics every half second, not at once."""

    def scrape_when_done() -> dict | None:
        scrape = samples(server)
        return scrape if done(scrape) else None

    return wait_until(scrape_when_done, 15, what)


def quiet_samples(server: Server) -> dict:
    """A scrape once every worker has flushed: equal to one taken a second (two flush intervals) later."""
    previous: dict | None = None  # the first poll only takes the reference scrape

    def unchanged() -> dict | None:
        nonlocal previous
        scrape = samples(server)
        counts = {key: v for key, v in scrape.items() if key[0].endswith(("_total", "_count", "_sum"))
                  and not key[0].startswith("forkserve_connection_closes")}  # each scrape's own connection counts there
        same, previous = counts == previous, counts
        return scrape if same else None

    return wait_until(unchanged, 15, "request metrics to settle", interval=1.0)


def target_health(port: int) -> str:
    """Health of the single scrape target ("unknown" before the first scrape)."""
    targets = requests.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    return targets[0]["health"] if targets else "unknown"
