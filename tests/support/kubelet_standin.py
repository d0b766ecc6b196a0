"""A kubelet stand-in that speaks the device-plugin API to a real plugin and writes what kubelet writes.

It is kubelet's device manager (kubernetes pkg/kubelet/cm/devicemanager) reduced to what a plugin
and gpuwarden can observe, built on the protos gpuwarden ships (gpuwarden.grpcapi):

- the `v1beta1.Registration` service on `<dir>/kubelet.sock`; Register checks the API version and
  answers at once, then, like the kubelet's plugin client, dials `<dir>/<endpoint>`, calls
  GetDevicePluginOptions and keeps one ListAndWatch stream open, tracking healthy and unhealthy
  device IDs per resource;
- `admit()`: one container's admission, as `devicesToAllocate` + `allocateContainerResources`
  do it — GetPreferredAllocation when the plugin offers it, then Allocate — with NO deadline on
  either call (kubelet passes context.Background()), and serially: one lock around the whole
  admission, as the kubelet's pod admission is serial (incident 5: while one call hangs, no other
  pod is admitted). A caller bounds itself by running admit() in a thread it can abandon;
- the device-manager checkpoint `<dir>/kubelet_internal_checkpoint` in kubelet's JSON layout
  (checkpoint.Data: Data{PodDeviceEntries, RegisteredDevices}, Checksum, BootID), with each
  entry's AllocResp the plugin's real ContainerAllocateResponse bytes and RegisteredDevices the
  healthy devices, rewritten after every admission and device update like the kubelet does.
  The Checksum is written as 0: the kubelet's is an FNV-32a over a go-spew dump of the Go struct,
  which only matters to a kubelet reading the file back (gpuwarden does not verify it);
- optionally a kubelet log (`log_path`) with the klog lines the kubelet writes at --v=4 before
  each call ("Issuing a GetPreferredAllocation call for container", "Making allocation request
  for device plugin") and nothing after a call returns, as the kubelet does.

What it is not: no pod lifecycle, no topology manager, no re-registration on plugin restart beyond
accepting a new Register (the kubelet does the same: a new Register replaces the endpoint).
"""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from gpuwarden.grpcapi import deviceplugin_v1beta1_pb2 as dp
from gpuwarden.grpcapi.client import rpc_method

API_VERSION = "v1beta1"
CHECKPOINT = "kubelet_internal_checkpoint"
NO_TOPOLOGY = "-1"  # kubelet's nodeWithoutTopology, the DeviceIDs key when a device has no NUMA node


@dataclass
class Endpoint:
    """One registered plugin, as the kubelet's endpoint/client pair holds it."""

    resource: str
    socket: str
    request: Any  # the RegisterRequest
    seq: int = 0  # 1 for the first registration the stand-in accepted, 2 for the next …
    options: Any = None  # DevicePluginOptions from GetDevicePluginOptions
    devices: dict[str, str] = field(default_factory=dict)  # id -> health, from the latest ListAndWatch
    numa: dict[str, tuple[int, ...]] = field(default_factory=dict)
    updates: int = 0
    stream_error: str = ""
    channel: grpc.Channel | None = None
    stream: Any = None


@dataclass(frozen=True)
class Admission:
    """What one admit() got: the preferred set, the allocated IDs and the container's response."""

    pod_uid: str
    container: str
    resource: str
    preferred: tuple[str, ...] | None
    device_ids: tuple[str, ...]
    response: Any  # ContainerAllocateResponse
    raw: bytes  # its serialized bytes, as stored in the checkpoint's AllocResp


class KubeletStandIn:
    def __init__(self, plugin_dir: str | os.PathLike[str], *, log_path: str | None = None,
                 boot_id: str | None = None) -> None:
        self.dir = os.path.abspath(os.fspath(plugin_dir))
        self.socket = os.path.join(self.dir, "kubelet.sock")
        self.checkpoint_path = os.path.join(self.dir, CHECKPOINT)
        self.log_path = log_path
        self.boot_id = boot_id if boot_id is not None else _boot_id()
        self.endpoints: dict[str, Endpoint] = {}
        self.registrations: list[Any] = []
        self.entries: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._admission = threading.Lock()  # pod admission is serial in the kubelet
        self._writing = threading.Lock()
        self._server: grpc.Server | None = None
        self._stopping = threading.Event()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "KubeletStandIn":
        os.makedirs(self.dir, exist_ok=True)
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet-standin"))
        handler = grpc.unary_unary_rpc_method_handler(
            self._register, request_deserializer=dp.RegisterRequest.FromString,
            response_serializer=dp.Empty.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "v1beta1.Registration", {"Register": handler}),))
        if server.add_insecure_port(f"unix://{self.socket}") == 0:
            raise RuntimeError(f"cannot bind {self.socket}")
        server.start()
        self._server = server
        self.write_checkpoint()
        return self

    def stop(self) -> None:
        """Cancel streams and close channels; an admission hung in a plugin call is abandoned."""
        with self._writing:
            self._stopping.set()
        for ep in list(self.endpoints.values()):
            _close(ep)
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
            self._server = None
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        with self._changed:
            self._changed.notify_all()

    def __enter__(self) -> "KubeletStandIn":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- registration and the plugin client -----------------------------------------------------
    def _register(self, req: Any, context: grpc.ServicerContext) -> Any:
        if req.version != API_VERSION:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported API version {req.version!r}")
        if not req.resource_name or "/" not in req.resource_name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid resource name {req.resource_name!r}")
        with self._changed:
            self.registrations.append(req)
            ep = Endpoint(req.resource_name, os.path.join(self.dir, req.endpoint), req, seq=len(self.registrations))
            old = self.endpoints.get(req.resource_name)
            if old is not None:
                _close(old)
            self.endpoints[req.resource_name] = ep
            self._changed.notify_all()
        # the kubelet answers Register first and connects to the plugin in the background
        threading.Thread(target=self._run_client, args=(ep,), daemon=True, name=f"client {req.endpoint}").start()
        return dp.Empty()

    def _run_client(self, ep: Endpoint) -> None:
        try:
            ep.channel = grpc.insecure_channel(f"unix://{ep.socket}")
            stub = _PluginStub(ep.channel)
            ep.options = stub.GetDevicePluginOptions(dp.Empty())  # no deadline, as in the kubelet
            ep.stream = stub.ListAndWatch(dp.Empty())
            for resp in ep.stream:
                with self._changed:
                    ep.devices = {d.ID: d.health for d in resp.devices}
                    ep.numa = {d.ID: tuple(n.ID for n in d.topology.nodes) for d in resp.devices}
                    ep.updates += 1
                    # the checkpoint first: a waiter woken by this update reads it (it raced the write before)
                    self.write_checkpoint()
                    self._changed.notify_all()
        except grpc.RpcError as exc:
            ep.stream_error = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.Call) else str(exc)
        except ValueError as exc:  # channel closed under us at stop()
            ep.stream_error = str(exc)
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, resource: str, *, updates: int = 1, timeout: float = 30.0, after: int = 0) -> Endpoint:
        """The endpoint of `resource` once it has sent `updates` ListAndWatch messages; raises TimeoutError.

        `after`: only an endpoint from a registration later than the first `after` ones (a restarted plugin).
        """
        end = time.monotonic() + timeout
        with self._changed:
            while True:
                ep = self.endpoints.get(resource)
                if ep is not None and ep.updates >= updates and ep.seq > after:
                    return ep
                left = end - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    raise TimeoutError(f"{resource}: {ep.updates if ep else 'no registration'} ListAndWatch "
                                       f"update(s) after {timeout:g}s" + (f" ({ep.stream_error})" if ep and ep.stream_error else ""))
                self._changed.wait(min(left, 0.2))

    # -- admission ------------------------------------------------------------------------------
    def admit(self, pod_uid: str, container: str, resource: str = "nvidia.com/gpu", count: int = 1,
              device_ids: list[str] | None = None) -> Admission:
        """Admit one container asking for `count` devices of `resource`, the way the kubelet does.

        Neither plugin call has a deadline: if the plugin hangs, this hangs (and every admit()
        after it waits on the admission lock). `device_ids` skips the choice and asks Allocate for
        exactly those IDs (an unknown ID: the plugin's own error comes back as grpc.RpcError).
        """
        with self._admission:
            ep = self.endpoints.get(resource)
            if ep is None or ep.channel is None:
                raise LookupError(f"no plugin registered for {resource}")
            stub = _PluginStub(ep.channel)
            preferred = None
            if device_ids is None:
                used = {d for e in self.entries if e["ResourceName"] == resource for ids in e["DeviceIDs"].values() for d in ids}
                available = [d for d, h in ep.devices.items() if h == "Healthy" and d not in used]
                if len(available) < count:
                    raise RuntimeError(f"{resource}: {len(available)} healthy device(s) free, {count} requested")
                device_ids = available[:count]
                if ep.options is not None and ep.options.get_preferred_allocation_available:
                    self._log("manager.go:956", "Issuing a GetPreferredAllocation call for container",
                              containerName=container, podUID=pod_uid)
                    resp = stub.GetPreferredAllocation(dp.PreferredAllocationRequest(container_requests=[
                        dp.ContainerPreferredAllocationRequest(available_deviceIDs=available,
                                                               allocation_size=count)]))
                    preferred = tuple(resp.container_responses[0].deviceIDs) if resp.container_responses else ()
                    if len(preferred) == count:
                        device_ids = list(preferred)
            self._log("manager.go:819", "Making allocation request for device plugin",
                      devices=f"[{' '.join(device_ids)}]", resourceName=resource)
            out = stub.Allocate(dp.AllocateRequest(container_requests=[
                dp.ContainerAllocateRequest(devices_ids=list(device_ids))]))
            if len(out.container_responses) != 1:
                raise RuntimeError(f"Allocate returned {len(out.container_responses)} container responses, want 1")
            cresp = out.container_responses[0]
            raw = cresp.SerializeToString()
            by_numa: dict[str, list[str]] = {}
            for d in device_ids:
                nodes = ep.numa.get(d) or ()
                by_numa.setdefault(str(nodes[0]) if nodes else NO_TOPOLOGY, []).append(d)
            self.entries.append({"PodUID": pod_uid, "ContainerName": container, "ResourceName": resource,
                                 "DeviceIDs": by_numa, "AllocResp": base64.b64encode(raw).decode()})
            self.write_checkpoint()
            return Admission(pod_uid, container, resource, preferred, tuple(device_ids), cresp, raw)

    def forget(self, pod_uid: str) -> None:
        """The pod is gone: its devices return to the pool (kubelet's UpdateAllocatedDevices)."""
        self.entries = [e for e in self.entries if e["PodUID"] != pod_uid]
        self.write_checkpoint()

    # -- what the kubelet writes ----------------------------------------------------------------
    def checkpoint_doc(self) -> dict[str, Any]:
        registered = {r: [d for d, h in ep.devices.items() if h == "Healthy"] for r, ep in self.endpoints.items()}
        doc: dict[str, Any] = {"Data": {"PodDeviceEntries": list(self.entries) or None,
                                        "RegisteredDevices": registered},
                               "Checksum": 0}
        if self.boot_id:
            doc["BootID"] = self.boot_id
        return doc

    def write_checkpoint(self) -> None:
        """Write the checkpoint atomically, as the kubelet's checkpoint manager does (one writer at a time)."""
        with self._writing:
            if self._stopping.is_set():
                return
            tmp = self.checkpoint_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.checkpoint_doc(), f)
            os.replace(tmp, self.checkpoint_path)

    def _log(self, where: str, msg: str, **kv: str) -> None:
        if not self.log_path:
            return
        t = time.time()
        head = time.strftime("I%m%d %H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1e6):06d} {os.getpid():7d} {where}]"
        pairs = " ".join(f"{k}={v}" if v.startswith("[") else f"{k}={json.dumps(v)}" for k, v in kv.items())
        with open(self.log_path, "a") as f:
            f.write(f"{head} {json.dumps(msg)} {pairs}\n")


class _PluginStub:
    """v1beta1.DevicePlugin's client calls, on the message classes only (see grpcapi.client.rpc_method)."""

    def __init__(self, channel: grpc.Channel) -> None:
        svc = "v1beta1.DevicePlugin/"
        self.GetDevicePluginOptions = rpc_method(channel, svc + "GetDevicePluginOptions", dp.Empty, dp.DevicePluginOptions)
        self.ListAndWatch = rpc_method(channel, svc + "ListAndWatch", dp.Empty, dp.ListAndWatchResponse, stream=True)
        self.GetPreferredAllocation = rpc_method(channel, svc + "GetPreferredAllocation", dp.PreferredAllocationRequest,
                                                 dp.PreferredAllocationResponse)
        self.Allocate = rpc_method(channel, svc + "Allocate", dp.AllocateRequest, dp.AllocateResponse)


def _close(ep: Endpoint) -> None:
    if ep.stream is not None:
        ep.stream.cancel()
    if ep.channel is not None:
        ep.channel.close()


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""
