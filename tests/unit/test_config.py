"""conf/models.toml parsing: defaults, per-model overrides and refusal of bad settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from server.config import (
    ConfigError,
    ModelConfig,
    ServerConfig,
    as_table,
    load_config,
    parse_config,
)


def write_toml(tmp_path: Path, text: str) -> Path:
    """Write `text` as models.toml under tmp_path and return its path."""
    path = tmp_path / "models.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_missing_file_means_every_default(tmp_path: Path) -> None:
    config = load_config(tmp_path / "does-not-exist.toml")
    assert config == ServerConfig()
    assert config.for_model("anything") == ModelConfig()


def test_model_config_defaults_serve_a_plain_model() -> None:
    config = ModelConfig()
    assert config.version_policy == "latest"
    assert config.latest == 1
    assert config.versions == ()
    assert config.labels == {}
    assert config.max_batch_size == 64
    assert config.max_batch_delay_ms == 0.0
    assert config.max_queue_rows == 1024
    assert config.request_timeout_s == 30.0
    assert config.image_scale == "unit"
    assert config.image_resize == "bilinear"
    assert config.image_mode == ""
    assert config.max_image_pixels == 16_000_000
    assert config.allow_non_finite is False
    assert config.validate("[defaults]") is config


def test_empty_file_means_every_default(tmp_path: Path) -> None:
    assert load_config(write_toml(tmp_path, "")) == ServerConfig()


def test_defaults_table_applies_to_every_model(tmp_path: Path) -> None:
    config = load_config(write_toml(tmp_path, "[defaults]\nmax_batch_size = 8\nimage_scale = 'none'\n"))
    for name in ("a", "b"):
        assert config.for_model(name).max_batch_size == 8
        assert config.for_model(name).image_scale == "none"


def test_model_table_overrides_defaults_and_inherits_the_rest(tmp_path: Path) -> None:
    text = """
[defaults]
max_batch_size = 8
request_timeout_s = 5.0

[models.digits]
image_mode = "L"
max_batch_size = 4
"""
    config = load_config(write_toml(tmp_path, text))
    digits = config.for_model("digits")
    assert digits.max_batch_size == 4  # its own value
    assert digits.image_mode == "L"
    assert digits.request_timeout_s == 5.0  # inherited from [defaults], not the dataclass default
    other = config.for_model("other")
    assert other.max_batch_size == 8 and other.image_mode == ""
    assert other == config.defaults


def test_labels_and_versions_are_parsed(tmp_path: Path) -> None:
    text = """
[models.m]
version_policy = "specific"
versions = [3, 1]
labels = { stable = 1, canary = 3 }
"""
    config = load_config(write_toml(tmp_path, text)).for_model("m")
    assert config.versions == (3, 1)
    assert isinstance(config.versions, tuple)
    assert config.labels == {"stable": 1, "canary": 3}


def test_labels_as_a_subtable_are_parsed(tmp_path: Path) -> None:
    text = "[models.m.labels]\nstable = 2\n"
    assert load_config(write_toml(tmp_path, text)).for_model("m").labels == {"stable": 2}


def test_unknown_setting_raises_config_error_naming_the_table(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[models.resnet]\nmax_batch = 8\n")
    with pytest.raises(ConfigError, match=r"\[models\.resnet\].*max_batch"):
        load_config(path)


def test_unknown_setting_in_defaults_names_defaults() -> None:
    with pytest.raises(ConfigError, match=r"^\[defaults\]: unknown setting\(s\) \['colour'\]"):
        parse_config({"defaults": {"colour": "red"}})


def test_unknown_top_level_table_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown table\(s\) \['model'\]"):
        parse_config({"model": {}})


def test_toml_syntax_error_raises_config_error_naming_the_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[defaults\nmax_batch_size = 8\n")
    with pytest.raises(ConfigError, match="models.toml"):
        load_config(path)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"version_policy": "newest"}, "version_policy must be one of"),
        ({"latest": 0}, "latest must be >= 1"),
        ({"version_policy": "specific", "versions": [1, 0]}, "versions must be positive"),
        ({"version_policy": "specific"}, "'specific' needs versions"),
        ({"labels": {"stable": 0}}, "labels map names to versions"),
        ({"labels": {"stable": "1"}}, "labels must be a table of label = version"),
        ({"max_batch_size": 0}, "max_batch_size must be >= 1"),
        ({"allowed_batch_sizes": [1, 8]}, "allowed_batch_sizes must increase and end with max_batch_size"),
        ({"allowed_batch_sizes": [8, 4, 64]}, "allowed_batch_sizes must increase"),
        ({"allowed_batch_sizes": ["8"]}, "allowed_batch_sizes must be a list of integers"),
        ({"max_batch_delay_ms": -1.0}, "max_batch_delay_ms must be >= 0"),
        ({"max_batch_size": 128, "max_queue_rows": 64}, "max_queue_rows must be >= max_batch_size"),
        ({"request_timeout_s": 0}, "request_timeout_s must be > 0"),
        ({"request_timeout_s": float("nan")}, "request_timeout_s must be a finite number"),
        ({"image_scale": "percent"}, "image_scale must be one of"),
        ({"image_resize": "magic"}, "image_resize must be one of"),
        ({"image_mode": "CMYK"}, "image_mode must be one of"),
        ({"max_image_pixels": 0}, "max_image_pixels must be >= 1"),
        ({"max_batch_size": "64"}, ""),  # a string cannot be compared: still a ConfigError
    ],
)
@pytest.mark.parametrize("where", ["defaults", "model"])
def test_bad_value_raises_config_error_naming_the_table(table: dict[str, Any], message: str, where: str) -> None:
    data = {"defaults": table} if where == "defaults" else {"models": {"m": table}}
    expected_table = "[defaults]" if where == "defaults" else "[models.m]"
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    assert str(caught.value).startswith(expected_table + ": ")
    assert message in str(caught.value)


def test_model_override_is_validated_against_inherited_defaults() -> None:
    data = {"defaults": {"max_queue_rows": 100, "max_batch_size": 10}, "models": {"big": {"max_batch_size": 200}}}
    with pytest.raises(ConfigError, match=r"^\[models\.big\]: max_queue_rows must be >= max_batch_size"):
        parse_config(data)


def test_bad_defaults_are_reported_before_any_model() -> None:
    with pytest.raises(ConfigError, match=r"^\[defaults\]"):
        parse_config({"defaults": {"latest": 0}, "models": {"m": {"latest": 2}}})


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    "data",
    [
        {"defaults": {"labels": 3}},
        {"defaults": {"versions": 3}},
        {"models": {"m": 1}},
        {"defaults": 1},
    ],
    ids=["labels-not-table", "versions-not-array", "model-not-table", "defaults-not-table"],
)
def test_non_table_values_raise_config_error(data: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        parse_config(data)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_batch_size", 2.5),
        ("max_batch_size", "64"),
        ("allow_non_finite", "false"),
        ("versions", [1.5]),
        ("max_batch_delay_ms", float("inf")),
        ("request_timeout_s", float("inf")),
    ],
    ids=["float-batch-size", "string-batch-size", "string-bool", "float-version", "inf-delay", "inf-timeout"],
)
def test_wrongly_typed_or_infinite_values_raise_config_error_naming_the_setting(key: str, value: Any) -> None:
    table = {key: value, **({"version_policy": "specific"} if key == "versions" else {})}
    with pytest.raises(ConfigError, match=rf"^\[defaults\]: .*{key}"):
        parse_config({"defaults": table})


def test_payload_log_sample_is_parsed_per_model_and_in_defaults() -> None:
    config = parse_config({"defaults": {"payload_log": {"sample": 0.5}}, "models": {"m": {"payload_log": {"sample": 1}}, "n": {}}})
    assert config.for_model("m").payload_log_sample == 1.0 and config.for_model("n").payload_log_sample == 0.5
    assert parse_config({}).for_model("x").payload_log_sample == 0.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"sample": 1.5}, "payload_log.sample must be between 0 and 1"),
        ({"sample": -0.1}, "payload_log.sample must be between 0 and 1"),
        ({"sample": "0.1"}, "payload_log must be a table"),
        ({"rate": 0.1}, "payload_log must be a table"),
        (0.1, "payload_log must be a table"),
    ],
)
def test_a_bad_payload_log_names_the_model(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^\[models\.m\]: " + message) as raised:
        parse_config({"models": {"m": {"payload_log": value}}})
    assert raised.value.model == "m"


def test_as_table_parses_back_to_the_same_settings() -> None:
    config = parse_config({"models": {"m": {"payload_log": {"sample": 0.25}, "labels": {"a": 1}}}}).for_model("m")
    assert parse_config({"models": {"m": json.loads(json.dumps(as_table(config)))}}).for_model("m") == config


@pytest.mark.parametrize("data, message", [
    ({"models": {"m": {"base_path": "models/m"}}}, "base_path must be an absolute path"),
    ({"defaults": {"base_path": "/m"}}, "base_path is a model's own setting"),
    ({"models": {"a/b": {"base_path": "/m"}}}, "a model name has letters, digits"),
])
def test_a_base_path_is_an_absolute_directory_of_a_named_model(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data)
    assert parse_config({"models": {"m": {"base_path": "/srv/m"}}}).for_model("m").base_path == "/srv/m"


@pytest.mark.parametrize("base_path", ["/proc", "/proc/1", "/sys/kernel", "/dev/shm/m", "/proc/../proc/self"])
def test_a_base_path_under_the_kernels_directories_is_refused(base_path: str) -> None:
    with pytest.raises(ConfigError, match="base_path must not be under /proc, /sys, /dev"):
        parse_config({"models": {"m": {"base_path": base_path}}})
    assert parse_config({"models": {"m": {"base_path": "/procedures/m"}}}).for_model("m").base_path == "/procedures/m"
