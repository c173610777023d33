#!/bin/sh
# Fails (exit 1, with the reason) unless every shared library the given binaries link resolves and
# cuBLAS can be loaded. Run by deploy/docker/Dockerfile on the runtime image, so that a missing
# library fails the build rather than the first start or the first matmul.
#   check-runtime-libs.sh [--without-cublas] BINARY...
# (--without-cublas: a CPU-only build, deploy/docker/Dockerfile.cpu, which never loads cuBLAS.)
# Two things a plain `ldd BINARY | ! grep "not found"` would miss:
# - ldd failing (a missing or foreign binary, a broken loader) prints no "not found": its own exit
#   status must count, so its output is captured before it is read, and no pipe hides a status;
# - cuBLAS is not linked: kernels/cublas_loader.cc dlopen()s libcublas.so.13 on the first matmul,
#   so ldd of the binaries never lists it. It is looked up where that dlopen looks (the
#   directories of LD_LIBRARY_PATH, then the ld.so cache), then at the loader's fallback path
#   /usr/local/cuda/lib64/libcublas.so.13; libcublasLt.so.13 likewise, and ldd of the cuBLAS found
#   must resolve everything it needs.
# CHECK_LIBS_SEARCH_PATH (colon-separated directories), when set, replaces those places: only
# scripts/check-deploy.sh sets it, to run this script against stand-in libraries.
set -eu

fail() {
  echo "check-runtime-libs: $*" >&2
  exit 1
}

# ldd's output for $1, or the reason it has none.
resolved_libs() {
  out="$(ldd "$1" 2>&1)" || fail "ldd $1 failed: $out"
  case "$out" in
    *"not found"*) fail "$1 needs libraries that are not installed:
$(printf '%s\n' "$out" | grep "not found")" ;;
  esac
}

# The first $2 in the colon-separated directories $1, or nothing.
first_in() {
  old_ifs="$IFS"
  IFS=:
  for dir in $1; do
    if [ -n "$dir" ] && [ -e "$dir/$2" ]; then
      printf '%s\n' "$dir/$2"
      break
    fi
  done
  IFS="$old_ifs"
}

# The path the dynamic loader would open for soname $1, or nothing.
find_lib() {
  if [ -n "${CHECK_LIBS_SEARCH_PATH+set}" ]; then
    first_in "$CHECK_LIBS_SEARCH_PATH" "$1"
    return
  fi
  found="$(first_in "${LD_LIBRARY_PATH:-}" "$1")"
  if [ -z "$found" ]; then
    cache="$(ldconfig -p)" || fail "ldconfig -p failed"
    # Cache lines read "	libcublas.so.13 (libc6,x86-64) => /usr/local/cuda/lib64/libcublas.so.13".
    found="$(printf '%s\n' "$cache" | awk -v so="$1" '$1 == so && $NF ~ /^\// { print $NF; exit }')"
    [ -e "$found" ] || found=""
  fi
  [ -n "$found" ] || found="$(first_in /usr/local/cuda/lib64 "$1")"
  printf '%s\n' "$found"
}

cublas=1
if [ "${1:-}" = "--without-cublas" ]; then
  cublas=0
  shift
fi
[ "$#" -gt 0 ] || fail "usage: check-runtime-libs.sh [--without-cublas] BINARY..."
for binary in "$@"; do
  resolved_libs "$binary"
done
if [ "$cublas" -eq 0 ]; then
  echo "check-runtime-libs: the libraries of $* resolve"
  exit 0
fi
for soname in libcublas.so.13 libcublasLt.so.13; do
  path="$(find_lib "$soname")"
  [ -n "$path" ] ||
    fail "$soname not found (opserve dlopen()s cuBLAS for matmul; the CUDA runtime image has it)"
  resolved_libs "$path"
  echo "check-runtime-libs: $soname: $path"
done
echo "check-runtime-libs: the libraries of $* and cuBLAS resolve"
