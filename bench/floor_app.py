"""The HTTP floor: a hello-world Flask app doing the same JSON work as a predict, and no model.

    gunicorn -w 2 -k gthread --threads 8 bench.floor_app:app
"""

from __future__ import annotations

import orjson
from flask import Flask, Response, request

app = Flask(__name__)
ANSWER = orjson.dumps({"predictions": [[0.123456789, -0.987654321]]})


@app.post("/v1/models/<name>:predict")
def predict(name: str) -> Response:
    """Parse the body as JSON and answer a predict-sized JSON body."""
    body = orjson.loads(request.get_data())
    if "instances" not in body:
        return Response(b'{"error": "no instances"}', status=400, mimetype="application/json")
    return Response(ANSWER, mimetype="application/json")
