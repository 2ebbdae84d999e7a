#!/usr/bin/env bash
# Ask the demo "digits" model what examples/digit.png shows, both ways it is served:
#   version 2 (the default) has a handler:  {"image": "<base64>"}  ->  {"digit": 3, "probability": ...}
#   version 1 is the plain model:            TF Serving's {"instances": [{"b64": ...}]}  ->  {"predictions": [[...]]}
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
image="${1:-$here/digit.png}"
base="${FORKSERVE_URL:-http://127.0.0.1:8000}/v1/models/digits"
b64="$(base64 -w0 "$image")"

curl -sS --fail-with-body -H 'Content-Type: application/json' --data-binary @- "$base:predict" <<JSON
{"image": "$b64"}
JSON
echo
curl -sS --fail-with-body -H 'Content-Type: application/json' --data-binary @- "$base/versions/1:predict" <<JSON
{"instances": [{"b64": "$b64"}]}
JSON
echo
