"""The tests' model repository: TF Serving's test models, Keras 3 and Keras 2 models, broken ones; copies of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[1] / "data"
TFSERVING_TESTDATA = DATA / "tfserving"  # TensorFlow Serving's own test models (Apache-2.0)
KERAS2 = DATA / "keras2"

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_BODY_BYTES = 1024 * 1024  # the shared server's FORKSERVE_MAX_BODY_BYTES (tests/e2e/conftest.py)

# The shared server's models.toml.
CONF = """
[models.digits]
image_mode = "L"
image_resize = "box"

[models.mlp]
labels = { stable = 1 }

[models.k3cnn]
image_resize = "bilinear"
image_scale = "unit"

[models.fallback]
latest = 1

[models.nonfinite]
allow_non_finite = true

[models.slow]
max_batch_size = 1
max_queue_rows = 1

# The demo model with its handler (version 2) beside the plain one (version 1), as conf/models.toml serves it.
[models.handled]
version_policy = "all"
handler = true
image_mode = "L"
image_resize = "box"
image_scale = "unit"
"""


def build_keras3_models(root: Path) -> None:
    """Small Keras 3 models with fixed seeds: an image CNN, a slow CNN, an MLP and a string-input model (TF imported here)."""
    import keras

    keras.utils.set_random_seed(7)
    cnn = keras.Sequential(
        [
            keras.Input(shape=(10, 12, 3), name="pixels"),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(5, activation="softmax", name="scores"),
        ]
    )
    (root / "k3cnn" / "1").mkdir(parents=True)
    cnn.save(root / "k3cnn" / "1" / "model.keras")

    # Slow on purpose (about 0.1-0.3 s per row on one core): for queueing, shedding and deadlines.
    slow = keras.Sequential(
        [
            keras.Input(shape=(192, 192, 3), name="image"),
            keras.layers.Conv2D(32, 7, padding="same"),
            keras.layers.Conv2D(64, 7, padding="same"),
            keras.layers.Conv2D(64, 7, padding="same"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1, name="score"),
        ]
    )
    (root / "slow" / "1").mkdir(parents=True)
    slow.save(root / "slow" / "1" / "model.keras")

    inputs = keras.Input(shape=(20,), name="features")
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    mlp = keras.Model(inputs, keras.layers.Dense(2, name="logits")(hidden))
    for name in ("mlp", "nonfinite"):
        (root / name / "1").mkdir(parents=True)
        mlp.save(root / name / "1" / "model.keras")

    keras.utils.set_random_seed(5)  # a string-input model: V2's BYTES tensors
    text = keras.Input(shape=(1,), dtype="string", name="text")
    one_hot = keras.layers.StringLookup(vocabulary=["cat", "dog", "bird"], output_mode="one_hot")(text)
    words = keras.Model(text, keras.layers.Dense(2, name="score")(keras.layers.Flatten()(one_hot)))
    (root / "words" / "1").mkdir(parents=True)
    words.save(root / "words" / "1" / "model.keras")


def write_three_output_model(directory: Path) -> None:
    """A SavedModel of three outputs, one complex64: a dtype forkserve cannot send (a server-side failure)."""
    import tensorflow as tf

    class Heads(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"double": 2 * x, "plus_one": x + 1, "complex": tf.complex(x, x)}

    module = Heads()
    tf.saved_model.save(module, str(directory / "1"), signatures={"serving_default": module.serve})


def write_model_naming_a_function(source: Path, target: Path) -> Path:
    """A .keras file whose config names an arbitrary Python function (os.system) as an activation."""
    import json
    import zipfile

    with zipfile.ZipFile(source) as original:
        config = json.loads(original.read("config.json"))
        layer = next(item for item in config["config"]["layers"] if "activation" in item["config"])
        layer["config"]["activation"] = {"module": "os", "class_name": "function", "config": "system", "registered_name": "system"}
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(target, "w") as forged:
            for name in original.namelist():
                forged.writestr(name, json.dumps(config) if name == "config.json" else original.read(name))
    return target


def build_repository(root: Path) -> Path:
    """TF Serving's test models, Keras 3, Keras 2 HDF5, a Keras 2 SavedModel, the demo with its handler, broken models."""
    shutil.copytree(TFSERVING_TESTDATA / "saved_model_half_plus_two_cpu", root / "half_plus_two")
    shutil.copytree(TFSERVING_TESTDATA / "saved_model_half_plus_two_tf2_cpu", root / "half_plus_two_tf2")
    build_keras3_models(root)
    for name, source in (("cnn_h5", "cnn.h5"), ("multi_h5", "multi.h5"), ("lambda_h5", "lambda.h5")):
        (root / name / "1").mkdir(parents=True)
        shutil.copy(KERAS2 / source, root / name / "1" / source)
    shutil.copytree(KERAS2 / "cnn_savedmodel", root / "cnn_savedmodel" / "1")
    shutil.copytree(REPO_ROOT / "models" / "digits" / "1", root / "digits" / "1")  # the plain version
    shutil.copytree(REPO_ROOT / "models" / "digits", root / "handled")  # both versions, the handler in 2
    write_three_output_model(root / "heads")
    # A corrupt model: random bytes where a .keras zip should be.
    (root / "corrupt" / "1").mkdir(parents=True)
    (root / "corrupt" / "1" / "model.keras").write_bytes(np.random.default_rng(0).bytes(4096))
    write_model_naming_a_function(REPO_ROOT / "models" / "digits" / "1" / "model.keras", root / "evil_fn" / "1" / "model.keras")
    # A good version 1 and a truncated version 2: the latest policy falls back to 1.
    shutil.copytree(root / "mlp" / "1", root / "fallback" / "1")
    (root / "fallback" / "2").mkdir(parents=True)
    good = (root / "mlp" / "1" / "model.keras").read_bytes()
    (root / "fallback" / "2" / "model.keras").write_bytes(good[: len(good) // 2])
    # Ignored entries: hidden and non-numeric directories must never be loaded.
    (root / ".staging" / "1").mkdir(parents=True)
    (root / "mlp" / "tmp").mkdir()
    return root


def copy_models(model_repo: Path, target: Path, *names: str) -> Path:
    """A repository of its own holding the named models of the shared one (every version)."""
    for name in names:
        shutil.copytree(model_repo / name, target / name)
    return target


def version_dir(root: Path, name: str, version: int, model_file: Path, handler: str, labels: str = "cat dog") -> Path:
    """A version directory: the model file, handler.py and assets/labels.txt."""
    directory = root / name / str(version)
    (directory / "assets").mkdir(parents=True)
    shutil.copy(model_file, directory / "model.keras")
    (directory / "handler.py").write_text(handler)
    (directory / "assets" / "labels.txt").write_text(labels)
    return directory
