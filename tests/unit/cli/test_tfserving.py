"""`python -m server tfserving`: tensorflow_model_server's flags as forkserve's settings, and what it refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from server.cli import tfserving
from server.cli.tfserving import FlagError, environment, parse_flags
from server.settings import Settings
from tests.support.harness import ROOT

MODEL_CONFIG = 'model_config_list { config { name: "half" base_path: "/models/half" model_platform: "tensorflow" } }'


def env_for(*argv: str, given: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    return environment(parse_flags(list(argv)), dict(given or {}))


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The Settings the server would resolve from this environment (the master's own reading)."""
    for name in [n for n in list(__import__("os").environ) if n.startswith("FORKSERVE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings.from_env()


def test_the_image_entrypoints_command_line_becomes_forkserves_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    env, notes = env_for("--port=8500", "--rest_api_port=8501", "--model_name=half", "--model_base_path=/models/half",
                         "--rest_api_timeout_in_ms=5000", "--tensorflow_intra_op_parallelism=2",
                         "--grpc_channel_arguments=grpc.max_connection_age_ms=2000,grpc.max_receive_message_length=1000")
    settings = settings_from(env, monkeypatch)
    assert (settings.bind, settings.grpc_bind, settings.models_dir, settings.tfserving_model) == (
        "0.0.0.0:8501", "0.0.0.0:8500", None, ("half", "/models/half"))
    assert settings.tfserving_defaults == {"request_timeout_s": 5.0}
    assert (settings.intra_op_threads, settings.grpc_max_connection_age, settings.max_body_bytes) == (2, 2.0, 1000)
    assert settings.poll_interval == 1.0  # --file_system_poll_wait_seconds's default
    assert notes == ["the standard gRPC health service (grpc.health.v1.Health) is always on in forkserve"]


def test_a_model_config_file_is_checked_and_wins_over_model_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "models.config"
    config.write_text(MODEL_CONFIG)
    batching = tmp_path / "batching.txt"
    batching.write_text("max_batch_size { value: 8 } batch_timeout_micros { value: 1000 } num_batch_threads { value: 4 }")
    monitoring = tmp_path / "monitoring.txt"
    monitoring.write_text("prometheus_config { enable: true }")
    env, notes = env_for(f"--model_config_file={config}", "--model_config_file_poll_wait_seconds=30",
                         "--model_base_path=/ignored", "--enable_batching", f"--batching_parameters_file={batching}",
                         f"--monitoring_config_file={monitoring}", "--allow_version_labels_for_unavailable_models=true",
                         "--enable_model_warmup=false", "--num_load_threads=4")
    settings = settings_from(env, monkeypatch)
    assert (settings.tfserving_model_config, settings.tfserving_model, settings.tfserving_model_config_poll) == (config, None, 30.0)
    assert settings.tfserving_defaults == {"max_batch_size": 8, "max_batch_delay_ms": 1.0}  # models.toml's timeout stays
    assert env["FORKSERVE_TFSERVING_METRICS_PATH"] == "/monitoring/prometheus/metrics"
    assert settings.tfserving_labels_for_unavailable and not settings.warmup_records
    assert any("--model_name and --model_base_path are ignored" in note for note in notes)
    assert any(note.startswith(f"{batching}: num_batch_threads has no equivalent") for note in notes)
    assert any(note.startswith("--num_load_threads has no effect") for note in notes)


def test_batching_parameters_without_enable_batching_are_noted_not_applied(tmp_path: Path) -> None:
    batching = tmp_path / "batching.txt"
    batching.write_text("max_batch_size { value: 8 }")
    env, notes = env_for("--model_base_path=/m/x", f"--batching_parameters_file={batching}")
    assert json.loads(env["FORKSERVE_TFSERVING_DEFAULTS"]) == {}
    assert any("has no effect without --enable_batching" in note for note in notes)


def test_the_last_of_a_repeated_flag_wins_and_poll_once_keeps_the_versions_found(monkeypatch: pytest.MonkeyPatch) -> None:
    env, _ = env_for("--model_base_path=/m/a", "--port=9000", "--port=9001", "--file_system_poll_wait_seconds=0",
                     given={"FORKSERVE_TFSERVING_METRICS_PATH": "/stale"})
    settings = settings_from(env, monkeypatch)
    assert settings.grpc_bind == "0.0.0.0:9001" and not settings.new_versions and settings.poll_interval == 2.0
    assert settings.tfserving_metrics_path == ""  # only the monitoring file turns TF Serving's path on


def test_rest_port_zero_keeps_the_rest_api_on_loopback_only() -> None:
    env, notes = env_for("--model_base_path=/m/x", "--port=9000")
    host, port = env["FORKSERVE_BIND"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0 and env["FORKSERVE_GRPC_BIND"] == "0.0.0.0:9000"
    assert any("--rest_api_port=0" in note for note in notes)
    assert env_for("--model_base_path=/m/x", "--port=0", "--rest_api_port=8501")[0]["FORKSERVE_GRPC_BIND"] == ""


def test_an_existing_models_toml_is_kept_else_none_is_read() -> None:
    assert env_for("--model_base_path=/m/x")[0]["FORKSERVE_CONF"] == "/dev/null"
    assert env_for("--model_base_path=/m/x", given={"FORKSERVE_CONF": "/etc/m.toml"})[0]["FORKSERVE_CONF"] == "/etc/m.toml"


@pytest.mark.parametrize("argv, message", [
    (["--bogus=1"], "unknown flag --bogus"),
    (["model"], "unknown argument: model"),
    (["--port", "8500"], "--port needs a value"),
    (["--port=http"], "--port takes an integer, got 'http'"),
    (["--enable_batching=maybe"], "--enable_batching takes true or false"),
    ([], "Both server_options.model_base_path and server_options.model_config_file are empty!"),
    (["--model_base_path=/m", "--port=8500", "--rest_api_port=8500"], "--port and --rest_api_port must be different"),
    (["--model_base_path=/m", "--ssl_config_file=/s"], "--ssl_config_file is not taken by forkserve: set FORKSERVE_TLS_CERT"),
    (["--model_base_path=/m", "--grpc_socket_path=/s"], "--grpc_socket_path is not taken by forkserve"),
    (["--model_base_path=/m", "--platform_config_file=/p"], "--platform_config_file is not taken"),
    (["--model_base_path=/m", "--saved_model_tags=serve,gpu"], "--saved_model_tags=serve,gpu is not taken"),
    (["--model_base_path=/m", "--enable_signature_method_name_check"], "--enable_signature_method_name_check is not taken"),
    (["--model_base_path=/m", "--grpc_channel_arguments=grpc.keepalive_time_ms=1"], "'grpc.keepalive_time_ms=1' is not taken"),
    (["--model_base_path=/m", "--file_system_poll_wait_seconds=-1"], "must not be negative"),
    (["--model_config_file=/nonexistent/models.config"], "--model_config_file=/nonexistent/models.config: cannot read it"),
    (["--model_base_path=models/half"], "Expected model default to have an absolute path or URI; got base_path()=models/half"),
    (["--model_base_path=/m", "--rest_api_timeout_in_ms=0"], "--rest_api_timeout_in_ms must be positive"),
])
def test_what_cannot_be_honoured_stops_with_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError) as refused:
        environment(parse_flags(argv), {})
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_malformed_config_file_stops_the_start_with_the_parsers_line_and_column(tmp_path: Path) -> None:
    config = tmp_path / "models.config"
    config.write_text('model_config_list {\n  config {\n    name: "a"\n    base_pth: "/m/a"\n  }\n}\n')
    result = subprocess.run([sys.executable, "-m", "server", "tfserving", f"--model_config_file={config}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"tensorflow_model_server (forkserve): {config}:4:5 : Message type "
                             '"tensorflow.serving.ModelConfig" has no field named "base_pth".\n')


def test_version_and_help_answer_without_starting() -> None:
    for argv, expected in ((["--version"], "TensorFlow ModelServer: forkserve"), (["--help"], "--model_config_file")):
        result = subprocess.run([sys.executable, "-m", "server", "tfserving", *argv], cwd=ROOT, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0 and expected in result.stdout
    assert "TensorFlow Library: 2." in tfserving.version()
