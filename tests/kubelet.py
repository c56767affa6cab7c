"""A kubelet pod-resources server for tests: grpcio's real server answering ``v1.PodResourcesLister/List`` on a
unix socket, with messages described independently of :mod:`fleetscope.sources.podresources` (the fields the
reader skips too: cpu ids, device topology), so the reader is tested against the wire format, not itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
# podresources/v1/api.proto, the messages List answers with (dynamic resources and memory left out)
API = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, F.TYPE_MESSAGE, True, ".v1.PodResources")],
    "PodResources": [("name", 1, F.TYPE_STRING, False, ""), ("namespace", 2, F.TYPE_STRING, False, ""),
                     ("containers", 3, F.TYPE_MESSAGE, True, ".v1.ContainerResources")],
    "ContainerResources": [("name", 1, F.TYPE_STRING, False, ""),
                           ("devices", 2, F.TYPE_MESSAGE, True, ".v1.ContainerDevices"),
                           ("cpu_ids", 3, F.TYPE_INT64, True, "")],
    "ContainerDevices": [("resource_name", 1, F.TYPE_STRING, False, ""), ("device_ids", 2, F.TYPE_STRING, True, ""),
                         ("topology", 3, F.TYPE_MESSAGE, False, ".v1.TopologyInfo")],
    "TopologyInfo": [("nodes", 1, F.TYPE_MESSAGE, True, ".v1.NUMANode")],
    "NUMANode": [("ID", 1, F.TYPE_INT64, False, "")],
}


def _classes() -> dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(name="tests/kubelet_api.proto", package="v1", syntax="proto3")
    for message, fields in API.items():
        described = proto.message_type.add(name=message)
        for name, number, kind, repeated, type_name in fields:
            described.field.add(name=name, number=number, type=kind, type_name=type_name or None,
                                label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {m: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{m}")) for m in API}


CLASSES = _classes()


def response(pods: list[dict[str, Any]]) -> Any:
    """A ListPodResourcesResponse from ``[{"name", "namespace", "containers": [{"name", "devices":
    [(resource, [ids])]}]}]``; every container gets cpu ids and every device NUMA node 0, as a real kubelet's."""
    answer = CLASSES["ListPodResourcesResponse"]()
    for pod in pods:
        described = answer.pod_resources.add(name=pod["name"], namespace=pod["namespace"])
        for container in pod["containers"]:
            entry = described.containers.add(name=container["name"], cpu_ids=[2, 3])
            for resource, ids in container["devices"]:
                device = entry.devices.add(resource_name=resource, device_ids=ids)
                device.topology.nodes.add(ID=0)
    return answer


@contextmanager
def kubelet(socket: str, answer: Any) -> Iterator[list[Any]]:
    """Serve ``answer`` to every List on ``socket``; yields the list of requests received."""
    requests: list[Any] = []

    def list_pods(request: Any, context: Any) -> Any:
        requests.append(request)
        return answer

    handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(
            list_pods, request_deserializer=CLASSES["ListPodResourcesRequest"].FromString,
            response_serializer=CLASSES["ListPodResourcesResponse"].SerializeToString),
    })
    server = grpc.server(_executor(), handlers=[handler])
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield requests
    finally:
        server.stop(None)


def _executor() -> Any:
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=2)
