#!/usr/bin/env bash
# The layering, checked on every build (the check_layers target) and in CI:
#   common <- kernels <- server/ops <- server/engine <- server/rpc <- server/main.cc
#   common <- client (with proto)
# A file may include its own layer and the layers below it, never one above. Protobuf and gRPC
# headers (.pb.h, grpcpp/, grpc/) belong to server/rpc/, server/main.cc, client/, proto/ and the
# tests only. Prints every offending line and exits 1.
#
#   scripts/check-layers.sh [ROOT]
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
status=0

# forbid DIR PATTERN WHY: no file under DIR (C++/CUDA sources) includes a path matching PATTERN.
forbid() {
  local dir=$1 pattern=$2 why=$3 hits
  [[ -e $dir ]] || return 0
  hits=$(grep -rnE --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' \
         "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($pattern)" "$dir" || true)
  if [[ -n $hits ]]; then
    echo "check-layers: $why:" >&2
    echo "$hits" >&2
    status=1
  fi
}

proto='opserve/v1/|grpcpp/|grpc/|grpc\+\+/|google/protobuf/'
forbid common "server/|kernels/|client/|$proto" "common/ is below everything"
forbid kernels "server/|client/|$proto" "kernels/ includes only kernels/ and common/"
forbid server/ops "server/engine/|server/rpc/|client/|$proto" "server/ops/ is below the engine"
forbid server/engine "server/rpc/|client/|$proto" "server/engine/ sees no proto and no gRPC"
forbid server/rpc "client/" "server/rpc/ does not include the client"
forbid client "server/" "client/ depends on proto/ and common/ only"
exit $status
