#!/usr/bin/env bash
# POST examples/digit.png (base64) to the forkserve "digits" model and print the response.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
image="${1:-$here/digit.png}"
url="${FORKSERVE_URL:-http://127.0.0.1:8000}/v1/models/digits:predict"

b64="$(base64 -w0 "$image")"
curl -sS --fail-with-body -X POST "$url" \
  -H 'Content-Type: application/json' \
  --data-binary @- <<JSON
{"instances": [{"b64": "$b64"}]}
JSON
echo
