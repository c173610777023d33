"""A tensor's bytes through system shared memory instead of the socket, for a server on this host.

A region lives for one call: a POSIX shared-memory object created here, registered with the
server (the Open Inference Protocol's SystemSharedMemoryRegister), named in the PutTensor
header, the GetTensor request, an Execute inline tensor or a ModelInfer input, then unregistered
and removed, on every path. The sync and asyncio clients drive the calls; this module makes the regions and the
messages.
"""

from __future__ import annotations

import itertools
import os
import secrets
import socket
from multiprocessing import shared_memory
from typing import Any, Dict, Tuple

import grpc
import numpy as np

from opserve._proto import pb
from opserve.errors import OpserveError, invalid_argument

_counter = itertools.count()
# Offsets of tensors packed into one region keep this alignment, as a device copy prefers.
_ALIGN = 64


class Region:
    """A mapped shared-memory object of at least `nbytes` bytes (1 at least: POSIX wants one)."""

    def __init__(self, nbytes: int) -> None:
        # Random bits as well as the pid: a client killed earlier with the same pid may have
        # left its object behind, and another process's must never be reused.
        name = f"opserve-py-{os.getpid()}-{next(_counter)}-{secrets.token_hex(4)}"
        self._shm = shared_memory.SharedMemory(name=name, create=True, size=max(nbytes, 1))
        self.name = name
        self.key = "/" + name
        self.nbytes = nbytes

    def write(self, offset: int, data: Any) -> None:
        src = np.frombuffer(memoryview(data).cast("B"), np.uint8)
        view = np.frombuffer(self._shm.buf, np.uint8, count=src.nbytes, offset=offset)
        view[:] = src
        del view  # the object cannot be closed while a view of it exists

    def read(self, nbytes: int) -> np.ndarray:
        """A copy of the first nbytes: the object goes away with the call."""
        view = np.frombuffer(self._shm.buf, np.uint8, count=nbytes)
        copy = view.copy()
        del view
        return copy

    def register_request(self) -> Any:
        return pb.SystemSharedMemoryRegisterRequest(name=self.name, key=self.key,
                                                    byte_size=max(self.nbytes, 1))

    def unregister_request(self) -> Any:
        return pb.SystemSharedMemoryUnregisterRequest(name=self.name)

    def ref(self, offset: int, byte_size: int) -> Any:
        return pb.SharedMemoryRef(region=self.name, offset=offset, byte_size=byte_size)

    def close(self) -> None:
        self._shm.close()
        self._shm.unlink()


def _pack(named_data: Any) -> Tuple[int, Dict[Any, Tuple[int, bytes]]]:
    layout, offset = {}, 0
    for key, data in named_data:
        layout[key] = (offset, data)
        offset += -(-len(data) // _ALIGN) * _ALIGN
    return offset, layout


def pack_inline(request: Any) -> Tuple[int, Dict[str, Tuple[int, bytes]]]:
    """Where each inline tensor of an ExecuteRequest goes in one region: (region bytes,
    {name: (offset, data)})."""
    return _pack((name, t.data) for name, t in request.inline_tensors.items())


def pack_infer_inputs(request: Any) -> Tuple[int, Dict[int, Tuple[int, bytes]]]:
    """The same for a ModelInferRequest's raw_input_contents, by input index."""
    return _pack(enumerate(request.raw_input_contents))


def move_inline(request: Any, region: Region, layout: Dict[str, Tuple[int, bytes]]) -> None:
    """Writes the inline tensors into the region and leaves in the request references to it."""
    for name, (offset, data) in layout.items():
        region.write(offset, data)
        tensor = request.inline_tensors[name]
        tensor.data = b""
        tensor.shm.CopyFrom(region.ref(offset, len(data)))


def move_infer_inputs(request: Any, region: Region, layout: Dict[int, Tuple[int, bytes]]) -> None:
    """Writes a ModelInferRequest's inputs into the region; each input then names its range
    (the Open Inference Protocol's shared_memory_* parameters) and the raw contents go."""
    for i, (offset, data) in layout.items():
        region.write(offset, data)
        parameters = request.inputs[i].parameters
        parameters["shared_memory_region"].string_param = region.name
        parameters["shared_memory_offset"].uint64_param = offset
        parameters["shared_memory_byte_size"].uint64_param = len(data)
    del request.raw_input_contents[:]


def _target_host(target: str) -> str:
    """The host of a gRPC target: "host:port", "[v6]:port", "dns:///host:port", "ipv4:a:p"."""
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):].split(",")[0]
            break
    if target.startswith("["):
        return target[1:target.find("]")]
    return target.rsplit(":", 1)[0] if ":" in target else target


def is_local(target: str) -> bool:
    """Whether the target is this host: a unix socket, or an address this host can bind."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(_target_host(target), None)}
    except OSError:
        return False
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address, 0))  # only an address of this host binds
            return True
        except OSError:
            continue
    return False


def check_local(target: str, call: str) -> None:
    if not is_local(target):
        raise invalid_argument(f"{call}: shm=True needs the server on this host, and {target} "
                               "is not an address of this host; leave shm off for a remote server")


def tensor_size(tensors: Any, name: str) -> int:
    """GetTensor into a region needs the size first: the listed tensor's bytes."""
    for info in tensors:
        if info.name == name:
            return int(info.bytes)
    raise OpserveError(grpc.StatusCode.NOT_FOUND, f"tensor {name!r} not found")
