"""The naive server the seeds show: Flask, model loaded at import, `model.predict` per request.

    NAIVE_MODEL=path/model.keras gunicorn -w 2 -k gthread --threads 8 bench.naive_app:app
"""

from __future__ import annotations

import base64
import io
import os

import keras
import numpy as np
from flask import Flask, jsonify, request
from PIL import Image

model = keras.saving.load_model(os.environ["NAIVE_MODEL"], compile=False)
height, width = (model.inputs[0].shape[1], model.inputs[0].shape[2]) if len(model.inputs[0].shape) == 4 else (0, 0)
app = Flask(__name__)


def _row(instance: object) -> np.ndarray:
    """One instance: a b64 image or a list of numbers."""
    if isinstance(instance, dict):
        image = Image.open(io.BytesIO(base64.b64decode(instance["b64"]))).convert("RGB").resize((width, height))
        return np.asarray(image, dtype=np.float32) / 255.0
    return np.asarray(instance, dtype=np.float32)


@app.post("/v1/models/<name>:predict")
def predict(name: str):
    """Decode, `model.predict`, encode: what most tutorials serve."""
    x = np.stack([_row(i) for i in request.get_json(force=True)["instances"]])
    return jsonify({"predictions": model.predict(x, verbose=0).tolist()})
