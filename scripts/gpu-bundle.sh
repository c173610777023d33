#!/usr/bin/env bash
# Packs the server, the CLI and the test binaries with every shared library they need into
# .bundle/opserve-bundle.tgz (or the path given second), for the lent GPU machine (which has CUDA and glibc but no gRPC,
# Abseil or prometheus-cpp). See ../shared/GPU.md.
#  - binaries: bin/, libraries: lib/ (RPATH $ORIGIN/../lib, then /usr/local/cuda/lib64)
#  - left out: glibc's own libraries, the driver (libcuda, libnvidia-*) and cuBLAS/cudart,
#    which the GPU machine has in /usr/local/cuda/lib64.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${2:-$root/.bundle/opserve-bundle.tgz}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/opserve/bin" "$stage/opserve/lib"

bins=()
for b in server/opserve client/opserve-cli tests/gpu/gpu_test tests/e2e/e2e_test tests/unit/unit_test \
         bench/opserve-bench bench/diag/opserve-row-patterns bench/diag/opserve-execute-floor; do
  if [[ -x "$build/$b" ]]; then bins+=("$build/$b"); fi
done
cp "${bins[@]}" "$stage/opserve/bin/"
# Host debug info is most of the size and the carry is limited; kernels keep their -lineinfo.
strip --strip-debug "$stage"/opserve/bin/*

skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libcuda\.so|libnvidia|libcublas|libcudart)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    if [[ "$name" =~ $skip ]]; then continue; fi
    [[ -e "$stage/opserve/lib/$name" ]] || cp -L "$path" "$stage/opserve/lib/$name"
  done
done
# RUNPATH is not transitive: every bundled library looks next to itself, binaries look in lib/.
for l in "$stage"/opserve/lib/*; do patchelf --set-rpath '$ORIGIN' "$l"; done
for b in "$stage"/opserve/bin/*; do patchelf --set-rpath '$ORIGIN/../lib:/usr/local/cuda/lib64' "$b"; done
cp "$root/scripts/gpu-suite.sh" "$root/scripts/gpu-demo.sh" "$stage/opserve/"
mkdir -p "$(dirname "$bundle")"
tar czf "$bundle" -C "$stage" opserve
du -sh "$bundle" "$stage/opserve"
