#!/usr/bin/env python3
"""Checks deploy/docker without a container engine (python3 and python3-yaml).

  check_docker.py compose DEFAULT.yaml WIDE.yaml [--repo DIR]
      DEFAULT.yaml and WIDE.yaml are `docker-compose config` of compose.yaml rendered with
      OPSERVE_BIND_ADDR unset and with OPSERVE_BIND_ADDR=0.0.0.0. Checks:
      - every published port binds 127.0.0.1 by default, and OPSERVE_BIND_ADDR moves every one
        of them (the documented way to publish wider);
      - every opserve service's stop_grace_period (Docker's default is 10 s) exceeds the
        --shutdown_grace_seconds it is started with (the default read from server/main.cc) by at
        least STOP_MARGIN_S, the time left for the teardown after the drain;
      - the service that reserves a GPU runs --device=cuda (or cuda:N, or a list cuda:0,2), never
        auto or cpu; one that reserves several GPUs (count: all, count: N > 1, several
        device_ids) serves each: --device=cuda (every GPU the container sees), or a list of as
        many.
  check_docker.py dockerfile [--repo DIR] [--dockerfile FILE] [--libs-script FILE] [--cpu]
      Checks the Dockerfile (default deploy/docker/Dockerfile):
      - every FROM names its image fully qualified, registry included (docker.io/nvidia/cuda,
        docker.io/library/debian): Podman and CRI-O, without Docker's default registry, refuse
        or ask about a short name;
      - with --cpu (deploy/docker/Dockerfile.cpu): no CUDA anywhere (no CUDA or NVIDIA image,
        package or path), the build says -DOPSERVE_CUDA=OFF, and the library check runs
        --without-cublas; without it, the library check looks for cuBLAS;
      and its runtime stage:
      - the group is created with an explicit gid before the user, the user gets that gid, no
        `useradd --user-group` (it takes the next free system gid), and USER names the same
        numeric uid:gid;
      - the user's home is created (useradd --create-home), and HOME, if set, is that home;
      - the binaries are checked by check-runtime-libs.sh after they are copied in, and that
        script (default deploy/docker/check-runtime-libs.sh) looks for the cuBLAS soname that
        kernels/cublas_loader.cc dlopen()s.
      (What check-runtime-libs.sh does with a failing ldd or a missing cuBLAS is tested by
      running it: scripts/check-deploy.sh dockerfile.)

Exit status 0 when all is well, 1 on a finding.
"""

import argparse
import os
import re
import shlex
import sys

import yaml

# Time after the drain's deadline for cancelling the calls left, stopping the device worker and
# releasing the GPU, before Docker's SIGKILL.
STOP_MARGIN_S = 5
LOCALHOST = "127.0.0.1"
WIDE = "0.0.0.0"


def duration_seconds(text):
    """A Compose duration ("45s", "1m30s", "1.5s", "500ms") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text):
        raise ValueError(f"not a Compose duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def host_ips(ports):
    """The host address of each published port, None where none is given (every interface)."""
    ips = []
    for port in ports or []:
        if isinstance(port, dict):
            ips.append(port.get("host_ip"))
        else:
            # "[ip:]published:target[/proto]", or just "target" (a random host port).
            fields = str(port).split("/")[0].rsplit(":", 2)
            ips.append(fields[0] if len(fields) == 3 else None)
    return ips


def flag_value(command, flag):
    """The value of --flag=VALUE or --flag VALUE in command (the last one wins, as in Abseil)."""
    value = None
    for i, arg in enumerate(command):
        if arg.startswith(f"--{flag}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{flag}" and i + 1 < len(command):
            value = command[i + 1]
    return value


def default_grace_seconds(repo):
    main_cc = open(os.path.join(repo, "server/main.cc")).read()
    match = re.search(r"ABSL_FLAG\(int, shutdown_grace_seconds, (\d+),", main_cc)
    if not match:
        raise SystemExit("server/main.cc: no ABSL_FLAG(int, shutdown_grace_seconds, ...)")
    return int(match.group(1))


def gpu_reservations(service):
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return [d for d in reservations.get("devices", [])
            if d.get("driver") == "nvidia" or "gpu" in d.get("capabilities", [])]


def reserves_gpu(service):
    return bool(gpu_reservations(service))


def reserved_gpus(service):
    """How many GPUs the service reserves: a number, or "all"."""
    total = 0
    for d in gpu_reservations(service):
        if str(d.get("count")) in ("all", "-1"):
            return "all"
        total += len(d["device_ids"]) if d.get("device_ids") else int(d.get("count", 1))
    return total


def listed_gpus(device):
    """How many GPUs --device=cuda:I[,J...] names (None for --device=cuda: every visible one,
    which is every one the service reserves)."""
    return None if device == "cuda" else len(device.split(":", 1)[1].split(","))


def check_compose(default_path, wide_path, repo):
    problems = []
    default = yaml.safe_load(open(default_path))["services"]
    wide = yaml.safe_load(open(wide_path))["services"]
    grace_default = default_grace_seconds(repo)
    opserve_services = 0
    for name, service in sorted(default.items()):
        for ip, wide_ip in zip(host_ips(service.get("ports")), host_ips(wide[name].get("ports"))):
            if ip != LOCALHOST:
                problems.append(f"{name}: a port binds {ip or 'every interface'}, not {LOCALHOST}")
            elif wide_ip != WIDE:
                problems.append(f"{name}: a port stays on {wide_ip} with OPSERVE_BIND_ADDR={WIDE}")
        if service.get("image", "").split(":")[0] != "opserve":
            continue
        opserve_services += 1
        command = [str(arg) for arg in service.get("command", [])]
        grace = int(flag_value(command, "shutdown_grace_seconds") or grace_default)
        stop = duration_seconds(service.get("stop_grace_period", "10s"))
        if stop < grace + STOP_MARGIN_S:
            problems.append(f"{name}: stop_grace_period {stop:g} s leaves less than {STOP_MARGIN_S} s "
                            f"after a drain of --shutdown_grace_seconds={grace}")
        device = flag_value(command, "device") or "auto"
        if reserves_gpu(service) and not re.fullmatch(r"cuda(:\d+(,\d+)*)?", device):
            problems.append(f"{name}: reserves a GPU but runs --device={device}: a broken GPU would "
                            "serve on the CPU backend instead of failing")
        elif reserves_gpu(service):
            reserved, listed = reserved_gpus(service), listed_gpus(device)
            if listed is not None and (reserved == "all" or listed < reserved):
                problems.append(f"{name}: reserves {reserved} GPUs but runs --device={device}, "
                                f"which serves {listed}: the others would sit idle (--device=cuda "
                                "serves every GPU the container sees)")
    if opserve_services < 2:
        problems.append(f"{opserve_services} opserve services (image opserve:...), "
                        "expected the GPU and CPU ones")
    if not any(reserves_gpu(s) for s in default.values()):
        problems.append("no service reserves a GPU")
    return problems


def instructions(dockerfile):
    """(keyword, arguments) of each instruction, continuation lines joined, comments dropped."""
    result, current = [], ""
    for line in open(dockerfile).read().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, args = current.strip().partition(" ")
        result.append((keyword.upper(), args.strip()))
        current = ""
    return result


def shell_commands(run_args):
    """The simple commands of a RUN line, each as argv (split on &&, ||, ;)."""
    commands = []
    for part in re.split(r"&&|\|\||;", run_args):
        try:
            commands.append(shlex.split(part))
        except ValueError:  # a quote split by the separators above: words are enough here
            commands.append(part.split())
    return [argv for argv in commands if argv]


def option(argv, *names):
    """The value of the first of names in argv (--name VALUE, --name=VALUE or -n VALUE)."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return None


def image_problems(steps, cpu):
    """The FROM lines' images, and for a CPU-only file any mention of CUDA."""
    problems, stages = [], set()
    for keyword, args in steps:
        if keyword != "FROM":
            continue
        words = [w for w in args.split() if not w.startswith("--")]
        image = words[0] if words else ""
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2])
        if image in stages:
            continue  # an earlier stage of this file
        registry = image.split("/")[0] if "/" in image else ""
        if not ("." in registry or ":" in registry or registry == "localhost"):
            problems.append(f"FROM {image}: not fully qualified (e.g. docker.io/library/debian:12-slim)")
    if cpu:
        for keyword, args in steps:
            text = args.replace("-DOPSERVE_CUDA=OFF", "")
            if re.search(r"cuda|nvidia|cublas", text, re.I) and "--without-cublas" not in text:
                problems.append(f"{keyword} {args[:80]}: a CPU-only image mentions CUDA")
        if not any(k == "RUN" and "-DOPSERVE_CUDA=OFF" in a for k, a in steps):
            problems.append("the build does not say -DOPSERVE_CUDA=OFF")
    return problems


def build_package_problems(repo, steps):
    """The build stage installs every -dev package scripts/install-deps.sh installs for a build:
    the same CMake find_package calls run in both."""
    script = open(os.path.join(repo, "scripts", "install-deps.sh"), encoding="utf-8").read()
    listed = re.search(r"^packages=\((.*?)^\)", script, re.S | re.M)
    if listed is None:
        return ["scripts/install-deps.sh: no packages=( ... ) list found"]
    words = [w for line in listed.group(1).splitlines() for w in line.split("#")[0].split()]
    needed = [w for w in words if w.endswith("-dev") or w.startswith("protobuf-compiler")]
    first_from = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    build = steps[first_from[0]:first_from[1] if len(first_from) > 1 else len(steps)]
    installed = set(" ".join(args for keyword, args in build if keyword == "RUN").split())
    return [f"build stage: {w} not installed (scripts/install-deps.sh installs it for the build)"
            for w in needed if w not in installed]


def check_dockerfile(repo, path, libs_script, cpu=False):
    steps = instructions(path)
    problems = image_problems(steps, cpu) + build_package_problems(repo, steps)
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    runtime = steps[last_from:]

    commands = []  # (instruction index, argv) of every command RUN in the runtime stage
    for i, (keyword, args) in enumerate(runtime):
        if keyword == "RUN":
            commands += [(i, argv) for argv in shell_commands(args)]
    groupadds = [(n, argv) for n, (_, argv) in enumerate(commands) if argv[0] == "groupadd"]
    useradds = [(n, argv) for n, (_, argv) in enumerate(commands) if argv[0] == "useradd"]
    users = [args for keyword, args in runtime if keyword == "USER"]
    if len(groupadds) != 1:
        problems.append(f"runtime stage: {len(groupadds)} groupadd, expected one that creates the "
                        "user's group with an explicit gid")
    if len(useradds) != 1 or len(users) != 1:
        problems.append(f"runtime stage: {len(useradds)} useradd, {len(users)} USER; "
                        "expected one of each")
    if len(useradds) == 1 and len(users) == 1:
        ((user_at, useradd),), (user_line,) = useradds, users
        group_at, groupadd = groupadds[0] if len(groupadds) == 1 else (None, [])
        gid = option(groupadd, "--gid", "-g")
        group_name = groupadd[-1] if groupadd else None
        uid = option(useradd, "--uid", "-u")
        user_gid = option(useradd, "--gid", "-g")
        if groupadd and gid is None:
            problems.append("groupadd without --gid: the group gets the next free system gid")
        if group_at is not None and group_at > user_at:
            problems.append("useradd runs before groupadd: its group does not exist yet")
        if "--user-group" in useradd or "-U" in useradd:
            problems.append("useradd --user-group: the group gets the next free system gid, not the uid")
        if user_gid is None:
            problems.append("useradd without --gid: the user's group is not the one created for it")
        elif groupadd and user_gid not in (gid, group_name):
            problems.append(f"useradd --gid {user_gid}: not the group made by groupadd "
                            f"({group_name}, gid {gid})")
        if gid is not None and user_line != f"{uid}:{gid}":
            problems.append(f"USER {user_line}: expected {uid}:{gid}, the uid and gid created above "
                            "(numeric, so that Kubernetes' runAsNonRoot can check it)")
        home = option(useradd, "--home-dir", "-d") or f"/home/{useradd[-1]}"
        env_home = [m.group(1) for keyword, args in runtime if keyword == "ENV"
                    for m in [re.match(r"HOME[= ]\s*(\S+)", args)] if m]
        if "--create-home" not in useradd and "-m" not in useradd:
            problems.append(f"useradd without --create-home: HOME ({home}) does not exist")
        if env_home and env_home[-1] != home:
            problems.append(f"ENV HOME={env_home[-1]}, not the user's home {home}")

    copies_binaries = next(
        (i for i, (k, a) in enumerate(runtime) if k == "COPY" and "--from=build" in a), None)
    checks = [i for i, argv in commands if any(arg.endswith("check-runtime-libs.sh") for arg in argv)
              and any(arg.endswith("/opserve") for arg in argv)
              and any(arg.endswith("/opserve-cli") for arg in argv)]
    without_cublas = [i for i, argv in commands if "--without-cublas" in argv]
    if not checks:
        problems.append("no RUN of check-runtime-libs.sh on opserve and opserve-cli in the runtime stage")
    elif cpu != bool(without_cublas):
        problems.append("check-runtime-libs.sh " + ("looks for cuBLAS in a CPU-only image" if cpu else
                        "runs --without-cublas in an image whose matmul loads cuBLAS"))
    elif copies_binaries is None or min(checks) < copies_binaries:
        problems.append("check-runtime-libs.sh runs before the binaries are copied in")
    if not any(k == "COPY" and "deploy/docker/check-runtime-libs.sh" in a for k, a in runtime):
        problems.append("the runtime stage does not COPY deploy/docker/check-runtime-libs.sh")

    if cpu:
        return problems
    loader = open(os.path.join(repo, "kernels/cublas_loader.cc")).read()
    sonames = set(re.findall(r'dlopen\("(?:[^"]*/)?(libcublas\.so\.\d+)"', loader))
    # The sonames the script looks for: its `for soname in ...` loop.
    loop = re.search(r"^for soname in ([^;\n]*); do$", open(libs_script).read(), re.M)
    looked_for = loop.group(1).split() if loop else []
    if len(sonames) != 1:
        problems.append(
            f"kernels/cublas_loader.cc: expected one cuBLAS soname, found {sorted(sonames)}")
    else:
        (soname,) = sonames
        for needed in (soname, soname.replace("libcublas", "libcublasLt")):
            if needed not in looked_for:
                problems.append(f"check-runtime-libs.sh does not look for {needed} "
                                f"(kernels/cublas_loader.cc loads {soname})")
    return problems


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["compose", "dockerfile"])
    parser.add_argument("rendered", nargs="*", help="compose: the default and the wide rendering")
    parser.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    parser.add_argument("--dockerfile", help="default: deploy/docker/Dockerfile of the repo")
    parser.add_argument("--libs-script", help="default: deploy/docker/check-runtime-libs.sh of the repo")
    parser.add_argument("--cpu", action="store_true", help="a CPU-only Dockerfile (Dockerfile.cpu)")
    args = parser.parse_args()
    if args.what == "compose":
        if len(args.rendered) != 2:
            parser.error("compose needs DEFAULT.yaml and WIDE.yaml")
        problems = check_compose(*args.rendered, args.repo)
    else:
        docker = os.path.join(args.repo, "deploy/docker")
        problems = check_dockerfile(args.repo, args.dockerfile or os.path.join(docker, "Dockerfile"),
                                    args.libs_script or os.path.join(docker, "check-runtime-libs.sh"),
                                    cpu=args.cpu)
    for problem in problems:
        print("FAIL", problem)
    print(f"check_docker {args.what}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
