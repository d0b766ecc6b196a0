"""Deadline-bound calls to a DRA kubelet plugin: its registration socket and its DRA service.

What the kubelet's plugin watcher asks a `<kubelet root>/plugins_registry/<driver>-reg.sock`
(pluginregistration `GetInfo`), and the empty `NodePrepareResources` the NVIDIA DRA driver's own
liveness check sends to `plugins/<driver>/dra.sock` (cmd/gpu-kubelet-plugin/health.go): side-effect
free, answered from the plugin's gRPC handler, so an answer says the plugin's serving path is alive
and a timeout says the kubelet's NodePrepareResources would hang there too. Same conventions as
client.py: plain records (msgspec Structs) back, every failure a status, never an exception.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from msgspec import Struct

from gpuwarden.grpcapi.client import DEFAULT_TIMEOUT_S, CallResult, _call, rpc_method

if TYPE_CHECKING:
    import grpc

#: the DRA gRPC services (their full names: the path of every call)
DRA_V1 = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
DRA_V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
DRA_SERVICES = (DRA_V1, DRA_V1BETA1)
#: what a plugin lists in GetInfo's supported_versions for each (drapb.DRAPluginService, measured on the real
#: gpu-kubelet-plugin: ["v1.DRAPlugin", "v1beta1.DRAPlugin"]); the full names are accepted too
ADVERTISED = {"v1.DRAPlugin": DRA_V1, "v1beta1.DRAPlugin": DRA_V1BETA1, DRA_V1: DRA_V1, DRA_V1BETA1: DRA_V1BETA1}
REGISTRATION = "pluginregistration.Registration"
DRA_PLUGIN_TYPE = "DRAPlugin"


class PluginInfo(Struct, frozen=True):
    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]

    @property
    def dra_service(self) -> str:
        """The DRA service the kubelet would pick: v1 when offered, else v1beta1 (the kubelet's order)."""
        offered = {ADVERTISED.get(v) for v in self.supported_versions}
        return next((s for s in DRA_SERVICES if s in offered), "")


class PreparedDevice(Struct, frozen=True):
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    request_names: tuple[str, ...] = ()


class ClaimResult(Struct, frozen=True):
    """One claim's answer: its devices, or the plugin's error for it."""

    uid: str
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


def _pb(service: str) -> Any:
    if service == DRA_V1BETA1:
        from . import dra_v1beta1_pb2 as pb
    else:
        from . import dra_v1_pb2 as pb
    return pb


def get_info(socket_path: str, timeout: float = DEFAULT_TIMEOUT_S) -> CallResult[PluginInfo]:
    """The plugin's registration GetInfo, as the kubelet's plugin watcher calls it."""

    def invoke(channel: grpc.Channel, deadline: float) -> PluginInfo:
        from . import pluginregistration_v1_pb2 as pb

        resp = rpc_method(channel, f"{REGISTRATION}/GetInfo", pb.InfoRequest, pb.PluginInfo)(
            pb.InfoRequest(), timeout=deadline)
        return PluginInfo(resp.type, resp.name, resp.endpoint, tuple(resp.supported_versions))

    return _call(socket_path, timeout, f"{REGISTRATION}/GetInfo", invoke)


def notify_registration(socket_path: str, registered: bool, error: str = "",
                        timeout: float = DEFAULT_TIMEOUT_S) -> CallResult[bool]:
    """NotifyRegistrationStatus, the kubelet's second call; the plugin starts serving claims after it."""

    def invoke(channel: grpc.Channel, deadline: float) -> bool:
        from . import pluginregistration_v1_pb2 as pb

        rpc_method(channel, f"{REGISTRATION}/NotifyRegistrationStatus", pb.RegistrationStatus,
                   pb.RegistrationStatusResponse)(pb.RegistrationStatus(plugin_registered=registered, error=error),
                                                  timeout=deadline)
        return True

    return _call(socket_path, timeout, f"{REGISTRATION}/NotifyRegistrationStatus", invoke)


def _claims(pb: Any, claims: list[tuple[str, str, str]]) -> list[Any]:
    return [pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]


def prepare(socket_path: str, claims: list[tuple[str, str, str]], service: str = DRA_V1,
            timeout: float = DEFAULT_TIMEOUT_S) -> CallResult[tuple[ClaimResult, ...]]:
    """NodePrepareResources for claims given as (namespace, uid, name); [] is the liveness no-op."""

    def invoke(channel: grpc.Channel, deadline: float) -> tuple[ClaimResult, ...]:
        pb = _pb(service)
        resp = rpc_method(channel, f"{service}/NodePrepareResources", pb.NodePrepareResourcesRequest,
                          pb.NodePrepareResourcesResponse)(
            pb.NodePrepareResourcesRequest(claims=_claims(pb, claims)), timeout=deadline)
        return tuple(ClaimResult(uid, tuple(PreparedDevice(d.pool_name, d.device_name, tuple(d.cdi_device_ids),
                                                           tuple(d.request_names)) for d in r.devices), r.error)
                     for uid, r in sorted(resp.claims.items()))

    return _call(socket_path, timeout, f"{service}/NodePrepareResources", invoke)


def unprepare(socket_path: str, claims: list[tuple[str, str, str]], service: str = DRA_V1,
              timeout: float = DEFAULT_TIMEOUT_S) -> CallResult[tuple[ClaimResult, ...]]:
    """NodeUnprepareResources for claims given as (namespace, uid, name)."""

    def invoke(channel: grpc.Channel, deadline: float) -> tuple[ClaimResult, ...]:
        pb = _pb(service)
        resp = rpc_method(channel, f"{service}/NodeUnprepareResources", pb.NodeUnprepareResourcesRequest,
                          pb.NodeUnprepareResourcesResponse)(
            pb.NodeUnprepareResourcesRequest(claims=_claims(pb, claims)), timeout=deadline)
        return tuple(ClaimResult(uid, error=r.error) for uid, r in sorted(resp.claims.items()))

    return _call(socket_path, timeout, f"{service}/NodeUnprepareResources", invoke)
