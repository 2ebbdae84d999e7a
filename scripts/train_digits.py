#!/usr/bin/env python3
"""Train the small 8x8 digits CNN demo model and write an example request PNG (needs `make install-tools`)."""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "models" / "digits" / "1" / "model.keras"
DEFAULT_EXAMPLE = REPO_ROOT / "examples" / "digit.png"
SEED = 1234
SPLIT_SEED = 42
EXAMPLE_CLASS = 3
UPSCALE = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse command-line arguments."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the .keras model")
    p.add_argument("--example-out", type=Path, default=DEFAULT_EXAMPLE, help="where to write the example PNG")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=SEED)
    return p.parse_args(argv)


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return (x_train, x_test, y_train, y_test) with x as float32 (N, 8, 8, 1) in [0, 1]."""
    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[..., np.newaxis]
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=SPLIT_SEED, stratify=y
    )
    return x_train, x_test, y_train, y_test


def build_model() -> keras.Model:
    """Build the small CNN (plain built-in layers only, no custom objects)."""
    inputs = keras.Input(shape=(8, 8, 1), name="image")
    x = keras.layers.Conv2D(16, 3, activation="relu", padding="same", name="conv1")(inputs)
    x = keras.layers.MaxPooling2D(2, name="pool1")(x)
    x = keras.layers.Conv2D(32, 3, activation="relu", padding="same", name="conv2")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(64, activation="relu", name="dense1")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="probabilities")(x)
    return keras.Model(inputs, outputs, name="digits_cnn")


def atomic_save_model(model: keras.Model, out: Path) -> None:
    """Save the model to a temp file in the target directory, then os.replace it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=".tmp.keras")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        model.save(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(data: bytes, out: Path) -> None:
    """Write bytes to a temp file in the target directory, then os.replace it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, out)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def encode_png(image: np.ndarray) -> bytes:
    """Encode an (8, 8, 1) [0, 1] image as an 8-bit grayscale PNG upscaled with NEAREST."""
    pixels = np.clip(np.round(image[..., 0] * 255.0), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels)  # uint8 2-D -> mode "L"
    img = img.resize((8 * UPSCALE, 8 * UPSCALE), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def server_preprocess(png: bytes) -> np.ndarray:
    """Decode a PNG exactly as the server does: mode L, BILINEAR resize to 8x8, /255 -> (8, 8, 1)."""
    with Image.open(io.BytesIO(png)) as img:
        img = img.convert("L").resize((8, 8), Image.Resampling.BILINEAR)
        arr = np.asarray(img, dtype=np.float32) / 255.0
    return arr[..., np.newaxis]


def main(argv: list[str] | None = None) -> int:
    """Train, evaluate, save the model, and write/verify the example PNG."""
    args = parse_args(argv)
    t0 = time.monotonic()
    keras.utils.set_random_seed(args.seed)
    try:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    except (ImportError, AttributeError):
        pass

    x_train, x_test, y_train, y_test = load_data()
    print(f"train={len(x_train)} test={len(x_test)}")

    model = build_model()
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    model.fit(
        x_train, y_train, epochs=args.epochs, batch_size=args.batch_size, shuffle=True, verbose=0
    )
    _, test_acc = model.evaluate(x_test, y_test, verbose=0)
    print(f"test accuracy: {test_acc:.4f}")

    # Save an uncompiled functional copy (same layers/weights) so the file carries no optimizer state.
    serving = keras.Model(model.inputs[0], model.outputs[0], name=model.name)
    atomic_save_model(serving, args.out)
    print(f"saved model: {args.out} ({args.out.stat().st_size} bytes)")

    reloaded = keras.saving.load_model(args.out, compile=False, safe_mode=True)
    test_probs = np.asarray(reloaded.predict(x_test, verbose=0))
    orig_probs = np.asarray(model.predict(x_test, verbose=0))
    if not np.allclose(test_probs, orig_probs, atol=1e-6):
        print("ERROR: reloaded model disagrees with trained model", file=sys.stderr)
        return 1
    test_pred = test_probs.argmax(axis=1)

    candidates = np.flatnonzero((y_test == EXAMPLE_CLASS) & (test_pred == EXAMPLE_CLASS))
    chosen: tuple[int, bytes, np.ndarray] | None = None
    for idx in candidates:
        png = encode_png(x_test[idx])
        served = server_preprocess(png)
        served_probs = np.asarray(reloaded.predict(served[np.newaxis], verbose=0))[0]
        if int(served_probs.argmax()) == int(test_pred[idx]):
            chosen = (int(idx), png, served_probs)
            break
    if chosen is None:
        print(f"ERROR: no correctly classified class-{EXAMPLE_CLASS} test example survives PNG preprocessing",
              file=sys.stderr)
        return 1
    idx, png, served_probs = chosen
    atomic_write_bytes(png, args.example_out)
    served = server_preprocess(args.example_out.read_bytes())
    max_diff = float(np.abs(served - x_test[idx]).max())
    print(f"example: {args.example_out} (test index {idx}, {len(png)} bytes)")
    print(f"example true label: {int(y_test[idx])}")
    print(f"model prediction on original array: {int(test_pred[idx])}")
    print(f"server-side preprocessing max |diff| vs original array: {max_diff:.4f}")
    print(f"predicted class for PNG (server preprocessing): {int(served_probs.argmax())}")
    print("predicted probabilities for PNG: "
          + np.array2string(served_probs, formatter={"float_kind": "{:.3g}".format}, max_line_width=200))
    print(f"elapsed: {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
