#!/usr/bin/env bash
# Checks deploy/ with the real tools. Usage: scripts/check-deploy.sh [CHECK...]
# Checks (default: all of them, in this order):
#   prometheus  promtool check config, check rules, test rules (deploy/prometheus/tests/*.yml)
#   mutants     each of a list of small wrong edits to the rules must make `promtool test rules`
#               fail: proof that the rule tests test something
#   dashboards  every Grafana panel's PromQL through `promtool check rules`, uids, variables,
#               metric names (deploy/grafana/check_dashboards.py)
#   compose     docker-compose config on deploy/docker/compose.yaml, both profiles; on what it
#               renders: ports on 127.0.0.1 unless OPSERVE_BIND_ADDR says otherwise, a stop grace
#               period longer than the server's drain, --device=cuda for the GPU service
#   dockerfile  deploy/docker/Dockerfile's and Dockerfile.cpu's images (fully qualified; no CUDA in
#               the CPU one), stages, user and group, health check and library check, and
#               deploy/docker/check-runtime-libs.sh run on stand-in binaries and libraries
#   docker_mutants  each of a list of small wrong edits to deploy/docker must make the compose or
#               dockerfile checks fail
#   yamllint    yamllint -c deploy/.yamllint deploy
#   kustomize   kubectl kustomize deploy/k8s, and the rendered objects' GPU, probes and ports
# A missing tool is a failure, not a skip: CI installs them (apt: prometheus docker-compose
# yamllint; kubectl is on the machine). Nothing here needs a Docker engine or a cluster.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# yamllint's own interpreter carries python3-yaml; the dashboard check needs only the stdlib.
py=/usr/bin/python3
[[ -x "$py" ]] || py=python3

need() {
  local tool
  for tool in "$@"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "check-deploy: $tool not found (CI installs it: see docs/DEPLOY.md)" >&2
      exit 1
    fi
  done
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

check_prometheus() {
  need promtool
  promtool check config deploy/prometheus/prometheus.yml
  promtool check rules deploy/prometheus/rules/*.yml
  promtool test rules deploy/prometheus/tests/*.yml
}

# Each mutant: file (under deploy/prometheus), the exact text to replace, its replacement.
mutants=(
  "rules/opserve-recording.yml|(rate(opserve_kernel_bytes_total[5m]))|(rate(opserve_kernel_launches_total[5m]))"
  "rules/opserve-recording.yml|            / 1e9|            / 1e6"
  "rules/opserve-recording.yml|(rate(opserve_kernel_seconds_total[5m])) > 0)|(rate(opserve_kernel_seconds_total[5m])))"
  "rules/opserve-recording.yml|sum by (job, instance, device, op, algorithm) (rate(opserve_kernel_flops_total|sum by (job, device, op, algorithm) (rate(opserve_kernel_flops_total"
  "rules/opserve-recording.yml|histogram_quantile(0.99,|histogram_quantile(0.9,"
  "rules/opserve-recording.yml|histogram_quantile(0.5,|histogram_quantile(0.05,"
  "rules/opserve-recording.yml|sum by (job, rpc, le) (rate(opserve_request_duration_seconds_bucket[5m])))|sum by (job, instance, rpc, le) (rate(opserve_request_duration_seconds_bucket[5m])))"
  "rules/opserve-recording.yml|{code!=\"OK\"}|{code=\"OK\"}"
  "rules/opserve-recording.yml|UNKNOWN|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNKNOWN|INVALID_ARGUMENT|RESOURCE_EXHAUSTED|INTERNAL|UNAVAILABLE|DATA_LOSS"
  "rules/opserve-recording.yml|rate(opserve_requests_total[5m])) * 0|rate(opserve_requests_total[5m])) * 1"
  "rules/opserve-recording.yml|{kind=\"used\"}|{kind=\"total\"}"
  "rules/opserve-alerts.yml|ratio_rate5m > 0.05|ratio_rate5m > 0.15"
  "rules/opserve-alerts.yml|ratio_rate5m > 0.5|ratio_rate5m > 0.75"
  "rules/opserve-alerts.yml|up{job=\"opserve\"} == 0|up == 0"
  "rules/opserve-alerts.yml|absent(up{job=\"opserve\"})|absent(up)"
  "rules/opserve-alerts.yml|            unless sum|            and sum"
  "rules/opserve-alerts.yml|ratio > 0.9|ratio >= 0.9"
  "rules/opserve-alerts.yml|        for: 10m|        for: 5m"
)

check_mutants() {
  need promtool
  local spec file survived=0 n=0
  for spec in "${mutants[@]}"; do
    # Split on the first two '|' only: the regex mutants carry '|' in their texts.
    file="${spec%%|*}"
    spec="${spec#*|}"
    rm -rf "$tmp/mutant" && cp -r deploy/prometheus "$tmp/mutant"
    # The texts are literal; python does the replacement, and fails if the text is not there
    # (a mutant that no longer applies must be updated, not silently pass).
    if ! "$py" - "$tmp/mutant/$file" "$spec" <<'EOF'
import sys
path, spec = sys.argv[1], sys.argv[2]
text = open(path).read()
# from and to have the same number of '|' fields: split in the middle.
fields = spec.split("|")
half = len(fields) // 2
old, new = "|".join(fields[:half]), "|".join(fields[half:])
if old not in text:
    sys.exit(f"mutant text not found in {path}: {old!r}")
open(path, "w").write(text.replace(old, new))
EOF
    then
      return 1
    fi
    n=$((n + 1))
    # A mutant must still be valid rules: caught by a test, not by the parser.
    if ! promtool check rules "$tmp/mutant/$file" >"$tmp/mutant.log" 2>&1; then
      cat "$tmp/mutant.log" >&2
      echo "INVALID MUTANT: $file: $spec" >&2
      return 1
    fi
    if promtool test rules "$tmp"/mutant/tests/*.yml >"$tmp/mutant.log" 2>&1; then
      echo "SURVIVED: $file: $spec" >&2
      survived=$((survived + 1))
    fi
  done
  echo "mutants: $n applied, $((n - survived)) caught by the rule tests, $survived survived"
  [[ $survived -eq 0 ]]
}

check_dashboards() {
  need promtool
  "$py" deploy/grafana/check_dashboards.py --repo "$repo"
}

# compose.yaml $1 rendered by docker-compose into $2.default.yaml (OPSERVE_BIND_ADDR unset: what a
# user who did not ask for more gets) and $2.wide.yaml (OPSERVE_BIND_ADDR=0.0.0.0).
render_compose() {
  env -u OPSERVE_BIND_ADDR docker-compose -f "$1" config >"$2.default.yaml"
  OPSERVE_BIND_ADDR=0.0.0.0 docker-compose -f "$1" config >"$2.wide.yaml"
}

# The checks of compose.yaml $1 on what docker-compose renders (see deploy/docker/check_docker.py).
compose_ok() {
  render_compose "$1" "$tmp/compose" &&
    "$py" deploy/docker/check_docker.py compose "$tmp/compose.default.yaml" "$tmp/compose.wide.yaml"
}

check_compose() {
  need docker-compose
  local profile
  docker-compose -f deploy/docker/compose.yaml config -q
  for profile in gpu cpu; do
    docker-compose -f deploy/docker/compose.yaml --profile "$profile" config --services \
      >"$tmp/services"
    grep -qx prometheus "$tmp/services"
    grep -qx grafana "$tmp/services"
  done
  compose_ok deploy/docker/compose.yaml
  echo "compose: deploy/docker/compose.yaml valid for docker-compose $(docker-compose version --short)"
}

# Runs check-runtime-libs.sh $1 on cases it must pass and cases it must fail. The stand-ins are
# copies of a library this host has, in directories the script is pointed at instead of the ld.so
# cache (this host may have the real cuBLAS there); a copy whose DT_NEEDED entry for libc is
# renamed is a library with a missing dependency, as ldd reports one ("not found", status 0).
runtime_libs_behave() {
  local script="$1" lib="$tmp/libs" good real bad=0
  good="$(command -v bash)"
  real="$(ldd "$good" | awk '$2 == "=>" && $3 ~ /^\// { print $3; exit }')"
  [[ -n "$real" ]] || { echo "runtime libs: no shared library of $good to copy" >&2; return 1; }
  rm -rf "$lib" && mkdir -p "$lib/cuda" "$lib/no-lt" "$lib/broken" "$lib/none"
  cp "$real" "$lib/cuda/libcublas.so.13"
  cp "$real" "$lib/cuda/libcublasLt.so.13"
  cp "$real" "$lib/no-lt/libcublas.so.13"
  "$py" - "$real" "$lib/missing-dep.so" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
assert data.count(b"libc.so.6\0") == 1, "expected one libc.so.6 in the stand-in's strings"
open(sys.argv[2], "wb").write(data.replace(b"libc.so.6\0", b"libQ.so.6\0"))
PY
  cp "$lib/missing-dep.so" "$lib/broken/libcublas.so.13"
  cp "$real" "$lib/broken/libcublasLt.so.13"
  printf 'not an ELF file\n' >"$lib/text"
  # expect|case|where cuBLAS is|binaries
  local cases=(
    "pass|the binary and cuBLAS resolve|$lib/cuda|$good"
    "fail|ldd fails on a binary (exit status 1, no \"not found\")|$lib/cuda|$good $lib/text"
    "fail|a binary needs a library that is missing|$lib/cuda|$lib/missing-dep.so"
    "fail|no libcublas.so.13|$lib/none|$good"
    "fail|libcublas.so.13 without libcublasLt.so.13|$lib/no-lt|$good"
    "fail|libcublas.so.13 needs a library that is missing|$lib/broken|$good"
    "pass|--without-cublas: no cuBLAS needed|$lib/none|--without-cublas $good"
    "fail|--without-cublas: a binary needs a library that is missing|$lib/none|--without-cublas $lib/missing-dep.so"
  )
  local c expect what search binaries got
  for c in "${cases[@]}"; do
    IFS='|' read -r expect what search binaries <<<"$c"
    got=fail
    # shellcheck disable=SC2086  # $binaries is a list of paths without spaces
    CHECK_LIBS_SEARCH_PATH="$search" sh "$script" $binaries >"$tmp/libs.log" 2>&1 && got=pass
    if [[ "$got" != "$expect" ]]; then
      echo "runtime libs: $what: expected $expect, got $got" >&2
      cat "$tmp/libs.log" >&2
      bad=$((bad + 1))
    fi
  done
  echo "runtime libs: ${#cases[@]} cases, $bad wrong"
  [[ $bad -eq 0 ]]
}

# The checks of Dockerfile $1 and its library check $2; a Dockerfile.cpu is checked as CPU-only.
dockerfile_ok() {
  local cpu=()
  [[ "$1" == *.cpu ]] && cpu=(--cpu)
  "$py" deploy/docker/check_docker.py dockerfile --dockerfile "$1" --libs-script "$2" "${cpu[@]}" &&
    runtime_libs_behave "$2"
}

check_dockerfile() {
  # Two stages from CUDA 13 on Ubuntu 24.04 and a gRPC health check; user, group and libraries
  # are check_docker.py's. (No engine here: the image itself is not built in CI.)
  grep -Eq '^FROM docker.io/nvidia/cuda:\$\{CUDA_VERSION\}-devel-ubuntu24.04 AS build' deploy/docker/Dockerfile
  grep -Eq '^FROM docker.io/nvidia/cuda:\$\{CUDA_VERSION\}-runtime-ubuntu24.04' deploy/docker/Dockerfile
  grep -Eq '^ARG CUDA_VERSION=13\.' deploy/docker/Dockerfile
  # The CPU-only image: Debian 12 slim, both stages.
  [[ $(grep -Ec '^FROM docker.io/library/debian:12-slim( AS build)?$' deploy/docker/Dockerfile.cpu) -eq 2 ]]
  local f
  for f in deploy/docker/Dockerfile deploy/docker/Dockerfile.cpu; do
    grep -Eq '^HEALTHCHECK .*' "$f"
    grep -Eq 'CMD \["opserve-cli", .*"health"\]' "$f"
    dockerfile_ok "$f" deploy/docker/check-runtime-libs.sh
  done
}

# Each mutant: file (under deploy/docker) => the exact text => its replacement ("\n" a newline).
# Each undoes one of the fixes the compose and dockerfile checks stand for.
# shellcheck disable=SC2016  # the texts are the files' own: their $ are not this script's
docker_mutants=(
  'compose.yaml => stop_grace_period: 45s => stop_grace_period: 30s'
  'compose.yaml =>   stop_grace_period: 45s\n => '
  'compose.yaml => "--device=cpu", "--shutdown_grace_seconds=30" => "--device=cpu", "--shutdown_grace_seconds=60"'
  'compose.yaml => "--device=cuda" => "--device=auto"'
  'compose.yaml => "--metrics_port=9464", "--device=cuda", => "--metrics_port=9464",'
  'compose.yaml => "${OPSERVE_BIND_ADDR:-127.0.0.1}:3000:3000" => "3000:3000"'
  'compose.yaml => ${OPSERVE_BIND_ADDR:-127.0.0.1}:9464 => ${OPSERVE_BIND_ADDR:-0.0.0.0}:9464'
  'compose.yaml => "${OPSERVE_BIND_ADDR:-127.0.0.1}:9090:9090" => "127.0.0.1:9090:9090"'
  'Dockerfile => groupadd --system --gid 10001 opserve => groupadd --system opserve'
  'Dockerfile => groupadd --system --gid 10001 opserve => true'
  'Dockerfile => --uid 10001 --gid 10001 => --uid 10001 --user-group'
  'Dockerfile => USER 10001:10001 => USER 10001'
  'Dockerfile => FROM docker.io/nvidia/cuda:${CUDA_VERSION}-devel => FROM nvidia/cuda:${CUDA_VERSION}-devel'
  'Dockerfile => FROM docker.io/nvidia/cuda:${CUDA_VERSION}-runtime => FROM nvidia/cuda:${CUDA_VERSION}-runtime'
  'Dockerfile => check-runtime-libs.sh /usr/local/bin/opserve => check-runtime-libs.sh --without-cublas /usr/local/bin/opserve'
  'Dockerfile.cpu => FROM docker.io/library/debian:12-slim AS build => FROM debian:12-slim AS build'
  'Dockerfile.cpu => FROM docker.io/library/debian:12-slim\n => FROM docker.io/nvidia/cuda:13.0.1-runtime-ubuntu24.04\n'
  'Dockerfile.cpu => -DOPSERVE_CUDA=OFF => -DOPSERVE_CUDA=ON'
  'Dockerfile.cpu => check-runtime-libs.sh --without-cublas => check-runtime-libs.sh'
  'Dockerfile.cpu => USER 10001:10001 => USER 10001'
  'Dockerfile => --home-dir /home/opserve --create-home => --no-create-home'
  'Dockerfile => RUN sh /usr/local/libexec/check-runtime-libs.sh /usr/local/bin/opserve /usr/local/bin/opserve-cli => RUN ! ldd /usr/local/bin/opserve /usr/local/bin/opserve-cli | grep "not found"'
  'check-runtime-libs.sh => || fail "ldd $1 failed: $out" => || true'
  'check-runtime-libs.sh => libcublas.so.13 libcublasLt.so.13 => libcublas.so.12 libcublasLt.so.12'
  'check-runtime-libs.sh =>   resolved_libs "$path"\n => '
)

check_docker_mutants() {
  need docker-compose
  local spec run m="$tmp/mutant-docker" survived=0 n=0
  for spec in "${docker_mutants[@]}"; do
    rm -rf "$m" && mkdir -p "$m/deploy" && cp -r deploy/docker "$m/deploy/docker"
    # The texts are literal; python fails if the text is not there (a stale mutant must be
    # updated, not pass).
    "$py" - "$m/deploy/docker" "$spec" <<'PY' || return 1
import sys
folder, spec = sys.argv[1], sys.argv[2].replace("\\n", "\n")
name, old, new = spec.split(" => ")
path = f"{folder}/{name}"
text = open(path).read()
if old not in text:
    sys.exit(f"mutant text not found in {path}: {old!r}")
open(path, "w").write(text.replace(old, new))
PY
    n=$((n + 1))
    if [[ "$spec" == compose.yaml* ]]; then
      run=(compose_ok "$m/deploy/docker/compose.yaml")
    elif [[ "$spec" == Dockerfile.cpu* ]]; then
      run=(dockerfile_ok "$m/deploy/docker/Dockerfile.cpu" "$m/deploy/docker/check-runtime-libs.sh")
    else
      run=(dockerfile_ok "$m/deploy/docker/Dockerfile" "$m/deploy/docker/check-runtime-libs.sh")
    fi
    if "${run[@]}" >"$tmp/mutant.log" 2>&1; then
      echo "SURVIVED: $spec" >&2
      survived=$((survived + 1))
    fi
  done
  echo "docker mutants: $n applied, $((n - survived)) caught by the compose and dockerfile checks, $survived survived"
  [[ $survived -eq 0 ]]
}

check_yamllint() {
  need yamllint
  yamllint --strict -c deploy/.yamllint deploy
  echo "yamllint: deploy/ clean"
}

check_kustomize() {
  need kubectl
  kubectl kustomize deploy/k8s >"$tmp/k8s.yaml"
  "$py" - "$tmp/k8s.yaml" <<'EOF'
import re
import sys
import yaml

docs = {d["kind"]: d for d in yaml.safe_load_all(open(sys.argv[1])) if d}
problems = []
def check(ok, what):
    if not ok:
        problems.append(what)

for kind in ("Deployment", "Service", "ServiceMonitor"):
    check(kind in docs, f"no {kind} rendered")
if not problems:
    dep, svc, smon = docs["Deployment"], docs["Service"], docs["ServiceMonitor"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    # N GPUs a pod (the node's, or part of it): one process serves each with --device=cuda.
    gpus = str(c["resources"]["limits"].get("nvidia.com/gpu"))
    check(gpus.isdigit() and int(gpus) >= 1, f"limits nvidia.com/gpu {gpus}, not a count of 1 or more")
    check(str(c["resources"]["requests"].get("nvidia.com/gpu")) == gpus,
          "requests nvidia.com/gpu != limits (an extended resource needs them equal)")
    check({"grpc", "http", "metrics"} <= set(ports), f"container ports not named grpc/http/metrics: {ports}")
    check(c.get("startupProbe", {}).get("grpc", {}).get("port") == ports.get("grpc"),
          "startupProbe is not gRPC on the gRPC port")
    for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")):
        p = c.get(probe, {}).get("httpGet", {})
        check(p.get("port") in ("http", ports.get("http")) and p.get("path") == path,
              f"{probe} is not GET {path} on the HTTP port")
    check(pod["securityContext"].get("runAsNonRoot") is True, "pod may run as root")
    # The kubelet's SIGKILL must come after the server's drain, with time for the teardown (the
    # margin of deploy/docker/check_docker.py); a GPU pod must not fall back to the CPU backend.
    flags = dict(a[2:].split("=", 1) for a in c.get("args", []) if a.startswith("--") and "=" in a)
    main_cc = open("server/main.cc").read()
    grace = int(flags.get("shutdown_grace_seconds") or
                re.search(r"ABSL_FLAG\(int, shutdown_grace_seconds, (\d+),", main_cc).group(1))
    kill_after = pod.get("terminationGracePeriodSeconds", 30)
    check(kill_after >= grace + 5,
          f"terminationGracePeriodSeconds {kill_after} leaves less than 5 s after a {grace} s drain")
    check(re.fullmatch(r"cuda(:\d+)?", flags.get("device", "auto")),
          f"a GPU pod runs --device={flags.get('device', 'auto')}, not cuda")
    check(svc["spec"].get("clusterIP") == "None", "Service is not headless")
    check({p["name"] for p in svc["spec"]["ports"]} >= {"grpc", "http", "metrics"}, "Service ports")
    sel = svc["spec"]["selector"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in sel.items()), "Service selector misses the pods")
    check(smon["apiVersion"] == "monitoring.coreos.com/v1", "ServiceMonitor apiVersion")
    msel = smon["spec"]["selector"]["matchLabels"]
    check(all(svc["metadata"]["labels"].get(k) == v for k, v in msel.items()),
          "ServiceMonitor selector misses the Service")
    check([e["port"] for e in smon["spec"]["endpoints"]] == ["metrics"], "ServiceMonitor port")
for p in problems:
    print("FAIL", p)
print(f"kustomize: {len(docs)} objects rendered, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
EOF
}

all=(prometheus mutants dashboards compose dockerfile docker_mutants yamllint kustomize)
(($# == 0)) && set -- "${all[@]}"
for check in "$@"; do
  case "$check" in
    prometheus | mutants | dashboards | compose | dockerfile | docker_mutants | yamllint | kustomize)
      echo "== check-deploy: $check"
      "check_$check"
      ;;
    *)
      echo "check-deploy: unknown check '$check' (one of: ${all[*]})" >&2
      exit 2
      ;;
  esac
done
echo "check-deploy: $* passed"
