"""Which pod uses which GPU: the kubelet's pod-resources API, read over its unix socket.

The kubelet serves ``v1.PodResourcesLister`` (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto)
on ``/var/lib/kubelet/pod-resources/kubelet.sock``: ``List`` gives every pod's containers and the
device ids the device plugins allocated them; ``GetAllocatableResources`` the ids the plugins
report healthy, which the scheduler may hand out (a GPU NVML sees that is not among them is
capacity lost). The NVIDIA device plugin's ids are a GPU's UUID
(``GPU-…``), a MIG device's UUID (``MIG-…``), a GPU index (its ``index`` id strategy), or, for a
time-sliced GPU, a replica of it (``GPU-…::2``): several pods on one device.

What is exported is one ``inferwatch_gpu_pod_info`` series per GPU and container holding it, not
pod labels on every GPU series: a label that changes when a pod is replaced would start every
counter of the GPU (XIDs, ECC) as a new series, which the XID pages read as a new error (the
reason the dcgm-exporter compatibility rules drop dcgm-exporter's pod labels). Queries join on
``uuid``. ``shared="true"`` marks a GPU more than one container holds: its utilization, power
and clocks belong to all of them together, and are attributable to none (a MIG device's memory
still is, by ``mig_uuid``).

Without the socket (compose, bare metal) nothing is exported and nothing is logged. Once the
socket has answered, a failure (the kubelet restarting, a slow answer past the timeout) keeps
the last answer served, sets ``inferwatch_podresources_up`` to 0 and counts it: pods outlive a
kubelet restart, and a scrape must not lose them for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

log = logging.getLogger(__name__)

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
SERVICE = "v1.PodResourcesLister"
GPU_RESOURCES = ("nvidia.com/",)  # whole GPUs, time-sliced replicas and MIG profiles (nvidia.com/mig-1g.10gb)

_F = descriptor_pb2.FieldDescriptorProto


def _message(name: str, *fields: tuple[str, int, int, int, str]) -> descriptor_pb2.DescriptorProto:
    """(field name, number, type, label, message type) as api.proto declares them."""
    out = descriptor_pb2.DescriptorProto(name=name)
    for field_name, number, kind, label, type_name in fields:
        field = out.field.add(name=field_name, number=number, type=kind, label=label)
        if type_name:
            field.type_name = type_name
    return out


def _api() -> descriptor_pb2.FileDescriptorProto:
    """The messages of the kubelet's api.proto that this reads, with their field numbers; the
    fields left out (CPUs, memory, topology, dynamic resources) are skipped on the wire."""
    rep, opt = _F.LABEL_REPEATED, _F.LABEL_OPTIONAL
    string, message = _F.TYPE_STRING, _F.TYPE_MESSAGE
    proto = descriptor_pb2.FileDescriptorProto(name="podresources/v1/api.proto", package="v1", syntax="proto3")
    proto.message_type.extend([
        _message("ListPodResourcesRequest"),
        _message("ListPodResourcesResponse", ("pod_resources", 1, message, rep, ".v1.PodResources")),
        _message("PodResources", ("name", 1, string, opt, ""), ("namespace", 2, string, opt, ""),
                 ("containers", 3, message, rep, ".v1.ContainerResources")),
        _message("ContainerResources", ("name", 1, string, opt, ""),
                 ("devices", 2, message, rep, ".v1.ContainerDevices")),
        _message("ContainerDevices", ("resource_name", 1, string, opt, ""), ("device_ids", 2, string, rep, "")),
        _message("AllocatableResourcesRequest"),
        _message("AllocatableResourcesResponse", ("devices", 1, message, rep, ".v1.ContainerDevices")),
    ])
    service = proto.service.add(name="PodResourcesLister")
    service.method.add(name="List", input_type=".v1.ListPodResourcesRequest",
                       output_type=".v1.ListPodResourcesResponse")
    service.method.add(name="GetAllocatableResources", input_type=".v1.AllocatableResourcesRequest",
                       output_type=".v1.AllocatableResourcesResponse")
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_api())
MESSAGES: dict[str, Any] = {name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"v1.{name}"))
                            for name in ("ListPodResourcesRequest", "ListPodResourcesResponse", "PodResources",
                                         "ContainerResources", "ContainerDevices", "AllocatableResourcesRequest",
                                         "AllocatableResourcesResponse")}


@dataclass(frozen=True)
class Holder:
    """A container holding a device, as the kubelet lists it."""

    namespace: str
    pod: str
    container: str
    resource: str
    device: str  # the id the device plugin gave: a GPU or MIG UUID, an index, or a replica (``GPU-…::2``)


def holders(response: Any) -> list[Holder]:
    """The GPU devices of a ``ListPodResourcesResponse``, per container."""
    return [Holder(pod.namespace, pod.name, container.name, devices.resource_name, device)
            for pod in response.pod_resources for container in pod.containers for devices in container.devices
            if devices.resource_name.startswith(GPU_RESOURCES) for device in devices.device_ids]


def allocatable(response: Any) -> frozenset[str]:
    """The GPU device ids of an ``AllocatableResourcesResponse``: what the device plugins
    report healthy, which the scheduler may hand out."""
    return frozenset(device for devices in response.devices if devices.resource_name.startswith(GPU_RESOURCES)
                     for device in devices.device_ids)


def physical(device: str) -> str:
    """The device a time-sliced replica id stands for (``GPU-…::2`` → ``GPU-…``)."""
    return device.split("::", 1)[0]


class PodResources:
    """Polls ``List`` every ``interval_s`` in a thread of its own, so a slow kubelet delays
    nothing but this; ``samples`` joins the last answer to the GPUs of a snapshot."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, interval_s: float = 10.0, timeout_s: float = 2.0,
                 exists: Callable[[Path], bool] = Path.exists) -> None:
        self.socket = socket
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._exists = exists
        self._lock = threading.Lock()
        self._holders: list[Holder] = []
        self._allocatable: frozenset[str] | None = None  # None: the kubelet does not say (older, or no answer yet)
        self._answered = False  # the socket has answered once: from then on, a failure is one
        self._up = False
        self._errors: dict[str, int] = {}
        self.version = 0  # bumps on every change, so cached expositions know they are stale
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel: grpc.Channel | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pod-resources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 2)
        self._close()

    def _close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _run(self) -> None:
        while True:
            self.poll()
            if self._stop.wait(self.interval_s):
                return

    def poll(self) -> None:
        """One ``List``; what it found, or why it failed, is what the next scrape says."""
        if not self._exists(self.socket):
            self._close()
            if self._answered:
                self._failed("socket_missing", f"{self.socket} is gone")
            return
        try:
            found = holders(self._call("List", "ListPodResourcesRequest", "ListPodResourcesResponse"))
        except grpc.RpcError as exc:
            self._close()  # a kubelet that restarted listens on a new socket file: connect afresh
            self._failed(exc.code().name.lower(), exc.details() or "")  # a call's RpcError is also a grpc.Call
            return
        try:
            devices: frozenset[str] | None = allocatable(self._call(
                "GetAllocatableResources", "AllocatableResourcesRequest", "AllocatableResourcesResponse"))
        except grpc.RpcError as exc:  # UNIMPLEMENTED before Kubernetes 1.28 without its feature gate
            log.debug("pod-resources GetAllocatableResources: %s", exc)
            devices = None
        with self._lock:
            if not self._up:
                log.info("pod-resources: the kubelet answers at %s", self.socket)
            changed = found != self._holders or devices != self._allocatable or not self._up
            self._holders, self._allocatable, self._up, self._answered = found, devices, True, True
            if changed:
                self.version += 1

    def _call(self, method: str, request: str, response: str) -> Any:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        call = self._channel.unary_unary(f"/{SERVICE}/{method}", request_serializer=MESSAGES[request].SerializeToString,
                                         response_deserializer=MESSAGES[response].FromString)
        return call(MESSAGES[request](), timeout=self.timeout_s)

    def _failed(self, reason: str, detail: str) -> None:
        with self._lock:
            if self._up or not self._answered:
                log.log(logging.WARNING if self._answered else logging.DEBUG,
                        "pod-resources at %s failed (%s: %s); serving the last answer", self.socket, reason, detail)
            self._up = False
            self._errors[reason] = self._errors.get(reason, 0) + 1
            self.version += 1

    def samples(self, gpus: list[tuple[str, ...]], migs: dict[str, tuple[str, ...]],
                ) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        """``inferwatch_gpu_pod_info`` for the GPUs of a snapshot (their GPU_LABELS), found by
        UUID, index, MIG device (``migs``: MIG UUID → its GPU's labels) or replica; whether the
        kubelet may allocate each GPU (any of its ids, a MIG device's included, among what the
        device plugins report healthy); and the API's own health once it has answered."""
        by_id = {labels[1]: labels for labels in gpus} | {labels[0]: labels for labels in gpus} | migs
        with self._lock:
            holders_, up, answered, errors = list(self._holders), self._up, self._answered, dict(self._errors)
            devices = self._allocatable
        rows = [(by_id[physical(h.device)], h) for h in holders_ if physical(h.device) in by_id]
        per_gpu: dict[str, set[tuple[str, str, str]]] = {}
        for labels, h in rows:
            per_gpu.setdefault(labels[1], set()).add((h.namespace, h.pod, h.container))
        out: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        if rows:
            out["inferwatch_gpu_pod_info"] = [
                ((*labels, h.namespace, h.pod, h.container, h.resource, h.device,
                  "true" if len(per_gpu[labels[1]]) > 1 else "false"), 1.0) for labels, h in rows]
        if devices is not None:
            usable = {by_id[physical(d)][1] for d in devices if physical(d) in by_id}
            out["inferwatch_gpu_allocatable"] = [(labels, 1.0 if labels[1] in usable else 0.0) for labels in gpus]
        if answered or errors:
            out["inferwatch_podresources_up"] = [((), 1.0 if up else 0.0)]
            out["inferwatch_podresources_errors"] = [((reason,), float(n)) for reason, n in sorted(errors.items())]
        return out
