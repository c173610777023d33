#!/usr/bin/env python3
"""Checks deploy/k8s/kserve (python3 and python3-yaml; kubectl for the rendering).

  check_kserve.py [--repo DIR] [--op-table TOOL]
      - servingruntime.yaml is one serving.kserve.io/v1alpha1 ServingRuntime whose
        protocolVersions include grpc-v2, with one container, kserve-container;
      - that container declares one port, named h2c (KServe sends gRPC there), whose number is
        the server's default gRPC port (--port in server/main.cc) and the --port it is given;
        its gRPC probes are on that port;
      - its image and args are those of deploy/k8s/deployment.yaml's container, and it and the
        InferenceService's model request and limit that container's nvidia.com/gpu count (the
        GPUs one server serves with --device=cuda; requests equal to limits, as an extended
        resource needs);
      - inferenceservice.yaml is one serving.kserve.io/v1beta1 InferenceService whose model names
        the runtime, a model format the runtime lists, and a protocolVersion the runtime lists;
        its terminationGracePeriodSeconds exceeds the drain (--shutdown_grace_seconds) by
        STOP_MARGIN_S, as in deploy/k8s;
      - kustomization.yaml lists both files and sets the images the base sets;
      - with --op-table (tests/support's opserve-op-table, which ctest passes), no file of
        deploy/k8s/kserve names an op of the table: the ops are models without a model
        repository (ListOps and RepositoryIndex list them), and a list here would go stale;
      - `kubectl kustomize` renders deploy/k8s/kserve, and the runtime's rendered image is the
        base's Deployment's. Without kubectl this is a failure, as in scripts/check-deploy.sh.
  check_kserve.py --mutants [--repo DIR]
      Each of MUTANTS (a small wrong edit of a copy) must make the checks above fail with the
      problem it stands for: proof that each check can fail.

Exit status 0 when all is well, 1 on a finding.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

# Time after the drain's deadline for the teardown, before the kubelet's SIGKILL (the margin of
# scripts/check-deploy.sh kustomize and deploy/docker/check_docker.py).
STOP_MARGIN_S = 5
KSERVE = "deploy/k8s/kserve"
GPU = "nvidia.com/gpu"


def load_one(path, problems):
    """The single YAML document of path, or None (with a problem) when it is not one mapping."""
    docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
    if len(docs) != 1 or not isinstance(docs[0], dict):
        problems.append(f"{path}: {len(docs)} documents, expected one object")
        return None
    return docs[0]


def flag_value(args, flag):
    """The value of --flag=VALUE or --flag VALUE in args (the last one wins, as in Abseil)."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(f"--{flag}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{flag}" and i + 1 < len(args):
            value = args[i + 1]
    return value


def flag_default(repo, name):
    main_cc = open(os.path.join(repo, "server/main.cc")).read()
    match = re.search(rf"ABSL_FLAG\(int, {name}, (\d+),", main_cc)
    if not match:
        raise SystemExit(f"server/main.cc: no ABSL_FLAG(int, {name}, ...)")
    return int(match.group(1))


def gpu_limit(container):
    return str(((container.get("resources") or {}).get("limits") or {}).get(GPU))


def gpu_request(container):
    return str(((container.get("resources") or {}).get("requests") or {}).get(GPU))


def base_gpus(deployment):
    """The GPU count of deploy/k8s/deployment.yaml's container, or None where it has none."""
    if deployment is None:
        return None
    (base,) = deployment["spec"]["template"]["spec"]["containers"]
    count = gpu_limit(base)
    return count if count.isdigit() and int(count) >= 1 else None


def check_gpus(what, resources_of, expected, problems):
    """`what` requests and limits `expected` GPUs (the base Deployment's count)."""
    if expected is None:
        problems.append(f"deploy/k8s/deployment.yaml's container has no {GPU} limit of 1 or more")
        return
    if gpu_limit(resources_of) != expected:
        problems.append(f"{what} limits {GPU}: {gpu_limit(resources_of)}, expected {expected} "
                        "(deploy/k8s/deployment.yaml's)")
    if gpu_request(resources_of) != gpu_limit(resources_of):
        problems.append(f"{what} requests {GPU}: {gpu_request(resources_of)}, not its limit "
                        f"{gpu_limit(resources_of)}")


def check_runtime(runtime, deployment, repo, problems):
    """The ServingRuntime's kind, protocols, container, port, image, args, probes and GPU."""
    if runtime.get("apiVersion") != "serving.kserve.io/v1alpha1" or runtime.get("kind") != "ServingRuntime":
        problems.append(f"servingruntime.yaml: {runtime.get('apiVersion')} {runtime.get('kind')}, "
                        "expected serving.kserve.io/v1alpha1 ServingRuntime")
    spec = runtime.get("spec") or {}
    if "grpc-v2" not in (spec.get("protocolVersions") or []):
        problems.append(f"runtime protocolVersions {spec.get('protocolVersions')} lack grpc-v2 "
                        "(the Open Inference Protocol over gRPC)")
    containers = [c for c in spec.get("containers") or [] if c.get("name") == "kserve-container"]
    if len(containers) != 1:
        problems.append("runtime: no container named kserve-container (the one KServe merges the "
                        "model spec into)")
        return
    (c,) = containers
    args = [str(a) for a in c.get("args") or []]
    grpc_port = flag_default(repo, "port")
    ports = c.get("ports") or []
    # KServe sends gRPC to the port named h2c; Knative allows a single port.
    if [p.get("name") for p in ports] != ["h2c"]:
        problems.append(f"runtime ports {[p.get('name') for p in ports]}: expected one, named h2c")
    for p in ports:
        if p.get("name") == "h2c" and p.get("containerPort") != grpc_port:
            problems.append(f"runtime port h2c is {p.get('containerPort')}, the server's default "
                            f"gRPC port (server/main.cc --port) is {grpc_port}")
    port_flag = flag_value(args, "port")
    if port_flag is not None and int(port_flag) != grpc_port:
        problems.append(f"runtime runs --port={port_flag}, not the h2c port {grpc_port}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = ((c.get(probe) or {}).get("grpc") or {}).get("port")
        if port != grpc_port:
            problems.append(f"runtime {probe} is not a gRPC probe on port {grpc_port} (got {port})")
    check_gpus("runtime container", c, base_gpus(deployment), problems)
    if deployment is not None:
        (base,) = deployment["spec"]["template"]["spec"]["containers"]
        if c.get("image") != base.get("image"):
            problems.append(f"runtime image {c.get('image')} is not deploy/k8s/deployment.yaml's "
                            f"{base.get('image')}")
        base_args = [str(a) for a in base.get("args") or []]
        if args != base_args:
            problems.append(f"runtime args {args} are not deploy/k8s/deployment.yaml's {base_args}")


def check_inference_service(isvc, runtime, deployment, repo, problems):
    """The InferenceService's kind, its reference to the runtime, its GPU and its grace period."""
    if isvc.get("apiVersion") != "serving.kserve.io/v1beta1" or isvc.get("kind") != "InferenceService":
        problems.append(f"inferenceservice.yaml: {isvc.get('apiVersion')} {isvc.get('kind')}, "
                        "expected serving.kserve.io/v1beta1 InferenceService")
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    model = predictor.get("model") or {}
    rspec = (runtime or {}).get("spec") or {}
    name = ((runtime or {}).get("metadata") or {}).get("name")
    if model.get("runtime") != name:
        problems.append(f"InferenceService model runtime {model.get('runtime')!r} is not the "
                        f"ServingRuntime {name!r}")
    formats = [f.get("name") for f in rspec.get("supportedModelFormats") or []]
    if (model.get("modelFormat") or {}).get("name") not in formats:
        problems.append(f"InferenceService model format {model.get('modelFormat')} is not among "
                        f"the runtime's {formats}")
    protocol = model.get("protocolVersion")
    if protocol != "grpc-v2" or protocol not in (rspec.get("protocolVersions") or []):
        problems.append(f"InferenceService protocolVersion {protocol!r}: expected grpc-v2, "
                        "listed by the runtime")
    # KServe merges these into the runtime's container, key by key: state the GPU here too, so
    # that the example reads whole and an edit of the runtime cannot change it unseen.
    check_gpus("InferenceService model", model, base_gpus(deployment), problems)
    containers = [c for c in rspec.get("containers") or [] if c.get("name") == "kserve-container"]
    args = [str(a) for a in (containers[0].get("args") or [])] if containers else []
    grace = int(flag_value(args, "shutdown_grace_seconds") or flag_default(repo, "shutdown_grace_seconds"))
    kill_after = predictor.get("terminationGracePeriodSeconds", 30)
    if kill_after < grace + STOP_MARGIN_S:
        problems.append(f"InferenceService terminationGracePeriodSeconds {kill_after} leaves less "
                        f"than {STOP_MARGIN_S} s after a {grace} s drain")


def check_kustomization(kserve, repo, problems):
    kust = load_one(os.path.join(kserve, "kustomization.yaml"), problems) or {}
    base = load_one(os.path.join(repo, "deploy/k8s/kustomization.yaml"), problems) or {}
    listed = set(kust.get("resources") or [])
    for needed in ("servingruntime.yaml", "inferenceservice.yaml"):
        if needed not in listed:
            problems.append(f"kustomization.yaml does not list {needed}")
    if kust.get("images") != base.get("images"):
        problems.append(f"kustomization.yaml images {kust.get('images')} are not the base's "
                        f"{base.get('images')}")


def op_names(tool):
    """The op table's op names, from opserve-op-table describe."""
    out = subprocess.run([tool, "describe"], check=True, capture_output=True, text=True).stdout
    return [op["name"] for op in json.loads(out)["ops"]]


def check_no_op_list(kserve, ops, problems):
    for name in sorted(os.listdir(kserve)):
        if not name.endswith(".yaml"):
            continue
        text = open(os.path.join(kserve, name)).read()
        named = [op for op in ops if re.search(rf"\b{re.escape(op)}\b", text)]
        if named:
            problems.append(f"{name} names ops {named}: the server lists its ops (ListOps, "
                            "RepositoryIndex); a list here goes stale")


def kustomize(folder, problems):
    """The objects `kubectl kustomize folder` renders, by kind; {} (with a problem) on failure."""
    run = subprocess.run(["kubectl", "kustomize", folder], capture_output=True, text=True)
    if run.returncode != 0:
        problems.append(f"kubectl kustomize {folder} failed: {run.stderr.strip()}")
        return {}
    return {d["kind"]: d for d in yaml.safe_load_all(run.stdout) if d}


def check_rendered(repo, problems):
    if shutil.which("kubectl") is None:
        problems.append("kubectl not found: the manifests were not rendered (CI has it: see "
                        "docs/DEPLOY.md)")
        return
    rendered = kustomize(os.path.join(repo, KSERVE), problems)
    base = kustomize(os.path.join(repo, "deploy/k8s"), problems)
    if not rendered or not base:
        return
    for kind in ("ServingRuntime", "InferenceService"):
        if kind not in rendered:
            problems.append(f"kubectl kustomize {KSERVE}: no {kind} rendered")
    if "ServingRuntime" in rendered and "Deployment" in base:
        image = rendered["ServingRuntime"]["spec"]["containers"][0].get("image")
        base_image = base["Deployment"]["spec"]["template"]["spec"]["containers"][0].get("image")
        if image != base_image:
            problems.append(f"rendered runtime image {image} is not the base Deployment's {base_image}")


def check(repo, ops=()):
    problems = []
    kserve = os.path.join(repo, KSERVE)
    runtime = load_one(os.path.join(kserve, "servingruntime.yaml"), problems)
    isvc = load_one(os.path.join(kserve, "inferenceservice.yaml"), problems)
    deployment = load_one(os.path.join(repo, "deploy/k8s/deployment.yaml"), problems)
    if runtime is not None:
        check_runtime(runtime, deployment, repo, problems)
    if isvc is not None:
        check_inference_service(isvc, runtime, deployment, repo, problems)
    check_kustomization(kserve, repo, problems)
    check_no_op_list(kserve, ops, problems)
    check_rendered(repo, problems)
    return problems


# Each: file (from the repository root), the exact text, its replacement, and a piece of the
# problem it must cause (so that the check meant to catch it is the one that does).
MUTANTS = [
    (f"{KSERVE}/servingruntime.yaml", "kind: ServingRuntime", "kind: ClusterServingRuntime",
     "expected serving.kserve.io/v1alpha1 ServingRuntime"),
    (f"{KSERVE}/servingruntime.yaml", "apiVersion: serving.kserve.io/v1alpha1",
     "apiVersion: serving.kserve.io/v1beta1", "expected serving.kserve.io/v1alpha1 ServingRuntime"),
    (f"{KSERVE}/inferenceservice.yaml", "apiVersion: serving.kserve.io/v1beta1",
     "apiVersion: serving.kserve.io/v1alpha1", "expected serving.kserve.io/v1beta1 InferenceService"),
    (f"{KSERVE}/servingruntime.yaml", "    - grpc-v2\n", "    - v2\n", "lack grpc-v2"),
    (f"{KSERVE}/servingruntime.yaml", "- name: kserve-container", "- name: opserve",
     "no container named kserve-container"),
    (f"{KSERVE}/servingruntime.yaml", "- name: h2c", "- name: grpc", "expected one, named h2c"),
    (f"{KSERVE}/servingruntime.yaml", "containerPort: 50051", "containerPort: 50052",
     "the server's default gRPC port"),
    ("server/main.cc", "ABSL_FLAG(int, port, 50051,", "ABSL_FLAG(int, port, 50052,",
     "the server's default gRPC port"),
    (f"{KSERVE}/servingruntime.yaml", "- --port=50051", "- --port=50052",
     "runs --port=50052, not the h2c port"),
    (f"{KSERVE}/servingruntime.yaml", "livenessProbe:\n        grpc:\n          port: 50051",
     "livenessProbe:\n        grpc:\n          port: 9464", "livenessProbe is not a gRPC probe"),
    (f"{KSERVE}/servingruntime.yaml", "memory: 16Gi\n          nvidia.com/gpu: 2", "memory: 16Gi",
     "runtime container limits nvidia.com/gpu"),
    (f"{KSERVE}/servingruntime.yaml", "memory: 16Gi\n          nvidia.com/gpu: 2",
     "memory: 16Gi\n          nvidia.com/gpu: 1", "runtime container limits nvidia.com/gpu: 1, expected 2"),
    (f"{KSERVE}/servingruntime.yaml", "memory: 4Gi\n          nvidia.com/gpu: 2",
     "memory: 4Gi\n          nvidia.com/gpu: 1", "runtime container requests nvidia.com/gpu: 1"),
    ("deploy/k8s/deployment.yaml", "memory: 16Gi\n              nvidia.com/gpu: 2",
     "memory: 16Gi\n              nvidia.com/gpu: 4", "expected 4 (deploy/k8s/deployment.yaml's)"),
    (f"{KSERVE}/servingruntime.yaml", "image: opserve", "image: opserve-kserve",
     "is not deploy/k8s/deployment.yaml's opserve"),
    (f"{KSERVE}/servingruntime.yaml", "- --device=cuda", "- --device=auto",
     "are not deploy/k8s/deployment.yaml's"),
    (f"{KSERVE}/inferenceservice.yaml", "runtime: opserve", "runtime: kserve-tritonserver",
     "is not the ServingRuntime 'opserve'"),
    (f"{KSERVE}/inferenceservice.yaml", "modelFormat:\n        name: opserve",
     "modelFormat:\n        name: triton", "is not among the runtime's"),
    (f"{KSERVE}/inferenceservice.yaml", "protocolVersion: grpc-v2", "protocolVersion: v2",
     "InferenceService protocolVersion 'v2'"),
    (f"{KSERVE}/inferenceservice.yaml", "memory: 16Gi\n          nvidia.com/gpu: 2", "memory: 16Gi",
     "InferenceService model limits nvidia.com/gpu"),
    (f"{KSERVE}/inferenceservice.yaml", "memory: 16Gi\n          nvidia.com/gpu: 2",
     "memory: 16Gi\n          nvidia.com/gpu: 1", "InferenceService model limits nvidia.com/gpu: 1"),
    (f"{KSERVE}/inferenceservice.yaml", "terminationGracePeriodSeconds: 45",
     "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds 30 leaves less"),
    (f"{KSERVE}/kustomization.yaml", "  - inferenceservice.yaml\n", "",
     "does not list inferenceservice.yaml"),
    (f"{KSERVE}/kustomization.yaml", 'newTag: "0.1.0"', 'newTag: "0.2.0"', "are not the base's"),
    # Broken for kubectl only: a patch file that is not there.
    (f"{KSERVE}/kustomization.yaml", "images:", "patches:\n  - path: missing.yaml\nimages:",
     "kubectl kustomize"),
    (f"{KSERVE}/servingruntime.yaml", "every op the server lists as a model",
     "the ops as models: sum, row_sum", "names ops ["),
]


def run_mutants(repo, ops):
    if shutil.which("kubectl") is None:
        print("kubectl not found: the mutants need it (CI has it: see docs/DEPLOY.md)")
        return 1
    missed = 0
    # The op list's mutant needs the op table's names (--op-table).
    mutants = [m for m in MUTANTS if ops or not m[3].startswith("names ops")]
    with tempfile.TemporaryDirectory() as tmp:
        for path, old, new, expected in mutants:
            copy = os.path.join(tmp, "repo")
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(os.path.join(repo, "deploy/k8s"), os.path.join(copy, "deploy/k8s"))
            os.makedirs(os.path.join(copy, "server"))
            shutil.copy(os.path.join(repo, "server/main.cc"), os.path.join(copy, "server"))
            text = open(os.path.join(copy, path)).read()
            if old not in text:
                # A mutant that no longer applies must be updated, not pass silently.
                print(f"STALE mutant: {path}: {old!r} not found")
                missed += 1
                continue
            open(os.path.join(copy, path), "w").write(text.replace(old, new))
            problems = check(copy, ops)
            if not any(expected in p for p in problems):
                print(f"SURVIVED: {path}: {old!r} -> {new!r} (problems: {problems})")
                missed += 1
    print(f"kserve mutants: {len(mutants)} applied, {len(mutants) - missed} caught, {missed} not")
    return 1 if missed else 0


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    parser.add_argument("--mutants", action="store_true", help="run the mutants instead")
    parser.add_argument("--op-table", help="opserve-op-table: check that no op list is kept here")
    args = parser.parse_args()
    repo = os.path.abspath(args.repo)
    ops = op_names(args.op_table) if args.op_table else []
    if args.mutants:
        return run_mutants(repo, ops)
    problems = check(repo, ops)
    for problem in problems:
        print("FAIL", problem)
    print(f"check_kserve: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
