"""scripts/docker-entrypoint, the image's ENTRYPOINT: what it execs in each case, run with fakes of the commands it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.entrypoint import fake_commands, run_entrypoint as run

TF_SERVING_DEFAULTS = ["tensorflow_model_server", "--port=8500", "--rest_api_port=8501"]


@pytest.fixture
def fakes(tmp_path: Path) -> Path:
    return fake_commands(tmp_path)


def test_model_name_alone_serves_it_from_models_as_tf_serving_s_image_does(fakes: Path) -> None:
    _, argv, _ = run(fakes, MODEL_NAME="half_plus_two")
    assert argv == [*TF_SERVING_DEFAULTS, "--model_name=half_plus_two", "--model_base_path=/models/half_plus_two"]


def test_model_base_path_alone_serves_model_under_it(fakes: Path) -> None:
    _, argv, _ = run(fakes, MODEL_BASE_PATH="/mnt/models")
    assert argv == [*TF_SERVING_DEFAULTS, "--model_name=model", "--model_base_path=/mnt/models/model"]


def test_both_together(fakes: Path) -> None:
    _, argv, _ = run(fakes, MODEL_NAME="resnet", MODEL_BASE_PATH="/srv/models")
    assert argv == [*TF_SERVING_DEFAULTS, "--model_name=resnet", "--model_base_path=/srv/models/resnet"]


def test_flags_as_arguments_are_appended_to_tf_serving_s_defaults(fakes: Path) -> None:
    _, argv, _ = run(fakes, "--model_config_file=/etc/tfserving/models.config", "--rest_api_timeout_in_ms=60000")
    assert argv == [*TF_SERVING_DEFAULTS, "--model_name=model", "--model_base_path=/models/model",
                    "--model_config_file=/etc/tfserving/models.config", "--rest_api_timeout_in_ms=60000"]


def test_flags_and_model_name_together(fakes: Path) -> None:
    _, argv, _ = run(fakes, "--enable_batching", "--port=9000", MODEL_NAME="half_plus_two")
    assert argv == [*TF_SERVING_DEFAULTS, "--model_name=half_plus_two", "--model_base_path=/models/half_plus_two",
                    "--enable_batching", "--port=9000"]


@pytest.mark.parametrize("env", [{}, {"MODEL_NAME": "half_plus_two"}])
def test_a_command_as_arguments_runs_as_given(fakes: Path, env: dict[str, str]) -> None:
    models, argv, _ = run(fakes, "python3", "-m", "server", "publish", "digits", "/tmp/model.keras", "--models", "/models", **env)
    assert argv == ["python3", "-m", "server", "publish", "digits", "/tmp/model.keras", "--models", "/models"]
    assert models == "(unset)"
    _, argv, _ = run(fakes, "gunicorn", "-c", "gunicorn.conf.py", "-w", "4", **env)
    assert argv == ["gunicorn", "-c", "gunicorn.conf.py", "-w", "4"]


def test_nothing_serves_a_repository_that_holds_models_natively(fakes: Path, tmp_path: Path) -> None:
    repository = tmp_path / "models"
    (repository / "digits" / "1").mkdir(parents=True)
    models, argv, err = run(fakes, FORKSERVE_MODELS=str(repository), FORKSERVE_DEMO_MODELS=str(tmp_path / "demo"))
    assert argv == ["gunicorn", "-c", "gunicorn.conf.py"] and models == str(repository)
    assert f"serving the model repository in {repository}" in err


@pytest.mark.parametrize("state", ["empty", "missing"])
def test_nothing_serves_the_demo_when_the_repository_is_empty_and_nothing_is_mounted(fakes: Path, tmp_path: Path, state: str) -> None:
    repository = tmp_path / "models"
    if state == "empty":
        repository.mkdir()
    models, argv, err = run(fakes, FORKSERVE_MODELS=str(repository), FORKSERVE_DEMO_MODELS="/opt/forkserve/demo-models")
    assert argv == ["gunicorn", "-c", "gunicorn.conf.py"] and models == "/opt/forkserve/demo-models"
    assert f"{repository} is empty: serving the demo models in /opt/forkserve/demo-models" in err

