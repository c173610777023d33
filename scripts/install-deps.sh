#!/usr/bin/env bash
# Installs the Debian 12 packages opserve needs that this machine lacks (through sudo when not
# root). The CUDA toolkit is expected at /usr/local/cuda; without it the build is CPU-only.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libgtest-dev
  # The Open Inference Protocol's HTTP/REST binding (server/http): HTTP(S), JSON, gzip bodies.
  libcivetweb-dev rapidjson-dev libssl-dev zlib1g-dev
  python3 python3-grpcio python3-protobuf
  # The Python client (client/python): installed with pip into a venv over these, offline.
  python3-numpy python3-venv python3-wheel
  # What Triton's tritonclient (from the Python package index, not Debian) imports, for
  # python_tritonclient where OPSERVE_TRITONCLIENT_PATH holds it; grpc-tools generates its
  # tritonclient.grpc modules from proto/inference.
  python3-geventhttpclient python3-gevent python3-rapidjson python3-packaging
  python3-pkg-resources python3-grpc-tools
  patchelf
)
# Tools the deploy and metrics checks in `make test` use (promtool and the Prometheus server,
# yamllint, docker-compose's config check, and HAProxy, which python_proxy runs in front of two
# replicas with a certificate made by openssl).
if [[ "${1:-}" == "--test" ]]; then
  packages+=(prometheus yamllint docker-compose openssl clang-14 libclang-rt-14-dev haproxy)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -q
# Installing the prometheus package must not leave a daemon behind on port 9090.
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
