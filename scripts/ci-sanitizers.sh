#!/usr/bin/env bash
# CI: the unit, end-to-end and client suites on the CPU backend under sanitizers, in two
# builds of their own:
#   asan  build-asan  -DOPSERVE_SANITIZE='address;undefined'  (ASan + LeakSanitizer + UBSan)
#   tsan  build-tsan  -DOPSERVE_SANITIZE=thread
#
#   scripts/ci-sanitizers.sh [asan] [tsan]        (default: both, asan first)
#
# Each builds opserve, opserve-cli and the suites' binaries, then runs `ctest -L unit` and the
# suites that drive the server over gRPC: labels e2e, client and hardening (less metrics_e2e,
# which needs Prometheus and has a step of its own, and the soak test). Their fixtures start the
# sanitized `opserve`, which inherits the options below. Every sanitizer report, from a test binary or from a server process, goes to a
# file under $build/sanitizer-logs (log_path), so that a report fails the step even when the test
# around it passed: a leak reported as a server exits, an error in a server the test then kills.
#
# ASan+UBSan: ASAN_OPTIONS=detect_leaks=1:halt_on_error=1, LSAN_OPTIONS with tests/fuzz/lsan.supp
# (c-ares' resolver memory only), UBSAN_OPTIONS with tests/fuzz/ubsan.supp (RapidJSON's parse
# stack only) and print_stacktrace=1:
# halt_on_error=1; any report fails.
#
# TSan: TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 and tests/fuzz/tsan.supp (races inside
# gRPC, Abseil and protobuf only; no entry names opserve code). The policy below is the project's
# decision for TSan in CI, not a stopgap:
#  - The unit suite has no gRPC in it: it is strict, every report fails.
#  - The gRPC-driven suites run over Debian's gRPC, Abseil and protobuf, which are not built
#    with TSan. TSan cannot see the synchronization inside them, so every object gRPC hands from
#    one of its threads to another (a reactor, a request, a response) shows up as a data race in
#    opserve code too. Suppressing those would mean suppressing opserve frames, and that would
#    hide opserve's real races as well. So there: the tests must pass, any report that does not
#    hinge on happens-before (lock-order inversion, mutex misuse, signal-unsafe calls, thread
#    leaks) fails, and data races are reported as advisory, with their counts and the most
#    frequent stacks. TSAN_GRPC_STRICT=1 makes every report fatal, for use with a TSan-built gRPC.
#
# Compiler: clang-14, as for the fuzz targets. (GCC 12's TSan runtime takes about half a second
# per report, which under the advisory reports above pushes the e2e tests past their deadlines.)
#
# Environment: SAN_CC / SAN_CXX (default clang-14 / clang++-14), JOBS (2), TSAN_GRPC_STRICT,
# SAN_TARGETS and SAN_GRPC_LABELS (the defaults above).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

variants=("$@")
[[ ${#variants[@]} -gt 0 ]] || variants=(asan tsan)
cc=${SAN_CC:-clang-14}
cxx=${SAN_CXX:-clang++-14}
jobs=${JOBS:-2}
# The suites: ctest labels, and the targets they need (those this tree lacks are skipped):
# besides the test binaries, the tools the suites run (the dtype table's dump, the op table's
# tool the Python suites read) and the toy-op server the contract tests also run against.
targets=(${SAN_TARGETS:-opserve opserve-cli unit_test e2e_test client_tests hardening_test
  hardening_upload_helper dtype_table opserve-op-table opserve_toy e2e_toy_op_test})
grpc_labels=${SAN_GRPC_LABELS:-e2e|client|hardening}

for tool in "$cc" "$cxx" cmake ninja ctest; do
  command -v "$tool" >/dev/null || { echo "ci-sanitizers: $tool is missing (scripts/install-deps.sh --test)" >&2; exit 1; }
done

declare -A timing status
overall=0

# Prints every sanitizer report under $1 and returns 1 if there is one.
check_logs() {
  local logs=$1 found=0 f
  for f in "$logs"/*; do
    [[ -s $f ]] || continue
    found=1
    echo "ci-sanitizers: sanitizer report $f:" >&2
    cat "$f" >&2
  done
  return $found
}

# TSan reports of the gRPC-driven suites (see the header): returns 1 for any report that does not
# hinge on happens-before (lock-order inversion, mutex misuse, signal-unsafe calls, thread leaks)
# and, with TSAN_GRPC_STRICT=1, for data races too; otherwise data races are listed, not fatal.
triage_tsan_grpc() {
  local logs=$1 total fatal
  total=$(cat "$logs"/* 2>/dev/null | grep -c '^WARNING: ThreadSanitizer:' || true)
  fatal=$(cat "$logs"/* 2>/dev/null | grep '^WARNING: ThreadSanitizer:' |
          grep -vcE 'ThreadSanitizer: data race( on vptr)? ' || true)
  [[ $total -gt 0 ]] || return 0
  echo "ci-sanitizers: [tsan] gRPC-driven suites: $total reports ($fatal not data races) in $(ls "$logs" | wc -l) processes; the most frequent:"
  cat "$logs"/* | grep -E '^SUMMARY: ThreadSanitizer:' | sed -E 's/ \(BuildId[^)]*\)//; s/\(pid=[0-9]+\)//' |
    sort | uniq -c | sort -rn | head -n 15
  if [[ $fatal -gt 0 || ${TSAN_GRPC_STRICT:-0} == 1 ]]; then
    for f in $(grep -lE '^WARNING: ThreadSanitizer:' "$logs"/*); do
      if [[ ${TSAN_GRPC_STRICT:-0} == 1 ]] || grep '^WARNING: ThreadSanitizer:' "$f" | grep -vqE 'data race( on vptr)? '; then
        echo "ci-sanitizers: TSan report $f:" >&2
        cat "$f" >&2
      fi
    done
    return 1
  fi
  echo "ci-sanitizers: [tsan] data races under Debian's uninstrumented gRPC are advisory (TSAN_GRPC_STRICT=1 makes them fatal); logs in $logs"
  return 0
}

run_variant() {
  local v=$1 build san
  case $v in
    asan) build=build-asan; san='address;undefined' ;;
    tsan) build=build-tsan; san=thread ;;
    *) echo "ci-sanitizers: unknown variant '$v' (asan or tsan)" >&2; return 2 ;;
  esac
  local start=$(date +%s)
  # A build dir configured with another compiler would be half reused: start it over.
  if [[ -f $build/CMakeCache.txt ]] &&
     ! grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=$(command -v "$cxx")\$" "$build/CMakeCache.txt"; then
    rm -rf "$build"
  fi
  mkdir -p "$build"
  echo "ci-sanitizers: [$v] configuring $build ($cxx, -fsanitize=${san/;/,})"
  # RelWithDebInfo with -O1: sanitizers want optimization on, and -O1 compiles faster than -O2.
  # The test hooks on: the e2e and hardening suites' fault and unrun tests use them.
  CC=$cc CXX=$cxx cmake -S . -B "$build" -G Ninja -Wno-dev \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO='-O1 -g -DNDEBUG' \
    -DOPSERVE_CUDA=OFF -DOPSERVE_TEST_HOOKS=ON -DOPSERVE_SANITIZE="$san" \
    >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; return 1; }
  # -k 0: a target that does not build fails the step, and the suites still run on the rest.
  local rc=0 t known=() all
  all=$(ninja -C "$build" -t targets all | cut -d: -f1)
  for t in "${targets[@]}"; do
    if grep -qxF "$t" <<<"$all"; then known+=("$t"); else echo "ci-sanitizers: [$v] no target $t here; skipped"; fi
  done
  ninja -C "$build" -j "$jobs" -k 0 "${known[@]}" || { rc=1; echo "ci-sanitizers: [$v] build failed" >&2; }
  local built=$(date +%s)

  local logs=$root/$build/sanitizer-logs
  rm -rf "$logs"
  mkdir -p "$logs/strict" "$logs/grpc"
  case $v in
    asan)
      # One log_path for both: the combined runtime takes it from whichever options it reads last.
      export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:log_path=$logs/strict/asan-ubsan"
      # c-ares' resolver memory only (tests/fuzz/lsan.supp says why).
      export LSAN_OPTIONS="suppressions=$root/tests/fuzz/lsan.supp:print_suppressions=0"
      # RapidJSON's null-stack arithmetic only (tests/fuzz/ubsan.supp says why).
      export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/fuzz/ubsan.supp:log_path=$logs/strict/asan-ubsan"
      run_suites "$build" all || rc=1
      unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS
      check_logs "$logs/strict" || rc=1
      ;;
    tsan)
      local supp=$root/tests/fuzz/tsan.supp
      export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp:log_path=$logs/strict/tsan"
      run_suites "$build" unit || rc=1
      check_logs "$logs/strict" || rc=1
      # The servers must survive advisory reports and still exit 0 where the tests expect it.
      local halt=0 exitcode=0
      [[ ${TSAN_GRPC_STRICT:-0} == 1 ]] && halt=1 exitcode=66
      export TSAN_OPTIONS="halt_on_error=$halt:exitcode=$exitcode:second_deadlock_stack=1:suppressions=$supp:log_path=$logs/grpc/tsan"
      # One test at a time: symbolizing the advisory reports is slow, and the signal tests pin
      # themselves to one CPU with deadlines.
      jobs=1 run_suites "$build" grpc || rc=1
      unset TSAN_OPTIONS
      triage_tsan_grpc "$logs/grpc" || rc=1
      ;;
  esac
  local end=$(date +%s)
  timing[$v]="build $((built - start))s, tests $((end - built))s"
  status[$v]=$([[ $rc -eq 0 ]] && echo ok || echo FAILED)
  return $rc
}

# ctest's output less a line per passing test.
quiet() { grep -vE '^ +Start +[0-9]+: |^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed ' || true; }

# run_suites BUILD unit|grpc|all: the unit suite (no gRPC in it), then the suites that drive the
# server over gRPC (labels $grpc_labels; not metrics_e2e, which needs Prometheus and has a step of
# its own, nor the soak test, too long for sanitizers).
run_suites() {
  local build=$1 which=$2 failed=0
  if [[ $which != grpc ]]; then
    echo "ci-sanitizers: [$build] ctest -L unit"
    ctest --test-dir "$build" -L '^unit$' -j "$jobs" --output-on-failure | quiet || failed=1
  fi
  if [[ $which != unit ]]; then
    echo "ci-sanitizers: [$build] ctest -L '^($grpc_labels)\$' -LE '^(metrics|soak)\$'"
    ctest --test-dir "$build" -L "^($grpc_labels)\$" -LE '^(metrics|soak)$' -j "$jobs" \
      --output-on-failure | quiet || failed=1
  fi
  return $failed
}

for v in "${variants[@]}"; do
  run_variant "$v" || overall=1
done

echo
echo "ci-sanitizers: summary"
for v in "${variants[@]}"; do
  printf '  %-5s %-7s %s\n' "$v" "${status[$v]:-FAILED}" "${timing[$v]:-}"
done
exit $overall
