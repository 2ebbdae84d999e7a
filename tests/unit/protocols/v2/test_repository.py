"""A load's config override (Triton's ModelConfig JSON) mapped onto forkserve's model settings, or refused with why."""

from __future__ import annotations

import orjson
import pytest

from server.config import ModelConfig, parse_config, with_overrides
from server.errors import InvalidArgument
from server.protocols.v2.model_config import model_config
from server.protocols.v2.repository import override_table
from server.signature import SignatureInfo, TensorInfo


def test_what_forkserve_has_maps_onto_its_settings() -> None:
    config = {"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": "2500",
                                                         "preferred_batch_size": [4, 16]},
              "version_policy": {"latest": {"num_versions": 2}}}
    assert override_table("m", orjson.dumps(config)) == {
        "max_batch_size": 16, "max_batch_delay_ms": 2.5, "allowed_batch_sizes": [4, 16],
        "version_policy": "latest", "latest": 2}
    assert override_table("m", '{"version_policy": {"all": {}}}') == {"version_policy": "all"}
    assert override_table("m", '{"version_policy": {"specific": {"versions": ["3", 1]}}}') == {
        "version_policy": "specific", "versions": [1, 3]}


def test_the_config_answer_itself_loads_back_unchanged() -> None:
    """A client that fetches the config, edits max_batch_size and loads it: the read-only fields are accepted as they are."""
    signature = SignatureInfo("serving_default", "predict", {"x": TensorInfo("x", "float32", (None, 2))},
                              {"y": TensorInfo("y", "float32", (None, 1))})
    fetched = model_config("m", "keras", ModelConfig(max_batch_delay_ms=1.0), signature)
    table = override_table("m", orjson.dumps({**fetched, "max_batch_size": 8}))
    assert table == {"max_batch_size": 8, "max_batch_delay_ms": 1.0, "version_policy": "latest", "latest": 1}
    merged = with_overrides(parse_config({}), {"m": table}).for_model("m")
    assert (merged.max_batch_size, merged.max_batch_delay_ms) == (8, 1.0)


@pytest.mark.parametrize("config,why", [
    ("{bad", "is not JSON"),
    ("[1]", "must be a JSON object"),
    ('{"instance_group": [{"count": 2}]}', "forkserve cannot set instance_group"),
    ('{"name": "other"}', "the config names model 'other'"),
    ('{"max_batch_size": -1}', "max_batch_size must be an integer >= 0"),
    ('{"dynamic_batching": {"priority_levels": 2}}', "dynamic_batching may set"),
    ('{"dynamic_batching": {"preserve_ordering": true}}', "preserve_ordering"),
    ('{"version_policy": {"newest": {}}}', "version_policy must be one of latest, all or specific"),
    ('{"version_policy": {"specific": {"versions": []}}}', "versions must be a list of versions"),
    ('{"version_policy": {"latest": {"num_versions": 0}}}', "num_versions must be an integer >= 1"),
    ("x" * 70_000, "larger than 65536 bytes"),
])
def test_malformed_or_unsupported_configs_are_a_failed_load_naming_the_model(config: str, why: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        override_table("m", config)
    assert caught.value.message.startswith("failed to load 'm': ") and why in caught.value.message


def test_a_non_batching_model_s_fetched_config_loads_back() -> None:
    """max_batch_size 0 is what the config call answers for a model without a free batch dimension: the model's own."""
    fixed = SignatureInfo("serving_default", "predict", {"x": TensorInfo("x", "float32", (3,))},
                          {"y": TensorInfo("y", "float32", (3,))})
    fetched = model_config("m", "keras", ModelConfig(), fixed)
    assert fetched["max_batch_size"] == 0
    assert override_table("m", orjson.dumps(fetched)) == {"version_policy": "latest", "latest": 1}
