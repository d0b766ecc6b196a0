"""Incidents 1, 2, 3 and 5a and the DRA forms through the real node runtime: Debian's containerd 2.1 and
runc 1.3, driven through CRI by the kubelet stand-in (tests/support/cri.py, cri_node.py), read by
`gpuwarden check`. The real device plugin's tests (its NVML the fake of tests/support/nvml_fake.c) skip,
loudly, where its binary is not found (tests/support/realplugin.py).

Root and a cgroup v1 devices hierarchy only (CI's machine); elsewhere each test skips saying why.
One containerd serves the module; each test adds its own pods and removes what it changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.support import cri, cri_node as cn
from tests.support.root_only import required

REPO = Path(__file__).resolve().parents[2]
RC92 = "runc version 1.0.0-rc92\ncommit: ff819c7e9184c13b7c2607fe6c30ae19403a7aff\nspec: 1.0.2-dev\n"


class Stack:
    def __init__(self, bin_dir: Path, work: Path):
        self.versions = cri.versions(bin_dir)
        self.node = cn.Node(work, self.versions["runc"] + "\n")
        self.node.write_cdi_spec(with_uvm=True)
        self.top = f"gpuwarden-cri-{os.getpid()}"
        self.containerd = cri.Containerd(bin_dir, work / "containerd", self.node.cdi_dir)
        self.k: cri.Kubelet | None = None
        self.pods: dict[str, dict] = {}

    def add(self, form: str, name: str, kind: str = cn.CDI_KIND) -> dict:
        assert self.k is not None
        p = cn.create_form(self.k, self.node, form, self.top, name, kind=kind)
        self.pods[name] = p
        return p

    def drop(self, name: str) -> None:
        p = self.pods.pop(name)
        assert self.k is not None
        self.k.stop_pod(p["sandbox"])
        self.k.remove_pod(p["sandbox"])

    def check(self, *flags: str, select: str = "GPU-DEV") -> dict:
        return cn.check(self.node, self.containerd.state, self.top, *flags, select=select)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    reason = cn.why_not()
    if reason:
        pytest.skip(reason)
    try:
        bin_dir = cri.build()
    except cri.Unavailable as exc:
        if required() and "needs root" not in str(exc):
            pytest.fail(f"the CRI runtime could not be set up on a root CI machine: {exc}")
        pytest.skip(str(exc))
    s = Stack(bin_dir, tmp_path_factory.mktemp("cri"))
    try:
        with s.containerd:
            s.k = cri.Kubelet(s.containerd.sock)
            for form in cn.FORMS:
                s.add(form, f"gpu-{form}")
            yield s
            s.k.close()
    finally:
        left = cri.remove_cgroups(s.top)
        assert not left, f"cgroups left behind: {left}"
        assert not s.containerd.shim_pids()


def test_the_runtime_is_debians_containerd_and_runc(stack: Stack) -> None:
    assert stack.versions["containerd"].startswith("containerd github.com/containerd/containerd/v2 2.")
    assert stack.versions["runc"].startswith("runc version 1.")
    assert stack.k is not None and stack.k.version()["runtime"] == "containerd"


def test_cpu_manager_update_keeps_the_gpu_devices_of_every_form(stack: Stack) -> None:
    """Incidents 2/3's mechanism on today's runc: UpdateContainerResources with only the cpuset (what
    the static CPU manager sends) leaves every GPU rule in place, the hook's too (runc >= 1.0 skips
    devices on update, runc#2994). The cpuset itself did change: the update went through."""
    assert stack.k is not None
    for form in cn.FORMS:
        p = stack.pods[f"gpu-{form}"]
        before = cn.gpu_rules(p["cgroup"])
        assert [r.split()[1] for r in before] and {r.split()[1] for r in before} >= {"195:0", "195:255", "238:0"}, (form, before)
        stack.k.update_cpuset(p["id"], "0")
        assert cn.gpu_rules(p["cgroup"]) == before, form
        assert Path("/sys/fs/cgroup/cpuset", p["cgroup"], "cpuset.cpus").read_text().strip() == "0"
        assert stack.k.status(p["id"])["cpuset"] == "0"


def test_cdi_forms_reach_the_task_spec_without_a_trace_of_cdi(stack: Stack) -> None:
    """containerd resolves CDI names into linux.devices and keeps neither the names nor the
    cdi.k8s.io annotation in config.json: gpuwarden cannot tell CDI from DeviceSpecs there."""
    for form in ("cdi-cri", "cdi-annotations"):
        cid = stack.pods[f"gpu-{form}"]["id"]
        spec = json.loads((stack.containerd.state / "io.containerd.runtime.v2.task/k8s.io" / cid / "config.json")
                          .read_text())
        assert {d["path"] for d in spec["linux"]["devices"]} == {"/dev/nvidiactl", "/dev/nvidia-uvm",
                                                                 "/dev/nvidia-uvm-tools", "/dev/nvidia0"}
        assert not any(k.startswith("cdi.k8s.io/") for k in spec.get("annotations", {}))


@pytest.mark.rule("GPU-DEV-002", "negative")
def test_gpuwarden_sees_no_loss_and_no_risk_on_runc_1_3(stack: Stack) -> None:
    for p in stack.pods.values():
        stack.k.update_cpuset(p["id"], "0")  # type: ignore[union-attr]
    report = stack.check()
    assert report["summary"]["not_checked"] is None
    assert [f["code"] for f in report["findings"]] == []
    seen = " ".join(u["reason"] for u in report["unavailable"])
    assert all(f"gpu-{form}/worker" in seen for form in cn.FORMS)  # the four GPU containers were read


@pytest.mark.rule("GPU-DEV-002", "positive")
def test_the_same_node_with_runc_rc92_is_at_risk_for_the_hook_container_only(stack: Stack) -> None:
    """The verdict is gated on runc's version: the real node above, its `runc --version` rc92's."""
    stack.node.set_runc(RC92)
    try:
        (f,) = cn.findings(stack.check(), "GPU-DEV-002")
    finally:
        stack.node.set_runc(stack.versions["runc"] + "\n")
    assert f["status"] == "at-risk"
    assert [a["name"] for a in f["affected"]] == ["gpu-hook/worker"]
    assert "runc 1.0.0-rc92 < 1.0.0 re-applies devices on update" in f["summary"]


@pytest.mark.rule("GPU-DEV-002", "positive")
def test_a_loss_is_confirmed_without_blaming_the_cpu_manager_on_runc_1_3_and_clears(stack: Stack) -> None:
    p = stack.add("hook", "gpu-lost")
    try:
        Path(cri.V1_DEVICES, p["cgroup"], "devices.deny").write_text("c 195:255 rwm")
        stack.k.update_cpuset(p["id"], "0")  # type: ignore[union-attr]
        (f,) = cn.findings(stack.check(), "GPU-DEV-002")
        assert f["status"] == "confirmed"
        assert [a["name"] for a in f["affected"]] == ["gpu-lost/worker"]
        assert "/dev/nvidiactl" in f["summary"]
        assert f["data"]["cause"] != "static-cpu-manager"
    finally:
        stack.drop("gpu-lost")
    assert cn.findings(stack.check(), "GPU-DEV-002") == []


def _plugin_strategy(stack: Stack, strategy: str) -> None:
    environ = stack.node.root / f"proc/{cn.PLUGIN_PID}/environ"
    environ.write_bytes(f"DEVICE_LIST_STRATEGY={strategy}\0FAIL_ON_INIT_ERROR=true\0".encode())


@pytest.mark.rule("GPU-DEV-001", "positive")
@pytest.mark.parametrize("form", ["cdi-cri", "cdi-annotations"])
@pytest.mark.parametrize("kind", [cn.CDI_KIND, cn.PLUGIN_CDI_KIND], ids=["toolkit-spec", "plugins-own-spec"])
def test_incident1_in_cdi_mode_names_the_spec_and_its_fix(stack: Stack, form: str, kind: str) -> None:
    """A CDI spec generated before nvidia-uvm existed; the plugin passes CDI names: the container lacks
    nvidia-uvm. The toolkit's spec (nvidia.com/gpu): regenerate it, not the plugin. The plugin's own
    (k8s.device-plugin.nvidia.com/gpu, written when it starts): restart the plugin."""
    own = kind == cn.PLUGIN_CDI_KIND
    spec = stack.node.write_cdi_spec(with_uvm=False, kind=kind)
    uvm_ctime = (stack.node.root / "dev/nvidia-uvm").stat().st_ctime
    os.utime(spec, (uvm_ctime - 120, uvm_ctime - 120))  # generated before the node was created
    environ = stack.node.root / f"proc/{cn.PLUGIN_PID}/environ"
    saved = environ.read_bytes()
    name = f"gpu-{form}-nouvm"
    try:
        _plugin_strategy(stack, form)
        p = stack.add(form, name, kind)
        assert "c 238:0 rwm" not in cn.gpu_rules(p["cgroup"])
        (f,) = cn.findings(stack.check(), "GPU-DEV-001")
        assert f["status"] == "confirmed"
        assert [a["name"] for a in f["affected"] if a["kind"] == "container"] == [f"{name}/worker"]
        assert f["data"]["cause"] == ("stale-plugin-cdi-spec" if own else "stale-cdi-spec")
        assert f["data"]["stale_plugin"] is own  # remediation restarts the plugin only for its own spec
        path = f"/var/run/cdi/{spec.name}"
        assert (f"the device plugin's own CDI spec {path}" if own else f"the node CDI spec {path} has no /dev/nvidia-uvm") \
            in f["summary"]
        assert ("Restart the device-plugin pod" in f["remedy"]) is own
        assert ("nvidia-ctk cdi generate" in f["remedy"]) is not own
        ev = [f"{e['source']}: {e['text']}" for e in f["evidence"]]
        assert any(f"{kind}=0 gives /dev/nvidia0, /dev/nvidiactl: no /dev/nvidia-uvm" in e for e in ev)
        assert any(e.startswith(f"{path}: written ") and "before /dev/nvidia-uvm was created" in e for e in ev)
        assert f"/proc/{cn.PLUGIN_PID}/environ: device plugin DEVICE_LIST_STRATEGY={form}" in ev
    finally:
        spec.unlink()
        stack.node.write_cdi_spec(with_uvm=True)
        environ.write_bytes(saved)
        if name in stack.pods:
            stack.drop(name)
    assert cn.findings(stack.check(), "GPU-DEV-001") == []


@pytest.mark.rule("GPU-DEV-001", "positive")
@pytest.mark.rule("GPU-DEV-001", "clears")
def test_incident1_devicespecs_from_a_stale_plugin_snapshot_names_restarting_the_plugin_and_clears(stack: Stack) -> None:
    """Incident 1 in the plugin's /dev snapshot form: the plugin started before nvidia-uvm existed, so its
    Allocate returns DeviceSpecs without it (apiDeviceSpecs only lists the optional nodes its /dev has);
    kubelet passes them to CreateContainer and runc's real device list lacks 238:0. gpuwarden reads that
    list, config.json and the checkpoint: the plugin's /dev is the cause, restarting it the fix (not the
    CDI spec's regenerate). After the restart and a new pod, nothing."""
    assert stack.k is not None
    ckpt = stack.node.root / "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    try:
        cn.plugin_dev(stack.node, with_uvm=False)
        specs = cn.plugin_allocate(stack.node)
        assert [h for _, h, _ in specs] == ["/dev/nvidiactl", "/dev/nvidia0"]
        p = cn.create_allocated(stack.k, stack.node, stack.top, "gpu-snapshot", specs)
        stack.pods["gpu-snapshot"] = p
        cn.write_checkpoint(stack.node, [(p["uid"], specs)])
        rules = cn.gpu_rules(p["cgroup"])
        assert "c 238:0 rw" not in rules and {"c 195:0 rw", "c 195:255 rw"} <= set(rules)
        config = json.loads((stack.containerd.state / "io.containerd.runtime.v2.task/k8s.io" / p["id"] / "config.json")
                            .read_text())
        assert "/dev/nvidia-uvm" not in {d["path"] for d in config["linux"]["devices"]}
        (f,) = cn.findings(stack.check(), "GPU-DEV-001")
        assert f["status"] == "confirmed"
        assert [a["name"] for a in f["affected"]] == ["gpu-snapshot/worker"]
        assert f["data"]["cause"] == "stale-plugin" and f["data"]["stale_plugin"] is True
        assert "the device plugin cannot see /dev/nvidia-uvm (not in its /dev), so its Allocate omitted it" in f["summary"]
        assert "Restart the device-plugin pod" in f["remedy"] and "nvidia-ctk cdi generate" not in f["remedy"]
        ev = [f"{e['source']}: {e['text']}" for e in f["evidence"]]
        assert f"/proc/{cn.PLUGIN_PID}/root/dev: device plugin (pid {cn.PLUGIN_PID}) has no nvidia-uvm in its /dev" in ev
        assert ("kubelet_internal_checkpoint AllocResp: plugin's Allocate returned devices /dev/nvidiactl, /dev/nvidia0 "
                "(no /dev/nvidia-uvm)") in ev
        # the fix: the plugin restarted (its /dev now has the node), the pod recreated from a new Allocate
        cn.plugin_dev(stack.node, with_uvm=True)
        stack.drop("gpu-snapshot")
        specs = cn.plugin_allocate(stack.node)
        assert "/dev/nvidia-uvm" in [h for _, h, _ in specs]
        p = cn.create_allocated(stack.k, stack.node, stack.top, "gpu-snapshot", specs)
        stack.pods["gpu-snapshot"] = p
        cn.write_checkpoint(stack.node, [(p["uid"], specs)])
        assert "c 238:0 rw" in cn.gpu_rules(p["cgroup"])
        assert cn.findings(stack.check(), "GPU-DEV-001") == []
    finally:
        cn.plugin_dev(stack.node, with_uvm=True)
        ckpt.unlink(missing_ok=True)
        if "gpu-snapshot" in stack.pods:
            stack.drop("gpu-snapshot")


def _gpu_containers(report: dict) -> int:
    """How many GPU containers the check read (the count its --no-probes gap names)."""
    import re

    text = " ".join(u["reason"] for u in report["unavailable"])
    m = re.search(r"did not evaluate them for (\d+) GPU container", text)
    return int(m.group(1)) if m else 0


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_a_plugin_snapshot_with_uvm_gives_devicespecs_with_it_and_no_finding(stack: Stack) -> None:
    assert stack.k is not None
    ckpt = stack.node.root / "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    read_before = _gpu_containers(stack.check())
    try:
        specs = cn.plugin_allocate(stack.node)
        p = cn.create_allocated(stack.k, stack.node, stack.top, "gpu-fresh", specs)
        stack.pods["gpu-fresh"] = p
        cn.write_checkpoint(stack.node, [(p["uid"], specs)])
        assert "c 238:0 rw" in cn.gpu_rules(p["cgroup"])
        report = stack.check()
        assert cn.findings(report, "GPU-DEV-001") == []
        assert _gpu_containers(report) == read_before + 1  # the new pod was read
    finally:
        ckpt.unlink(missing_ok=True)
        if "gpu-fresh" in stack.pods:
            stack.drop("gpu-fresh")


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_cdi_mode_with_a_spec_that_has_uvm_gives_no_finding(stack: Stack) -> None:
    environ = stack.node.root / f"proc/{cn.PLUGIN_PID}/environ"
    saved = environ.read_bytes()
    try:
        _plugin_strategy(stack, "cdi-cri")
        assert cn.findings(stack.check(), "GPU-DEV-001") == []
    finally:
        environ.write_bytes(saved)


def test_nothing_is_left_after_a_pod_is_removed(stack: Stack) -> None:
    p = stack.add("devicespecs", "gpu-gone")
    stack.drop("gpu-gone")
    assert cri.v1_devices_list(p["cgroup"]) is None
    assert not (stack.containerd.state / "io.containerd.runtime.v2.task/k8s.io" / p["id"]).exists()


@pytest.mark.rule("GPU-DRA-010", "positive")
@pytest.mark.parametrize("with_uvm", [False, True], ids=["claim-spec-without-uvm", "claim-spec-with-uvm"])
def test_a_dra_claim_injected_by_containerds_cdi(stack: Stack, with_uvm: bool) -> None:
    """The DRA form: the claim's CDI device ID in CreateContainer's CDI_devices, resolved by containerd in
    the driver's transient claim spec. Without nvidia-uvm in it, GPU-DRA-010 names the claim and the pod,
    and GPU-DEV-001 leaves that container to it; with it, nothing."""
    assert stack.k is not None
    sid, uid = stack.k.run_pod("dra-pod", namespace="ml", parent_prefix=f"/{stack.top}")
    spec_files = set(stack.node.cdi_dir.iterdir())
    try:
        cdi_id = cn.write_claim(stack.node, uid, with_uvm=with_uvm)
        cid = stack.k.create(sid, "worker", cdi=[cdi_id])
        stack.k.start(cid)
        rules = cn.gpu_rules(f"{stack.top}/kubepods/pod{uid}/{cid}")
        assert ("c 238:0 rwm" in rules) is with_uvm and "c 195:255 rwm" in rules
        report = stack.check(select="GPU-D")
        dra = cn.findings(report, "GPU-DRA-010")
        if with_uvm:
            assert dra == []
        else:
            (f,) = dra
            assert f["status"] == "confirmed"
            assert [a["name"] for a in f["affected"]] == ["gpu-claim", "dra-pod/worker"]
        assert cn.findings(report, "GPU-DEV-001") == []
    finally:
        stack.k.stop_pod(sid)
        stack.k.remove_pod(sid)
        for p in set(stack.node.cdi_dir.iterdir()) - spec_files:
            p.unlink()
        (stack.node.root / "var/lib/kubelet/dra_manager_state").unlink(missing_ok=True)


@pytest.mark.rule("GPU-DRA-011", "positive")
@pytest.mark.rule("GPU-DRA-011", "negative")
@pytest.mark.parametrize("uvm_major", [237, 238], ids=["stale-uvm-major", "live-uvm-major"])
def test_a_dra_claim_whose_spec_carries_a_stale_major(stack: Stack, uvm_major: int) -> None:
    """The DRA form of a driver reload: the claim's CDI spec (the driver's transient spec, resolved by
    containerd's own CDI handling) names nvidia-uvm at major 237 while /proc/devices now says 238.
    containerd takes the spec's numbers as they are: runc allows c 237:0 and the container has no access
    to the live node. GPU-DRA-011 names the claim and its pod; with the live major, nothing."""
    assert stack.k is not None
    sid, uid = stack.k.run_pod("dra-stale", namespace="ml", parent_prefix=f"/{stack.top}")
    spec_files = set(stack.node.cdi_dir.iterdir())
    try:
        cdi_id = cn.write_claim(stack.node, uid, with_uvm=True, uvm_major=uvm_major)
        cid = stack.k.create(sid, "worker", cdi=[cdi_id])
        stack.k.start(cid)
        rules = cn.gpu_rules(f"{stack.top}/kubepods/pod{uid}/{cid}")
        assert ("c 238:0 rwm" in rules) is (uvm_major == 238)
        config = json.loads((stack.containerd.state / "io.containerd.runtime.v2.task/k8s.io" / cid / "config.json")
                            .read_text())
        assert {"path": "/dev/nvidia-uvm", "major": uvm_major} in [{"path": d["path"], "major": d["major"]}
                                                                   for d in config["linux"]["devices"]]
        report = stack.check(select="GPU-D")
        stale = cn.findings(report, "GPU-DRA-011")
        if uvm_major == 238:
            assert stale == []
        else:
            (f,) = stale
            assert f["status"] == "confirmed"
            assert [a["name"] for a in f["affected"]] == ["gpu-claim", "dra-stale/worker"]
            assert any("deviceNodes /dev/nvidia-uvm major 237, but /proc/devices says 238 nvidia-uvm" in e["text"]
                       for e in f["evidence"])
    finally:
        stack.k.stop_pod(sid)
        stack.k.remove_pod(sid)
        for p in set(stack.node.cdi_dir.iterdir()) - spec_files:
            p.unlink()
        (stack.node.root / "var/lib/kubelet/dra_manager_state").unlink(missing_ok=True)


# --- the real device plugin (tests/support/realplugin.py, its NVML the fake of nvml_fake.c) admitting
# pods the stand-in then creates through CRI, as kubelet does: the device manager's admission
# (GetPreferredAllocation, Allocate) first, RunPodSandbox/CreateContainer only once it returned ----------

@pytest.fixture(scope="module")
def plugin_kit(stack: Stack):
    """(binary, fake NVML dir, injection shim); skips loudly when the real plugin cannot run here."""
    from tests.support import realplugin

    try:
        with realplugin.plugin_kit("gw-cri-kit-") as kit:
            yield kit
    except realplugin.Unavailable as exc:
        pytest.skip(f"REAL DEVICE PLUGIN NOT RUN: {exc}")


def _real_plugin(kit, var_lib: Path, *, dev_nodes, hang: bool = False):
    from tests.support import realplugin

    binary, fake, shim = kit
    env = {"LD_LIBRARY_PATH": str(fake), "GW_FAKE_NVML_UUID": cn.GPU_UUID}
    if hang:
        env.update(LD_PRELOAD=str(shim), GW_NVML_HANG_FILE=str(var_lib / "hang"))
    # without CAP_MKNOD, as the Helm chart runs it: NVML cannot re-create a missing nvidia-uvm
    return realplugin.RealPlugin(binary, ["--fail-on-init-error=false", "--pass-device-specs"], var_lib=var_lib,
                                 env=env, dev_nodes=dev_nodes, log_path=var_lib / "plugin.log",
                                 drop_caps=[realplugin.CAP_MKNOD])


def _admit_and_create(standin, stack: Stack, name: str, out: dict) -> None:
    """What kubelet does for one GPU pod: the device manager's admission, then (only once it returned)
    the pod through CRI with the Allocate's DeviceSpecs. `out` gets the pod, or how admission ended."""
    uid = str(uuid.uuid4())
    out["uid"] = uid
    try:
        a = standin.admit(uid, "worker")
    except Exception as exc:  # noqa: BLE001 - the plugin stopped under a hung admission: UNAVAILABLE
        out["admission"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return
    out["admission"] = "returned"
    specs = cri.from_allocate(a.response)["devices"]
    out["specs"] = specs
    assert stack.k is not None
    out["pod"] = cn.create_allocated(stack.k, stack.node, stack.top, name, specs, uid=uid)


@pytest.mark.rule("GPU-DEV-001", "positive")
def test_incident1_the_real_plugins_allocate_through_cri_names_restarting_it(stack: Stack, plugin_kit) -> None:
    """Incident 1 end to end but the GPU: the real plugin started with no nvidia-uvm in its /dev; the stand-in
    admits a pod through it and creates the container from its real DeviceSpecs through containerd; runc's
    device list lacks 238:0; gpuwarden (the plugin's /dev as the real plugin saw it, the stand-in's
    checkpoint with the real AllocResp) names the plugin's /dev as the cause and restarting it as the fix."""
    from tests.support.kubelet_standin import KubeletStandIn

    var_lib = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))  # unix socket paths are limited to 107 bytes
    ckpt = stack.node.root / "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    out: dict = {}
    try:
        with KubeletStandIn(var_lib / "kubelet/device-plugins") as k, \
                _real_plugin(plugin_kit, var_lib, dev_nodes=[("nvidiactl", 195, 255), ("nvidia0", 195, 0)]) as p:
            k.wait_for("nvidia.com/gpu", timeout=20)
            seen = sorted(n for n in os.listdir(f"/proc/{p.pid}/root/dev") if n.startswith("nvidia"))
            _admit_and_create(k, stack, "gpu-real-stale", out)
            shutil.copy(var_lib / "kubelet/device-plugins/kubelet_internal_checkpoint", ckpt)
        assert seen == ["nvidia0", "nvidiactl"]
        cn.plugin_dev(stack.node, with_uvm="nvidia-uvm" in seen)  # the tree's plugin /dev: the real one's
        stack.pods["gpu-real-stale"] = p_ = out["pod"]
        assert [h for _, h, _ in out["specs"]] == ["/dev/nvidiactl", "/dev/nvidia0"]
        assert not any(r.startswith("c 238:") for r in cn.gpu_rules(p_["cgroup"]))
        (f,) = cn.findings(stack.check(), "GPU-DEV-001")
        assert f["status"] == "confirmed" and [a["name"] for a in f["affected"]] == ["gpu-real-stale/worker"]
        assert f["data"]["cause"] == "stale-plugin" and f["data"]["stale_plugin"] is True
        assert "Restart the device-plugin pod" in f["remedy"] and "nvidia-ctk" not in f["remedy"]
        assert any(e["text"] == "plugin's Allocate returned devices /dev/nvidiactl, /dev/nvidia0 (no /dev/nvidia-uvm)"
                   for e in f["evidence"])
    finally:
        cn.plugin_dev(stack.node, with_uvm=True)
        ckpt.unlink(missing_ok=True)
        if "gpu-real-stale" in stack.pods:
            stack.drop("gpu-real-stale")
        shutil.rmtree(var_lib, ignore_errors=True)


@pytest.mark.rule("GPU-K8S-001", "positive")
@pytest.mark.rule("GPU-K8S-001", "negative")
@pytest.mark.parametrize("hung", [True, False], ids=["nvml-hung", "nvml-answers"])
def test_incident5a_admission_through_a_hung_plugin_creates_no_container(stack: Stack, plugin_kit, hung: bool) -> None:
    """Incident 5a through the stand-in: the real plugin's NVML hangs (nvml_inject_shim's trigger), the
    device manager's admission blocks in GetPreferredAllocation (no deadline, as kubelet's), the next pod
    queues behind it, and containerd never sees either pod. `gpuwarden check` asks the plugin socket in a
    killable child: GPU-K8S-001 confirmed, within its deadline. With NVML answering: the pod runs, nothing."""
    from tests.support.kubelet_standin import KubeletStandIn

    root = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    var_lib = root / "var/lib"
    outs: list[dict] = [{}, {}] if hung else [{}]  # the fake NVML has one GPU: one pod gets it
    threads: list[threading.Thread] = []
    assert stack.k is not None
    before = set(stack.k.list_pods())
    try:
        with KubeletStandIn(var_lib / "kubelet/device-plugins") as k, \
                _real_plugin(plugin_kit, var_lib, dev_nodes=[(n, *mm) for n, mm in cn.NODES.items()], hang=True) as p:
            k.wait_for("nvidia.com/gpu", timeout=20)
            if hung:
                (var_lib / "hang").touch()
            for i, o in enumerate(outs):
                threads.append(threading.Thread(target=_admit_and_create, args=(k, stack, f"gpu-5a-{i}", o), daemon=True))
                threads[-1].start()
                time.sleep(0.3)
            for t in threads:
                t.join(3)
            pending = [t.is_alive() for t in threads]
            created = set(stack.k.list_pods()) - before
            t0 = time.monotonic()
            run = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--root", str(root), "--select",
                                  "GPU-K8S-001", "--probe-timeout", "1", "--format", "json"],
                                 capture_output=True, text=True, timeout=60,
                                 env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
            elapsed = time.monotonic() - t0
            if hung:
                assert p.wait_log("nvmlInit hangs now", 5)
        for t in threads:
            t.join(10)  # stopping the plugin released the hung admissions
        assert not any(t.is_alive() for t in threads)
        findings = json.loads(run.stdout)["findings"]
        if hung:
            assert pending == [True, True] and created == set()  # kubelet stuck, containerd asked for nothing
            assert all("pod" not in o and o["admission"] != "returned" for o in outs)
            assert set(stack.k.list_pods()) == before
            (f,) = findings
            assert (f["code"], f["status"]) == ("GPU-K8S-001", "confirmed") and "GetPreferredAllocation" in f["summary"]
            assert elapsed < 15
        else:
            assert pending == [False] and len(created) == 1 and findings == []
            assert all(any(h == "/dev/nvidia-uvm" for _, h, _ in o["specs"]) for o in outs)
    finally:
        for i, o in enumerate(outs):
            if "pod" in o:
                stack.pods[f"gpu-5a-{i}"] = o["pod"]
                stack.drop(f"gpu-5a-{i}")
        shutil.rmtree(root, ignore_errors=True)


# --- incident 4's container, as the GPU scenario cri-memory-escape makes it (tests/gpu/cri_scenarios.py):
# a memory limit set by containerd from CreateContainer, the node's own python3 run in the busybox image
# from read-only hostPath mounts, a line-protocol worker as the container's own process (FifoWorker) ----

_STANDIN_WORKER = r"""
import json, os, sys
held = []
print(json.dumps({"pid": os.getpid(), "ready": True, "cgroup": open("/proc/self/cgroup").read(),
                  "pidns": os.readlink("/proc/self/ns/pid")}), flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd == "alloc":  # MiB, touched: charged to the container's memory cgroup
        held.append(bytearray(int(arg) << 20))
        for b in held[-1:]:
            b[::4096] = b"x" * len(b[::4096])
        print(json.dumps({"held_mib": sum(len(b) for b in held) >> 20}), flush=True)
    elif cmd == "quit":
        break
"""


def test_a_container_limit_set_through_cri_holds_the_nodes_python_worker(stack: Stack, tmp_path: Path) -> None:
    """The container of cri-memory-escape without the GPU: kubelet's pod limit and CreateContainer's
    memory_limit_in_bytes (runc writes the container's limit), the node's python3 from hostPath mounts
    running a line-protocol worker as the container's process, answering through the FIFO from inside the
    container's cgroup and pid namespace. Ordinary memory is charged and limited: past the limit the
    kernel kills the worker (what the driver's graphics memory escapes on the GPU host)."""
    assert stack.k is not None
    limit = 256 << 20
    sid, uid = stack.k.run_pod("render-0", namespace="viz", parent_prefix=f"/{stack.top}")
    pod_limit = cri.set_pod_memory_limit(uid, limit, parent_prefix=f"/{stack.top}")
    io = Path(tempfile.mkdtemp(prefix="gw-io-", dir="/tmp"))
    w = cri.FifoWorker(io, [sys.executable, "-c", _STANDIN_WORKER])
    try:
        cid = stack.k.create(sid, "render", command=w.command, memory_limit=limit,
                             mounts=cri.host_python_mounts(REPO) + [w.mount])
        stack.k.start(cid)
        first = w.read(30)
        cg = f"{cri.pod_cgroup(uid, f'/{stack.top}')}/{cid}"
        assert first.get("ready"), first
        assert first["pidns"] != os.readlink("/proc/self/ns/pid")  # the container's own process, not a host child
        assert f"/{cg}" in first["cgroup"]
        mem = cri.container_memory(cg)
        assert mem["limit"] == limit and pod_limit.read_text().strip() == str(limit)
        assert w.cmd("alloc 64")["held_mib"] == 64
        assert 64 << 20 <= cri.container_memory(cg)["current"] < limit  # type: ignore[operator]
        assert "error" in w.cmd("alloc 512", timeout=20)  # over the limit: OOM-killed, no answer
        status = stack.k.status(cid)
        assert status["state"] == "CONTAINER_EXITED"
    finally:
        w.close()
        stack.k.stop_pod(sid)
        stack.k.remove_pod(sid)
        shutil.rmtree(io, ignore_errors=True)


_FILL_STANDIN = "import json, sys; print(json.dumps({'filled': 'stand-in'}), flush=True); sys.stdin.read()"
_GL_STANDIN = r"""
import json, os, sys
held, n = [], 0
print(json.dumps({"pid": os.getpid(), "ready": True, "gl": {"GL_VENDOR": "stand-in"}}), flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "fb":  # 4 MiB of ordinary (charged) memory a "framebuffer": nothing escapes here
        n += int(args[0])
        held.append(bytearray(int(args[0]) << 22))
        print(json.dumps({"counts": {"fb": n}, "seconds": 0}), flush=True)
    elif cmd == "quit":
        break
"""


def test_the_memory_escape_scenario_runs_through_cri_with_stand_ins(tmp_path: Path) -> None:
    """tests/gpu/cri_scenarios.py cri-memory-escape end to end on a host without a GPU: the filler and the
    graphics worker replaced by stand-ins (ordinary memory, nothing escapes), everything else as on the GPU
    host -- the pod limit, CreateContainer's memory_limit_in_bytes, the worker as the container's process,
    the samples, gpuwarden's check and the agent's dry run. Its checks of the CRI side hold; those that need
    the GPU (host memory falling past the limit, the pod named) do not, and the scenario says so."""
    reason = cn.why_not()
    if reason:
        pytest.skip(reason)
    try:
        cri.build()
    except cri.Unavailable as exc:
        pytest.skip(str(exc))
    sys.path[:0] = [str(REPO / "tests/gpu"), str(REPO / "tools/gpu")]
    import cri_scenarios as cs

    patch = {"CDI_DIR": tmp_path / "cdi", "SPEC": tmp_path / "cdi/nvidia.yaml", "STATE": tmp_path / "state",
             "WORK": tmp_path / "cri", "KUBELET": tmp_path / "kubelet", "FILL": ["-c", _FILL_STANDIN],
             "GL_WORKER": ["-c", _GL_STANDIN], "_gpu": lambda: ("GPU-stand-in", 0), "_host_gpu_devices": lambda: []}
    saved = {k: getattr(cs, k) for k in patch}
    for k, v in patch.items():
        setattr(cs, k, v)
    try:
        res = cs.memory_escape(fbs=16, step=8, limit=256 << 20)
    finally:
        for k, v in saved.items():
            setattr(cs, k, v)
        cri.remove_cgroups("kubepods")
    checks = res["checks"]
    assert res["worker"]["ready"] and res["fill"] == {"filled": "stand-in"}
    assert checks["limit_set_by_runc"] and checks["limit_in_config_json"] and res["limits"]["pod"] == str(256 << 20)
    assert checks["worker_is_the_containers_process"] and checks["container_stays_under_its_limit"]
    assert res["samples"][-1]["worker"]["counts"] == {"fb": 16}
    assert 16 << 22 <= res["container_current_peak"] < 256 << 20
    assert not checks["host_memory_fell_more_than_the_limit"] and not checks["named_the_pod"]
    assert res["error"].startswith("checks failed: host_memory_fell_more_than_the_limit")
    assert "agent_dry_run" in res and res["check_seconds"] > 0
