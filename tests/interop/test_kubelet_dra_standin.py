"""The kubelet DRA stand-in (tests/support/kubelet_dra.py) against a plugin speaking the real wire protocol.

Registration handshake, a claim prepared and unprepared, the kubelet's claim checkpoint, and the
runtime's reading of the claim's CDI spec into device nodes and runc's device rules. The same
stand-in drives the real gpu-kubelet-plugin on the GPU machine (tests/gpu/dra_scenarios.py).
"""

from __future__ import annotations

import json
import os

import pytest

from gpuwarden.grpcapi import dra
from tests.support.fake_dra_plugin import FakeDraPlugin
from tests.support.kubelet_dra import KubeletDra, StandInError, device_rules

DRIVER = "gpu.example.com"
UID = "8a1b7f9e-3c2d-4e5f-a6b7-c8d9e0f1a2b3"
POD = "0f0e0d0c-0b0a-4909-8807-060504030201"
CDI_ID = f"k8s.{DRIVER}/claim={UID}-gpu-0"


def _spec(d, nodes):
    d.mkdir(parents=True, exist_ok=True)
    (d / f"k8s.{DRIVER}-claim_{UID}.json").write_text(json.dumps({
        "cdiVersion": "0.8.0", "kind": f"k8s.{DRIVER}/claim",
        "devices": [{"name": f"{UID}-gpu-0", "containerEdits": {"deviceNodes": nodes}}],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}}))


def test_register_prepare_checkpoint_cdi_unprepare(sock_dir, tmp_path):
    cdi = tmp_path / "cdi"
    _spec(cdi, [{"path": "/dev/null"}, {"path": "/dev/zero", "type": "c", "major": 1, "minor": 5}])
    with FakeDraPlugin(sock_dir, DRIVER, prepared={UID: [CDI_ID]}) as p:
        k = KubeletDra(sock_dir, cdi_dirs=[str(cdi)], timeout=2)
        reg = k.register(DRIVER)
        assert reg.service == dra.DRA_V1 and reg.endpoint == str(p.dra_path) and p.registered is True
        got = k.prepare(DRIVER, POD, [("ml", UID, "gpu-claim")])
        assert got[UID].devices[0].cdi_device_ids == (CDI_ID,)
        state = json.loads((sock_dir / "dra_manager_state").read_text())
        data = json.loads(state["Data"])
        assert data["kind"] == "DRACheckpoint" and data["apiVersion"] == "checkpoint.dra.kubelet.k8s.io/v1"
        (e,) = data["Entries"]
        assert (e["ClaimUID"], e["ClaimName"], e["Namespace"], e["PodUIDs"]) == (UID, "gpu-claim", "ml", {POD: {}})
        assert e["DriverState"][DRIVER]["Devices"][0]["CDIDeviceIDs"] == [CDI_ID]
        nodes = k.cdi_device_nodes([CDI_ID])
        null = os.stat("/dev/null").st_rdev
        assert [(n["path"], n["type"], n["major"], n["minor"]) for n in nodes] == [
            ("/dev/null", "c", os.major(null), os.minor(null)), ("/dev/zero", "c", 1, 5)]
        assert device_rules(nodes) == [f"c {os.major(null)}:{os.minor(null)} rwm", "c 1:5 rwm"]
        k.unprepare(DRIVER, [("ml", UID, "gpu-claim")])
        assert json.loads(json.loads((sock_dir / "dra_manager_state").read_text())["Data"])["Entries"] == []
    assert [n for n, _ in p.calls] == ["GetInfo", "NotifyRegistrationStatus", "NodePrepareResources",
                                       "NodeUnprepareResources"]


def test_a_claim_the_plugin_refuses_and_a_missing_spec_fail_like_the_kubelet(sock_dir, tmp_path):
    with FakeDraPlugin(sock_dir, DRIVER) as p:
        k = KubeletDra(sock_dir, cdi_dirs=[str(tmp_path / "none")], timeout=2)
        k.register(DRIVER)
        with pytest.raises(StandInError, match="not allocated to this node"):
            k.prepare(DRIVER, POD, [("ml", UID, "gpu-claim")])
        with pytest.raises(StandInError, match="in no spec"):
            k.cdi_device_nodes([CDI_ID])
    assert p.calls


def test_a_plugin_that_is_not_dra_is_refused_at_registration(sock_dir):
    with FakeDraPlugin(sock_dir, DRIVER, plugin_type="CSIPlugin") as p:
        with pytest.raises(StandInError, match="not DRAPlugin"):
            KubeletDra(sock_dir, timeout=2).register(DRIVER)
    assert p.registered is False


def test_a_hung_prepare_fails_at_the_kubelets_deadline(sock_dir):
    with FakeDraPlugin(sock_dir, DRIVER, hang={"NodePrepareResources"}, prepared={UID: [CDI_ID]}):
        k = KubeletDra(sock_dir, timeout=0.5)
        k.register(DRIVER)
        with pytest.raises(StandInError, match="timeout"):
            k.prepare(DRIVER, POD, [("ml", UID, "gpu-claim")])
