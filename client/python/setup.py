"""Builds the opserve package, compiling proto/ into a descriptor set as part of build_py.

The descriptor set (opserve/opserve_v1.desc, written into the build tree, never the source tree)
is what opserve._proto turns into message classes at import. Unlike generated *_pb2.py code it
cannot disagree with the protobuf runtime installed next to it, whichever implementation (C++,
upb or pure Python) that runtime uses.

Where proto/ lives: OPSERVE_PROTO_ROOT if set, else two levels up (this file is
client/python/setup.py in the opserve repository). protoc: PROTOC if set, else the one on PATH
(Debian's protobuf-compiler).
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# The Open Inference Protocol's service beside opserve's own: saved graphs run through its
# ModelInfer, and shared memory regions are registered through it.
PROTO_FILES = ["opserve/v1/opserve.proto", "inference/grpc_service.proto"]
DESCRIPTOR_NAME = "opserve_v1.desc"


def proto_root() -> str:
    root = os.environ.get("OPSERVE_PROTO_ROOT") or os.path.join(HERE, os.pardir, os.pardir, "proto")
    root = os.path.abspath(root)
    missing = [p for p in PROTO_FILES if not os.path.isfile(os.path.join(root, p))]
    if missing:
        raise SystemExit(f"opserve: {', '.join(missing)} not found under {root}; "
                         "set OPSERVE_PROTO_ROOT to the repository's proto/ directory")
    return root


def find_protoc() -> str:
    protoc = os.environ.get("PROTOC") or shutil.which("protoc")
    if not protoc:
        raise SystemExit("opserve: protoc not found (Debian: apt-get install protobuf-compiler); "
                         "or set PROTOC")
    return protoc


class BuildPyWithDescriptors(build_py):
    """build_py, then protoc --descriptor_set_out into the built package."""

    def run(self) -> None:
        super().run()
        out = os.path.abspath(os.path.join(self.build_lib, "opserve", DESCRIPTOR_NAME))
        os.makedirs(os.path.dirname(out), exist_ok=True)
        root = proto_root()
        # --include_imports: the set stands alone should the proto ever import another file.
        subprocess.run([find_protoc(), f"--proto_path={root}", f"--descriptor_set_out={out}",
                        "--include_imports", *PROTO_FILES], check=True, cwd=root)

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return super().get_outputs(include_bytecode) + [
            os.path.join(self.build_lib, "opserve", DESCRIPTOR_NAME)]


setup(packages=["opserve"], cmdclass={"build_py": BuildPyWithDescriptors})
