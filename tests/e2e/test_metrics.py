"""Prometheus metrics in multiprocess mode, against a real gunicorn, promtool and Prometheus."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest
import requests

from tests.support.harness import ROOT, Server, wait_until
from tests.support.metrics import prometheus_scraping, quiet_samples, require_tool, samples, settled_samples, value
from tests.support.models import copy_models

CONF_DIR = ROOT / "conf"


@pytest.fixture(scope="module")
def metrics_server(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A 2-worker server of its own (these tests kill workers and count exactly)."""
    repo = copy_models(model_repo, tmp_path_factory.mktemp("metrics-models"), "half_plus_two", "mlp", "corrupt")
    instance = Server(models_dir=repo, run_dir=tmp_path_factory.mktemp("metrics-run"), workers=2).start()
    yield instance
    instance.stop()


def test_scrape_passes_promtool_lint(metrics_server: Server) -> None:
    promtool = require_tool("promtool")
    metrics_server.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]})
    scrape = metrics_server.get("/metrics")
    assert scrape.headers["Content-Type"].startswith("text/plain; version=")
    lint = subprocess.run([promtool, "check", "metrics"], input=scrape.content, capture_output=True, timeout=30)
    assert lint.returncode == 0 and lint.stdout == b"" and lint.stderr == b"", lint


def test_counts_from_both_workers_sum_exactly(metrics_server: Server) -> None:
    before = quiet_samples(metrics_server)
    sent = 200

    def send(_: int) -> int:
        return requests.post(
            f"{metrics_server.url}/v1/models/half_plus_two:predict",
            json={"instances": [1.0, 2.0]},
            headers={"Connection": "close"},
            timeout=30,
        ).status_code

    with ThreadPoolExecutor(16) as pool:
        assert set(pool.map(send, range(sent))) == {200}
    labels = {"model": "half_plus_two", "version": "123", "api": "tfserving_predict", "code": "200", "protocol": "rest"}

    def counted(scrape: dict) -> float:
        return value(scrape, "forkserve_requests_total", **labels) - value(before, "forkserve_requests_total", **labels)

    after = settled_samples(metrics_server, lambda scrape: counted(scrape) >= sent, f"{sent} requests counted")
    assert counted(after) == sent
    rows = value(after, "forkserve_batch_size_rows_sum", model="half_plus_two") - value(
        before, "forkserve_batch_size_rows_sum", model="half_plus_two"
    )
    assert rows == 2 * sent
    # Both workers answered some of them: each has its own counter file with a share.
    per_worker = _per_process_counts(metrics_server, "forkserve_requests_total", labels)
    assert len([count for count in per_worker.values() if count > 0]) == 2, per_worker


def _per_process_counts(server: Server, name: str, labels: dict[str, str]) -> dict[int, float]:
    """What each live worker's own counter file holds for one series."""
    from prometheus_client.mmap_dict import MmapedDict

    counts = {}
    for pid in server.worker_pids():
        path = server.run_dir / "metrics" / f"counter_{pid}.db"
        total = 0.0
        for key, val, _, _ in MmapedDict.read_all_values_from_file(str(path)):
            sample, sample_name, sample_labels, _ = json.loads(key)
            if sample_name == name and sample_labels == labels:
                total += val
        counts[pid] = total
    return counts


def test_requests_refused_at_url_validation_are_counted(metrics_server: Server) -> None:
    before = quiet_samples(metrics_server)
    refused = [
        metrics_server.post("/v1/models/bad%20name:predict", json={"instances": [1.0]}),
        metrics_server.post("/v1/models/mlp/versions/abc:predict", json={"instances": [[0.5] * 20]}),
        metrics_server.post("/v1/models/mlp:explode", json={"instances": [[0.5] * 20]}),
    ]
    assert [r.status_code for r in refused] == [400, 400, 404]
    expected = {
        ("tfserving_predict", "400"): 2,
        ("tfserving_other", "404"): 1,
    }

    def counted(scrape: dict) -> dict:
        return {key: value(scrape, "forkserve_requests_total", model="_unknown", version="", api=key[0], code=key[1], protocol="rest")
                - value(before, "forkserve_requests_total", model="_unknown", version="", api=key[0], code=key[1], protocol="rest")
                for key in expected}

    after = settled_samples(metrics_server, lambda scrape: counted(scrape) == expected, "refused requests counted")
    assert counted(after) == expected


def test_live_gauges_count_the_workers_and_their_models(metrics_server: Server) -> None:
    scrape = samples(metrics_server)
    assert value(scrape, "forkserve_workers_alive") == 2
    assert value(scrape, "forkserve_model_workers_ready", model="half_plus_two", version="123") == 2
    assert value(scrape, "forkserve_model_workers_ready", model="corrupt", version="1") == 0
    assert value(scrape, "forkserve_model_load_failures_total", model="corrupt", version="1") == 2
    assert value(scrape, "forkserve_model_workers_loading", model="mlp", version="1") == 0
    assert value(scrape, "forkserve_model_load_duration_seconds_count", model="mlp") == 2


def test_retraces_stay_zero_after_mixed_batch_sizes(metrics_server: Server) -> None:
    sizes = [1, 3, 7, 16, 33, 64, 65, 100, 2, 1, 50, 9] * 4

    def send(rows: int) -> int:
        body = {"instances": [[0.1] * 20] * rows}
        return requests.post(f"{metrics_server.url}/v1/models/mlp:predict", json=body, timeout=30).status_code

    with ThreadPoolExecutor(12) as pool:
        assert set(pool.map(send, sizes)) == {200}
    scrape = settled_samples(
        metrics_server,
        lambda scrape: value(scrape, "forkserve_request_stage_duration_seconds_count", model="mlp", stage="encode", protocol="rest") >= len(sizes),
        "the requests' stage times",
    )
    assert ("forkserve_model_retraces_total", frozenset({("model", "mlp")})) in scrape
    assert value(scrape, "forkserve_model_retraces_total", model="mlp") == 0
    assert value(scrape, "forkserve_batch_size_rows_sum", model="mlp") >= sum(sizes)
    # 65 and 100 rows are over max_batch_size (64): split into calls of at most 64 rows.
    assert value(scrape, "forkserve_batch_size_rows_bucket", model="mlp", le="64.0") == value(
        scrape, "forkserve_batch_size_rows_count", model="mlp"
    )
    for stage in ("decode", "queue", "compute", "encode"):
        assert value(scrape, "forkserve_request_stage_duration_seconds_count", model="mlp", stage=stage, protocol="rest") >= len(sizes)


def test_error_is_logged_once_with_the_request_id_returned_to_the_client(metrics_server: Server) -> None:
    response = metrics_server.post(
        "/v1/models/corrupt:predict", json={"instances": [[1.0]]}, headers={"X-Request-Id": "trace-4242"}
    )
    assert response.status_code == 503
    assert response.headers["X-Request-Id"] == "trace-4242"
    wait_until(lambda: "rid=trace-4242" in metrics_server.log(), 10, "the access log line")
    log = metrics_server.log()
    assert log.count("request trace-4242 failed with 503") == 1
    assert len([line for line in log.splitlines() if "rid=trace-4242" in line]) == 1


def test_model_loads_are_logged_with_their_duration(metrics_server: Server) -> None:
    lines = re.findall(r"model half_plus_two version 123 \(savedmodel\) loaded and warmed \(\d+ calls\) in [\d.]+s", metrics_server.log())
    assert len(lines) >= 2


def test_sigkilled_worker_leaves_the_live_gauges_and_counters_do_not_go_back(metrics_server: Server) -> None:
    before = samples(metrics_server)
    victim = metrics_server.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    metrics_server.wait_reaped(victim)

    def stable_scrape() -> tuple[list[int], dict] | None:
        """A scrape taken while the set of booted workers did not change."""
        booted = metrics_server.worker_pids()
        scrape = samples(metrics_server)
        return (booted, scrape) if metrics_server.worker_pids() == booted else None

    booted, during = wait_until(stable_scrape, 30, "a scrape with a stable set of workers")
    assert value(during, "forkserve_workers_alive") == len(booted)
    assert value(during, "forkserve_model_workers_ready", model="half_plus_two", version="123") == len(booted)
    metrics_server.wait_workers_loaded(2)
    after = samples(metrics_server)
    assert value(after, "forkserve_workers_alive") == 2
    assert value(after, "forkserve_worker_exits_total", reason="killed") == value(
        before, "forkserve_worker_exits_total", reason="killed"
    ) + 1
    for (name, labels), old in before.items():
        if name.endswith("_total") or name.endswith("_count") or name.endswith("_bucket"):
            assert after.get((name, labels), 0.0) >= old, (name, dict(labels))
    files = sorted(p.name for p in (metrics_server.run_dir / "metrics").glob("*.db"))
    assert not [f for f in files if f.endswith(f"_{victim}.db")], files


def test_prometheus_sees_exactly_the_requests_sent(tmp_path: Path, metrics_server: Server) -> None:
    query = 'sum(forkserve_requests_total{model="half_plus_two", api="tfserving_regress"}) or vector(0)'
    with prometheus_scraping(tmp_path, metrics_server) as prometheus:
        sent = 23
        body = {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}]}
        for _ in range(sent):
            assert metrics_server.post("/v1/models/half_plus_two:regress", json=body).status_code == 200
        assert wait_until(lambda: prometheus(query) == sent, 30, f"Prometheus to report {sent} requests")


def test_dashboard_queries_use_only_metrics_that_exist(metrics_server: Server) -> None:
    dashboard = json.loads((CONF_DIR / "grafana-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = set(re.findall(r"\b(forkserve_[a-z_]+)", " ".join(exprs)))
    metrics_server.post("/v1/models/half_plus_two:predict", json={"instances": [1.0]})
    exposed = {name for name, _ in samples(metrics_server)}
    assert used and used <= exposed, used - exposed
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("request rate", "error", "p50", "p99", "stage", "batch size", "queue", "ready", "load failures"):
        assert topic in titles, topic


def test_shipped_prometheus_config_and_alert_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        result = subprocess.run([promtool, *args], cwd=CONF_DIR, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    rules = (CONF_DIR / "alerts.yml").read_text()
    for alert in ("ModelNotReady", "ModelLoadFailures", "HighErrorRatio", "HighLatencyP99", "Retraces", "WorkerRestarts"):
        assert f"alert: Forkserve{alert}" in rules
