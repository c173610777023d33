#!/usr/bin/env bash
# The GPU suite, on a machine with an NVIDIA GPU: every op x algorithm x dtype against the CPU
# reference (gpu_test), then the end-to-end service tests against the CUDA backend (e2e_test
# with OPSERVE_TEST_DEVICE=cuda, and tests/python/kserve_test.py), then compute-sanitizer
# memcheck and racecheck over a kernel subset when asked (--sanitize). Ends with one line:
# "N passed, N failed, N skipped".
#
# Capped mode, the GPU suite of an older GPU on this one: every server it starts gets
# --max_compute_capability, and the in-process kernel tests create their backend with the same
# cap ($OPSERVE_TEST_MAX_COMPUTE_CAPABILITY), so rows above it are skipped, never run.
#   --device=D     the GPU the servers run on (default cuda:0; cuda:1 runs the suite on a
#                  second GPU, where every CUDA call must find its own device)
#   --max-cc=X.Y   cap the suite at X.Y (the binaries as they are)
#   --shards=N     run the kernel table's cases (Table/*) as N gtest shards at once: their CPU
#                  references, not the GPU, bound that part, and a GPU host has the cores
#   --capped80     the bundle's capped80/ binaries (kernels built as compute_80 PTX only,
#                  OPSERVE_CUDA_ARCHS=80-virtual, so the driver JIT-compiles them for this GPU)
#                  with --max-cc=8.0: what an A100 would run, from the code an A100 would load
#
# From a bundle (scripts/gpu-bundle.sh): tar xzf opserve-bundle.tgz && opserve/gpu-suite.sh
# From a build tree: scripts/gpu-suite.sh BUILD_DIR (a test build, OPSERVE_TEST_HOOKS=ON, as
# `make test-build` makes in build-test: the fault tests use the server's --test_* flags)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sanitize=0 max_cc="" capped80=0 shards=1 build=build-test device=cuda:0
for arg in "$@"; do
  case $arg in
    --sanitize) sanitize=1 ;;
    --max-cc=*) max_cc=${arg#--max-cc=} ;;
    --capped80) capped80=1 max_cc=8.0 ;;
    --shards=*) shards=${arg#--shards=} ;;
    --device=*) device=${arg#--device=} ;;
    -*) echo "gpu-suite: unknown option $arg" >&2; exit 2 ;;
    *) build=$arg ;;
  esac
done
if [[ $capped80 -eq 1 ]]; then
  bin="$here/capped80/bin"
  [[ -d "$bin" ]] || bin="$build-80v"  # a build tree: gpu-bundle.sh builds BUILD-80v beside it
elif [[ -d "$here/bin" ]]; then
  bin="$here/bin"
else
  bin="$build"
fi
find_bin() { for p in "$bin/$1" "$bin/tests/gpu/$1" "$bin/tests/e2e/$1" "$bin/server/$1" "$bin/client/$1"; do [[ -x "$p" ]] && { echo "$p"; return; }; done; }
out=${OUT:-/tmp/opserve-gpu-suite}
mkdir -p "$out"
export OPSERVE_BIN=$(find_bin opserve) OPSERVE_CLI=$(find_bin opserve-cli) OPSERVE_TEST_DEVICE=$device
start=$SECONDS

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
if [[ -n "$max_cc" ]]; then
  export OPSERVE_TEST_MAX_COMPUTE_CAPABILITY=$max_cc
  echo "gpu-suite: capped at compute capability $max_cc, binaries from $bin"
  # PTX-only kernels are compiled by the driver at first load; its cache (kept out of $OUT, which
  # comes back to the caller) lets every later process load them at once. The server's start-up
  # warm-up loads every kernel it offers: start it once, unhurried, before the tests, whose
  # servers must listen within 20 s, and once more to show the cache works.
  export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-/tmp/opserve-jit-cache} CUDA_CACHE_MAXSIZE=4294967296
  for pass in first cached; do
    t0=$SECONDS
    log="$out/jit_$pass.log"
    "$OPSERVE_BIN" --device=cuda --host=127.0.0.1 --port=0 --metrics_port=-1 --http_port=-1 \
      --max_compute_capability="$max_cc" > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q "listening on" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 1; done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    echo "gpu-suite: server start ($pass JIT pass): $((SECONDS - t0)) s; $(grep -E 'backend cuda|warm-up' "$log" | tr '\n' ' ')"
  done
fi
status=0
run() {  # name, binary, args...
  local name=$1 b=$2; shift 2
  [[ -n "$b" ]] || { echo "gpu-suite: $name missing"; status=1; return; }
  echo "== $name"
  "$b" --gtest_output="xml:$out/$name.xml" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | head -5
  grep -E '^\[  FAILED  \]' "$out/$name.log" | head -40
  [[ $rc -eq 0 ]] || status=1
}
# The summary of every test case run so far (gtest XML under $out): "N passed, N failed, N skipped".
summary() {
  python3 - "$out" <<'PY'
import sys, glob, xml.etree.ElementTree as ET
p = f = s = 0
for x in glob.glob(sys.argv[1] + "/*.xml"):
    for tc in ET.parse(x).getroot().iter("testcase"):
        if tc.find("failure") is not None: f += 1
        elif tc.get("result") == "skipped" or tc.find("skipped") is not None: s += 1
        else: p += 1
print(f"{p} passed, {f} failed, {s} skipped")
PY
}
if [[ $shards -gt 1 ]]; then
  # The table's cases in shards side by side (each its own XML, summed by `summary`), then the rest.
  echo "== gpu_test (Table/* in $shards shards)"
  gpu_test_bin=$(find_bin gpu_test)
  pids=()
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$gpu_test_bin" --gtest_filter='Table/*' \
      --gtest_output="xml:$out/gpu_test_table$i.xml" > "$out/gpu_test_table$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || status=1
    grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/gpu_test_table$i.log" | head -5
    grep -E '^\[  FAILED  \]' "$out/gpu_test_table$i.log" | head -40
  done
  run gpu_test "$gpu_test_bin" --gtest_filter='-Table/*'
else
  run gpu_test "$(find_bin gpu_test)"
fi
run e2e_cuda "$(find_bin e2e_test)"
# The Open Inference Protocol's Python client test (tests/python/kserve_test.py, written from the
# specification) against the CUDA backend. It needs python3 with grpc and numpy; it generates its
# stubs with protoc and grpc_python_plugin, which a bundle carries in bin/. Without them it counts
# as one skipped test, never as passed.
py_root=$here/python
[[ -d "$py_root" ]] || py_root=$(cd "$here/.." && pwd)  # scripts/ of a checkout
if python3 -c "import grpc, numpy" 2>/dev/null && PATH="$here/bin:$PATH" command -v protoc grpc_python_plugin >/dev/null; then
  echo "== python_kserve"
  PATH="$here/bin:$PATH" OPSERVE_TEST_DEVICE=$device python3 "$py_root/tests/python/kserve_test.py" \
    --opserve "$OPSERVE_BIN" --proto-root "$py_root/proto" --work-dir "$out/python_kserve" \
    --junit-xml "$out/python_kserve.xml" > "$out/python_kserve.log" 2>&1 || status=1
  grep -E '^(Ran |OK|FAILED)' "$out/python_kserve.log"
  grep -E '^(FAIL|ERROR):' "$out/python_kserve.log" | head -20
else
  echo "gpu-suite: python_kserve skipped: python3 with grpc and numpy, protoc or grpc_python_plugin missing"
  echo '<testsuites><testsuite name="python_kserve"><testcase classname="python_kserve" name="all"><skipped message="python3 with grpc and numpy, protoc or grpc_python_plugin missing"/></testcase></testsuite></testsuites>' > "$out/python_kserve.xml"
fi
# Printed before the sanitizers too, which can take minutes: a run cut short keeps the count.
summary

if [[ $sanitize -eq 1 ]] && command -v compute-sanitizer >/dev/null; then
  # Small shapes: the sanitizers slow kernels by 10-100x.
  filter='Table/GpuKernelTest.MatchesCpuReference/*_1x1*:Table/GpuKernelTest.MatchesCpuReference/*_33*:Table/GpuKernelTest.MatchesCpuReference/*_65x129*:Table/GpuKernelTest.MatchesCpuReference/*_127x129_129x131*:Table/GpuKernelTest.MatchesCpuReference/*_10x2048*:Table/GpuKernelTest.MatchesCpuReference/sum_*_16777219:Table/GpuKernelTest.MatchesCpuReference/transpose_*_1001x1028*:Table/GpuKernelTest.MatchesCpuReference/transpose_*_1000x1028*:Table/GpuKernelTest.MatchesCpuReference/row_*_300x8195*'
  # The smallest shapes that reach the large configurations: tensor_core_sm90a (clusters, TMA
  # multicast, mbarriers) and warp_tiled's 256 x 128 x 16 tiles; smaller ones fall back.
  filter+=':Table/GpuKernelTest.MatchesCpuReference/matmul_tensor_core_sm90a_*_2048x512_512x2048'
  filter+=':Table/GpuKernelTest.MatchesCpuReference/matmul_warp_tiled_*_4104x1032_1032x4112'
  # The timestamp and host-copy kernels a replayed graph runs (server/engine/cuda_node_timer.h).
  filter+=':GpuGraphMarks.*'
  # racecheck leaves out the cuBLAS rows: on the H100 it reports hazards inside cuBLAS's own
  # nvjet_sm90 GEMM kernels (NVIDIA's TMA/wgmma code; excluding them by kernel name instead made
  # the sanitizer fail on a hardware exception). memcheck covers them.
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool"
    f=$filter
    [[ $tool == racecheck ]] && f="$filter-*cublas*"
    compute-sanitizer --tool $tool --error-exitcode 9 "$(find_bin gpu_test)" --gtest_filter="$f" > "$out/sanitizer_$tool.log" 2>&1
    rc=$?
    echo "compute-sanitizer $tool rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer_$tool.log" | tail -1)"
    [[ $rc -eq 0 ]] || status=1
  done
fi

summary
echo "gpu-suite: $((SECONDS - start)) s${max_cc:+ (capped at $max_cc)}"
exit $status
