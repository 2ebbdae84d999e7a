#!/usr/bin/env bash
# Debian packages the end-to-end tests and benchmarks use: prometheus (with promtool), nginx, wrk, hey,
# h2load (nghttp2-client, bench.grpc_load's gRPC load), kubectl (kubernetes-client, for `kubectl
# kustomize`), openssl and curl (the TLS tests' certificates and an HTTPS client). Only the packages whose tool is missing are installed: a kubectl from elsewhere
# (google-cloud-sdk's) is kept, Debian's would conflict with it.
set -euo pipefail
declare -A package_of=([prometheus]=prometheus [promtool]=prometheus [nginx]=nginx [wrk]=wrk [hey]=hey [h2load]=nghttp2-client [kubectl]=kubernetes-client [openssl]=openssl [curl]=curl)
missing=()
for tool in prometheus promtool nginx wrk hey h2load kubectl openssl curl; do
  if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
    missing+=("${package_of[$tool]}")
  fi
done
[ "${#missing[@]}" = 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; else
  echo "install-system-deps: not root and no sudo; tests that need ${missing[*]} will be skipped" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
