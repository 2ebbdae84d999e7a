"""Per-model settings from conf/models.toml (read with tomllib; no TensorFlow here)."""

from __future__ import annotations

import copy
import math
import os
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

IMAGE_SCALES = ("unit", "symmetric", "none")
RESIZE_METHODS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
IMAGE_MODES = ("L", "RGB", "RGBA")
VERSION_POLICIES = ("latest", "all", "specific")
SYSTEM_PATHS = ("/proc", "/sys", "/dev")  # never model directories; their files lie about their size (the master reads them)


class ConfigError(ValueError):
    """conf/models.toml is malformed: the server refuses to start, or keeps its last good configuration."""

    def __init__(self, message: str, model: str | None = None) -> None:
        super().__init__(message)
        self.model = model  # the model whose table is wrong; None: the whole file (every model)


def _under_system_paths(path: str) -> bool:
    """`path` is one of SYSTEM_PATHS or under one (a base_path that would make the master read kernel files)."""
    normal = os.path.normpath(path) if path else ""
    return any(normal == root or normal.startswith(root + "/") for root in SYSTEM_PATHS)


@dataclass(frozen=True)
class ModelConfig:
    """Settings of one model; every field has a default that serves a plain model."""

    version_policy: str = "latest"
    latest: int = 1  # how many of the newest versions the "latest" policy serves
    versions: tuple[int, ...] = ()  # the "specific" policy's versions
    labels: dict[str, int] = field(default_factory=dict)
    max_batch_size: int = 64
    allowed_batch_sizes: tuple[int, ...] = ()  # sizes batches are padded to; empty: no padding
    max_batch_delay_ms: float = 0.0
    max_queue_rows: int = 1024
    max_request_rows: int = 1024  # rows one request may carry; more is a 400
    request_timeout_s: float = 30.0  # a request that waits longer is answered 504
    image_scale: str = "unit"  # unit: [0, 1]; symmetric: [-1, 1]; none: 0..255
    image_resize: str = "bilinear"
    image_mode: str = ""  # empty: derived from the model's channel count
    max_image_pixels: int = 16_000_000
    allow_non_finite: bool = False
    handler: bool = False  # run the version's handler.py; a handler.py without this fails the version
    payload_log_sample: float = 0.0  # `payload_log = { sample = F }`: the share of requests logged (server.telemetry.payloads)
    base_path: str = ""  # an absolute directory holding the model's version directories; empty: <repository>/<name>

    @property
    def padded_batch_sizes(self) -> list[int]:
        """Sizes the executor pads a batch up to: the configured ones; empty (the default) runs each batch at its own size."""
        return list(self.allowed_batch_sizes)

    @property
    def batch_buckets(self) -> list[int]:
        """Batch sizes warm-up runs: the configured ones, or powers of two and the maximum."""
        if self.allowed_batch_sizes:
            return list(self.allowed_batch_sizes)
        sizes, size = [], 1
        while size < self.max_batch_size:
            sizes.append(size)
            size *= 2
        return sizes + [self.max_batch_size]

    def validate(self, where: str) -> ModelConfig:
        """Raise ConfigError naming `where` when a value is out of range."""
        checks = [
            (self.version_policy in VERSION_POLICIES, f"version_policy must be one of {VERSION_POLICIES}"),
            (self.latest >= 1, "latest must be >= 1"),
            (all(v >= 1 for v in self.versions), "versions must be positive integers"),
            (self.version_policy != "specific" or bool(self.versions), "version_policy 'specific' needs versions"),
            (all(isinstance(v, int) and v >= 1 for v in self.labels.values()), "labels map names to versions"),
            (self.max_batch_size >= 1, "max_batch_size must be >= 1"),
            (
                not self.allowed_batch_sizes
                or (
                    list(self.allowed_batch_sizes) == sorted(set(self.allowed_batch_sizes))
                    and self.allowed_batch_sizes[0] >= 1
                    and self.allowed_batch_sizes[-1] == self.max_batch_size
                ),
                "allowed_batch_sizes must increase and end with max_batch_size",
            ),
            (self.max_batch_delay_ms >= 0, "max_batch_delay_ms must be >= 0"),
            (self.max_queue_rows >= self.max_batch_size, "max_queue_rows must be >= max_batch_size"),
            (self.request_timeout_s > 0, "request_timeout_s must be > 0"),
            (self.max_request_rows >= 1, "max_request_rows must be >= 1"),
            (self.image_scale in IMAGE_SCALES, f"image_scale must be one of {IMAGE_SCALES}"),
            (self.image_resize in RESIZE_METHODS, f"image_resize must be one of {RESIZE_METHODS}"),
            (self.image_mode in ("",) + IMAGE_MODES, f"image_mode must be one of {IMAGE_MODES}"),
            (self.max_image_pixels >= 1, "max_image_pixels must be >= 1"),
            (0 <= self.payload_log_sample <= 1, "payload_log.sample must be between 0 and 1"),
            (not self.base_path or os.path.isabs(self.base_path), f"base_path must be an absolute path, got {self.base_path!r}"),
            (not _under_system_paths(self.base_path), f"base_path must not be under {', '.join(SYSTEM_PATHS)}, got {self.base_path!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"{where}: {message}")
        return self


@dataclass(frozen=True)
class ServerConfig:
    """The defaults and the per-model overrides of conf/models.toml."""

    defaults: ModelConfig = field(default_factory=ModelConfig)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict, compare=False)  # the parsed TOML it came from

    def for_model(self, name: str) -> ModelConfig:
        """Settings of model `name`: its own table over the defaults."""
        return self.models.get(name, self.defaults)


_FIELDS = {f.name for f in fields(ModelConfig)} - {"payload_log_sample"} | {"payload_log"}
_INT_FIELDS = {"latest", "max_batch_size", "max_queue_rows", "max_request_rows", "max_image_pixels"}
_FLOAT_FIELDS = {"max_batch_delay_ms", "request_timeout_s"}


def as_table(config: ModelConfig) -> dict[str, Any]:
    """A ModelConfig as the models.toml table that parses back to it."""
    table = asdict(config)
    table["payload_log"] = {"sample": table.pop("payload_log_sample")}
    return table


def _type_problem(key: str, value: Any) -> str:
    """What is wrong with the type of one setting, or ''."""
    if key in _INT_FIELDS:
        return "" if type(value) is int else "an integer"
    if key in _FLOAT_FIELDS:
        return "" if type(value) in (int, float) and math.isfinite(value) else "a finite number"
    if key in ("allow_non_finite", "handler"):
        return "" if isinstance(value, bool) else "true or false"
    if key in ("versions", "allowed_batch_sizes"):
        return "" if isinstance(value, list) and all(type(v) is int for v in value) else "a list of integers"
    if key == "payload_log":
        ok = isinstance(value, dict) and set(value) <= {"sample"} and _type_problem("max_batch_delay_ms", value.get("sample", 0)) == ""
        return "" if ok else "a table { sample = a number between 0 and 1 }"
    if key == "labels":
        ok = isinstance(value, dict) and all(type(v) is int for v in value.values())
        return "" if ok else "a table of label = version"
    return "" if isinstance(value, str) else "a string"


def _model_config(table: Any, base: ModelConfig, where: str, model: str | None = None) -> ModelConfig:
    """Apply one TOML table on top of `base`; errors name `model` (None for [defaults])."""
    try:
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: must be a table, got {table!r}")
        unknown = set(table) - _FIELDS
        if unknown:
            raise ConfigError(f"{where}: unknown setting(s) {sorted(unknown)}; known: {sorted(_FIELDS)}")
        for key, value in table.items():
            wanted = _type_problem(key, value)
            if wanted:
                raise ConfigError(f"{where}: {key} must be {wanted}, got {value!r}")
        values = dict(table)
        for key in ("versions", "allowed_batch_sizes"):
            if key in values:
                values[key] = tuple(values[key])
        if "labels" in values:
            values["labels"] = dict(values["labels"])
        if "payload_log" in values:
            values["payload_log_sample"] = float(values.pop("payload_log").get("sample", 0))
        return replace(base, **values).validate(where)
    except ConfigError as exc:
        raise ConfigError(str(exc), model) from None


def parse_config(data: dict[str, Any]) -> ServerConfig:
    """Build a ServerConfig from parsed TOML."""
    unknown = set(data) - {"defaults", "models"}
    if unknown:
        raise ConfigError(f"models.toml: unknown table(s) {sorted(unknown)}")
    defaults = _model_config(data.get("defaults", {}), ModelConfig(), "[defaults]")
    if defaults.base_path:
        raise ConfigError("[defaults]: base_path is a model's own setting ([models.NAME])")
    if not isinstance(data.get("models", {}), dict):
        raise ConfigError("[models]: must be a table of [models.NAME] tables")
    models = {
        name: _model_config(table, defaults, f"[models.{name}]", name)
        for name, table in data.get("models", {}).items()
    }
    from server.repository import is_model_name  # NOTE: here, not at the top: server.repository imports this module

    for name, settings in models.items():
        if settings.base_path and not is_model_name(name):
            raise ConfigError(f"[models.{name}]: a model name has letters, digits, '_', '.' and '-' "
                              "(it is a URL path segment), and is not all digits", name)
    return ServerConfig(defaults=defaults, models=models, source=data)


def with_overrides(config: ServerConfig, overrides: dict[str, dict[str, Any]]) -> ServerConfig:
    """The configuration with each model's table updated by its override (a load's config); ConfigError names the model."""
    if not any(overrides.values()):
        return config
    source = copy.deepcopy(config.source)
    models = source.setdefault("models", {})
    for name, table in overrides.items():
        if table:
            models[name] = {**models.get(name, {}), **table}
    return parse_config(source)


def with_model_server_config(config: ServerConfig, defaults: dict[str, Any], models: dict[str, dict[str, Any]]) -> ServerConfig:
    """models.toml under TF Serving's files: `defaults` over its [defaults], and each model's table over its own.

    TF Serving's ModelServerConfig decides which models are served, from where, with which
    versions and labels; models.toml keeps every other setting, per model.
    """
    source = copy.deepcopy(config.source)
    source["defaults"] = {**source.get("defaults", {}), **defaults}
    tables = source.setdefault("models", {})
    for name, table in tables.items():
        if isinstance(table, dict) and "base_path" in table:
            raise ConfigError(f"[models.{name}]: base_path does not go with TF Serving's model configuration, "
                              "which names the served models and their base paths (list the model there)", name)
    for name, table in models.items():
        tables[name] = {**tables.get(name, {}), **table}
    return parse_config(source)


def read_config_bytes(path: Path) -> bytes | None:
    """The file's bytes, None when it does not exist; an unreadable file is a ConfigError."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def parse_config_bytes(raw: bytes, path: Path) -> ServerConfig:
    """Parse the bytes of conf/models.toml; every problem is a ConfigError naming the file."""
    try:
        return parse_config(tomllib.loads(raw.decode("utf-8")))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def load_config(path: Path) -> ServerConfig:
    """Read conf/models.toml; a missing file means every default."""
    raw = read_config_bytes(path)
    return ServerConfig() if raw is None else parse_config_bytes(raw, path)
