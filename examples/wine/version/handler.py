"""The wine model's handler: named measurements in, {"label": ..., "score": ...} out, as flask_app.py answered.

The model was trained on standardised features: the statistics it was trained with
(assets/stats.json) and the class names (assets/labels.txt) are published with it, so a
retrained version brings its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


class Handler:
    """Scale the measurements like the training data; answer the most likely cultivar and its probability."""

    response_schema = {
        "type": "object",
        "required": ["label", "score"],
        "properties": {"label": {"type": "string"}, "score": {"type": "number"}},
    }

    def setup(self, version_dir: Path) -> None:
        """Read the statistics and labels; the example request is the training mean."""
        stats = json.loads((version_dir / "assets" / "stats.json").read_text())
        self.features: list[str] = stats["features"]
        self.mean = np.asarray(stats["mean"], dtype=np.float32)
        self.std = np.asarray(stats["std"], dtype=np.float32)
        self.labels = (version_dir / "assets" / "labels.txt").read_text().split()
        self.example = dict(zip(self.features, stats["mean"]))
        self.request_schema = {
            "type": "object",
            "required": self.features,
            "properties": {name: {"type": "number"} for name in self.features},
        }

    def preprocess(self, body: dict[str, Any]) -> dict[str, np.ndarray]:
        """The named measurements as one standardised row of the model's `features` input."""
        missing = [name for name in self.features if name not in body]
        if missing:
            raise ValueError(f"missing measurements: {', '.join(missing)}")
        try:
            row = np.asarray([[float(body[name]) for name in self.features]], dtype=np.float32)
        except (TypeError, ValueError):
            raise ValueError("every measurement must be a number") from None
        return {"features": (row - self.mean) / self.std}

    def postprocess(self, outputs: dict[str, np.ndarray], body: dict[str, Any]) -> dict[str, Any]:
        """The label with the highest probability, in the shape the old clients parse."""
        probabilities = outputs["probabilities"][0]
        best = int(np.argmax(probabilities))
        return {"label": self.labels[best], "score": float(probabilities[best])}
