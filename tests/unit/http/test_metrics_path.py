"""TF Serving's metrics path on the Flask app: answered only when FORKSERVE_TFSERVING_METRICS_PATH sets it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from server.config import ServerConfig
from server.http.app import create_app
from server.settings import Settings

PATH = "/monitoring/prometheus/metrics"


def client(tmp_path: Path, path: str):  # type: ignore[no-untyped-def]
    settings = dataclasses.replace(Settings.from_env(), metrics_dir=tmp_path, tfserving_metrics_path=path)
    return create_app(settings, config=ServerConfig()).test_client()


def test_off_the_path_is_an_unknown_path(tmp_path: Path) -> None:
    answer = client(tmp_path, "").get(PATH)
    assert answer.status_code == 404 and answer.is_json  # TF Serving without prometheus_config: 404 too


def test_on_the_path_carries_tf_servings_families_and_metrics_does_not(tmp_path: Path) -> None:
    app = client(tmp_path, PATH)
    answer = app.get(PATH)
    assert answer.status_code == 200 and answer.content_type.startswith("text/plain")
    assert "# TYPE :tensorflow:serving:request_count counter" in answer.text
    assert ":tensorflow:" not in app.get("/metrics").text
    assert app.post(PATH).status_code == 405


def test_a_broken_metrics_directory_is_a_503_there_too(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    answer = client(tmp_path / "file", PATH).get(PATH)
    assert answer.status_code == 503 and "metrics unavailable" in answer.json["error"]
