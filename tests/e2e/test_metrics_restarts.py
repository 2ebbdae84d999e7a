"""The multiprocess directory stays bounded over worker restarts and keeps every count."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support.harness import Server
from tests.support.metrics import samples, settled_samples, value

# Two SIGKILLs and two SIGTERMs: enough for the bound below (14 files) to fail without the folding of dead workers' files.
RESTARTS = 4


@pytest.fixture()
def light_server(tmp_path: Path) -> Server:
    """A server with no models: its workers never import TensorFlow, so they restart in a second."""
    (tmp_path / "models").mkdir()  # an empty repository: these restarts need no TensorFlow
    instance = Server(models_dir=tmp_path / "models", run_dir=tmp_path / "run", workers=2).start(timeout=60)
    yield instance
    instance.stop()


def test_restarts_keep_counts_and_a_bounded_number_of_files(light_server: Server) -> None:
    sent = 0
    labels = {"model": "_unknown", "version": "", "api": "tfserving_predict", "code": "404", "protocol": "rest"}

    def counted(scrape: dict) -> tuple[float, float]:
        return (
            value(scrape, "forkserve_requests_total", **labels),
            value(scrape, "forkserve_request_duration_seconds_count", model="_unknown", api="tfserving_predict", protocol="rest"),
        )

    for round_number in range(RESTARTS):
        for _ in range(3):
            assert light_server.post("/v1/models/absent:predict", json={"instances": [1]}).status_code == 404
            sent += 1
        # A SIGKILLed worker loses what it has not flushed yet: count first, then kill.
        settled_samples(light_server, lambda scrape: counted(scrape) == (sent, sent), f"{sent} requests")
        light_server.restart_worker(signal.SIGKILL if round_number % 3 == 0 else signal.SIGTERM)
    scrape = samples(light_server)
    assert value(scrape, "forkserve_requests_total", **labels) == sent
    assert value(scrape, "forkserve_request_duration_seconds_count", model="_unknown", api="tfserving_predict", protocol="rest") == sent
    assert value(scrape, "forkserve_worker_boots_total") == 2 + RESTARTS
    assert value(scrape, "forkserve_worker_exits_total", reason="killed") == len(range(0, RESTARTS, 3))
    assert value(scrape, "forkserve_worker_exits_total", reason="graceful") == RESTARTS - len(range(0, RESTARTS, 3))
    assert value(scrape, "forkserve_workers_alive") == 2
    files = sorted(p.name for p in (light_server.run_dir / "metrics").glob("*.db"))
    live = {str(pid) for pid in light_server.worker_pids()} | {str(light_server.process.pid), "archive"}
    assert {name.rsplit("_", 1)[1].removesuffix(".db") for name in files} <= live, files
    assert len(files) <= 4 * 3 + 2, files  # counter, histogram, 2 gauge modes per live process + 2 archives
