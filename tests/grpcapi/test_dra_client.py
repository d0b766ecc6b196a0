"""The DRA plugin and plugin-registration clients (grpcapi/dra.py) against real gRPC servers on unix sockets.

Wire contract pinned by hand-built bytes (tests/support/protowire.py) from the upstream api.proto
field numbers (k8s.io/kubelet pkg/apis/dra/v1, v1beta1, pluginregistration/v1), independent of
the generated code; the hang tests use a handler that never returns and a socket that never speaks.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from gpuwarden.grpcapi import dra, dra_v1_pb2, dra_v1beta1_pb2, pluginregistration_v1_pb2 as reg
from tests.support.fake_dra_plugin import FakeDraPlugin, MuteSocket
from tests.support.protowire import ld, vi

SLACK_S = 0.5
UID = "0b5c7e7a-1f2d-4c1e-9a0b-5d6e7f809a1b"


def test_wire_contract_field_numbers_match_upstream() -> None:
    for pb in (dra_v1_pb2, dra_v1beta1_pb2):
        claim = ld(1, "ns") + ld(2, UID) + ld(3, "c")
        req = pb.NodePrepareResourcesRequest.FromString(ld(1, claim))
        assert (req.claims[0].namespace, req.claims[0].uid, req.claims[0].name) == ("ns", UID, "c")
        dev = ld(1, "gpu") + ld(2, "node-a") + ld(3, "gpu-0") + ld(4, "k8s.gpu.nvidia.com/claim=x")
        entry = ld(1, UID) + ld(2, ld(1, dev) + ld(2, "boom"))  # map<string, NodePrepareResourceResponse>
        resp = pb.NodePrepareResourcesResponse.FromString(ld(1, entry))
        r = resp.claims[UID]
        assert (list(r.devices[0].request_names), r.devices[0].pool_name, r.devices[0].device_name,
                list(r.devices[0].cdi_device_ids), r.error) == (["gpu"], "node-a", "gpu-0", ["k8s.gpu.nvidia.com/claim=x"], "boom")
        un = pb.NodeUnprepareResourcesResponse.FromString(ld(1, ld(1, UID) + ld(2, ld(1, "e"))))
        assert un.claims[UID].error == "e"
    assert dra_v1_pb2.Device.FromString(ld(5, "share")).share_id == "share"
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    info = reg.PluginInfo.FromString(ld(1, "DRAPlugin") + ld(2, "gpu.nvidia.com") + ld(3, "/p/dra.sock")
                                     + ld(4, dra.DRA_V1) + ld(4, dra.DRA_V1BETA1))
    assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
        "DRAPlugin", "gpu.nvidia.com", "/p/dra.sock", [dra.DRA_V1, dra.DRA_V1BETA1])
    st = reg.RegistrationStatus.FromString(vi(1, 1) + ld(2, "x"))
    assert st.plugin_registered and st.error == "x"


def test_service_paths_are_upstreams() -> None:
    assert dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == dra.DRA_V1
    assert dra_v1beta1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == dra.DRA_V1BETA1
    assert reg.DESCRIPTOR.services_by_name["Registration"].full_name == dra.REGISTRATION
    assert [m.name for m in reg.DESCRIPTOR.services_by_name["Registration"].methods] == [
        "GetInfo", "NotifyRegistrationStatus"]


def test_registration_prepare_unprepare(sock_dir: Path) -> None:
    with FakeDraPlugin(sock_dir, "gpu.example.com", prepared={UID: ["k8s.gpu.example.com/claim=x-gpu-0"]}) as p:
        info = dra.get_info(str(p.reg_path), 2)
        assert info.ok and info.value == dra.PluginInfo("DRAPlugin", "gpu.example.com", str(p.dra_path),
                                                        ("v1.DRAPlugin", "v1beta1.DRAPlugin"))
        assert info.value.dra_service == dra.DRA_V1
        assert dra.notify_registration(str(p.reg_path), True, timeout=2).ok and p.registered is True
        noop = dra.prepare(str(p.dra_path), [], timeout=2)
        assert noop.ok and noop.value == ()
        r = dra.prepare(str(p.dra_path), [("default", UID, "c"), ("default", "other", "d")],
                        dra.DRA_V1BETA1, timeout=2)
        assert r.ok, r.detail
        got = {c.uid: c for c in r.value}
        assert got[UID].devices[0].cdi_device_ids == ("k8s.gpu.example.com/claim=x-gpu-0",) and not got[UID].error
        assert "not allocated" in got["other"].error
        u = dra.unprepare(str(p.dra_path), [("default", UID, "c")], timeout=2)
        assert u.ok and u.value == (dra.ClaimResult(UID),)


def test_v1beta1_only_plugin_answers_unimplemented_on_v1(sock_dir: Path) -> None:
    with FakeDraPlugin(sock_dir, services=(dra.DRA_V1BETA1,)) as p:
        assert dra.prepare(str(p.dra_path), [], dra.DRA_V1, timeout=2).status == "unimplemented"
        assert dra.prepare(str(p.dra_path), [], dra.DRA_V1BETA1, timeout=2).ok
        assert dra.get_info(str(p.reg_path), 2).value.dra_service == dra.DRA_V1BETA1


@pytest.mark.parametrize("method", ["GetInfo", "NodePrepareResources"])
def test_a_handler_that_never_returns_is_a_timeout_within_the_deadline(sock_dir: Path, method: str) -> None:
    with FakeDraPlugin(sock_dir, hang={method}) as p:
        t0 = time.monotonic()
        r = dra.get_info(str(p.reg_path), 0.5) if method == "GetInfo" else dra.prepare(str(p.dra_path), [], timeout=0.5)
        assert r.status == "timeout" and time.monotonic() - t0 < 0.5 + SLACK_S


def test_a_socket_that_accepts_and_never_answers_is_a_timeout(sock_dir: Path) -> None:
    with MuteSocket(sock_dir / "mute-reg.sock") as m:
        t0 = time.monotonic()
        r = dra.get_info(str(m.path), 0.5)
    assert r.status == "timeout" and time.monotonic() - t0 < 0.5 + SLACK_S


def test_a_socket_left_by_a_dead_plugin_is_unavailable_at_once(sock_dir: Path) -> None:
    path = sock_dir / "dra.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    r = dra.prepare(str(path), [], timeout=5)
    assert r.status == "unavailable" and r.elapsed_s < 2.0
    assert dra.get_info(str(sock_dir / "none.sock"), 5).status == "unavailable"
