"""Interoperability with the real NVIDIA DRA kubelet plugin (gpu-kubelet-plugin 95932046), without a GPU.

The plugin is the upstream binary (tests/support/realdra.py). Its NVML is tests/support/nvml_fake.c
(one fake H100) in a driver root of the test's own; with that it enumerates the GPU, serves its
registration and DRA sockets and starts its ResourceSlice controller, which waits for the API
server. Here the kubeconfig points nowhere (the test API server with resource.k8s.io drives the
rest: tests/gpu/dra_scenarios.py on the GPU machine); everything below happens before that, on the
plugin's own code: the kubelet stand-in's registration handshake, the probe's GetInfo and empty
NodePrepareResources (GPU-DRA-030 silent), the plugin killed with its sockets left behind
(CONFIRMED: refuses connections, and no process of it in the process table) and restarted with its
NVML hung in nvmlInit (tools/gpu/nvml_hang_shim.c: incident 5a; the sockets stay dead while its
process runs: AT-RISK high, not "gone"), then restarted healthy (the finding clears). The plugin's
tree is taken for the node (TreeAsNode) with this machine's process table, where the plugin runs: a
refusal on any other tree is evidence of nothing (issue 44). Every test is bounded; the plugin is
always stopped.

Skipped, loudly and with the reason, only when the plugin cannot run here (binary missing or not
matching SHA256SUMS, no C compiler, no mount namespace).
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest

from gpuwarden import engine
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.findings import Severity, Status
from gpuwarden.grpcapi import dra
from gpuwarden.root import HostRoot
from tests.support import realdra, realplugin
from tests.support.kubelet_dra import KubeletDra

REPO = Path(__file__).resolve().parents[2]
KR = "/var/lib/kubelet"
TIMEOUT = 2.0


@pytest.fixture(scope="module")
def kit():
    work = realdra.workdir()
    try:
        binary = realdra.unpack()
        realplugin.namespace_prefix()
        fake = realdra.fake_driver_root(work / "drv", REPO / "tests/support/nvml_fake.c")
        hung = realdra.fake_driver_root(work / "drv-hung", REPO / "tools/gpu/nvml_hang_shim.c")
    except realplugin.Unavailable as exc:
        shutil.rmtree(work, ignore_errors=True)
        pytest.skip(f"REAL DRA PLUGIN NOT RUN: {exc}")
    yield binary, work, fake, hung
    shutil.rmtree(work, ignore_errors=True)


def _plugin(kit, driver_root: Path, name: str) -> realplugin.RealPlugin:
    binary, work, _, _ = kit
    root = work / "node"
    kr = root / KR.lstrip("/")
    kc = realdra.kubeconfig(work / "kubeconfig")
    a = realdra.args("gw-node", kr, root / "etc/cdi", driver_root, kc)
    return realplugin.RealPlugin(binary, a, log_path=work / f"{name}.log").start()


def _wait_sockets(kit, p: realplugin.RealPlugin, timeout: float = 30.0) -> None:
    reg, svc = realdra.sockets(kit[1] / "node" / KR.lstrip("/"))
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if reg.exists() and svc.exists() and "GRPC server started" in p.log() and p.log().count("GRPC server started") >= 2:
            return
        if p.proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"the plugin did not serve its sockets; log: {p.log()[-2000:]}")


class TreeAsNode(HostRoot):
    """The plugin's tree taken for the running node: the plugin runs on this machine, its sockets are real."""

    def node_identity(self) -> str:
        return ""


def _dra030(kit) -> list:
    facts = NodeFacts(TreeAsNode(str(kit[1] / "node")), Settings(probes=True, probe_timeout_s=TIMEOUT))
    facts.set("processes", NodeFacts(HostRoot("/"), Settings(probes=True)).get("processes"))  # where the plugin runs
    rep = engine.run(facts, engine.select(engine.all_rules(), ("GPU-DRA-030",)), mode="live")
    assert rep.errors == []
    return rep.findings


def _kill9(p: realplugin.RealPlugin) -> None:
    p.proc.send_signal(signal.SIGKILL)
    p.proc.wait(10)
    p.stop()


@pytest.mark.rule("GPU-DRA-030", "negative")
def test_real_plugin_registers_and_answers_the_liveness_calls(kit):
    p = _plugin(kit, kit[2], "healthy")
    try:
        _wait_sockets(kit, p)
        k = KubeletDra(kit[1] / "node" / KR.lstrip("/"), timeout=TIMEOUT)
        reg = k.register(realdra.DRIVER)
        assert reg.info.type == "DRAPlugin" and reg.info.name == realdra.DRIVER
        assert reg.info.supported_versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin") and reg.service == dra.DRA_V1
        assert reg.endpoint == str(realdra.sockets(kit[1] / "node" / KR.lstrip("/"))[1])
        assert dra.prepare(reg.endpoint, [], dra.DRA_V1BETA1, TIMEOUT).ok  # what its own liveness check sends
        assert _dra030(kit) == []
        assert "About to announce device gpu-0" in p.log()  # the fake GPU, enumerated by the plugin's own code
    finally:
        p.stop()


@pytest.mark.rule("GPU-DRA-030", "positive")
def test_real_plugin_killed_then_hung_in_nvml_then_healthy_again(kit):
    p = _plugin(kit, kit[2], "before-kill")
    try:
        _wait_sockets(kit, p)
        assert _dra030(kit) == []
    finally:
        _kill9(p)  # kill -9: its sockets stay behind
    reg, svc = realdra.sockets(kit[1] / "node" / KR.lstrip("/"))
    assert reg.exists() and svc.exists()
    (f,) = _dra030(kit)
    assert f.status is Status.CONFIRMED and "refuses connections" in f.summary and "no process" in f.summary
    assert [c["status"] for c in f.data["calls"]] == ["unavailable", "unavailable"]

    hung = _plugin(kit, kit[3], "hung-nvml")  # restarted, and its nvmlInit never returns (incident 5a)
    try:
        assert hung.wait_log("Initializing NVML", 20), hung.log()[-2000:]
        time.sleep(1.0)
        assert hung.proc.poll() is None and "t_nvml_init" not in hung.log()
        t0 = time.monotonic()
        (f,) = _dra030(kit)
        assert time.monotonic() - t0 < 3 * TIMEOUT + 2
        assert f.status is Status.AT_RISK and f.severity is Severity.HIGH and f.affected[0].name == realdra.DRIVER
        assert "still runs" in f.summary and f"pid {hung.proc.pid}" in str(f.evidence)
    finally:
        hung.stop()

    p = _plugin(kit, kit[2], "after")  # a healthy restart re-creates the sockets: the finding clears
    try:
        _wait_sockets(kit, p)
        assert _dra030(kit) == []
    finally:
        p.stop()
