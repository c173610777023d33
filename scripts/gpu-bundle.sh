#!/usr/bin/env bash
# Packs the server, the CLI and the test binaries with every shared library they need into
# .bundle/opserve-bundle.tgz (or the path given second), for a GPU machine (which has CUDA and
# glibc but no gRPC, Abseil or prometheus-cpp). BUILD must be a test build (OPSERVE_TEST_HOOKS=ON,
# `make test-build`): the GPU suite and opserve-bench's --load_variant use the server's --test_*
# flags.
#  - binaries: bin/, libraries: lib/ (RPATH $ORIGIN/../lib, then /usr/local/cuda/lib64)
#  - capped80/bin/: the server, the CLI and the GPU and e2e suites again, from BUILD-80v, a tree
#    whose kernels are compute_80 PTX only (OPSERVE_CUDA_ARCHS=80-virtual), for
#    `gpu-suite.sh --capped80` (the GPU suite of an A100, run on a newer GPU); they share lib/.
#    OPSERVE_BUNDLE_CAPPED=0 leaves them out (and skips that build).
#  - left out: glibc's own libraries, the driver (libcuda, libnvidia-*) and cuBLAS/cudart,
#    which the GPU machine has in /usr/local/cuda/lib64.
# Environment: CMAKE_FLAGS (the main tree's configure flags, also given to BUILD-80v), JOBS.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-test}
if ! grep -q '^OPSERVE_TEST_HOOKS:BOOL=ON$' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "gpu-bundle: $build is not a test build (OPSERVE_TEST_HOOKS=ON; make test-build makes one)" >&2
  exit 1
fi
bundle=${2:-$root/.bundle/opserve-bundle.tgz}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/opserve/bin" "$stage/opserve/lib"

# copy_bins BUILD DEST TARGET_PATH...: the executables that BUILD has, into DEST, stripped.
# Host debug info is most of the size and the carry is limited; kernels keep their -lineinfo.
all_bins=()
copy_bins() {
  local from=$1 dest=$2 b
  shift 2
  mkdir -p "$dest"
  for b in "$@"; do
    if [[ -x "$from/$b" ]]; then
      cp "$from/$b" "$dest/"
      strip --strip-debug "$dest/$(basename "$b")"
      all_bins+=("$from/$b")
    fi
  done
}
copy_bins "$build" "$stage/opserve/bin" server/opserve client/opserve-cli tests/gpu/gpu_test \
  tests/e2e/e2e_test tests/unit/unit_test tests/support/opserve-op-table \
  bench/opserve-bench bench/diag/opserve-row-patterns \
  bench/diag/opserve-execute-floor bench/diag/opserve-matmul-sweep bench/diag/opserve-graph-marks

# The Python test of the Open Inference Protocol (gpu-suite.sh runs it against the CUDA backend):
# its sources and protos under python/, and the stub generators it runs, which the GPU machine lacks.
# It reads the op table through bin/opserve-op-table (tests/python/op_table.py), on its PATH.
copy_bins / "$stage/opserve/bin" usr/bin/protoc usr/bin/grpc_python_plugin
# HAProxy for scripts/proxy-bench.sh (replicas behind deploy/proxy/haproxy.cfg), where installed.
[[ -x /usr/sbin/haproxy ]] && copy_bins / "$stage/opserve/bin" usr/sbin/haproxy
for f in tests/python/kserve_test.py tests/python/kserve_support.py tests/python/client_support.py \
    tests/python/op_table.py \
    tests/support/e2e_script.py proto/inference/grpc_service.proto proto/opserve/v1/opserve.proto; do
  install -D -m 644 "$root/$f" "$stage/opserve/python/$f"
done

capped_targets=(opserve opserve-cli gpu_test e2e_test)
if [[ ${OPSERVE_BUNDLE_CAPPED:-1} != 0 ]]; then
  capped="$build-80v"
  # shellcheck disable=SC2086  # CMAKE_FLAGS is a list of flags
  cmake -S "$root" -B "$capped" -G Ninja ${CMAKE_FLAGS:-} -DOPSERVE_TEST_HOOKS=ON \
    -DOPSERVE_CUDA_ARCHS=80-virtual >/dev/null
  ninja -C "$capped" -j "${JOBS:-$(nproc)}" "${capped_targets[@]}"
  copy_bins "$capped" "$stage/opserve/capped80/bin" server/opserve client/opserve-cli \
    tests/gpu/gpu_test tests/e2e/e2e_test
fi

skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libcuda\.so|libnvidia|libcublas|libcudart)'
for b in "${all_bins[@]}"; do
  ldd "$b" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    if [[ "$name" =~ $skip ]]; then continue; fi
    [[ -e "$stage/opserve/lib/$name" ]] || cp -L "$path" "$stage/opserve/lib/$name"
  done
done
# RUNPATH is not transitive: every bundled library looks next to itself, binaries look in lib/.
for l in "$stage"/opserve/lib/*; do patchelf --set-rpath '$ORIGIN' "$l"; done
for b in "$stage"/opserve/bin/*; do patchelf --set-rpath '$ORIGIN/../lib:/usr/local/cuda/lib64' "$b"; done
if [[ -d "$stage/opserve/capped80/bin" ]]; then
  for b in "$stage"/opserve/capped80/bin/*; do
    patchelf --set-rpath '$ORIGIN/../../lib:/usr/local/cuda/lib64' "$b"
  done
fi
cp "$root/scripts/gpu-suite.sh" "$root/scripts/gpu-demo.sh" "$stage/opserve/"
mkdir -p "$(dirname "$bundle")"
tar czf "$bundle" -C "$stage" opserve
du -sh "$bundle" "$stage/opserve"
