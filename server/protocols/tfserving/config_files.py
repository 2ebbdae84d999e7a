"""TensorFlow Serving's text-proto files as forkserve settings: ModelServerConfig, BatchingParameters, MonitoringConfig.

Read with the protobuf definitions (protobuf only: the master and the CLI use this module, and
neither may import TensorFlow). A ModelServerConfig becomes models.toml tables, one per model:
its base_path, version policy and labels; the batching parameters become [defaults] settings.
Every refusal is a ConfigError with TF Serving's message where it has one (the parser's
line:column for a malformed file).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from google.protobuf.message import Message

from server.config import ConfigError
from server.repository import is_model_name

PROMETHEUS_PATH = "/monitoring/prometheus/metrics"  # TF Serving's PrometheusExporter::kPrometheusPath
URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def parse_text(message: Message, raw: bytes | str, path: Path | str) -> Message:
    """Fill `message` from text-proto bytes; a malformed file is a ConfigError with the parser's line:column."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        text_format.Parse(text, message)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except text_format.ParseError as exc:
        raise ConfigError(f"{path}:{exc}") from None
    return message


def model_server_config(raw: bytes | str, path: Path | str) -> Any:
    """A ModelServerConfig message from its text form."""
    from tensorflow_serving.config import model_server_config_pb2  # protobuf only, no TensorFlow

    return parse_text(model_server_config_pb2.ModelServerConfig(), raw, path)


def single_model_config(name: str, base_path: str) -> str:
    """The ModelServerConfig TF Serving builds from --model_name and --model_base_path (its BuildSingleModelConfig)."""
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    model = config.model_config_list.config.add()
    model.name, model.base_path, model.model_platform = name, base_path, "tensorflow"
    return text_format.MessageToString(config)


def model_tables(config: Any, where: str) -> dict[str, dict[str, Any]]:
    """name -> the models.toml table of each model of a ModelServerConfig, validated as TF Serving validates it."""
    kind = config.WhichOneof("config")
    if kind == "custom_model_config":
        raise ConfigError(f"{where}: custom_model_config is not supported: list the models in model_config_list")
    tables: dict[str, dict[str, Any]] = {}
    for model in config.model_config_list.config if kind else ():
        if model.name in tables:
            raise ConfigError(f"{where}: Illegal to list model {model.name} multiple times in config list")
        tables[model.name] = _model_table(model, where)
    return tables


def _model_table(model: Any, where: str) -> dict[str, Any]:
    """One ModelConfig as a models.toml table (base_path, version policy, labels)."""
    name = model.name
    if not is_model_name(name):
        raise ConfigError(f"{where}: model name {name!r}: forkserve's model names have letters, digits, '_', '.' "
                          "and '-' (they are URL path segments) and are not all digits", name)
    _check_platform(model, where)
    if URI_RE.match(model.base_path):
        raise ConfigError(f"{where}: model {name}: base_path {model.base_path!r} is a URI; forkserve reads local "
                          "directories: mount the bucket (gcsfuse, s3fs, a CSI volume) and give its path", name)
    if not model.base_path.startswith("/"):
        raise ConfigError(f"{where}: Expected model {name} to have an absolute path or URI; "
                          f"got base_path()={model.base_path}", name)
    if not policy_versions_positive(model):
        raise ConfigError(f"{where}: model {name}: versions and version labels must name versions >= 1", name)
    if model.HasField("logging_config"):
        raise ConfigError(f"{where}: model {name}: logging_config is not supported: forkserve logs requests with "
                          "FORKSERVE_PAYLOAD_LOG (docs/observability.md)", name)
    table: dict[str, Any] = {"base_path": model.base_path}
    policy = model.model_version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        table["version_policy"] = "all"
    elif choice == "specific":
        if not policy.specific.versions:
            raise ConfigError(f"{where}: model {name}: the specific version policy lists no version", name)
        table["version_policy"], table["versions"] = "specific", sorted(set(int(v) for v in policy.specific.versions))
    else:  # latest, and TF Serving's default: the newest version
        table["version_policy"], table["latest"] = "latest", max(1, int(policy.latest.num_versions)) if choice else 1
    # NOTE: always set, empty too: TF Serving's file decides the labels, never models.toml's table under it
    table["labels"] = {label: int(version) for label, version in sorted(model.version_labels.items())}
    return table


def policy_versions_positive(model: Any) -> bool:
    """The specific policy's versions and the labels' versions are all >= 1 (forkserve's version directories)."""
    versions = list(model.model_version_policy.specific.versions) + list(model.version_labels.values())
    return all(version >= 1 for version in versions)


def _check_platform(model: Any, where: str) -> None:
    """TF Serving's GetPlatform: model_platform (or the deprecated model_type) must say TensorFlow."""
    if model.model_type:  # ModelType.MODEL_TYPE_UNSPECIFIED is 0
        if model.model_platform:
            raise ConfigError(f"{where}: Illegal setting both ModelServerConfig::model_type (deprecated) and "
                              f"ModelServerConfig::model_platform, model name is {model.name}", model.name)
        if model.model_type != 1:  # ModelType.TENSORFLOW
            raise ConfigError(f"{where}: ModelServerConfig::model_type choice {model.model_type} not supported.", model.name)
        return
    if not model.model_platform:
        raise ConfigError(f"{where}: Illegal setting neither ModelServerConfig::model_type (deprecated) nor "
                          f"ModelServerConfig::model_platform, model name is {model.name}", model.name)
    if model.model_platform != "tensorflow":
        raise ConfigError(f"{where}: model {model.name}: model_platform {model.model_platform!r} is not served by "
                          "forkserve, which serves TensorFlow and Keras models (model_platform: \"tensorflow\")", model.name)


def batching_defaults(raw: bytes | str, path: Path | str) -> tuple[dict[str, Any], list[str]]:
    """([defaults] settings from a BatchingParameters file, a note for each field that has no equivalent)."""
    from server.protocols.tfserving.protos import config_pb2

    params = parse_text(config_pb2.BatchingParameters(), raw, path)
    table: dict[str, Any] = {}
    if params.HasField("max_batch_size"):
        table["max_batch_size"] = int(params.max_batch_size.value)
    if params.HasField("batch_timeout_micros"):
        table["max_batch_delay_ms"] = params.batch_timeout_micros.value / 1000.0
    if params.allowed_batch_sizes:
        table["allowed_batch_sizes"] = [int(size) for size in params.allowed_batch_sizes]
    if params.HasField("max_enqueued_batches"):
        table["max_queue_rows"] = int(params.max_enqueued_batches.value) * table.get("max_batch_size", 64)
    notes = []
    unmapped = {
        "num_batch_threads": "each worker runs one executor thread per model; add workers (FORKSERVE_WORKERS) instead",
        "thread_pool_name": "forkserve has no named thread pools",
        "enable_large_batch_splitting": "a request larger than max_batch_size runs as a batch of its own",
        "max_execution_batch_size": "batches are at most max_batch_size rows",
    }
    for field, why in unmapped.items():
        if params.HasField(field):
            notes.append(f"{path}: {field} has no equivalent in forkserve ({why}); it has no effect")
    if params.pad_variable_length_inputs:
        notes.append(f"{path}: pad_variable_length_inputs has no equivalent in forkserve (rows of different "
                     "shapes never share a batch); it has no effect")
    return table, notes


def prometheus_path(raw: bytes | str, path: Path | str) -> str:
    """The path a MonitoringConfig serves Prometheus metrics at, "" when it does not enable them."""
    from server.protocols.tfserving.protos import config_pb2

    config = parse_text(config_pb2.MonitoringConfig(), raw, path)
    if not config.prometheus_config.enable:
        return ""
    return config.prometheus_config.path or PROMETHEUS_PATH
