"""Fact sections: kubelet, containers (cgroupfs/systemd/v2), driver, processes, plugin, gpu_access, runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.facts import FactUnavailable
from gpuwarden.facts.runtime import RuntimeFacts
from gpuwarden.root import BundleRoot
from tests.support.bundles import (
    CAPTURE,
    CHECKPOINT,
    CID_GPU,
    CID_PAUSE,
    CID_PLUGIN,
    GPU_DEVICES_LIST,
    GPU_SPEC,
    GPU_UUID,
    KUBELET_PID,
    PLUGIN_POD_UID,
    POD_UID,
    copy_example,
    example_root,
    facts_of,
    open_dir,
    write,
)

BTIME = 1795313527


def gaps(facts) -> dict[str, str]:
    return {g.source: g.reason for g in facts.gaps()}


# --- kubelet -----------------------------------------------------------------------------------


def test_kubelet_healthy() -> None:
    k = facts_of(example_root("healthy")).get("kubelet")
    assert k.pid == KUBELET_PID and k.argv[0] == "/usr/bin/kubelet"
    assert k.config_path == "/var/lib/kubelet/config.yaml"
    assert (k.cpu_manager_policy, k.cpu_manager_policy_source) == ("none", "/var/lib/kubelet/config.yaml: cpuManagerPolicy: none")
    assert k.cgroup_driver == "cgroupfs"
    assert k.verbosity == 2
    assert k.cpu_manager_state["policyName"] == "none"
    assert [e.container for e in k.checkpoint.entries] == ["trainer"]
    assert k.plugin_sockets == ["kubelet.sock", "nvidia-gpu.sock"]
    assert k.sources == ["/var/lib/kubelet/config.yaml", f"/proc/{KUBELET_PID}/cmdline"]


def test_kubelet_flags_override_config(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    argv = ["/usr/bin/kubelet", "--config=/var/lib/kubelet/config.yaml", "--cpu-manager-policy", "static",
            "--cgroup-driver=systemd", "--feature-gates=DevicePluginCDIDevices=true", "--v=4"]
    write(b, f"/proc/{KUBELET_PID}/cmdline", "\0".join(argv) + "\0")
    k = facts_of(open_dir(b)).get("kubelet")
    assert k.cpu_manager_policy == "static"
    assert k.cpu_manager_policy_source == "kubelet flag --cpu-manager-policy=static"
    assert (k.cgroup_driver, k.cgroup_driver_source) == ("systemd", "kubelet flag --cgroup-driver=systemd")
    assert k.feature_gates == {"DevicePluginCDIDevices": True}
    assert k.verbosity == 4


def test_kubelet_cpu_manager_state_fallback(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, "/var/lib/kubelet/config.yaml", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
    write(b, "/var/lib/kubelet/cpu_manager_state",
          (example_root("cpu-manager-device-loss").read_text("/var/lib/kubelet/cpu_manager_state")))
    k = facts_of(open_dir(b)).get("kubelet")
    assert k.cpu_manager_policy == "static"
    assert k.cpu_manager_policy_source == "/var/lib/kubelet/cpu_manager_state: policyName=static"
    assert k.cgroup_driver_source == "kubelet default (cgroupDriver not set)"


def test_kubelet_config_beats_state(tmp_path: Path) -> None:
    # the state file is what the last run used; the config is what this run uses
    b = copy_example("healthy", tmp_path)
    write(b, "/var/lib/kubelet/cpu_manager_state", '{"policyName":"static","defaultCpuSet":"0-15","checksum":1}')
    assert facts_of(open_dir(b)).get("kubelet").cpu_manager_policy == "none"


@pytest.mark.parametrize("config", [
    "{{{ not: yaml",
    "- a list\n- not a mapping\n",
    "cgroupDriver: systemd\ncpuManagerPol",  # truncated
    "\x00\x01\x02\xff",
    "",
])
def test_kubelet_garbage_yaml_is_a_gap(tmp_path: Path, config: str) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, "/var/lib/kubelet/config.yaml", config)
    f = facts_of(open_dir(b))
    k = f.get("kubelet")
    assert k.config == {} and k.config_path == "/var/lib/kubelet/config.yaml"
    assert k.cpu_manager_policy == "none"  # from cpu_manager_state (healthy's says none)
    assert k.cgroup_driver == "cgroupfs" and k.cgroup_driver_source.startswith("kubelet default")
    assert gaps(f)["/var/lib/kubelet/config.yaml"] == "not a YAML mapping (garbage or truncated)"
    assert f.errors == []


def test_kubelet_garbage_state_and_checkpoint(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, "/var/lib/kubelet/cpu_manager_state", '{"policyName":"sta')
    write(b, CHECKPOINT, '{"Data": {"PodDeviceEntries": [{"PodUID": "8f1c')
    f = facts_of(open_dir(b))
    k = f.get("kubelet")
    assert k.cpu_manager_state is None and k.checkpoint is None
    g = gaps(f)
    assert g["/var/lib/kubelet/cpu_manager_state"] == "not JSON"
    assert g[CHECKPOINT] == "not a device-manager checkpoint (garbage or truncated)"


def test_kubelet_checkpoint_list_layout(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    doc = json.loads(example_root("healthy").read_text(CHECKPOINT))
    doc["Data"]["PodDeviceEntries"][0]["DeviceIDs"] = [GPU_UUID]
    write(b, CHECKPOINT, json.dumps(doc))
    f = facts_of(open_dir(b))
    assert f.get("kubelet").checkpoint.entries[0].device_ids == (GPU_UUID,)
    ca = next(x for x in f.get("gpu_access").containers if x.container.id == CID_GPU)
    assert ca.gpu_minors == [0] and ca.resource == "nvidia.com/gpu"
    assert [d[1] for d in ca.alloc.devices] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"]


def test_kubelet_missing_config_named_by_flag_is_a_gap(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    (b / "files/var/lib/kubelet/config.yaml").unlink()
    f = facts_of(open_dir(b))
    k = f.get("kubelet")
    assert k.config_path is None and k.pid == KUBELET_PID
    assert "named by kubelet --config" in gaps(f)["/var/lib/kubelet/config.yaml"]


def test_kubelet_root_dir_flag(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, f"/proc/{KUBELET_PID}/cmdline", "/usr/bin/kubelet\0--root-dir=/data/kubelet\0")
    write(b, "/data/kubelet/cpu_manager_state", '{"policyName":"static"}')
    k = facts_of(open_dir(b)).get("kubelet")
    assert k.root_dir == "/data/kubelet"
    assert k.checkpoint_path == "/data/kubelet/device-plugins/kubelet_internal_checkpoint"
    assert k.cpu_manager_state == {"policyName": "static"} and k.checkpoint is None
    assert k.cpu_manager_policy == "none"  # /var/lib/kubelet/config.yaml (the default --config) still says so


def test_kubelet_unavailable_without_process_or_config() -> None:
    with pytest.raises(FactUnavailable, match="no kubelet process found"):
        facts_of(BundleRoot(CAPTURE)).get("kubelet")


# --- containers ----------------------------------------------------------------------------------


def test_containers_cgroupfs_v1() -> None:
    c = facts_of(example_root("healthy")).get("containers")
    assert (c.layout.version, c.layout.driver, c.kubepods) == (1, "cgroupfs", "kubepods")
    assert c.layout.v1_mounts["devices"] == "/sys/fs/cgroup/devices"
    assert c.layout.v1_mounts["cpuacct"] == "/sys/fs/cgroup/cpu,cpuacct"  # first mount wins
    assert c.layout.v2_mount == "/sys/fs/cgroup/unified"
    assert c.layout.dir("memory", "kubepods/x") == "/sys/fs/cgroup/memory/kubepods/x"
    pods = {p.uid: p for p in c.pods}
    trainer, plugin = pods[POD_UID], pods[PLUGIN_POD_UID]
    assert (trainer.namespace, trainer.name, trainer.qos) == ("ml", "trainer-0", "besteffort")
    assert (plugin.namespace, plugin.name, plugin.qos) == ("kube-system", "nvidia-device-plugin-x7k2p", "burstable")
    by_id = {x.id: x for x in trainer.containers}
    gpu, pause = by_id[CID_GPU], by_id[CID_PAUSE]
    assert pause.sandbox and not gpu.sandbox
    assert gpu.name == "trainer" and gpu.runtime == "containerd"
    assert gpu.pids == [3400, 3411]
    assert gpu.cgroup == f"kubepods/besteffort/pod{POD_UID}/{CID_GPU}"
    assert gpu.device_rules_source == GPU_DEVICES_LIST and len(gpu.device_rules) == 16
    assert gpu.env == {"NVIDIA_VISIBLE_DEVICES": GPU_UUID, "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    assert [d["path"] for d in gpu.spec_devices] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"]
    assert gpu.dev_view == {"/dev/nvidia-uvm": (238, 0), "/dev/nvidia-uvm-tools": (238, 1), "/dev/nvidia0": (195, 0),
                            "/dev/nvidiactl": (195, 255)}
    assert gpu.started_at == BTIME + 3150 / 100
    assert c.find(POD_UID, "trainer") is gpu and c.find(POD_UID, "nope") is None
    assert [x.ref for _, x in c.containers() if x.id == CID_GPU] == ["trainer"]
    # the plugin container has no runtime spec in the bundle: its name comes from /var/log/containers
    assert {x.id: x.name for x in plugin.containers}[CID_PLUGIN] == "nvidia-device-plugin-ctr"


SYSTEMD_UID = "5a6b7c8d-1111-4222-8333-944455566677"
GUARANTEED_UID = "0a0b0c0d-aaaa-4bbb-8ccc-dddddddddddd"
CID_A = "ab" * 32
CID_B = "cd" * 32


def _systemd_bundle(tmp_path: Path) -> Path:
    b = tmp_path / "systemd-node"
    uid_ = SYSTEMD_UID.replace("-", "_")
    g_ = GUARANTEED_UID.replace("-", "_")
    dev = "/sys/fs/cgroup/devices/kubepods.slice"
    be = f"{dev}/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice"
    write(b, f"{be}/cri-containerd-{CID_A}.scope/devices.list", "c 195:255 rw\nc 195:0 rw\n")
    write(b, f"{be}/cri-containerd-{CID_A}.scope/cgroup.procs", "4242\n")
    write(b, f"{be}/crio-conmon-{CID_A}.scope/cgroup.procs", "4241\n")  # not a container
    write(b, f"{be}/devices.list", "a *:* rwm\n")
    write(b, f"{dev}/kubepods-pod{g_}.slice/docker-{CID_B}.scope/devices.list", "a *:* rwm\n")
    write(b, "/sys/fs/cgroup/memory/kubepods.slice/memory.stat", "cache 0\n")
    (b / "meta.json").write_text(json.dumps({
        "captured_at": 1795313561.0,
        "listdir": {"/var/log/containers": [f"infer-7d9_serving_model-{CID_A}.log"],
                    "/var/log/pods": [f"serving_infer-7d9_{SYSTEMD_UID}"]},
    }))
    return b


def test_containers_systemd_layout(tmp_path: Path) -> None:
    f = facts_of(open_dir(_systemd_bundle(tmp_path)))
    c = f.get("containers")
    assert (c.layout.version, c.layout.driver, c.kubepods) == (1, "systemd", "kubepods.slice")
    pods = {p.uid: p for p in c.pods}
    assert set(pods) == {SYSTEMD_UID, GUARANTEED_UID}  # underscores back to dashes
    be = pods[SYSTEMD_UID]
    assert (be.qos, be.namespace, be.name) == ("besteffort", "serving", "infer-7d9")
    assert be.cgroup.endswith(f"kubepods-besteffort-pod{SYSTEMD_UID.replace('-', '_')}.slice")
    assert [(x.id, x.runtime, x.name, x.pids) for x in be.containers] == [(CID_A, "containerd", "model", [4242])]
    assert [r.line for r in be.containers[0].device_rules] == ["c 195:255 rw", "c 195:0 rw"]
    g = pods[GUARANTEED_UID]
    assert g.qos == "guaranteed" and [(x.id, x.runtime) for x in g.containers] == [(CID_B, "docker")]
    assert f.get("identity")["cgroup"] == "v1/systemd"


def test_containers_v2_detection(tmp_path: Path) -> None:
    # the real capture: cgroup v2, no kubelet
    f = facts_of(BundleRoot(CAPTURE))
    with pytest.raises(FactUnavailable, match="no kubepods cgroup under /sys/fs/cgroup"):
        f.get("containers")
    from gpuwarden.facts.containers import _layout

    lay = _layout(f)
    assert (lay.version, lay.v2_mount) == (2, "/sys/fs/cgroup")
    assert lay.dir("devices", "kubepods.slice") == "/sys/fs/cgroup/kubepods.slice"
    # a v2 node with pods: no devices.list anywhere, rules are left to bpf
    b = tmp_path / "v2"
    write(b, "/sys/fs/cgroup/cgroup.controllers", (CAPTURE / "files/sys/fs/cgroup/cgroup.controllers").read_text())
    scope = f"/sys/fs/cgroup/kubepods.slice/kubepods-pod{GUARANTEED_UID.replace('-', '_')}.slice/cri-containerd-{CID_A}.scope"
    write(b, f"{scope}/cgroup.procs", "77\n")
    (b / "meta.json").write_text("{}")
    c = facts_of(open_dir(b)).get("containers")
    assert c.layout.version == 2 and c.layout.driver == "systemd"
    ctr = c.pods[0].containers[0]
    assert ctr.id == CID_A and ctr.device_rules is None and ctr.pids == [77]


def test_containers_cgroup_root_missing(tmp_path: Path) -> None:
    b = tmp_path / "bare"
    write(b, "/proc/devices", "Character devices:\n195 nvidia\n")
    (b / "meta.json").write_text("{}")
    with pytest.raises(FactUnavailable, match="/sys/fs/cgroup cannot be listed: missing"):
        facts_of(open_dir(b)).get("containers")


def test_containers_garbage_spec_and_devices_list(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, GPU_SPEC, '{"ociVersion": "1.0.2-dev", "annotations": {"io.kub')
    pause_spec = GPU_SPEC.replace(CID_GPU, CID_PAUSE)
    write(b, pause_spec, '{"annotations": ["not", "a", "map"], "linux": "nope"}')
    write(b, GPU_DEVICES_LIST, "c 195:255 rw\n\x00\x01garbage\nc 195:0 rw\nc 238:")
    f = facts_of(open_dir(b))
    c = f.get("containers")
    gpu = next(x for _, x in c.containers() if x.id == CID_GPU)
    assert gpu.spec_devices is None and gpu.name == "trainer"  # name from /var/log/containers
    assert [r.line for r in gpu.device_rules] == ["c 195:255 rw", "c 195:0 rw"] and gpu.device_rules_bad == 2
    g = gaps(f)
    assert g[GPU_SPEC] == "not JSON (garbage or truncated)"
    assert g[pause_spec].startswith("unexpected spec layout")
    assert g[GPU_DEVICES_LIST].startswith("2 unparsable line(s)")
    assert f.errors == []
    # a corrupt list decides nothing it does not show
    ca = next(x for x in f.get("gpu_access").containers if x.container.id == CID_GPU)
    assert ca.verdict("/dev/nvidiactl").allowed is True
    assert ca.verdict("/dev/nvidia-uvm").allowed is None
    assert "undecided" in ca.verdict("/dev/nvidia-uvm").evidence


# --- driver, processes, plugin ---------------------------------------------------------------------


def test_driver_healthy() -> None:
    d = facts_of(example_root("healthy")).get("driver")
    assert d.version.version == "580.159.04" and d.loaded
    assert d.uvm_major == 238
    assert [(g.bus_id, g.minor, g.uuid, g.model) for g in d.gpus] == [("0000:00:06.0", 0, GPU_UUID, "NVIDIA H200")]
    assert d.gpu_by_uuid(GPU_UUID).minor == 0 and d.gpu_by_minor(0).uuid == GPU_UUID and d.gpu_by_uuid("x") is None
    assert set(d.nodes) == {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                            "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"}
    assert [(n.path, n.rule, n.required) for n in d.control_nodes()] == [
        ("/dev/nvidiactl", "c 195:255", True), ("/dev/nvidia-uvm", "c 238:0", True),
        ("/dev/nvidia-uvm-tools", "c 238:1", False)]
    assert d.gpu_node(0).path == "/dev/nvidia0"
    assert d.smi.gpus[0].uuid == GPU_UUID and d.mig_gpus == []
    assert d.char_links == {}


def test_driver_without_host_uvm_node(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    meta = json.loads((b / "meta.json").read_text())
    for p in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        del meta["stat"][p]
    (b / "meta.json").write_text(json.dumps(meta))
    d = facts_of(open_dir(b)).get("driver")
    assert d.uvm_major == 238 and "/dev/nvidia-uvm" not in d.nodes
    assert [n.path for n in d.control_nodes()] == ["/dev/nvidiactl"]


def test_driver_garbage_sources(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, "/proc/devices", "\x00\x7fELF garbage\n")
    write(b, "/proc/driver/nvidia/version", "NVRM vers")
    write(b, "/.gpuwarden/commands/nvidia-smi-q-x.xml", "<?xml version='1.0'?><nvidia_smi_log><gpu id='0'>")
    f = facts_of(open_dir(b))
    d = f.get("driver")
    assert d.uvm_major is None and d.version is None and d.smi is None
    assert d.loaded  # /proc/modules still says so
    g = gaps(f)
    assert set(g) >= {"/proc/devices", "/proc/driver/nvidia/version", "/.gpuwarden/commands/nvidia-smi-q-x.xml"}


def test_driver_unavailable_when_all_sources_missing(tmp_path: Path) -> None:
    b = tmp_path / "empty"
    (b / "files").mkdir(parents=True)
    (b / "meta.json").write_text("{}")
    with pytest.raises(FactUnavailable, match="all unreadable"):
        facts_of(open_dir(b)).get("driver")


def test_processes_and_plugin() -> None:
    f = facts_of(example_root("healthy"))
    procs = f.get("processes")
    assert procs.boot_time == BTIME and procs.clk_tck == 100
    assert [p.pid for p in procs.by_name("kubelet")] == [KUBELET_PID]
    assert procs.start_time(f, 2301) == BTIME + 29.0
    assert procs.start_time(f, 99999) is None
    plugin = f.get("plugin").processes
    assert [p.pid for p in plugin] == [2301]
    p = plugin[0]
    assert p.pass_device_specs is True
    assert p.env == {"PASS_DEVICE_SPECS": "true", "DEVICE_LIST_STRATEGY": "envvar", "FAIL_ON_INIT_ERROR": "true",
                     "NVIDIA_VISIBLE_DEVICES": "all"}
    assert "/dev/nvidia-uvm" in p.dev_view
    assert "/dev/nvidia-uvm" not in facts_of(example_root("uvm-missing")).get("plugin").processes[0].dev_view
    assert facts_of(example_root("cpu-manager-device-loss")).get("plugin").processes[0].pass_device_specs is None


def test_plugin_pass_device_specs_from_argv() -> None:
    from gpuwarden.facts.plugin import PluginProcess

    assert PluginProcess(1, ("nvidia-device-plugin", "--pass-device-specs=false"), None, {}, None).pass_device_specs is False
    assert PluginProcess(1, ("nvidia-device-plugin", "--pass-device-specs"), None, {}, None).pass_device_specs is True
    assert PluginProcess(1, ("x",), None, {"PASS_DEVICE_SPECS": "False"}, None).pass_device_specs is False


# --- gpu_access --------------------------------------------------------------------------------------


def test_gpu_access_healthy() -> None:
    a = facts_of(example_root("healthy")).get("gpu_access")
    assert a.policy_source == "devices.list"
    by_id = {ca.container.id: ca for ca in a.containers}
    # the privileged plugin sees the GPUs too (its /dev), and its cgroup allows everything
    assert set(by_id) == {CID_GPU, CID_PLUGIN}
    assert by_id[CID_PLUGIN].assignment == ["/proc/2301/root/dev: nvidia0"] and by_id[CID_PLUGIN].denied() == []
    assert by_id[CID_PLUGIN].verdict("/dev/nvidia-uvm").evidence == "'a *:* rwm' allows c 238:0 rw"
    ca = by_id[CID_GPU]
    assert ca.gpu_minors == [0] and ca.hook_injected is False
    assert ca.assignment[0] == f"{CHECKPOINT}: nvidia.com/gpu -> {GPU_UUID}"
    assert set(ca.verdicts) == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"}
    assert ca.denied() == []
    assert ca.verdict("/dev/nvidia-uvm").evidence == "'c 238:0 rw' allows c 238:0 rw"


def test_gpu_access_incidents() -> None:
    def gpu(name: str):
        return next(ca for ca in facts_of(example_root(name)).get("gpu_access").containers if ca.container.id == CID_GPU)

    uvm = gpu("uvm-missing")
    assert [v.node.path for v in uvm.denied()] == ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    cpu = gpu("cpu-manager-device-loss")
    assert cpu.hook_injected is True
    # incident 3's broken list: every NVIDIA line is gone
    assert {v.node.path for v in cpu.denied()} == {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    assert cpu.alloc is not None and cpu.alloc.devices == ()
    assert cpu.assignment[-1].endswith(f"NVIDIA_VISIBLE_DEVICES={GPU_UUID}")


# --- runtime -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version,at_least_1_0", [
    ("1.0.0-rc92", False), ("1.0.0-rc10", False), ("0.1.1", False), ("1.0.0", True), ("1.0.0-rc95+dev", False),
    ("1.1.12", True), ("1.1.12-0ubuntu2~22.04.1", True), ("v1.2.0-rc.1", True), ("1.0", True), (None, None),
])
def test_runc_at_least(version: str | None, at_least_1_0: bool | None) -> None:
    assert RuntimeFacts(runc_version=version).runc_at_least((1, 0, 0)) is at_least_1_0


def test_runtime_from_examples() -> None:
    assert facts_of(example_root("healthy")).get("runtime").runc_version == "1.1.12"
    rt = facts_of(example_root("cpu-manager-device-loss")).get("runtime")
    assert rt.runc_version == "1.0.0-rc92" and rt.runc_tuple() == (1, 0, 0) and rt.runc_at_least((1, 0, 0)) is False
    assert facts_of(example_root("systemd-reload-device-loss")).get("runtime").runc_version == "1.1.5"


def test_identity() -> None:
    ident = facts_of(example_root("healthy")).get("identity")
    assert ident == {"hostname": "gpu-node-a", "kernel": "6.18.44-fc-v657-gpu", "driver": "580.159.04", "gpus": 1,
                     "cgroup": "v1/cgroupfs"}
    assert facts_of(BundleRoot(CAPTURE)).get("identity")["hostname"] == "vm"
