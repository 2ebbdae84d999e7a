"""TF Serving's text-proto files (model config, batching parameters, monitoring config) read as forkserve settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from server.config import ConfigError, ServerConfig, parse_config, with_model_server_config
from server.protocols.tfserving import config_files

ROOT = Path(__file__).resolve().parents[4]
PROTO = "server/protocols/tfserving/protos/config.proto"


def tables(text: str) -> dict:
    return config_files.model_tables(config_files.model_server_config(text, "models.config"), "models.config")


def one_model(body: str, name: str = "half") -> str:
    return f'model_config_list {{ config {{ name: "{name}" base_path: "/m/{name}" model_platform: "tensorflow" {body} }} }}'


def test_the_committed_module_is_generated_from_the_proto(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", ".", f"--python_out={tmp_path}", PROTO],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    generated = PROTO.replace(".proto", "_pb2.py")
    assert (tmp_path / generated).read_bytes() == (ROOT / generated).read_bytes(), "stale: run `make protos`"


def test_each_version_policy_and_labels_become_the_models_table() -> None:
    text = """
    model_config_list {
      config { name: 'a' base_path: '/models/a' model_platform: 'tensorflow'
               model_version_policy { specific { versions: 2 versions: 1 versions: 2 } }
               version_labels { key: 'stable' value: 1 } version_labels { key: 'canary' value: 2 } }
      config { name: 'b' base_path: '/models/b' model_platform: 'tensorflow' model_version_policy { latest { num_versions: 3 } } }
      config { name: 'c' base_path: '/models/c' model_platform: 'tensorflow' model_version_policy { all {} } }
      config { name: 'd' base_path: '/models/d' model_type: TENSORFLOW }
    }"""
    assert tables(text) == {
        "a": {"base_path": "/models/a", "version_policy": "specific", "versions": [1, 2], "labels": {"canary": 2, "stable": 1}},
        "b": {"base_path": "/models/b", "version_policy": "latest", "latest": 3, "labels": {}},
        "c": {"base_path": "/models/c", "version_policy": "all", "labels": {}},
        "d": {"base_path": "/models/d", "version_policy": "latest", "latest": 1, "labels": {}},  # TF Serving's default
    }


def test_the_tables_apply_over_models_toml_which_keeps_its_other_settings() -> None:
    toml = parse_config({"defaults": {"max_batch_size": 16}, "models": {"a": {"latest": 2, "request_timeout_s": 5}}})
    composed = with_model_server_config(toml, {"max_batch_delay_ms": 2.0}, tables(one_model("", "a")))
    model = composed.for_model("a")
    assert (model.base_path, model.latest, model.request_timeout_s, model.max_batch_size, model.max_batch_delay_ms) == (
        "/m/a", 1, 5, 16, 2.0)  # TF Serving's policy wins; models.toml's own settings stay
    assert with_model_server_config(ServerConfig(), {}, {}).models == {}


@pytest.mark.parametrize("text, message", [
    ('model_config_list { config { name: "a" base_path: "/m/a" model_platform: "tensorflow" bogus: 1 } }',
     'models.config:1:87 : Message type "tensorflow.serving.ModelConfig" has no field named "bogus".'),  # at bogus
    ('model_config_list { config { name: "a" base_path: "/a" model_platform: "tensorflow" } '
     'config { name: "a" base_path: "/b" model_platform: "tensorflow" } }',
     "Illegal to list model a multiple times in config list"),
    ('model_config_list { config { name: "a" base_path: "models/a" model_platform: "tensorflow" } }',
     "Expected model a to have an absolute path or URI; got base_path()=models/a"),
    ('model_config_list { config { name: "a" base_path: "/m/a" } }',
     "Illegal setting neither ModelServerConfig::model_type (deprecated) nor ModelServerConfig::model_platform, model name is a"),
    ('model_config_list { config { name: "a" base_path: "/m/a" model_type: TENSORFLOW model_platform: "tensorflow" } }',
     "Illegal setting both ModelServerConfig::model_type (deprecated) and ModelServerConfig::model_platform"),
    ('model_config_list { config { name: "a" base_path: "gs://bucket/a" model_platform: "tensorflow" } }',
     "is a URI; forkserve reads local directories: mount the bucket"),
    ('model_config_list { config { name: "a" base_path: "/m/a" model_platform: "tflite" } }',
     "model_platform 'tflite' is not served by forkserve"),
    ('model_config_list { config { name: "a/b" base_path: "/m/a" model_platform: "tensorflow" } }',
     "forkserve's model names have letters, digits"),
    ('model_config_list { config { name: "a" base_path: "/m/a" model_platform: "tensorflow" logging_config { } } }',
     "logging_config is not supported: forkserve logs requests with FORKSERVE_PAYLOAD_LOG"),
    ('custom_model_config { }', "custom_model_config is not supported"),
])
def test_what_tf_serving_refuses_is_refused_with_its_message(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        tables(text)
    assert message in str(refused.value)


def test_a_file_that_is_not_utf8_is_named() -> None:
    with pytest.raises(ConfigError, match="models.config: not UTF-8"):
        config_files.model_server_config(b"\xff\xfe", "models.config")


def test_the_single_model_config_is_tf_servings_and_reads_back() -> None:
    text = config_files.single_model_config("half", "/models/half")
    assert tables(text) == {"half": {"base_path": "/models/half", "version_policy": "latest", "latest": 1, "labels": {}}}


def test_batching_parameters_map_to_the_defaults_and_name_what_has_no_equivalent() -> None:
    text = """
    max_batch_size { value: 32 }
    batch_timeout_micros { value: 2500 }
    max_enqueued_batches { value: 100 }
    num_batch_threads { value: 8 }
    allowed_batch_sizes: 8
    allowed_batch_sizes: 32
    pad_variable_length_inputs: true
    """
    table, notes = config_files.batching_defaults(text, "batching.txt")
    assert table == {"max_batch_size": 32, "max_batch_delay_ms": 2.5, "allowed_batch_sizes": [8, 32], "max_queue_rows": 3200}
    assert parse_config({"defaults": table}).defaults.max_batch_size == 32  # valid as forkserve settings
    assert [note.split(" has no")[0] for note in notes] == ["batching.txt: num_batch_threads",
                                                            "batching.txt: pad_variable_length_inputs"]
    assert config_files.batching_defaults("", "empty.txt") == ({}, [])
    with pytest.raises(ConfigError, match=r"batching.txt:1:1 : .*max_batch_sizes"):
        config_files.batching_defaults("max_batch_sizes { value: 1 }", "batching.txt")


def test_the_monitoring_config_gives_the_prometheus_path() -> None:
    assert config_files.prometheus_path('prometheus_config { enable: true path: "/m/p" }', "m") == "/m/p"
    assert config_files.prometheus_path("prometheus_config { enable: true }", "m") == "/monitoring/prometheus/metrics"
    assert config_files.prometheus_path('prometheus_config { path: "/m/p" }', "m") == ""
    assert config_files.prometheus_path("", "m") == ""
