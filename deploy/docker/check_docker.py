#!/usr/bin/env python3
"""Checks deploy/docker without a container engine (python3 standard library only).

  check_docker.py dockerfile [--repo DIR] [--dockerfile FILE] [--libs-script FILE]
      Checks the runtime stage of the Dockerfile (default deploy/docker/Dockerfile):
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


def check_dockerfile(repo, path, libs_script):
    problems = []
    steps = instructions(path)
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
    if not checks:
        problems.append("no RUN of check-runtime-libs.sh on opserve and opserve-cli in the runtime stage")
    elif copies_binaries is None or min(checks) < copies_binaries:
        problems.append("check-runtime-libs.sh runs before the binaries are copied in")
    if not any(k == "COPY" and "deploy/docker/check-runtime-libs.sh" in a for k, a in runtime):
        problems.append("the runtime stage does not COPY deploy/docker/check-runtime-libs.sh")

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
    parser.add_argument("what", choices=["dockerfile"])
    parser.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    parser.add_argument("--dockerfile", help="default: deploy/docker/Dockerfile of the repo")
    parser.add_argument("--libs-script", help="default: deploy/docker/check-runtime-libs.sh of the repo")
    args = parser.parse_args()
    docker = os.path.join(args.repo, "deploy/docker")
    problems = check_dockerfile(args.repo, args.dockerfile or os.path.join(docker, "Dockerfile"),
                                args.libs_script or os.path.join(docker, "check-runtime-libs.sh"))
    for problem in problems:
        print("FAIL", problem)
    print(f"check_docker {args.what}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
