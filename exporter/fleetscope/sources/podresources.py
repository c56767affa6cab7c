"""The kubelet's pod-resources API (v1): which pod and container each allocated GPU is assigned to.

The kubelet serves ``v1.PodResourcesLister/List`` over gRPC on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``, mounted read-only). Its
answer names, per pod and container, the device plugin resources allocated
and their device ids: GPU UUIDs for ``nvidia.com/gpu``, MIG device UUIDs for
``nvidia.com/mig-*``. A GPU allocated to a pod is attributed even while idle,
which the process-based attribution of :mod:`fleetscope.sources.gpu_jobs`
cannot do.

gRPC and protobuf are the ``kubelet`` extra, imported on the first read. The
few messages of the API are described here at runtime (a descriptor built
with ``descriptor_pb2``), so no generated code is checked in; fields this
reader does not describe (cpu ids, memory, topology, dynamic resources) are
skipped by the parser.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import Any

from fleetscope.errors import SourceError

METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCE_PREFIX = "nvidia.com/"
EXTRA_HINT = "gpu.pod-resources-socket needs grpcio and protobuf: pip install 'fleetscope[kubelet]'"

# (message, [(field, number, type, repeated, message type)]): the subset of podresources/v1/api.proto read here
_STRING, _MESSAGE = 9, 11  # FieldDescriptorProto.TYPE_STRING, TYPE_MESSAGE
MESSAGES: tuple[tuple[str, tuple[tuple[str, int, int, bool, str], ...]], ...] = (
    ("ListPodResourcesRequest", ()),
    ("ListPodResourcesResponse", (("pod_resources", 1, _MESSAGE, True, ".v1.PodResources"),)),
    ("PodResources", (("name", 1, _STRING, False, ""), ("namespace", 2, _STRING, False, ""),
                      ("containers", 3, _MESSAGE, True, ".v1.ContainerResources"))),
    ("ContainerResources", (("name", 1, _STRING, False, ""),
                            ("devices", 2, _MESSAGE, True, ".v1.ContainerDevices"))),
    ("ContainerDevices", (("resource_name", 1, _STRING, False, ""), ("device_ids", 2, _STRING, True, ""))),
)


@dataclass(frozen=True)
class Allocation:
    """One device of one container, as the kubelet allocated it."""

    pod: str
    namespace: str
    container: str
    resource: str  # "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"
    device: str  # the device plugin's id: a GPU or MIG device UUID


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise SourceError(EXTRA_HINT) from None


@cache
def message_classes() -> dict[str, Any]:
    """The API's message classes by name, built from a runtime descriptor in a pool of their own."""
    descriptor_pb2 = _import("google.protobuf.descriptor_pb2")
    descriptor_pool = _import("google.protobuf.descriptor_pool")
    message_factory = _import("google.protobuf.message_factory")
    proto = descriptor_pb2.FileDescriptorProto(name="fleetscope/podresources_v1.proto", package="v1", syntax="proto3")
    for message, fields in MESSAGES:
        described = proto.message_type.add(name=message)
        for field, number, kind, repeated, type_name in fields:
            described.field.add(
                name=field, number=number, type=kind, type_name=type_name or None,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if repeated
                else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
            )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {message: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{message}"))
            for message, _ in MESSAGES}


def allocations(response: Any, prefix: str = GPU_RESOURCE_PREFIX) -> tuple[Allocation, ...]:
    """Every device of a resource named ``prefix…`` in a ``ListPodResourcesResponse``."""
    return tuple(
        Allocation(pod.name, pod.namespace, container.name, devices.resource_name, device)
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices if devices.resource_name.startswith(prefix)
        for device in devices.device_ids
    )


def read(socket: str, timeout: float) -> tuple[Allocation, ...]:
    """The GPU allocations the kubelet at ``socket`` reports; :class:`SourceError` (one line) when it cannot be
    asked: the extra missing, the socket absent or refusing, the call timing out or failing."""
    grpc = _import("grpc")
    classes = message_classes()
    request, response = classes["ListPodResourcesRequest"], classes["ListPodResourcesResponse"]
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            call = channel.unary_unary(METHOD, request_serializer=request.SerializeToString,
                                       response_deserializer=response.FromString)
            answer = call(request(), timeout=timeout)
    except grpc.RpcError as exc:
        code, details = getattr(exc, "code", None), getattr(exc, "details", None)
        name = code().name if callable(code) else "error"
        detail = details() if callable(details) else str(exc)
        raise SourceError(f"kubelet pod-resources {socket}: {name}: {' '.join(str(detail).split())}") from None
    return allocations(answer)
