#!/usr/bin/env python3
"""Train the wine example: a small Keras classifier on scikit-learn's bundled wine data, and its handler's files.

The model sees standardised features; the statistics it was trained with go to
version/assets/stats.json and the class names to version/assets/labels.txt, so the Flask app
(flask_app.py) and the forkserve handler (version/handler.py) both scale requests the same way.
Writes version/model.keras, version/assets/{stats.json,labels.txt} and sample.json. Needs `make install-tools`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_wine  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

HERE = Path(__file__).resolve().parent
VERSION = HERE / "version"
# The data set's three cultivars are unnamed (class_0..2); these names only make the answers readable.
LABELS = ["barolo", "grignolino", "barbera"]
SEED = 1234


def main() -> int:
    """Train, check, and write the model, its statistics, its labels and one sample request."""
    keras.utils.set_random_seed(SEED)
    wine = load_wine()
    names = [name.replace("/", "_") for name in wine.feature_names]
    x_train, x_test, y_train, y_test = train_test_split(
        wine.data.astype(np.float32), wine.target, test_size=0.25, random_state=42, stratify=wine.target)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)

    inputs = keras.Input(shape=(len(names),), name="features")
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(len(LABELS), activation="softmax", name="probabilities")(hidden)
    model = keras.Model(inputs, outputs, name="wine")
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit((x_train - mean) / std, y_train, epochs=60, batch_size=16, verbose=0)
    _, accuracy = model.evaluate((x_test - mean) / std, y_test, verbose=0)
    print(f"test accuracy: {accuracy:.3f}")
    if accuracy < 0.9:
        print("ERROR: accuracy below 0.9", file=sys.stderr)
        return 1

    (VERSION / "assets").mkdir(parents=True, exist_ok=True)
    keras.Model(model.inputs, model.outputs, name="wine").save(VERSION / "model.keras")
    stats = {"features": names, "mean": mean.tolist(), "std": std.tolist()}
    (VERSION / "assets" / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    (VERSION / "assets" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    sample = {name: round(float(value), 3) for name, value in zip(names, x_test[0])}
    (HERE / "sample.json").write_text(json.dumps(sample, indent=1) + "\n")
    print(f"wrote {VERSION}/model.keras, assets/stats.json, assets/labels.txt and {HERE}/sample.json "
          f"(a {LABELS[int(y_test[0])]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
