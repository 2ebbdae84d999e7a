"""The "before": a hand-written Flask + Keras server, the way teams write one before forkserve.

Run it:  gunicorn --chdir examples/wine -b 127.0.0.1:5000 flask_app:app
Ask it:  python examples/wine/client.py http://127.0.0.1:5000/predict

docs/from-flask.md shows where each part of this file goes in forkserve: the model file and
assets are published as a version, the body of predict() becomes version/handler.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
from flask import Flask, jsonify, request

HERE = Path(__file__).resolve().parent
# (1) Load at import: the model, the training statistics and the label map.
model = keras.saving.load_model(HERE / "version" / "model.keras", compile=False)
stats = json.loads((HERE / "version" / "assets" / "stats.json").read_text())
labels = (HERE / "version" / "assets" / "labels.txt").read_text().split()
mean, std = np.asarray(stats["mean"], dtype=np.float32), np.asarray(stats["std"], dtype=np.float32)

app = Flask(__name__)


@app.post("/predict")
def predict():
    body = request.get_json()
    # (2) Decode and scale: named measurements to the model's standardised row.
    missing = [name for name in stats["features"] if name not in body]
    if missing:
        return jsonify({"error": f"missing measurements: {', '.join(missing)}"}), 400
    row = np.asarray([[float(body[name]) for name in stats["features"]]], dtype=np.float32)
    # (3) The model.
    probabilities = model.predict((row - mean) / std, verbose=0)[0]
    # (4) The response shape the clients parse.
    best = int(np.argmax(probabilities))
    return jsonify({"label": labels[best], "score": float(probabilities[best])})
