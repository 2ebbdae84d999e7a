"""The benchmark's models (Keras 3): a small CNN and a heavy one on 100x100x3 images, an MLP on 20 floats.

`cnn_heavy` is the CNN whose TensorFlow call dominates a request (issue 20's): about 1.8 ms at batch 1
and 0.5-0.6 ms per sample batched on one core, where `cnn` costs about 0.5 and 0.35. Its dense layer
reads 8 M weights per call, so a larger batch costs much less per sample: the workload that shows
whether a server's batches grow with the load.
"""

from __future__ import annotations

from pathlib import Path

CNN_SHAPE = (100, 100, 3)
MLP_FEATURES = 20


WORKLOADS = ("cnn", "mlp", "cnn_heavy")


def build(repository: Path, names: tuple[str, ...] = ("cnn", "mlp")) -> dict[str, Path]:
    """Save `NAME/1/model.keras` under `repository` for each of `names`; returns their files."""
    import keras

    keras.utils.set_random_seed(0)
    cnn = keras.Sequential(
        [
            keras.Input(shape=CNN_SHAPE, name="image"),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax", name="probabilities"),
        ]
    )
    mlp = keras.Sequential(
        [
            keras.Input(shape=(MLP_FEATURES,), name="features"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(2, name="logits"),
        ]
    )
    cnn_heavy = keras.Sequential(
        [
            keras.Input(shape=CNN_SHAPE, name="image"),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(64, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10, activation="softmax", name="probabilities"),
        ]
    )
    built = {"cnn": cnn, "mlp": mlp, "cnn_heavy": cnn_heavy}
    files = {}
    for name in names:
        model = built[name]
        path = repository / name / "1" / "model.keras"
        path.parent.mkdir(parents=True, exist_ok=True)
        model.save(path)
        files[name] = path
    return files
