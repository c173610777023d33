#!/usr/bin/env bash
# scripts/demo-cmake-flags.sh: make demo's architecture choice for the GPUs a machine reports.
set -uo pipefail
script="$(cd "$(dirname "$0")/../.." && pwd)/scripts/demo-cmake-flags.sh"
known="sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120"
failed=0
expect() {  # expect CAPS FLAGS
  local got
  got=$("$script" --caps "$1" --known "$known" 2>/dev/null)
  if [[ "$got" != "$2" ]]; then
    echo "FAIL: caps '$1': got '$got', expected '$2'"
    failed=1
  fi
}
expect "" "-DOPSERVE_CUDA=OFF"                                          # no driver, no GPU
expect "9.0" "-DOPSERVE_CUDA=ON -DOPSERVE_CUDA_ARCHS=90-real"            # one H100
expect "9.0 9.0 9.0 9.0" "-DOPSERVE_CUDA=ON -DOPSERVE_CUDA_ARCHS=90-real"  # four of them
expect $'8.6\n8.9' "-DOPSERVE_CUDA=ON -DOPSERVE_CUDA_ARCHS=86-real;89-real"  # nvidia-smi's lines
expect "12.0" "-DOPSERVE_CUDA=ON -DOPSERVE_CUDA_ARCHS=120-real"
expect "7.5" "-DOPSERVE_CUDA=OFF"                                        # older than opserve needs
expect "7.5 8.0" "-DOPSERVE_CUDA=ON -DOPSERVE_CUDA_ARCHS=80-real"
expect "[N/A]" "-DOPSERVE_CUDA=OFF"                                      # not a capability
expect "13.5" "-DOPSERVE_CUDA=ON -UOPSERVE_CUDA_ARCHS"                   # newer than this nvcc
"$script" --bogus >/dev/null 2>&1 && { echo "FAIL: an unknown argument was accepted"; failed=1; }
[[ $failed -eq 0 ]] && echo "demo-cmake-flags: all cases pass"
exit $failed
