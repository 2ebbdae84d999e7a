"""Reading forkserve's /metrics in tests: one scrape as a dict, a series' value, scrapes that wait for flushes."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import Server, free_port, wait_until


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


@contextmanager
def prometheus_scraping(tmp_path: Path, server: Server, metrics_path: str = "/metrics") -> Iterator[Callable[[str], float | None]]:
    """A real Prometheus scraping `server` every second; yields query(promql) -> the first value, None before it answers.

    Returns once Prometheus answers queries and has scraped the target successfully once.
    """
    prometheus = require_tool("prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: forkserve\n    metrics_path: {metrics_path}\n"
        f"    static_configs:\n      - targets: ['{server.url.removeprefix('http://')}']\n"
    )
    process = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    api = f"http://127.0.0.1:{port}/api/v1/query"

    def query(promql: str) -> float | None:
        try:
            result = requests.get(api, params={"query": promql}, timeout=5).json()["data"]["result"]
        except (requests.RequestException, ValueError, KeyError):
            return None
        return float(result[0]["value"][1]) if result else None

    try:
        wait_until(lambda: query("vector(1)") is not None, 60, "Prometheus to answer queries")
        wait_until(lambda: target_health(port) == "up", 60, "the first successful scrape")
        yield query
    finally:
        process.terminate()
        process.wait(30)
