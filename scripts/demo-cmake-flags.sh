#!/usr/bin/env bash
# The CMake flags of make demo's build, which only has to run on this machine: kernels for this
# machine's GPUs alone (a fraction of the full list's compile time), or no CUDA backend where
# no GPU answers (the server would fall back to its CPU backend anyway). make build, the image
# and CI keep OPSERVE_CUDA_ARCHS' full list.
#
#   scripts/demo-cmake-flags.sh            asks nvidia-smi for the GPUs' compute capabilities
#   scripts/demo-cmake-flags.sh --caps "9.0 8.6" [--known "sm_80 sm_90 ..."]
#                                          decides for those (the test's way in); --known is the
#                                          architectures nvcc compiles for (nvcc --list-gpu-code)
# Prints the flags on one line (each set every time: the demo's tree keeps its cache between
# runs, and the machine may have gained a driver since), and on stderr why.
set -euo pipefail

caps="" known="" given=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --caps) caps=$2; given=1; shift 2 ;;
    --known) known=$2; shift 2 ;;
    *) echo "demo-cmake-flags: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [[ $given -eq 0 ]]; then
  caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null || true)
fi
if [[ -z $known ]]; then
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  known=$("$nvcc" --list-gpu-code 2>/dev/null | tr '\n' ' ' || true)
fi

archs=()
for cap in $caps; do
  if [[ ! $cap =~ ^([0-9]+)\.([0-9]+)$ ]]; then
    echo "demo-cmake-flags: ignoring compute capability '$cap'" >&2
    continue
  fi
  arch=$((BASH_REMATCH[1] * 10 + BASH_REMATCH[2]))
  if [[ $arch -lt 80 ]]; then
    echo "demo-cmake-flags: a GPU of compute capability $cap is older than 8.0, which opserve needs" >&2
    continue
  fi
  [[ " ${archs[*]} " == *" $arch-real "* ]] || archs+=("$arch-real")
done

if [[ ${#archs[@]} -eq 0 ]]; then
  echo "demo-cmake-flags: no usable GPU: CPU backend only" >&2
  echo "-DOPSERVE_CUDA=OFF"
  exit 0
fi
for arch in "${archs[@]}"; do
  if [[ -n $known && " $known " != *" sm_${arch%-real} "* ]]; then
    # Too new for this nvcc: the full list ends in PTX that the driver compiles for it.
    echo "demo-cmake-flags: nvcc cannot compile for sm_${arch%-real}: the full list of architectures" >&2
    echo "-DOPSERVE_CUDA=ON -UOPSERVE_CUDA_ARCHS"
    exit 0
  fi
done
list=$(IFS=';'; echo "${archs[*]}")
echo "demo-cmake-flags: kernels for this machine's GPUs: $list" >&2
echo "-DOPSERVE_CUDA=ON -DOPSERVE_CUDA_ARCHS=$list"
