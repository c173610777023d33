#!/usr/bin/env bash
# CI: the libFuzzer targets of tests/fuzz each for a bounded time.
#
#   scripts/ci-fuzz.sh [SECONDS_PER_TARGET]        (default 45; or FUZZ_SECONDS=...)
#
# Configures and builds build-fuzz with clang-14: the libraries under test with
# -fsanitize=fuzzer-no-link,address,undefined, the targets with -fsanitize=fuzzer. Then, per
# target, on a copy of its seed corpus in a temporary directory:
#   1. the seeds alone (-runs=0) must run clean;
#   2. libFuzzer runs for SECONDS (-max_total_time) with -rss_limit_mb=2048 -timeout=10.
# Any crash, leak, timeout, OOM or sanitizer report fails the script; the reproducer and the log
# are copied to $FUZZ_ARTIFACTS (default build-fuzz/artifacts) for CI to keep. A summary table
# gives each run's exec count (libFuzzer's final "Done N runs in S second(s)").
#
# Environment: BUILD (default build-fuzz), JOBS (default 2: ninja's jobs, and how many targets
# fuzz side by side, FUZZ_PARALLEL), FUZZ_TARGETS (default all of them), FUZZ_ARTIFACTS.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

seconds=${1:-${FUZZ_SECONDS:-45}}
build=${BUILD:-build-fuzz}
jobs=${JOBS:-2}
targets=(${FUZZ_TARGETS:-fuzz_execute_plan fuzz_put_assembly fuzz_npy fuzz_graph_json fuzz_model_infer_parse fuzz_http_infer})
artifacts=${FUZZ_ARTIFACTS:-$build/artifacts}
[[ $artifacts == /* ]] || artifacts=$root/$artifacts

# Largest input libFuzzer may generate, per target: an ExecuteRequest needs room for inline
# tensors; the readers' interesting inputs are small.
declare -A max_len=([fuzz_execute_plan]=16384 [fuzz_put_assembly]=8192 [fuzz_npy]=4096
                    [fuzz_graph_json]=4096)

for tool in clang-14 clang++-14 cmake ninja; do
  command -v "$tool" >/dev/null || { echo "ci-fuzz: $tool is missing (scripts/install-deps.sh --test)" >&2; exit 1; }
done

start=$(date +%s)
echo "ci-fuzz: configuring $build (clang-14, fuzzer-no-link + ASan + UBSan)"
# CMAKE_BUILD_TYPE RelWithDebInfo: -O2 -g, as fast as fuzzing gets with line numbers in reports.
# A build dir configured with another compiler would keep it: start it over.
if [[ -f $build/CMakeCache.txt ]] &&
   ! grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=$(command -v clang++-14)\$" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
mkdir -p "$build"
# The test hooks off: the targets fuzz the code a release runs.
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -G Ninja -Wno-dev \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPSERVE_CUDA=OFF -DOPSERVE_TEST_HOOKS=OFF -DOPSERVE_FUZZ=ON \
  -DCMAKE_CXX_FLAGS='-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fsanitize-recover=pointer-overflow -fno-omit-frame-pointer' \
  >"$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; exit 1; }
ninja -C "$build" -j "$jobs" "${targets[@]}"
built=$(date +%s)

work=$(mktemp -d "${TMPDIR:-/tmp}/opserve-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
rm -rf "$artifacts"
mkdir -p "$artifacts"
# detect_leaks is libFuzzer's default with ASan; spelled out so a leak is never a surprise.
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1
# RapidJSON's null-stack arithmetic only (tests/fuzz/ubsan.supp says why): pointer-overflow is
# the one check built recoverable, so that the suppression can skip it; any other report of it
# still halts.
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$root/tests/fuzz/ubsan.supp
export TMPDIR=$work  # fuzz_graph_json's .npy fixture directory goes here

# One target: seeds, then fuzzing. Writes "RESULT EXECS SECONDS" to $work/$t/result; all output
# goes to $work/$t/*.log.
fuzz_one() {
  local t=$1 bin=$build/tests/fuzz/$1 dir=$work/$1
  local corpus=$dir/corpus rc=0 done_line kind f
  mkdir -p "$corpus" "$dir/out"
  cp "tests/fuzz/corpus/$t/"* "$corpus/"
  local common=(-rss_limit_mb=2048 -timeout=10 -max_len="${max_len[$t]:-4096}"
                -artifact_prefix="$dir/out/")
  [[ -f tests/fuzz/$t.dict ]] && common+=(-dict="tests/fuzz/$t.dict")

  if ! "$bin" "${common[@]}" -runs=0 "$corpus" >"$dir/seeds.log" 2>&1; then
    echo "SEED_FAILURE - -" >"$dir/result"
    return
  fi
  "$bin" "${common[@]}" -max_total_time="$seconds" -print_final_stats=1 "$corpus" \
    >"$dir/fuzz.log" 2>&1 || rc=$?
  done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$dir/fuzz.log" | tail -n 1 || true)
  if [[ $rc -eq 0 && -n $done_line ]]; then
    echo "ok $(awk '{print $2, $5}' <<<"$done_line")" >"$dir/result"
  else
    kind=$(ls "$dir/out" | sed -n 's/^\(crash\|leak\|timeout\|oom\|slow-unit\)-.*/\1/p' | head -n 1)
    echo "FAILED:${kind:-rc_$rc} $(grep -oE '^#[0-9]+' "$dir/fuzz.log" | tail -n 1 | tr -d '#') -" \
      >"$dir/result"
  fi
}

# The targets run side by side, $parallel at a time (libFuzzer is single-threaded).
parallel=${FUZZ_PARALLEL:-$jobs}
running=0
for t in "${targets[@]}"; do
  if [[ $running -ge $parallel ]]; then
    wait -n || true
    running=$((running - 1))
  fi
  echo "ci-fuzz: $t: seeds, then ${seconds}s of fuzzing"
  fuzz_one "$t" &
  running=$((running + 1))
done
wait

failed=()
declare -A result execs secs
for t in "${targets[@]}"; do
  dir=$work/$t
  read -r res n s <"$dir/result" || { res="FAILED:no_result"; n=-; s=-; }
  result[$t]=$res
  execs[$t]=${n:--}
  secs[$t]=${s:--}
  [[ $res == ok ]] && continue
  failed+=("$t")
  if [[ $res == SEED_FAILURE ]]; then
    echo "ci-fuzz: $t: a seed input fails:" >&2
    tail -n 60 "$dir/seeds.log" >&2
    cp "$dir/seeds.log" "$artifacts/$t.seeds.log"
  else
    echo "ci-fuzz: $t: $res; the end of its log:" >&2
    grep -vE '^#[0-9]+.*(NEW|REDUCE|pulse)' "$dir/fuzz.log" | tail -n 80 >&2
    cp "$dir/fuzz.log" "$artifacts/$t.fuzz.log"
  fi
  for f in "$dir/out/"*; do
    [[ -e $f ]] || continue
    echo "ci-fuzz: reproducer $(basename "$f") (base64): $(base64 -w0 "$f" | head -c 4000)" >&2
    cp "$f" "$artifacts/$t.$(basename "$f")"
  done
done
for t in "${targets[@]}"; do
  result[$t]="${result[$t]}, corpus $(ls "tests/fuzz/corpus/$t" | wc -l) -> $(ls "$work/$t/corpus" | wc -l)"
done
end=$(date +%s)

echo
echo "ci-fuzz: summary (${seconds}s per target; build $((built - start))s, total $((end - start))s)"
printf '  %-20s %12s %8s %10s  %s\n' target execs seconds execs/s result
for t in "${targets[@]}"; do
  rate=-
  if [[ ${execs[$t]} =~ ^[0-9]+$ && ${secs[$t]} =~ ^[0-9]+$ && ${secs[$t]} -gt 0 ]]; then
    rate=$((execs[$t] / secs[$t]))
  fi
  printf '  %-20s %12s %8s %10s  %s\n' "$t" "${execs[$t]}" "${secs[$t]}" "$rate" "${result[$t]}"
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "ci-fuzz: FAILED: ${failed[*]} (reproducers and logs in $artifacts)" >&2
  exit 1
fi
echo "ci-fuzz: all ${#targets[@]} targets ran clean"
