"""What the APIs tell about the served models, without a transport: TF Serving's status, V2's metadata and readiness."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from server.config import ModelConfig, ServerConfig
from server.dataplane.models import (
    tfserving_statuses,
    v2_model_config,
    v2_model_metadata,
    v2_model_ready,
    v2_server_metadata,
)
from server.errors import NotFound
from server.models.registry import AVAILABLE, LOADING, Model, ModelRegistry, ModelVersion
from server.repository import VersionSource
from server.signature import SignatureInfo, TensorInfo

PREDICT = SignatureInfo("serving_default", "predict", {"x": TensorInfo("x", "float32", (None, 2))},
                        {"y": TensorInfo("y", "float32", (None, 2))})
OTHER = SignatureInfo("other", "predict", {"images": TensorInfo("images", "uint8", (None, 8, 8, 1))},
                      {"scores": TensorInfo("scores", "float32", (None, 3))})


def loaded(registry: ModelRegistry, directory: Path, name: str, number: int, signatures: dict[str, SignatureInfo],
           config: ModelConfig) -> ModelVersion:
    """A version loaded through the registry's own path, from a servable made of plain data (no TensorFlow)."""
    (directory / name / str(number)).mkdir(parents=True)
    version = ModelVersion(VersionSource(name, number, directory / name / str(number), "keras"), config)
    servable = SimpleNamespace(signatures=signatures, platform="tensorflow_savedmodel", warm_up=lambda buckets: 0,
                               traces=lambda: 0, run=lambda signature, fed: {"y": np.asarray(fed["x"])})
    assert registry._load_version(version, SimpleNamespace(load_servable=lambda source: servable)), version.error
    return version


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> ModelRegistry:
    """Model `m` with versions 1 and 2 serving and 3 still loading; model `o` whose only signature is not serving_default."""
    directory = tmp_path_factory.mktemp("dataplane-models")
    registry = ModelRegistry(directory, None, ServerConfig())
    config = ModelConfig()
    versions = {n: loaded(registry, directory, "m", n, {"serving_default": PREDICT}, config) for n in (1, 2)}
    versions[3] = ModelVersion(VersionSource("m", 3, directory / "m" / "3", "keras"), config, state=LOADING)
    registry.models["m"] = Model("m", config, versions)
    registry.models["o"] = Model("o", config, {1: loaded(registry, directory, "o", 1, {"other": OTHER}, config)})
    registry.loaded = True
    return registry


def test_tfserving_status_lists_every_version_or_the_one_asked_for(registry: ModelRegistry) -> None:
    assert [(s["version"], s["state"]) for s in tfserving_statuses(registry, "m", None, None)] == [
        ("3", LOADING), ("2", AVAILABLE), ("1", AVAILABLE)]
    assert [s["version"] for s in tfserving_statuses(registry, "m", 1, None)] == ["1"]
    with pytest.raises(NotFound, match=r"Servable not found for request: Specific\(m, 9\)"):
        tfserving_statuses(registry, "m", 9, None)
    with pytest.raises(NotFound, match="label 'stable' not found for model m"):
        tfserving_statuses(registry, "m", None, "stable")
    with pytest.raises(NotFound):
        tfserving_statuses(registry, "nope", None, None)


def test_v2_metadata_describes_serving_default_or_else_the_first_signature(registry: ModelRegistry) -> None:
    assert v2_model_metadata(registry, registry.get("m").resolve(1)) == {
        "name": "m", "versions": ["2", "1"], "platform": "tensorflow_savedmodel",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}
    described = v2_model_metadata(registry, registry.get("o").resolve(None))
    assert described["inputs"] == [{"name": "images", "datatype": "UINT8", "shape": [-1, 8, 8, 1]}]
    assert v2_server_metadata(["binary_tensor_data"])["extensions"] == ["model_configuration", "statistics", "model_repository",
                                                                         "binary_tensor_data"]


def test_v2_ready_is_true_for_a_serving_version_false_with_why_for_a_loading_one(registry: ModelRegistry) -> None:
    ready, served, why = v2_model_ready(registry, "m", None)
    assert (ready, served.version if served else None, why) == (True, 2, "")
    ready, served, why = v2_model_ready(registry, "m", 3)
    assert (ready, served) == (False, None) and "version 3 is LOADING" in why
    with pytest.raises(NotFound):
        v2_model_ready(registry, "m", 9)
    with pytest.raises(NotFound):
        v2_model_ready(registry, "nope", None)


def test_v2_model_config_is_triton_s_shape_with_dims_past_the_batch_dimension(registry: ModelRegistry) -> None:
    assert v2_model_config(registry.get("m").resolve(1)) == {
        "name": "m", "platform": "tensorflow_savedmodel", "backend": "tensorflow",
        "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 64,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [2], "format": "FORMAT_NONE"}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [2]}],
        "parameters": {"signature_name": {"string_value": "serving_default"}},
        "dynamic_batching": {"preferred_batch_size": [], "max_queue_delay_microseconds": 0, "preserve_ordering": False}}
    image = v2_model_config(registry.get("o").resolve(None))
    assert image["input"] == [{"name": "images", "data_type": "TYPE_UINT8", "dims": [8, 8, 1], "format": "FORMAT_NONE"}]
    assert image["parameters"]["signature_name"] == {"string_value": "other"}
