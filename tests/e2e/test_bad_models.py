"""A model that fails to load is reported and never served; every other model keeps serving."""

from __future__ import annotations

from tests.support.harness import Server


def test_corrupt_model_is_reported_with_its_error(server: Server) -> None:
    status = server.get("/v1/models/corrupt").json()["model_version_status"]
    assert len(status) == 1
    assert status[0]["version"] == "1"
    assert status[0]["state"] == "END"
    assert status[0]["status"]["error_code"] == "UNKNOWN"
    assert "failed to load" in status[0]["status"]["error_message"]
    response = server.post("/v1/models/corrupt:predict", json={"instances": [[1.0]]})
    assert response.status_code == 503
    assert "no version that loaded" in response.json()["error"]


def test_lambda_layer_is_refused_by_safe_mode(server: Server) -> None:
    status = server.get("/v1/models/lambda_h5").json()["model_version_status"][0]
    assert status["state"] == "END"
    assert "Lambda" in status["status"]["error_message"]
    assert server.post("/v1/models/lambda_h5:predict", json={"instances": [[[[0.0]]]]}).status_code == 503


def test_config_naming_an_arbitrary_function_is_refused(server: Server) -> None:
    status = server.get("/v1/models/evil_fn").json()["model_version_status"][0]
    assert status["state"] == "END" and "could not be deserialized" in status["status"]["error_message"]
    assert server.post("/v1/models/evil_fn:predict", json={"instances": [[[[0.0]] * 8] * 8]}).status_code == 503


def test_broken_latest_version_falls_back_to_the_previous_one(server: Server) -> None:
    statuses = {s["version"]: s for s in server.get("/v1/models/fallback").json()["model_version_status"]}
    assert statuses["2"]["state"] == "END"
    assert statuses["1"]["state"] == "AVAILABLE"
    response = server.post("/v1/models/fallback:predict", json={"instances": [[0.1] * 20]})
    assert response.status_code == 200
    assert response.headers["X-Model-Version"] == "1"
    explicit = server.post("/v1/models/fallback/versions/2:predict", json={"instances": [[0.1] * 20]})
    assert explicit.status_code == 503
    assert "END" in explicit.json()["error"]
    # A truncated .keras is named for what it is, not Keras's "File not found".
    assert "not a valid .keras file" in statuses["2"]["status"]["error_message"]
    assert "File not found" not in statuses["2"]["status"]["error_message"]


def test_readyz_names_the_failed_models_and_liveness_stays_ok(server: Server) -> None:
    ready = server.get("/readyz")  # the models that serve keep the worker ready (strict readiness aside)
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    models = ready.json()["models"]
    assert models["corrupt"]["serving"] == []
    assert "1" in models["corrupt"]["failed"]
    assert models["mlp"]["serving"] == [1]
    assert models["fallback"]["serving"] == [1] and "2" in models["fallback"]["failed"]
    assert server.get("/healthz").json() == {"status": "alive"}


def test_hidden_and_non_numeric_directories_are_ignored(server: Server) -> None:
    assert server.get("/v1/models/.staging").status_code == 400  # not a model name at all
    assert "mlp" in server.get("/readyz").json()["models"] and ".staging" not in server.get("/readyz").json()["models"]
    assert [s["version"] for s in server.get("/v1/models/mlp").json()["model_version_status"]] == ["1"]


def test_failures_are_logged_once_per_worker_and_the_master_keeps_running(server: Server) -> None:
    log = server.log()
    assert log.count("model corrupt version 1 failed to load") == 2
    assert server.process is not None and server.process.poll() is None
