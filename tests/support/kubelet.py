"""A kubelet's pod-resources API on a unix socket, for the exporter's tests: a real gRPC server
whose answers are encoded by hand, field numbers taken from the kubelet's
k8s.io/kubelet/pkg/apis/podresources/v1/api.proto, fields the exporter does not read included
(CPU ids, NUMA topology). Nothing of the exporter's own descriptor makes them, so a wrong
field number there shows in its tests."""

from __future__ import annotations

import time
from concurrent import futures
from pathlib import Path

import grpc


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _text(number: int, value: str) -> bytes:
    return _bytes(number, value.encode())


def devices(resource: str, *ids: str, numa: int = 0) -> bytes:
    """ContainerDevices: resource_name = 1, device_ids = 2, topology = 3 (TopologyInfo.nodes = 1,
    NUMANode.ID = 1)."""
    topology = _bytes(1, _varint(1 << 3 | 0) + _varint(numa))
    return _text(1, resource) + b"".join(_text(2, i) for i in ids) + _bytes(3, topology)


def container(name: str, *held: bytes) -> bytes:
    """ContainerResources: name = 1, devices = 2, cpu_ids = 3 (packed int64)."""
    return _text(1, name) + b"".join(_bytes(2, d) for d in held) + _bytes(3, _varint(4) + _varint(5))


def pod(namespace: str, name: str, *containers: bytes) -> bytes:
    """PodResources: name = 1, namespace = 2, containers = 3."""
    return _text(1, name) + _text(2, namespace) + b"".join(_bytes(3, c) for c in containers)


def listing(*pods: bytes) -> bytes:
    """ListPodResourcesResponse: pod_resources = 1."""
    return b"".join(_bytes(1, p) for p in pods)


def allocatable(*held: bytes) -> bytes:
    """AllocatableResourcesResponse: devices = 1 (ContainerDevices), cpu_ids = 2 (packed int64)."""
    return b"".join(_bytes(1, d) for d in held) + _bytes(2, _varint(0) + _varint(1))


class Kubelet:
    """A gRPC server on a unix socket serving v1.PodResourcesLister: ``List`` with ``answer``
    (``delay_s`` late), ``GetAllocatableResources`` with ``allocatable`` where it is set (left
    None, the method is not served, as by a kubelet before Kubernetes 1.28 without its gate)."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.answer = listing()
        self.allocatable: bytes | None = None
        self.delay_s = 0.0
        self.calls = 0
        self.server: grpc.Server | None = None

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        assert request == b""  # ListPodResourcesRequest has no fields
        time.sleep(self.delay_s)
        return self.answer

    def _allocatable(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        assert request == b""
        if self.allocatable is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources")
        return self.allocatable

    def start(self) -> Kubelet:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(self._list),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(self._allocatable)})
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None).wait()
            self.server = None
        self.socket.unlink(missing_ok=True)
