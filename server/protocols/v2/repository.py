"""Triton's model repository extension: a load's configuration override mapped onto forkserve's model settings.

A load may carry `parameters.config`, a JSON ModelConfig (Triton's shape, as the model configuration
extension answers it). What forkserve has a setting for becomes a models.toml table over the model's
own; anything else is refused with a message that says what can be set, never ignored.
"""

from __future__ import annotations

from typing import Any

import orjson

from server.errors import InvalidArgument

SETTABLE = ("max_batch_size", "dynamic_batching", "version_policy")
INFORMATIVE = ("name", "platform", "backend", "input", "output", "parameters")  # the config call's: accepted, not applied
BATCHING_KEYS = {"max_queue_delay_microseconds", "preferred_batch_size", "preserve_ordering"}
MAX_CONFIG_BYTES = 64 * 1024


def refused(model: str, why: str) -> InvalidArgument:
    """The failed load, worded as Triton words it."""
    return InvalidArgument(f"failed to load '{model}': {why}")


def override_table(model: str, config_json: str | bytes) -> dict[str, Any]:
    """The models.toml table a load's `config` parameter asks for; InvalidArgument for malformed or unsupported ones."""
    if len(config_json) > MAX_CONFIG_BYTES:
        raise refused(model, f"the config parameter is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = orjson.loads(config_json)
    except orjson.JSONDecodeError as exc:
        raise refused(model, f"the config parameter is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise refused(model, "the config parameter must be a JSON object (a ModelConfig)")
    unknown = sorted(set(config) - set(SETTABLE) - set(INFORMATIVE))
    if unknown:
        raise refused(model, f"forkserve cannot set {', '.join(unknown)}; a load's config may set "
                             f"{', '.join(SETTABLE)} (other fields of the model configuration are read-only)")
    if config.get("name", model) != model:
        raise refused(model, f"the config names model {config['name']!r}")
    table: dict[str, Any] = {}
    if config.get("max_batch_size", 0) != 0:  # NOTE: 0 is what the config call answers for a model that cannot batch
        size = config["max_batch_size"]
        if type(size) is not int or size < 1:
            raise refused(model, f"max_batch_size must be an integer >= 0, got {size!r} (0: the model's own)")
        table["max_batch_size"] = size
    if "dynamic_batching" in config:
        table.update(_batching(model, config["dynamic_batching"]))
    if "version_policy" in config:
        table.update(_version_policy(model, config["version_policy"]))
    return table


def _batching(model: str, batching: Any) -> dict[str, Any]:
    """dynamic_batching's delay and preferred sizes as max_batch_delay_ms and allowed_batch_sizes."""
    if not isinstance(batching, dict) or set(batching) - BATCHING_KEYS:
        raise refused(model, f"dynamic_batching may set {', '.join(sorted(BATCHING_KEYS))}, got {batching!r}")
    table: dict[str, Any] = {}
    delay = batching.get("max_queue_delay_microseconds")
    if delay is not None:
        if isinstance(delay, str) and delay.isdigit():  # NOTE: protobuf's JSON writes uint64 as a string
            delay = int(delay)
        if type(delay) is not int or delay < 0:
            raise refused(model, f"max_queue_delay_microseconds must be an integer >= 0, got {delay!r}")
        table["max_batch_delay_ms"] = delay / 1000
    sizes = batching.get("preferred_batch_size")
    if sizes:
        if not isinstance(sizes, list) or not all(type(size) is int for size in sizes):
            raise refused(model, f"preferred_batch_size must be a list of integers, got {sizes!r}")
        table["allowed_batch_sizes"] = sizes
    if batching.get("preserve_ordering"):
        raise refused(model, "preserve_ordering: forkserve answers each request as soon as its batch is done")
    return table


def _version_policy(model: str, policy: Any) -> dict[str, Any]:
    """Triton's ModelVersionPolicy as forkserve's version_policy, latest and versions."""
    if not isinstance(policy, dict) or len(policy) != 1:
        raise refused(model, f"version_policy must be one of latest, all or specific, got {policy!r}")
    (kind, value), = policy.items()
    value = value if isinstance(value, dict) else {}
    if kind == "all":
        return {"version_policy": "all"}
    if kind == "latest":
        count = int(value["num_versions"]) if str(value.get("num_versions", "1")).isdigit() else -1
        if count < 1:
            raise refused(model, f"version_policy.latest.num_versions must be an integer >= 1, got {value!r}")
        return {"version_policy": "latest", "latest": count}
    if kind == "specific":
        versions = value.get("versions")
        if not isinstance(versions, list) or not versions or not all(str(v).isdigit() for v in versions):
            raise refused(model, f"version_policy.specific.versions must be a list of versions, got {value!r}")
        return {"version_policy": "specific", "versions": sorted(int(v) for v in versions)}
    raise refused(model, f"version_policy must be one of latest, all or specific, got {kind!r}")
