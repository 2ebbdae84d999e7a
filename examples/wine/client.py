#!/usr/bin/env python3
"""The wine app's client, unchanged between the Flask app and forkserve: only the URL differs.

    python examples/wine/client.py http://127.0.0.1:5000/predict                  # flask_app.py
    python examples/wine/client.py http://127.0.0.1:8000/v1/models/wine:predict   # forkserve
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent / "sample.json"


def classify(url: str, measurements: dict[str, float]) -> tuple[str, float]:
    """POST the measurements, return (label, score) from the answer."""
    request = urllib.request.Request(url, data=json.dumps(measurements).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    return answer["label"], answer["score"]


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    measurements = json.loads(Path(argv[2] if len(argv) == 3 else SAMPLE).read_text())
    label, score = classify(argv[1], measurements)
    print(f"{label} {score:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
