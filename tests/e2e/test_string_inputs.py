"""Models that take strings are warmed like the others (empty strings), or say why a signature is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from server.repository import scan
from tests.support.models import TFSERVING_TESTDATA


@pytest.fixture(scope="module")
def words(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Keras 3 model with a string input (a vocabulary lookup), saved as a .keras version."""
    import keras

    keras.utils.set_random_seed(5)
    text = keras.Input(shape=(1,), dtype="string", name="text")
    one_hot = keras.layers.StringLookup(vocabulary=["cat", "dog", "bird"], output_mode="one_hot")(text)
    model = keras.Model(text, keras.layers.Dense(2, name="score")(keras.layers.Flatten()(one_hot)))
    root = tmp_path_factory.mktemp("string-models")
    (root / "words" / "1").mkdir(parents=True)
    model.save(root / "words" / "1" / "model.keras")
    return root


def test_a_string_input_model_is_warmed_at_every_batch_size_and_never_traces_again(words: Path) -> None:
    from server.models import runtime

    servable = runtime.load_servable(scan(words)["words"][0])
    assert servable.warm_up([1, 2, 4]) == 3 and servable.unwarmed == {}
    assert servable.flat is not None  # the flat call takes strings too
    traced = servable.traces()
    answer = servable.run("serving_default", {"text": np.array([[b"cat"], [b"dog"], [b"fish"], [b"cat"]], dtype=object)})
    assert answer["score"].shape == (4, 2) and servable.traces() == traced
    np.testing.assert_array_equal(answer["score"][0], answer["score"][3])


def test_signatures_that_refuse_empty_strings_say_why_they_are_not_warmed() -> None:
    from server.models import runtime
    from server.repository import VersionSource

    path = TFSERVING_TESTDATA / "saved_model_half_plus_two_tf2_cpu" / "00000123"
    servable = runtime.load_servable(VersionSource("half_plus_two_tf2", 123, path, "savedmodel"))
    assert servable.warm_up([1, 2]) >= 2  # serving_default (floats) at both sizes
    assert set(servable.unwarmed) == {"classify_x_to_y", "regress_x_to_y", "regress_x_to_y2"}
    assert all(why.startswith("empty strings refused") for why in servable.unwarmed.values())
