"""The flat TensorFlow call: bit-identical to ConcreteFunction.__call__ for every input dtype, and avoidable."""

from __future__ import annotations

import numpy as np
import pytest

from server import compat


@pytest.fixture(scope="module")
def mixed_model():
    """A Keras model with float, integer and boolean inputs, traced as the runtime traces it."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    values = keras.Input((4,), name="values")
    ids = keras.Input((3,), dtype="int32", name="ids")
    mask = keras.Input((4,), dtype="bool", name="mask")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(5, 2)(ids))
    masked = keras.layers.Lambda(lambda pair: pair[0] * keras.ops.cast(pair[1], "float32"))([values, mask])
    model = keras.Model([values, ids, mask], keras.layers.Dense(3, name="out")(keras.layers.Concatenate()([masked, embedded])))
    specs = [tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((None, 3), tf.int32), tf.TensorSpec((None, 4), tf.bool)]
    function = tf.function(lambda v, i, m: {"out": model([v, i, m], training=False)}, input_signature=specs)
    return function.get_concrete_function(), [(None, 4), (None, 3), (None, 4)], ["float32", "int32", "bool"]


def test_the_flat_call_answers_exactly_as_the_public_call(mixed_model) -> None:
    import tensorflow as tf

    concrete, shapes, dtypes = mixed_model
    flat = compat.flat_call_or_none(concrete, shapes, dtypes)
    assert flat is not None
    arrays = compat.probe_arrays(shapes, dtypes, batch=5)
    assert arrays[1].dtype == np.int32 and arrays[2].dtype == np.bool_ and len(arrays[0]) == 5
    tensors = [tf.constant(a) for a in arrays]
    np.testing.assert_array_equal(flat(*tensors)["out"].numpy(), concrete(*tensors)["out"].numpy())


def test_an_unverified_tensorflow_gets_the_public_call(mixed_model, monkeypatch: pytest.MonkeyPatch) -> None:
    concrete, shapes, dtypes = mixed_model
    monkeypatch.setattr(compat, "verified", lambda distribution: False)
    assert compat.flat_call_or_none(concrete, shapes, dtypes) is None
