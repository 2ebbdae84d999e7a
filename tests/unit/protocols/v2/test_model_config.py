"""Triton's ModelConfig of a signature and forkserve's settings: data types, dims, batching, version policy."""

from __future__ import annotations

from server.config import ModelConfig
from server.protocols.v2.model_config import model_config
from server.signature import SignatureInfo, TensorInfo

FIXED = SignatureInfo("serving_default", "predict", {"text": TensorInfo("text", "string", (3,))},
                      {"ids": TensorInfo("ids", "int64", (3, 4)), "any": TensorInfo("any", "bool", None)})
BATCHED = SignatureInfo("serving_default", "predict", {"x": TensorInfo("x", "float16", (None, None, 5))},
                        {"y": TensorInfo("y", "float64", (None,))})


def test_a_model_without_a_free_batch_dimension_has_max_batch_size_0_full_dims_and_no_batcher() -> None:
    config = model_config("t", "keras", ModelConfig(version_policy="all"), FIXED)
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert config["input"] == [{"name": "text", "data_type": "TYPE_STRING", "dims": [3], "format": "FORMAT_NONE"}]
    assert config["output"] == [{"name": "ids", "data_type": "TYPE_INT64", "dims": [3, 4]},
                                {"name": "any", "data_type": "TYPE_BOOL", "dims": [-1]}]
    assert config["version_policy"] == {"all": {}}


def test_a_batching_model_shows_its_batch_limit_padding_sizes_and_delay() -> None:
    settings = ModelConfig(version_policy="specific", versions=(3, 1), max_batch_size=16,
                           allowed_batch_sizes=(4, 16), max_batch_delay_ms=2.5)
    config = model_config("b", "tensorflow_savedmodel", settings, BATCHED)
    assert config["max_batch_size"] == 16
    assert config["input"][0] == {"name": "x", "data_type": "TYPE_FP16", "dims": [-1, 5], "format": "FORMAT_NONE"}
    assert config["output"] == [{"name": "y", "data_type": "TYPE_FP64", "dims": []}]
    assert config["dynamic_batching"] == {"preferred_batch_size": [4, 16], "max_queue_delay_microseconds": 2500,
                                          "preserve_ordering": False}
    assert config["version_policy"] == {"specific": {"versions": [1, 3]}}


def test_a_float_image_input_is_nhwc() -> None:
    image = SignatureInfo("serving_default", "predict", {"image": TensorInfo("image", "float32", (None, 8, 8, 1))},
                          {"p": TensorInfo("p", "float32", (None, 10))})
    assert model_config("d", "keras", ModelConfig(), image)["input"] == [
        {"name": "image", "data_type": "TYPE_FP32", "dims": [8, 8, 1], "format": "FORMAT_NHWC"}]
