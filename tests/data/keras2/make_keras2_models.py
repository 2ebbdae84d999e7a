"""Generate small legacy Keras 2 (tf_keras) test models and reference outputs.

Run with a venv holding tensorflow-cpu==2.21.0 and tf-keras==2.21.0 (NOT the server venv):
    TF_USE_LEGACY_KERAS=1 /tmp/k2venv/bin/python tests/data/keras2/make_keras2_models.py [OUT_DIR]
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

SEED = 1234


def _init(seed: int) -> keras.initializers.Initializer:
    """Return a seeded uniform initializer (used for kernels and biases alike)."""
    return keras.initializers.RandomUniform(-0.5, 0.5, seed=seed)


def build_cnn() -> keras.Model:
    """Build the Sequential CNN: (8, 8, 1) -> Conv2D(4) -> Flatten -> Dense(3, softmax)."""
    return keras.Sequential(
        [
            keras.Input(shape=(8, 8, 1), dtype="float32", name="image"),
            keras.layers.Conv2D(
                4, 3, activation="relu", padding="same", name="conv",
                kernel_initializer=_init(SEED + 1), bias_initializer=_init(SEED + 2),
            ),
            keras.layers.Flatten(name="flatten"),
            keras.layers.Dense(
                3, activation="softmax", name="probs",
                kernel_initializer=_init(SEED + 3), bias_initializer=_init(SEED + 4),
            ),
        ],
        name="cnn",
    )


def build_multi() -> keras.Model:
    """Build the functional two-input model: concat(tag(2), signal(3)) -> Dense(2)."""
    tag = keras.Input(shape=(2,), dtype="float32", name="tag")
    signal = keras.Input(shape=(3,), dtype="float32", name="signal")
    x = keras.layers.Concatenate(name="concat")([tag, signal])
    out = keras.layers.Dense(
        2, name="score", kernel_initializer=_init(SEED + 5), bias_initializer=_init(SEED + 6)
    )(x)
    return keras.Model(inputs={"tag": tag, "signal": signal}, outputs={"score": out}, name="multi")


def build_lambda() -> keras.Model:
    """Build a tiny model with a Python-lambda Lambda layer (unsafe for Keras 3 safe_mode)."""
    inp = keras.Input(shape=(3,), dtype="float32", name="x")
    out = keras.layers.Lambda(lambda x: x * 2, name="double")(inp)
    return keras.Model(inp, out, name="lambda_model")


def main(out_dir: Path) -> None:
    """Write cnn.h5, cnn_savedmodel/, multi.h5, lambda.h5 and reference.npz into out_dir."""
    keras.utils.set_random_seed(SEED)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)

    cnn = build_cnn()
    cnn.save(out_dir / "cnn.h5", save_format="h5", include_optimizer=False)
    sm_dir = out_dir / "cnn_savedmodel"
    if sm_dir.exists():
        shutil.rmtree(sm_dir)
    tf.saved_model.save(cnn, str(sm_dir))

    multi = build_multi()
    multi.save(out_dir / "multi.h5", save_format="h5", include_optimizer=False)

    build_lambda().save(out_dir / "lambda.h5", save_format="h5", include_optimizer=False)

    cnn_x = rng.standard_normal((2, 8, 8, 1)).astype(np.float32)
    multi_tag = rng.standard_normal((2, 2)).astype(np.float32)
    multi_signal = rng.standard_normal((2, 3)).astype(np.float32)
    cnn_y = cnn(cnn_x, training=False).numpy()
    multi_y = multi({"tag": multi_tag, "signal": multi_signal}, training=False)["score"].numpy()
    np.savez(
        out_dir / "reference.npz",
        cnn_x=cnn_x, cnn_y=cnn_y,
        multi_tag=multi_tag, multi_signal=multi_signal, multi_y=multi_y,
    )
    print(f"wrote Keras 2 test models to {out_dir}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
