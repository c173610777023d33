#!/usr/bin/env bash
# The layering, checked on every build (the check_layers target) and by ctest (check_layers_test):
#   common <- kernels <- server/ops <- server/engine <- server/rpc <- server/main.cc
#   common <- client (with the generated proto code)
# A file may include its own layer and the layers below it, never one above, nor tests/ or bench/.
# Every generated proto header (*.pb.h, and anything under a package directory of proto/**.proto)
# and the gRPC and protobuf headers belong to server/rpc/, server/main.cc and client/ only.
#
# What the build enforces by itself (CMakeLists.txt, "Layers"): the generated headers are on no
# include path below server/rpc (ctest layers_proto_headers), and each layer links alone
# (layer_link_* targets), so a call up the stack fails to link. What it cannot see is a header
# of a higher layer included from below, since every layer shares the include root; that is
# checked here, with each include resolved the way the compiler finds it: a quoted path that
# starts with ./ or ../ from the including file's folder (so "../rpc/service.h" in
# server/engine/ is server/rpc/service.h), any other path from the root, dot segments folded.
# Prints every offending line and exits 1.
#
#   scripts/check-layers.sh [ROOT]
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

layers=()
for d in common kernels server client; do [[ -d $d ]] && layers+=("$d"); done
if [[ ${#layers[@]} -eq 0 ]]; then
  echo "check-layers: no layer folder (common, kernels, server, client) under $root" >&2
  exit 2
fi
# The proto packages' folders (opserve/v1, inference, ...): where protoc puts their headers.
proto_dirs=""
if [[ -d proto ]]; then
  proto_dirs=$(cd proto && find . -name '*.proto' -printf '%h\n' | sed 's|^\./||' | sort -u | paste -sd' ')
fi
# The project's own top-level folders: an include that resolves into one of them is the
# project's; any other (absl/..., cuda_runtime_api.h) is a library's.
top_dirs=$(find . -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%f\n' | paste -sd' ')

grep -rnE --include='*.h' --include='*.cc' --include='*.cu' --include='*.cuh' \
  '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"][^>"]+[>"]' "${layers[@]}" |
awk -v proto_dirs="$proto_dirs" -v top_dirs="$top_dirs" '
  # Folds "." and ".." segments; a path that leaves the root keeps its leading "..".
  function normalize(path,   n, parts, out, k, i) {
    n = split(path, parts, "/")
    k = 0
    for (i = 1; i <= n; i++) {
      if (parts[i] == "" || parts[i] == ".") continue
      if (parts[i] == ".." && k > 0 && out[k] != "..") { k--; continue }
      out[++k] = parts[i]
    }
    path = ""
    for (i = 1; i <= k; i++) path = path (i > 1 ? "/" : "") out[i]
    return path
  }
  # The layer a project path belongs to, as a rank; -1 for none (tests/, bench/, ...).
  function rank(path) {
    if (path ~ /^common\//) return 0
    if (path ~ /^kernels\//) return 1
    if (path ~ /^server\/ops\//) return 2
    if (path ~ /^server\/engine\//) return 3
    if (path ~ /^server\/rpc\//) return 4
    if (path ~ /^server\//) return 5
    if (path ~ /^client\//) return 10
    return -1
  }
  function report(why) {
    printf "check-layers: %s:%s: %s: %s\n", file, line, why, text > "/dev/stderr"
    bad = 1
  }
  BEGIN {
    n = split(proto_dirs, p, " ")
    for (i = 1; i <= n; i++) proto[p[i]] = 1
    n = split(top_dirs, t, " ")
    for (i = 1; i <= n; i++) top[t[i]] = 1
    name[0] = "common/"; name[1] = "kernels/"; name[2] = "server/ops/"
    name[3] = "server/engine/"; name[4] = "server/rpc/"; name[5] = "server/"; name[10] = "client/"
  }
  {
    # FILE:LINE:TEXT (a file name with ":" in it is not one of ours).
    file = $0; sub(/:.*/, "", file)
    rest = substr($0, length(file) + 2)
    line = rest; sub(/:.*/, "", line)
    text = substr(rest, length(line) + 2)
    inc = text
    sub(/^[[:space:]]*#[[:space:]]*include[[:space:]]*/, "", inc)
    quoted = substr(inc, 1, 1) == "\""
    inc = substr(inc, 2); sub(/[>"].*/, "", inc)

    from = rank(file)
    dir = file; sub(/\/[^\/]*$/, "", dir)
    target = (quoted && inc ~ /^\.\.?\//) ? normalize(dir "/" inc) : normalize(inc)

    # Proto, gRPC and protobuf headers: the edge, main.cc and the client only.
    if (from <= 3) {
      pkg = target; sub(/\/[^\/]*$/, "", pkg)
      if (target ~ /\.pb\.h$/ || (pkg in proto) || target ~ /^(grpcpp|grpc|grpc\+\+|google\/protobuf)\//) {
        report("a generated proto, gRPC or protobuf header below server/rpc/")
        next
      }
    }
    if (target ~ /^\.\.\//) { report("an include that leaves the source tree"); next }
    first = target; sub(/\/.*/, "", first)
    if (!(first in top) || target !~ /\//) next  # a library header, or a file outside the layers
    to = rank(target)
    if (to < 0) {
      report("a layer includes " first "/, which is no layer (only tests and tools include it)")
    } else if (from == 10 && to != 0 && to != 10) {
      report("client/ includes only client/, common/ and the generated proto code")
    } else if (from != 10 && to == 10) {
      report("the server does not include the client")
    } else if (from != 10 && to > from) {
      report(name[from] " includes " name[to] ", a layer above it")
    }
  }
  END { exit bad }
'
