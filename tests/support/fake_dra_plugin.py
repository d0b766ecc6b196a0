"""A DRA kubelet plugin that speaks the real wire protocol from gpuwarden's protos, for probe tests.

Serves pluginregistration.Registration on `<root>/plugins_registry/<driver>-reg.sock` and the DRA
service (v1 and/or v1beta1) on `<root>/plugins/<driver>/dra.sock`, as the kubeletplugin helper does.
`hang` names the methods whose handler never returns (the plugin stuck in NVML, a lock, the API);
the connection is accepted and the call waits until the client's deadline. `prepared` maps a claim
UID to the CDI device IDs answered for it.

Run as a module (`python -m tests.support.fake_dra_plugin ROOT DRIVER [--hang M]... [--v1beta1-only]`)
when the test forks a probe child: a process running grpc threads must not fork.
`MuteSocket` is the bare case: a Unix socket that accepts and never says a byte.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
from concurrent import futures
from pathlib import Path

import grpc

from gpuwarden.grpcapi import dra as dra_api
from gpuwarden.grpcapi import dra_v1_pb2, dra_v1beta1_pb2, pluginregistration_v1_pb2 as reg


class FakeDraPlugin:
    def __init__(self, root: Path, driver: str = "gpu.example.com", hang: set[str] = frozenset(),
                 services: tuple[str, ...] = dra_api.DRA_SERVICES, prepared: dict[str, list[str]] | None = None,
                 plugin_type: str = dra_api.DRA_PLUGIN_TYPE) -> None:
        self.driver, self.hang, self.services = driver, set(hang), services
        self.prepared = prepared or {}
        self.plugin_type = plugin_type
        self.reg_path = Path(root) / "plugins_registry" / f"{driver}-reg.sock"
        self.dra_path = Path(root) / "plugins" / driver / "dra.sock"
        self.calls: list[tuple[str, object]] = []
        self.registered: bool | None = None
        self._release = threading.Event()
        self._servers: list[grpc.Server] = []

    # -- handlers --------------------------------------------------------------------------------
    def _wait_if_hung(self, name: str) -> None:
        if name in self.hang:
            self._release.wait()

    def _get_info(self, req, ctx):
        self.calls.append(("GetInfo", req))
        self._wait_if_hung("GetInfo")
        return reg.PluginInfo(type=self.plugin_type, name=self.driver, endpoint=str(self.dra_path),
                              supported_versions=[s.rsplit(".", 2)[-2] + ".DRAPlugin" for s in self.services])

    def _notify(self, req, ctx):
        self.calls.append(("NotifyRegistrationStatus", req))
        self.registered = req.plugin_registered
        return reg.RegistrationStatusResponse()

    def _prepare(self, pb):
        def handler(req, ctx):
            self.calls.append(("NodePrepareResources", req))
            self._wait_if_hung("NodePrepareResources")
            out = pb.NodePrepareResourcesResponse()
            for c in req.claims:
                ids = self.prepared.get(c.uid)
                if ids is None:
                    out.claims[c.uid].error = f"claim {c.namespace}/{c.name} not allocated to this node"
                else:
                    out.claims[c.uid].devices.add(pool_name="node-a", device_name=f"gpu-{len(ids) - 1}",
                                                  cdi_device_ids=ids, request_names=["gpu"])
            return out
        return handler

    def _unprepare(self, pb):
        def handler(req, ctx):
            self.calls.append(("NodeUnprepareResources", req))
            self._wait_if_hung("NodeUnprepareResources")
            out = pb.NodeUnprepareResourcesResponse()
            for c in req.claims:
                out.claims[c.uid].error = ""
            return out
        return handler

    # -- lifecycle -------------------------------------------------------------------------------
    def _serve(self, path: Path, handlers: list[grpc.GenericRpcHandler]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        server.add_generic_rpc_handlers(handlers)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        self._servers.append(server)

    def start(self) -> "FakeDraPlugin":
        u = grpc.unary_unary_rpc_method_handler
        reg_h = grpc.method_handlers_generic_handler(dra_api.REGISTRATION, {
            "GetInfo": u(self._get_info, reg.InfoRequest.FromString, reg.PluginInfo.SerializeToString),
            "NotifyRegistrationStatus": u(self._notify, reg.RegistrationStatus.FromString,
                                          reg.RegistrationStatusResponse.SerializeToString)})
        dra_h = []
        for svc, pb in ((dra_api.DRA_V1, dra_v1_pb2), (dra_api.DRA_V1BETA1, dra_v1beta1_pb2)):
            if svc in self.services:
                dra_h.append(grpc.method_handlers_generic_handler(svc, {
                    "NodePrepareResources": u(self._prepare(pb), pb.NodePrepareResourcesRequest.FromString,
                                              pb.NodePrepareResourcesResponse.SerializeToString),
                    "NodeUnprepareResources": u(self._unprepare(pb), pb.NodeUnprepareResourcesRequest.FromString,
                                                pb.NodeUnprepareResourcesResponse.SerializeToString)}))
        self._serve(self.dra_path, dra_h)  # the service first, as the kubeletplugin helper does
        self._serve(self.reg_path, [reg_h])
        return self

    def stop(self) -> None:
        self._release.set()
        for s in self._servers:
            s.stop(0).wait(2)
        self._servers.clear()

    def __enter__(self) -> "FakeDraPlugin":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MuteSocket:
    """A Unix socket that accepts every connection and never answers: a plugin hung before its first byte."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(16)
        self._held: list[socket.socket] = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._held.append(conn)  # held open, never read or written

    def close(self) -> None:
        self._sock.close()
        for c in self._held:
            c.close()

    def __enter__(self) -> "MuteSocket":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("driver")
    ap.add_argument("--hang", action="append", default=[])
    ap.add_argument("--v1beta1-only", action="store_true")
    a = ap.parse_args()
    p = FakeDraPlugin(Path(a.root), a.driver, set(a.hang),
                      (dra_api.DRA_V1BETA1,) if a.v1beta1_only else dra_api.DRA_SERVICES).start()
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    p.stop()
    os._exit(0)  # hung handler threads must not keep the process


if __name__ == "__main__":
    main()
