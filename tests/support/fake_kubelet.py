"""Real gRPC servers on unix sockets standing in for a device plugin and the kubelet.

They speak the same wire protocol as the real thing so client tests (and agent
tests) exercise grpc end to end. Misbehaviour is injected per method:
`hang_on` blocks until stop() (a plugin stuck in nvmlInit), `delay_s` answers
late, `fail_on` aborts with a status code, `unimplemented` leaves the method out
of the server entirely (an older plugin), so grpc itself answers UNIMPLEMENTED.
"""

from __future__ import annotations

import json

import os
import threading
from concurrent import futures
from typing import Any, Callable, Collection, Iterable, Iterator, Mapping, Sequence

import grpc

from gpuwarden.grpcapi import deviceplugin_v1beta1_pb2 as dp
from gpuwarden.grpcapi import podresources_v1_pb2 as pr
from gpuwarden.grpcapi.client import HEALTHY, PluginDevice, PodDevices

DeviceLike = PluginDevice | tuple[str, str] | str


class _FakeServer:
    """start/stop/context-manager plumbing plus per-method fault injection."""

    service: str = ""

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        hang_on: Collection[str] = (),
        delay_s: Mapping[str, float] | None = None,
        fail_on: Mapping[str, grpc.StatusCode] | None = None,
        unimplemented: Collection[str] = (),
        max_workers: int = 8,
    ) -> None:
        self.socket_path = os.path.abspath(os.fspath(socket_path))
        self.hang_on = set(hang_on)
        self.delay_s = dict(delay_s or {})
        self.fail_on = dict(fail_on or {})
        self.unimplemented = set(unimplemented)
        self.calls: list[str] = []
        self.calls_file: str | None = None  # set by Apart: each call is also a line there
        self._max_workers = max_workers
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._pool: futures.ThreadPoolExecutor | None = None

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> "_FakeServer":
        if self._server is not None:
            raise RuntimeError("already started")
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)  # stale socket from an earlier run
        self._stopping.clear()
        self._pool = futures.ThreadPoolExecutor(
            max_workers=self._max_workers, thread_name_prefix=type(self).__name__
        )
        server = grpc.server(self._pool)
        handlers = {n: h for n, h in self._handlers().items() if n not in self.unimplemented}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(self.service, handlers),))
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise RuntimeError(f"cannot bind {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Wake hung handlers first, so neither grpc nor the pool waits on them."""
        self._stopping.set()
        server, pool = self._server, self._pool
        self._server = self._pool = None
        if server is not None:
            server.stop(grace=0).wait(5)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    # -- helpers for subclasses ----------------------------------------------
    def _handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        raise NotImplementedError

    def _enter(self, method: str, context: grpc.ServicerContext) -> None:
        """Record the call and apply the fault configured for it."""
        with self._lock:
            self.calls.append(method)
            if self.calls_file:
                with open(self.calls_file, "a") as f:
                    f.write(method + "\n")
        if method in self.hang_on:
            self._stopping.wait()
            context.abort(grpc.StatusCode.UNAVAILABLE, "fake server stopping")
        delay = self.delay_s.get(method)
        if delay:
            self._stopping.wait(delay)
        code = self.fail_on.get(method)
        if code is not None:
            context.abort(code, f"injected failure in {method}")

    def _unary(self, method: str, fn: Callable[[Any], Any], req_type: Any, resp_type: Any) -> grpc.RpcMethodHandler:
        def handler(request: Any, context: grpc.ServicerContext) -> Any:
            self._enter(method, context)
            return fn(request)

        return grpc.unary_unary_rpc_method_handler(
            handler,
            request_deserializer=req_type.FromString,
            response_serializer=resp_type.SerializeToString,
        )


def _as_device(d: DeviceLike) -> PluginDevice:
    if isinstance(d, PluginDevice):
        return d
    if isinstance(d, str):
        return PluginDevice(d, HEALTHY)
    return PluginDevice(d[0], d[1])


def _topology(mod: Any, numa: Iterable[int]) -> Any:
    return mod.TopologyInfo(nodes=[mod.NUMANode(ID=n) for n in numa])


class FakeDevicePlugin(_FakeServer):
    """A v1beta1.DevicePlugin on `socket_path`.

    `set_devices()` pushes a new list to open ListAndWatch streams, like a
    plugin reporting a GPU gone Unhealthy. `preferred` overrides the choice
    GetPreferredAllocation makes (default: must-include first, then in order).
    """

    service = "v1beta1.DevicePlugin"

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        devices: Sequence[DeviceLike] = (),
        *,
        pre_start_required: bool = False,
        get_preferred_allocation_available: bool = True,
        preferred: Callable[[Sequence[str], Sequence[str], int], Sequence[str]] | None = None,
        **faults: Any,
    ) -> None:
        super().__init__(socket_path, **faults)
        self.options = dp.DevicePluginOptions(
            pre_start_required=pre_start_required,
            get_preferred_allocation_available=get_preferred_allocation_available,
        )
        self.preferred = preferred
        self._devices = [_as_device(d) for d in devices]
        self._version = 0
        self._changed = threading.Condition()

    def set_devices(self, devices: Sequence[DeviceLike]) -> None:
        with self._changed:
            self._devices = [_as_device(d) for d in devices]
            self._version += 1
            self._changed.notify_all()

    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        super().stop()

    def _list_message(self) -> Any:
        return dp.ListAndWatchResponse(
            devices=[dp.Device(ID=d.id, health=d.health, topology=_topology(dp, d.numa_nodes)) for d in self._devices]
        )

    def _list_and_watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self._enter("ListAndWatch", context)
        with self._changed:
            seen, msg = self._version, self._list_message()
        yield msg
        while not self._stopping.is_set() and context.is_active():
            with self._changed:
                # Short waits so a client cancel frees the worker promptly.
                self._changed.wait_for(lambda: self._version != seen or self._stopping.is_set(), 0.1)
                if self._version == seen or self._stopping.is_set():
                    continue
                seen, msg = self._version, self._list_message()
            yield msg

    def _preferred(self, req: Any) -> Any:
        out = []
        for cr in req.container_requests:
            if self.preferred is not None:
                ids = list(self.preferred(cr.available_deviceIDs, cr.must_include_deviceIDs, cr.allocation_size))
            else:
                ids = list(cr.must_include_deviceIDs)
                ids += [d for d in cr.available_deviceIDs if d not in ids]
                ids = ids[: cr.allocation_size]
            out.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return dp.PreferredAllocationResponse(container_responses=out)

    def _allocate(self, req: Any) -> Any:
        out = []
        for cr in req.container_requests:
            ids = list(cr.devices_ids)
            out.append(
                dp.ContainerAllocateResponse(
                    envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids)},
                    devices=[
                        dp.DeviceSpec(container_path=f"/dev/nvidia{i}", host_path=f"/dev/nvidia{i}", permissions="rw")
                        for i, _ in enumerate(ids)
                    ],
                    cdi_devices=[dp.CDIDevice(name=f"nvidia.com/gpu={d}") for d in ids],
                )
            )
        return dp.AllocateResponse(container_responses=out)

    def _handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        return {
            "GetDevicePluginOptions": self._unary(
                "GetDevicePluginOptions", lambda _: self.options, dp.Empty, dp.DevicePluginOptions
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self._list_and_watch,
                request_deserializer=dp.Empty.FromString,
                response_serializer=dp.ListAndWatchResponse.SerializeToString,
            ),
            "GetPreferredAllocation": self._unary(
                "GetPreferredAllocation", self._preferred, dp.PreferredAllocationRequest, dp.PreferredAllocationResponse
            ),
            "Allocate": self._unary("Allocate", self._allocate, dp.AllocateRequest, dp.AllocateResponse),
            "PreStartContainer": self._unary(
                "PreStartContainer",
                lambda _: dp.PreStartContainerResponse(),
                dp.PreStartContainerRequest,
                dp.PreStartContainerResponse,
            ),
        }


class FakePodResources(_FakeServer):
    """The kubelet's v1.PodResourcesLister on `socket_path`.

    `pods` are the rows the client is expected to return. Device-plugin rows
    are sent as the kubelet does, one ContainerDevices per device, so the
    client's merging is exercised. `allocatable` maps resource -> ids and
    defaults to every device-plugin id in `pods`.
    """

    service = "v1.PodResourcesLister"

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        pods: Sequence[PodDevices] = (),
        *,
        allocatable: Mapping[str, Sequence[str]] | None = None,
        **faults: Any,
    ) -> None:
        super().__init__(socket_path, **faults)
        self.pods = list(pods)
        if allocatable is None:
            merged: dict[str, dict[str, None]] = {}
            for row in self.pods:
                if row.source == "device-plugin":
                    merged.setdefault(row.resource, {}).update(dict.fromkeys(row.device_ids))
            allocatable = {r: list(ids) for r, ids in merged.items()}
        self.allocatable = {r: list(ids) for r, ids in allocatable.items()}

    def _pod_messages(self) -> list[Any]:
        pods: dict[tuple[str, str], dict[str, Any]] = {}
        for row in self.pods:
            containers = pods.setdefault((row.namespace, row.pod), {})
            c = containers.setdefault(row.container, pr.ContainerResources(name=row.container))
            if row.source == "dra":
                ns, _, name = row.claim.partition("/")
                c.dynamic_resources.append(
                    pr.DynamicResource(
                        claim_name=name,
                        claim_namespace=ns,
                        claim_resources=[
                            pr.ClaimResource(
                                driver_name=row.resource,
                                pool_name="pool-0",
                                device_name=d,
                                cdi_devices=[pr.CDIDevice(name=f"{row.resource}/gpu={d}")],
                            )
                            for d in row.device_ids
                        ],
                    )
                )
            else:
                for d in row.device_ids:
                    c.devices.append(
                        pr.ContainerDevices(
                            resource_name=row.resource, device_ids=[d], topology=_topology(pr, row.numa_nodes)
                        )
                    )
        return [
            pr.PodResources(name=pod, namespace=ns, containers=list(cs.values())) for (ns, pod), cs in pods.items()
        ]

    def _get(self, req: Any) -> Any:
        for p in self._pod_messages():
            if p.name == req.pod_name and p.namespace == req.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=p)
        raise _NotFound(f"pod {req.pod_namespace}/{req.pod_name} not found")

    def _allocatable(self, _: Any) -> Any:
        return pr.AllocatableResourcesResponse(
            devices=[pr.ContainerDevices(resource_name=r, device_ids=list(ids)) for r, ids in self.allocatable.items()]
        )

    def _handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        def get(request: Any, context: grpc.ServicerContext) -> Any:
            self._enter("Get", context)
            try:
                return self._get(request)
            except _NotFound as exc:
                context.abort(grpc.StatusCode.NOT_FOUND, str(exc))

        return {
            "List": self._unary(
                "List",
                lambda _: pr.ListPodResourcesResponse(pod_resources=self._pod_messages()),
                pr.ListPodResourcesRequest,
                pr.ListPodResourcesResponse,
            ),
            "GetAllocatableResources": self._unary(
                "GetAllocatableResources", self._allocatable, pr.AllocatableResourcesRequest, pr.AllocatableResourcesResponse
            ),
            "Get": grpc.unary_unary_rpc_method_handler(
                get,
                request_deserializer=pr.GetPodResourcesRequest.FromString,
                response_serializer=pr.GetPodResourcesResponse.SerializeToString,
            ),
        }


class _NotFound(Exception):
    pass


def write_checkpoint(plugin_dir: str | os.PathLike[str], registered: dict[str, list[str]],
                     entries: Sequence[tuple[str, str, str, list[str]]] = ()) -> str:
    """A kubelet device-manager checkpoint beside the plugin sockets (kubelet's JSON layout):
    RegisteredDevices per resource and (pod uid, container, resource, ids) entries."""
    path = os.path.join(os.fspath(plugin_dir), "kubelet_internal_checkpoint")
    doc = {"Data": {"PodDeviceEntries": [{"PodUID": u, "ContainerName": c, "ResourceName": r,
                                          "DeviceIDs": {"-1": ids}, "AllocResp": ""} for u, c, r, ids in entries],
                    "RegisteredDevices": registered}, "Checksum": 0}
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


class Apart:
    """A fake server (FakeDevicePlugin, FakePodResources) run in a process of its own.

    For code that calls gRPC from a forked child (the agent's monitors, agent/monitors.py): a child
    forked from a process that runs a gRPC server finds grpc's core copied without its threads, and
    cannot use it. The server here is a fresh interpreter (`python -m tests.support.fake_kubelet`),
    built from the same arguments (pickled); `calls` reads what it recorded.
    """

    def __init__(self, cls: type, socket_path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> None:
        self.socket_path = os.path.abspath(os.fspath(socket_path))
        self._spec = (cls.__name__, self.socket_path, args, kwargs)
        self._calls = self.socket_path + ".calls"
        self._proc: Any = None
        self._final: list[str] | None = None  # the calls, once stopped

    def __enter__(self) -> "Apart":
        import pickle
        import subprocess
        import sys
        import time

        spec = self.socket_path + ".spec"
        with open(spec, "wb") as f:
            pickle.dump((*self._spec, self._calls), f)
        open(self._calls, "w").close()
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.support.fake_kubelet", spec], cwd=repo,
                                      stdin=subprocess.DEVNULL)
        t_end = time.monotonic() + 30
        while not os.path.exists(self.socket_path + ".ready"):
            if self._proc.poll() is not None or time.monotonic() > t_end:
                self.__exit__()
                raise RuntimeError(f"fake server for {self.socket_path} did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except Exception:
                self._proc.kill()
                self._proc.wait(5)
        if os.path.exists(self._calls):
            self._final = self.calls
        for suffix in (".spec", ".ready", ".calls", ""):
            if os.path.exists(self.socket_path + suffix):
                os.unlink(self.socket_path + suffix)

    @property
    def calls(self) -> list[str]:
        if self._final is not None:
            return list(self._final)
        with open(self._calls) as f:
            return f.read().split()


def inline_monitors(monkeypatch: Any) -> None:
    """The agent's gRPC monitor calls (agent/monitors.py ask_sockets) made in this process instead of a
    forked child: for tests whose fake servers run in this process (see Apart), or that count calls."""
    import time

    from gpuwarden.agent import monitors as mon
    from gpuwarden.probes.bounded import ChildResult

    def ask(plan: Any, pod_resources_addr: Any, timeout_s: float) -> ChildResult:
        t0 = time.monotonic()
        value = mon._ask(plan, pod_resources_addr, timeout_s)
        return ChildResult("ok", time.monotonic() - t0, value=value)

    monkeypatch.setattr(mon, "ask_sockets", ask)


def _serve_apart(spec_path: str) -> None:
    """The process of an Apart server: build it, start it, say so, serve until SIGTERM."""
    import pickle
    import signal

    with open(spec_path, "rb") as f:
        name, socket_path, args, kwargs, calls_file = pickle.load(f)
    server = {"FakeDevicePlugin": FakeDevicePlugin, "FakePodResources": FakePodResources}[name](
        socket_path, *args, **kwargs)
    server.calls_file = calls_file
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    server.start()
    open(socket_path + ".ready", "w").close()
    signal.sigwait({signal.SIGTERM})
    server.stop()


if __name__ == "__main__":
    import sys

    _serve_apart(sys.argv[1])
