"""The API's message classes, built at import from the descriptor set compiled at install time.

setup.py runs protoc on proto/opserve/v1/opserve.proto and proto/inference/grpc_service.proto
(the Open Inference Protocol, for saved graphs and shared memory) and installs the result as
opserve_v1.desc. Building classes from it here, instead of importing generated *_pb2.py code,
means they always match the installed protobuf runtime and its implementation (C++, upb or pure
Python: PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION). The grpc.health.v1 messages are not in proto/;
their two messages are described below, field for field as grpc/health/v1/health.proto has them.
"""

from __future__ import annotations

from importlib import resources
from types import SimpleNamespace
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_DESCRIPTOR_SET = "opserve_v1.desc"
_PACKAGE = "opserve.v1"
_INFERENCE_PACKAGE = "inference"
_HEALTH_PACKAGE = "grpc.health.v1"


def _health_file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="grpc/health/v1/health.proto",
                                           package=_HEALTH_PACKAGE, syntax="proto3")
    request = f.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                      label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    response = f.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
                       type_name=f".{_HEALTH_PACKAGE}.HealthCheckResponse.ServingStatus",
                       label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    return f


def _message_class(pool: descriptor_pool.DescriptorPool, full_name: str) -> Any:
    descriptor = pool.FindMessageTypeByName(full_name)
    # GetMessageClass is protobuf 4.22's name; 3.21 (Debian 12) only has the factory method,
    # which later releases removed.
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def _load() -> SimpleNamespace:
    try:
        data = resources.files(__package__).joinpath(_DESCRIPTOR_SET).read_bytes()
    except FileNotFoundError:
        raise ImportError(f"opserve: {_DESCRIPTOR_SET} is missing; the package must be installed "
                          "with pip (setup.py compiles proto/ into it), not imported from the "
                          "source tree") from None
    # A pool of our own: nothing else in the process (another copy of these protos, say) can
    # clash with it.
    pool = descriptor_pool.DescriptorPool()
    for file_proto in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.AddSerializedFile(file_proto.SerializeToString())
    pool.AddSerializedFile(_health_file().SerializeToString())

    api = pool.FindFileByName("opserve/v1/opserve.proto")
    classes = {name: _message_class(pool, f"{_PACKAGE}.{name}") for name in api.message_types_by_name}
    inference = pool.FindFileByName("inference/grpc_service.proto")
    for name in inference.message_types_by_name:
        # One namespace for both packages: a name in both would hide one of them.
        assert name not in classes, f"{name} is in both {_PACKAGE} and {_INFERENCE_PACKAGE}"
        classes[name] = _message_class(pool, f"{_INFERENCE_PACKAGE}.{name}")
    for name in ("HealthCheckRequest", "HealthCheckResponse"):
        classes[name] = _message_class(pool, f"{_HEALTH_PACKAGE}.{name}")
    dtype = pool.FindEnumTypeByName(f"{_PACKAGE}.DType")
    serving = pool.FindEnumTypeByName(f"{_HEALTH_PACKAGE}.HealthCheckResponse.ServingStatus")
    graph = pool.FindEnumTypeByName(f"{_PACKAGE}.GraphReplay")
    return SimpleNamespace(
        **classes,
        dtype_number={v.name: v.number for v in dtype.values},
        dtype_name={v.number: v.name for v in dtype.values},
        serving_status_name={v.number: v.name for v in serving.values},
        graph_replay_name={v.number: v.name for v in graph.values},
    )


# The messages by name (pb.PutTensorRequest, pb.HealthCheckResponse, ...) and the enums' names
# and numbers.
pb = _load()
