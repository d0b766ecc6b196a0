"""Deadline-bound probes of the kubelet's local gRPC sockets.

A device plugin stuck in nvmlInit makes the kubelet wait forever (incident 5),
so every call here carries a hard deadline and reports *how* it failed instead
of raising: a timeout on a plugin socket is itself evidence. Results are plain
records (msgspec Structs) so callers never touch protobuf objects.

grpc and the generated modules are imported inside the functions: importing
this module must stay cheap for CLI start-up.
"""

from __future__ import annotations

import os
import stat
import time
from typing import TYPE_CHECKING, Any, Callable, Generic, Literal, Sequence, TypeVar

from msgspec import Struct

from gpuwarden.grpcapi.sockets import (DEVICE_PLUGIN_DIR, KUBELET_REGISTRATION_SOCKET,  # noqa: F401
                                      discover_plugin_sockets, plugin_socket_paths)

if TYPE_CHECKING:
    import grpc

POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT_S = 5.0
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

# A big node's List answer can pass grpc's 4 MiB default receive limit.
_MAX_RECEIVE_BYTES = 16 * 1024 * 1024
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", _MAX_RECEIVE_BYTES),
    ("grpc.enable_http_proxy", 0),
)

Status = Literal["ok", "timeout", "unavailable", "unimplemented", "error"]
T = TypeVar("T")


class CallResult(Struct, Generic[T], frozen=True):
    """Outcome of one RPC; `value` is set only when `ok`."""

    ok: bool
    status: Status
    elapsed_s: float
    detail: str
    value: T | None = None
    rpc: str = ""
    socket_path: str = ""
    timeout_s: float = 0.0


class PluginOptions(Struct, frozen=True):
    pre_start_required: bool
    get_preferred_allocation_available: bool


class PluginDevice(Struct, frozen=True):
    id: str
    health: str
    numa_nodes: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        return self.health == HEALTHY


class PodDevices(Struct, frozen=True):
    """Devices one container holds for one resource (or one DRA claim)."""

    namespace: str
    pod: str
    container: str
    resource: str  # e.g. nvidia.com/gpu; the driver name for DRA rows
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()
    source: Literal["device-plugin", "dra"] = "device-plugin"
    claim: str = ""  # "namespace/name" for DRA rows


class ResourceDevices(Struct, frozen=True):
    """All devices the kubelet can hand out for one resource."""

    resource: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


class _ProtocolError(Exception):
    """The peer answered, but not with what the API promises."""


# --------------------------------------------------------------------------
# device plugin (v1beta1.DevicePlugin)


def plugin_options(socket_path: str, timeout: float = DEFAULT_TIMEOUT_S) -> CallResult[PluginOptions]:
    def invoke(channel: grpc.Channel, deadline: float) -> PluginOptions:
        pb = _deviceplugin()
        call = rpc_method(channel, "v1beta1.DevicePlugin/GetDevicePluginOptions", pb.Empty, pb.DevicePluginOptions)
        resp = call(pb.Empty(), timeout=deadline)
        return PluginOptions(
            pre_start_required=resp.pre_start_required,
            get_preferred_allocation_available=resp.get_preferred_allocation_available,
        )

    return _call(socket_path, timeout, "v1beta1.DevicePlugin/GetDevicePluginOptions", invoke)


def plugin_first_list(
    socket_path: str, timeout: float = DEFAULT_TIMEOUT_S
) -> CallResult[tuple[PluginDevice, ...]]:
    """First ListAndWatch message; the stream is cancelled right after it.

    For tests against a plugin they start only: never call it on a live node. The NVIDIA plugin
    (v0.20.0) never ends a cancelled ListAndWatch, and the stream left behind takes health events
    meant for the kubelet's (docs/grpc.md).
    """

    def invoke(channel: grpc.Channel, deadline: float) -> tuple[PluginDevice, ...]:
        pb = _deviceplugin()
        call = rpc_method(channel, "v1beta1.DevicePlugin/ListAndWatch", pb.Empty, pb.ListAndWatchResponse, stream=True)
        stream = call(pb.Empty(), timeout=deadline)
        try:
            first = next(stream, None)
        finally:
            stream.cancel()
        if first is None:
            raise _ProtocolError("ListAndWatch ended without sending a device list")
        return tuple(
            PluginDevice(id=d.ID, health=d.health, numa_nodes=_numa(d.topology)) for d in first.devices
        )

    return _call(socket_path, timeout, "v1beta1.DevicePlugin/ListAndWatch", invoke)


def plugin_preferred_allocation(
    socket_path: str,
    available_device_ids: Sequence[str],
    allocation_size: int,
    must_include_device_ids: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT_S,
) -> CallResult[tuple[str, ...]]:
    """Ask for a preferred set, as the kubelet does at admission.

    Side-effect free by contract, unlike Allocate, so it is safe to probe on a
    live node; a hang here is what blocks pod admission.
    """

    def invoke(channel: grpc.Channel, deadline: float) -> tuple[str, ...]:
        pb = _deviceplugin()
        req = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available_device_ids),
                    must_include_deviceIDs=list(must_include_device_ids),
                    allocation_size=allocation_size,
                )
            ]
        )
        call = rpc_method(channel, "v1beta1.DevicePlugin/GetPreferredAllocation", pb.PreferredAllocationRequest,
                          pb.PreferredAllocationResponse)
        resp = call(req, timeout=deadline)
        if len(resp.container_responses) != 1:
            raise _ProtocolError(
                f"expected 1 container response, got {len(resp.container_responses)}"
            )
        return tuple(resp.container_responses[0].deviceIDs)

    return _call(socket_path, timeout, "v1beta1.DevicePlugin/GetPreferredAllocation", invoke)


# --------------------------------------------------------------------------
# pod resources (v1.PodResourcesLister)


def pod_resources_list(
    socket_path: str, timeout: float = DEFAULT_TIMEOUT_S
) -> CallResult[tuple[PodDevices, ...]]:
    """Every container on the node that holds devices, one row per resource/claim."""

    def invoke(channel: grpc.Channel, deadline: float) -> tuple[PodDevices, ...]:
        pb = _podresources()
        call = rpc_method(channel, "v1.PodResourcesLister/List", pb.ListPodResourcesRequest, pb.ListPodResourcesResponse)
        resp = call(pb.ListPodResourcesRequest(), timeout=deadline)
        return tuple(row for pod in resp.pod_resources for row in _pod_rows(pod))

    return _call(socket_path, timeout, "v1.PodResourcesLister/List", invoke)


def pod_resources_get(
    socket_path: str, namespace: str, pod: str, timeout: float = DEFAULT_TIMEOUT_S
) -> CallResult[tuple[PodDevices, ...]]:
    """One pod's rows; older kubelets answer unimplemented (feature-gated)."""

    def invoke(channel: grpc.Channel, deadline: float) -> tuple[PodDevices, ...]:
        pb = _podresources()
        req = pb.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
        resp = rpc_method(channel, "v1.PodResourcesLister/Get", pb.GetPodResourcesRequest, pb.GetPodResourcesResponse)(
            req, timeout=deadline)
        return tuple(_pod_rows(resp.pod_resources))

    return _call(socket_path, timeout, "v1.PodResourcesLister/Get", invoke)


def pod_resources_allocatable(
    socket_path: str, timeout: float = DEFAULT_TIMEOUT_S
) -> CallResult[tuple[ResourceDevices, ...]]:
    """Devices the kubelet considers allocatable, merged per resource."""

    def invoke(channel: grpc.Channel, deadline: float) -> tuple[ResourceDevices, ...]:
        pb = _podresources()
        call = rpc_method(channel, "v1.PodResourcesLister/GetAllocatableResources", pb.AllocatableResourcesRequest,
                          pb.AllocatableResourcesResponse)
        resp = call(pb.AllocatableResourcesRequest(), timeout=deadline)
        merged: dict[str, tuple[dict[str, None], set[int]]] = {}
        for cd in resp.devices:
            ids, numa = merged.setdefault(cd.resource_name, ({}, set()))
            ids.update(dict.fromkeys(cd.device_ids))
            numa.update(_numa(cd.topology))
        return tuple(
            ResourceDevices(resource=r, device_ids=tuple(ids), numa_nodes=tuple(sorted(numa)))
            for r, (ids, numa) in merged.items()
        )

    return _call(socket_path, timeout, "v1.PodResourcesLister/GetAllocatableResources", invoke)


# --------------------------------------------------------------------------
# plumbing


def rpc_method(channel: grpc.Channel, path: str, request: Any, response: Any, stream: bool = False) -> Any:
    """A callable for `Service/Method` on `channel`, built from the message classes alone.

    The generated `*_pb2_grpc` stubs do the same, but refuse to import on a grpcio older than the
    grpcio-tools that generated them (measured: a GPU node image with grpcio 1.84 and stubs from
    1.85.1); the wire calls need nothing from them, so a version skew cannot disable the probes.
    """
    make = channel.unary_stream if stream else channel.unary_unary
    return make(f"/{path}", request_serializer=request.SerializeToString, response_deserializer=response.FromString)


def _deviceplugin() -> Any:
    from . import deviceplugin_v1beta1_pb2 as pb

    return pb


def _podresources() -> Any:
    from . import podresources_v1_pb2 as pb

    return pb


def load_protos() -> None:
    """Import grpc and the device-plugin and pod-resources messages now, without opening a channel.

    For a process that forks the callers (agent/monitors.py): the children find them loaded.
    Importing grpc starts no thread and initialises no gRPC core; a channel does."""
    import grpc  # noqa: F401

    _deviceplugin()
    _podresources()


def _numa(topology: Any) -> tuple[int, ...]:
    return tuple(sorted({n.ID for n in topology.nodes})) if topology is not None else ()


def _pod_rows(pod: Any) -> list[PodDevices]:
    """Flatten one PodResources message.

    The kubelet sends one ContainerDevices per device, so ids are merged per
    (container, resource); DRA devices are grouped per (container, claim, driver).
    """
    rows: list[PodDevices] = []
    for c in pod.containers:
        plugin: dict[str, tuple[dict[str, None], set[int]]] = {}
        for cd in c.devices:
            ids, numa = plugin.setdefault(cd.resource_name, ({}, set()))
            ids.update(dict.fromkeys(cd.device_ids))
            numa.update(_numa(cd.topology))
        for resource, (ids, numa) in plugin.items():
            if ids:
                rows.append(
                    PodDevices(pod.namespace, pod.name, c.name, resource, tuple(ids), tuple(sorted(numa)))
                )
        for dr in c.dynamic_resources:
            claim = f"{dr.claim_namespace}/{dr.claim_name}"
            per_driver: dict[str, dict[str, None]] = {}
            for cr in dr.claim_resources:
                # Kubelets before 1.31 only fill cdi_devices.
                names = [cr.device_name] if cr.device_name else [d.name for d in cr.cdi_devices]
                per_driver.setdefault(cr.driver_name, {}).update(dict.fromkeys(names))
            for driver, ids in per_driver.items():
                rows.append(
                    PodDevices(
                        pod.namespace, pod.name, c.name, driver, tuple(ids), source="dra", claim=claim
                    )
                )
    return rows


def _socket_problem(path: str) -> tuple[Status, str] | None:
    """Cheap pre-flight so a missing socket never costs a deadline."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "unavailable", f"no socket at {path}"
    except OSError as exc:
        return "error", f"cannot stat {path}: {exc.strerror or exc}"
    if not stat.S_ISSOCK(mode):
        return "unavailable", f"{path} exists but is not a unix socket"
    return None


def _refuses(path: str) -> bool:
    """Whether connecting to the unix socket at `path` is refused now: nobody listens there. A listener
    that does not accept in time (a full backlog) counts as listening."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(0.2)
        s.connect(path)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        s.close()
    return False


#: a CANCELLED arriving this late in the deadline is the server giving up at the deadline, not a cancel
_DEADLINE_SHARE = 0.95

_STATUS_BY_CODE: dict[str, Status] = {
    "DEADLINE_EXCEEDED": "timeout",
    "UNAVAILABLE": "unavailable",
    "UNIMPLEMENTED": "unimplemented",
}


def _call(
    socket_path: str,
    timeout: float,
    rpc: str,
    invoke: Callable[[grpc.Channel, float], T],
) -> CallResult[T]:
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    path = os.path.abspath(socket_path)
    start = time.monotonic()

    def result(status: Status, detail: str, value: T | None = None) -> CallResult[T]:
        return CallResult(
            ok=status == "ok",
            status=status,
            elapsed_s=time.monotonic() - start,
            detail=detail,
            value=value,
            rpc=rpc,
            socket_path=path,
            timeout_s=timeout,
        )

    problem = _socket_problem(path)
    if problem is not None:
        return result(*problem)
    try:
        import grpc
    except ImportError as exc:  # pragma: no cover - grpcio is a hard dependency
        return result("error", f"grpc unavailable: {exc}")

    channel = grpc.insecure_channel(f"unix://{path}", options=_CHANNEL_OPTIONS)
    try:
        # Time spent before the RPC counts against the caller's budget.
        value = invoke(channel, max(timeout - (time.monotonic() - start), 0.001))
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        name = code.name if code is not None else "UNKNOWN"
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        status = _STATUS_BY_CODE.get(name, "error")
        if (status == "timeout" or name == "CANCELLED") and _refuses(path):
            # gRPC's deadline passed while it was still setting up the connection (a loaded host, a short
            # deadline): a socket nobody listens on must not read as a plugin that accepted and hung
            return result("unavailable", f"connection refused: nothing listens on the socket ({name} before connecting)")
        if name == "CANCELLED" and time.monotonic() - start >= timeout * _DEADLINE_SHARE:
            # a grpc-go server (the NVIDIA plugin) resets the stream when the deadline it was sent
            # expires; that RST_STREAM(CANCEL) races the client's own DEADLINE_EXCEEDED (measured: about
            # half of the calls to the real plugin with its NVML hung)
            return result("timeout", f"no answer within {timeout:g}s (the server reset the stream at the deadline)")
        if status == "timeout":
            return result(status, f"no answer within {timeout:g}s ({name})")
        return result(status, f"{name}: {details or ''}".rstrip(": "))
    except _ProtocolError as exc:
        return result("error", str(exc))
    except Exception as exc:  # a probe must report, never crash the agent
        return result("error", f"{type(exc).__name__}: {exc}")
    finally:
        channel.close()
    return result("ok", "ok", value)
