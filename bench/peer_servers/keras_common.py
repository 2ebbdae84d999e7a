"""What both peer runtimes share: a Keras model behind a warm concrete function, images decoded like forkserve.

Imported inside the peers' own virtual environments (.peers/*), never by forkserve.
"""

from __future__ import annotations

import base64
import io

import numpy as np


class WarmModel:
    """A .keras file as a concrete function over a float32 batch, warmed at batch sizes 1..32."""

    def __init__(self, path: str) -> None:
        import keras
        import tensorflow as tf

        model = keras.saving.load_model(path, compile=False)
        shape = tuple(model.inputs[0].shape[1:])
        self.image_size = (shape[1], shape[0]) if len(shape) == 3 else None
        spec = tf.TensorSpec((None, *shape), tf.float32)
        self._function = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
        self._tf = tf
        for batch in (1, 2, 4, 8, 16, 32):
            self(np.zeros((batch, *shape), np.float32))

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return self._function(self._tf.constant(batch)).numpy()

    def decode_images(self, encoded: list) -> np.ndarray:
        """Base64 JPEG/PNG strings to a float32 batch in [0, 1], RGB, resized to the input (forkserve's defaults)."""
        from PIL import Image

        rows = []
        for text in encoded:
            raw = base64.b64decode(text if isinstance(text, (str, bytes)) else text["b64"])
            with Image.open(io.BytesIO(raw)) as image:
                rows.append(np.asarray(image.convert("RGB").resize(self.image_size, Image.Resampling.BILINEAR),
                                       dtype=np.float32) / np.float32(255))
        return np.stack(rows)
