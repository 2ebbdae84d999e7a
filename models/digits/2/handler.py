"""The digits demo's handler: {"image": "<base64 PNG or JPEG>"} in, {"digit": 3, "probability": 0.9999} out.

Version 1 of the same model takes TensorFlow Serving's `{"instances": [{"b64": ...}]}` and answers
the ten raw probabilities; this version speaks the shape a hand-written Flask app would have used.
The labels come from assets/labels.txt, published with the model.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

MAX_PIXELS = 4_000_000  # refuse an image bomb before decoding it


class Handler:
    """Decode and shrink the image like the training data; answer the best digit and its probability."""

    request_schema = {
        "type": "object",
        "required": ["image"],
        "properties": {"image": {"type": "string", "description": "a PNG or JPEG image, base64"}},
    }
    response_schema = {
        "type": "object",
        "required": ["digit", "probability"],
        "properties": {"digit": {"type": "integer"}, "probability": {"type": "number"}},
    }

    def setup(self, version_dir: Path) -> None:
        """Read the labels and build the example request from the files published with the model."""
        self.labels = [int(line) for line in (version_dir / "assets" / "labels.txt").read_text().split()]
        example_png = (version_dir / "assets" / "example.png").read_bytes()
        self.example = {"image": base64.b64encode(example_png).decode("ascii")}

    def preprocess(self, body: dict[str, Any]) -> dict[str, np.ndarray]:
        """The image as the model's input: grayscale, 8x8 (box filter), scaled to [0, 1], a batch of one."""
        text = body.get("image")
        if not isinstance(text, str):
            raise ValueError('send {"image": "<a PNG or JPEG image, base64>"}')
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("image is not valid base64") from None
        try:
            with Image.open(io.BytesIO(data)) as image:
                if image.width * image.height > MAX_PIXELS:
                    raise ValueError(f"image is {image.width}x{image.height}; at most {MAX_PIXELS} pixels")
                gray = image.convert("L").resize((8, 8), Image.Resampling.BOX)
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError):
            raise ValueError("image is not a PNG or JPEG image") from None
        pixels = np.asarray(gray, dtype=np.float32) / np.float32(255)
        return {"image": pixels[np.newaxis, :, :, np.newaxis]}

    def postprocess(self, outputs: dict[str, np.ndarray], body: dict[str, Any]) -> dict[str, Any]:
        """The digit with the highest probability, as the client expects it."""
        probabilities = outputs["probabilities"][0]
        best = int(np.argmax(probabilities))
        return {"digit": self.labels[best], "probability": probabilities[best]}  # float32: JSON writes 0.99999976
