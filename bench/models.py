"""The benchmark's models: a small CNN on 100x100x3 images and an MLP on 20 floats (Keras 3)."""

from __future__ import annotations

from pathlib import Path

CNN_SHAPE = (100, 100, 3)
MLP_FEATURES = 20


def build(repository: Path) -> dict[str, Path]:
    """Save `cnn/1/model.keras` and `mlp/1/model.keras` under `repository`; returns their files."""
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
    files = {}
    for name, model in (("cnn", cnn), ("mlp", mlp)):
        path = repository / name / "1" / "model.keras"
        path.parent.mkdir(parents=True, exist_ok=True)
        model.save(path)
        files[name] = path
    return files
