#!/usr/bin/env bash
# scripts/check-layers.sh against the source tree, which must pass, and against small trees made
# here: one that follows the layers and must pass, and that tree with one bad include added at a
# time, each of which must fail with the offending line named.
#
#   tests/layers/check_layers_test.sh SCRIPT SOURCE_ROOT
set -u
script=$1
source_root=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/check-layers-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=0

fail() { echo "check_layers_test: FAIL: $*" >&2; failed=1; }

if ! out=$("$script" "$source_root" 2>&1); then
  fail "the source tree does not pass:"$'\n'"$out"
fi

# A tree that follows the layers: downward includes, relative ones among them, the proto headers
# at the edge and in the client.
good=$work/good
mkdir -p "$good"/{common,kernels,server/ops,server/engine,server/rpc,client,proto/opserve/v1,proto/inference}
touch "$good/proto/opserve/v1/opserve.proto" "$good/proto/inference/grpc_service.proto"
printf '#include "absl/status/status.h"\n' >"$good/common/status.h"
printf '#include <cuda_runtime_api.h>\n' >"$good/kernels/k.h"
printf '#include "kernels/k.h"\n#include "../../common/status.h"\n' >"$good/server/ops/op.h"
printf '#include "server/ops/op.h"\n#include "plan.h"\n' >"$good/server/engine/plan.cc"
printf '#include "../engine/plan.h"\n#include "inference/grpc_service.grpc.pb.h"\n' \
  >"$good/server/rpc/service.h"
printf '#include "rpc/service.h"\n#include <grpcpp/grpcpp.h>\n' >"$good/server/main.cc"
printf '#include "common/status.h"\n#include "opserve/v1/opserve.pb.h"\n' >"$good/client/c.cc"
if ! out=$("$script" "$good" 2>&1); then
  fail "a tree that follows the layers does not pass:"$'\n'"$out"
fi

# expect_refused FILE LINE: FILE of the good tree with LINE appended must fail, naming the line.
case_no=0
expect_refused() {
  local file=$1 text=$2 tree out rc=0 lineno
  case_no=$((case_no + 1))
  tree=$work/bad$case_no
  cp -r "$good" "$tree"
  printf '%s\n' "$text" >>"$tree/$file"
  lineno=$(wc -l <"$tree/$file")
  out=$("$script" "$tree" 2>&1) || rc=$?
  if [[ $rc -ne 1 ]]; then
    fail "$file: '$text' was not refused (exit $rc):"$'\n'"$out"
  elif ! grep -qF "$file:$lineno: " <<<"$out"; then
    fail "$file: '$text' was refused without naming $file:$lineno:"$'\n'"$out"
  fi
}

expect_refused server/engine/plan.cc '#include "../rpc/service.h"'
expect_refused server/engine/plan.cc '#include "server/engine/../rpc/service.h"'
expect_refused server/engine/plan.cc '#include "inference/grpc_service.pb.h"'
expect_refused server/ops/op.h '#include <inference/grpc_service.grpc.pb.h>'
expect_refused server/ops/op.h '#include "opserve/v1/opserve.pb.h"'
expect_refused server/ops/op.h '#include "../engine/plan.h"'
expect_refused kernels/k.h '#include "../server/ops/op.h"'
expect_refused common/status.h '#include "./../kernels/k.h"'
expect_refused server/engine/plan.cc '#include <grpcpp/grpcpp.h>'
expect_refused server/rpc/service.h '#include "../../client/c.h"'
expect_refused client/c.cc '#include "server/rpc/service.h"'
expect_refused server/engine/plan.cc '#include "../../../outside.h"'

[[ $failed -eq 0 ]] && echo "check_layers_test: the source tree and $case_no refused includes as expected"
exit $failed
