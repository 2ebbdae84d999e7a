#!/usr/bin/env bash
# Debian packages the end-to-end tests and benchmarks use: prometheus (with promtool), nginx, wrk, hey, kubectl (kustomize).
set -euo pipefail
packages=(prometheus nginx wrk hey kubernetes-client)
tools=(prometheus promtool nginx wrk hey kubectl)
missing=0
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || missing=1
done
[ "$missing" = 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; else
  echo "install-system-deps: not root and no sudo; tests that need ${tools[*]} will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
