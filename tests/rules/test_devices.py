"""GPU-DEV-001..003 on the built-in example nodes and on variants of them (copied to tmp and edited)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.findings import Severity, Status
from tests.support.bundles import (
    CHECKPOINT,
    GPU_DEVICES_LIST,
    GPU_SPEC,
    INCIDENT1_DEVICES_LIST,
    INCIDENT3_BROKEN,
    PLUGIN_PID,
    POD_UID,
    copy_example,
    edit_meta,
    ev_lines,
    example_root,
    findings,
    open_dir,
    write,
)

HEALTHY_GPU_LIST = example_root("healthy").read_text(GPU_DEVICES_LIST)
TRAINER = ("container", "trainer-0/trainer", "ml", POD_UID)
#: the same container in the systemd driver's layout (example systemd-reload-device-loss)
SYSTEMD_GPU_DEVICES_LIST = (
    "/sys/fs/cgroup/devices/kubepods.slice/kubepods-besteffort.slice/"
    f"kubepods-besteffort-pod{POD_UID.replace('-', '_')}.slice/"
    f"cri-containerd-{GPU_DEVICES_LIST.rstrip('/').split('/')[-2]}.scope/devices.list"
)


def dev(root, code: str) -> list:
    return [f for f in findings(root, "GPU-DEV") if f.code == code]


def who(f) -> list[tuple]:
    return [(a.kind, a.name, a.namespace, a.uid) for a in f.affected]


# --- GPU-DEV-001: /dev/nvidia-uvm missing from the container's allowlist --------------------------


@pytest.mark.rule("GPU-DEV-001", "positive")
def test_dev001_confirmed_on_uvm_missing() -> None:
    (f,) = dev(example_root("uvm-missing"), "GPU-DEV-001")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert who(f) == [TRAINER, ("plugin", "nvidia-device-plugin-x7k2p", "kube-system", "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d")]  # named by the engine
    assert f.mechanism == "device plugin /dev snapshot predates nvidia-uvm"
    assert f.data == {"uvm_major": 238, "stale_plugin": True, "cause": "stale-plugin"}
    assert "Cause: the device plugin cannot see /dev/nvidia-uvm (not in its /dev)" in f.summary
    ev = ev_lines(f)
    assert "/proc/devices: 238 nvidia-uvm" in ev
    assert "/dev/nvidia-uvm: char 238:0, ctime 2026-11-22T02:13:42Z" in ev
    assert f"{CHECKPOINT}: nvidia.com/gpu -> GPU-517551a5-9054-f7d5-9cfb-b9575e192f6f" in ev
    # devices.list: uvm denied, nvidiactl allowed (why nvidia-smi still works)
    assert (f"{GPU_DEVICES_LIST}: /dev/nvidia-uvm (c 238:0): no entry allows c 238:0 rw "
            "(entries for major 238: c *:* m; b *:* m)") in ev
    assert f"{GPU_DEVICES_LIST}: /dev/nvidiactl (c 195:255): 'c 195:255 rw' allows c 195:255 rw" in ev
    # the plugin's Allocate response (decoded from the checkpoint) omitted uvm
    assert ("kubelet_internal_checkpoint AllocResp: plugin's Allocate returned devices /dev/nvidiactl, /dev/nvidia0 "
            "(no /dev/nvidia-uvm)") in ev
    # the cause: the plugin's /dev snapshot, and the ctime ordering
    assert f"/proc/{PLUGIN_PID}/root/dev: device plugin (pid {PLUGIN_PID}) has no nvidia-uvm in its /dev" in ev
    assert (f"/proc/{PLUGIN_PID}/stat: device plugin started 2026-11-22T02:12:36Z, before /dev/nvidia-uvm was "
            "created (2026-11-22T02:13:42Z)") in ev
    assert f"/proc/{PLUGIN_PID}/environ: PASS_DEVICE_SPECS=true" in ev
    assert "nvidia-modprobe -u -c=0" in f.remedy
    assert any("incident 1" in r for r in f.references)


@pytest.mark.rule("GPU-DEV-001", "positive")
def test_dev001_confirmed_with_incident1_list_verbatim(tmp_path: Path) -> None:
    b = copy_example("uvm-missing", tmp_path)
    write(b, GPU_DEVICES_LIST, INCIDENT1_DEVICES_LIST)
    (f,) = dev(open_dir(b), "GPU-DEV-001")
    assert f.status is Status.CONFIRMED
    assert any("no entry allows c 238:0 rw" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-DEV-001", "positive")
def test_dev001_at_risk_when_plugin_stale_but_no_container_affected(tmp_path: Path) -> None:
    b = copy_example("uvm-missing", tmp_path)
    write(b, GPU_DEVICES_LIST, HEALTHY_GPU_LIST)  # the GPU container got its uvm lines back
    (f,) = dev(open_dir(b), "GPU-DEV-001")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM
    assert who(f) == [("plugin", f"pid {PLUGIN_PID}", "", ""),  # the rule's; the engine names its pod:
                      ("plugin", "nvidia-device-plugin-x7k2p", "kube-system", "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d")]
    ev = ev_lines(f)
    assert f"/proc/{PLUGIN_PID}/root/dev: device plugin (pid {PLUGIN_PID}) has no nvidia-uvm in its /dev" in ev
    assert "/proc/devices: 238 nvidia-uvm" in ev


@pytest.mark.rule("GPU-DEV-001", "positive")
def test_dev001_at_risk_from_ctime_ordering_when_the_plugin_dev_is_unknown(tmp_path: Path) -> None:
    # the host node was (re)created after the plugin started and the plugin's /dev was not captured
    b = copy_example("healthy", tmp_path)

    def unknown_view(m: dict) -> None:
        m["stat"]["/dev/nvidia-uvm"].update(ctime=1795313600.0)
        m["listdir"].pop(f"/proc/{PLUGIN_PID}/root/dev", None)
        for k in [k for k in m["stat"] if k.startswith(f"/proc/{PLUGIN_PID}/root/dev/")]:
            m["stat"].pop(k)
        m.setdefault("remove", []).append(f"/proc/{PLUGIN_PID}/root/dev")

    edit_meta(b, unknown_view)
    (f,) = dev(open_dir(b), "GPU-DEV-001")
    assert f.status is Status.AT_RISK
    assert any("before /dev/nvidia-uvm was created" in e.text for e in f.evidence)
    assert f.summary.startswith("The device plugin started before /dev/nvidia-uvm was created and its /dev does not")
    assert "snapshot" not in f.mechanism  # inferred: remediation restarts only a plugin seen stale


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_dev001_negative_when_the_plugin_dev_shows_the_host_node_despite_ctime(tmp_path: Path) -> None:
    """The host node is newer than the plugin, but the plugin's /dev holds it (same numbers): it allocates it."""
    b = copy_example("healthy", tmp_path)
    edit_meta(b, lambda m: m["stat"]["/dev/nvidia-uvm"].update(ctime=1795313600.0))
    assert dev(open_dir(b), "GPU-DEV-001") == []


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_dev001_negative_on_healthy() -> None:
    assert dev(example_root("healthy"), "GPU-DEV-001") == []


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_dev001_negative_when_host_lacks_uvm_node(tmp_path: Path) -> None:
    """No host /dev/nvidia-uvm: the container cannot have it either; that is GPU-DRV-003's finding."""
    b = copy_example("uvm-missing", tmp_path)

    def drop_uvm(m: dict) -> None:
        for p in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
            m["stat"].pop(p)
            m["remove"].append(p)

    edit_meta(b, drop_uvm)
    root = open_dir(b)
    assert root.listdir("/dev").count("nvidia-uvm") == 0
    assert dev(root, "GPU-DEV-001") == []


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_dev001_negative_when_uvm_module_not_loaded(tmp_path: Path) -> None:
    b = copy_example("uvm-missing", tmp_path)
    text = example_root("healthy").read_text("/proc/devices")
    write(b, "/proc/devices", text.replace("238 nvidia-uvm\n", ""))
    assert dev(open_dir(b), "GPU-DEV-001") == []


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_dev001_negative_when_nvidiactl_is_gone_too() -> None:
    """Everything NVIDIA denied is the runc-update loss (GPU-DEV-002), not a missing uvm."""
    root = example_root("cpu-manager-device-loss")
    assert dev(root, "GPU-DEV-001") == []
    assert [f.code for f in findings(root)] == ["GPU-DEV-002"]


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_dev001_negative_for_a_stale_plugin_that_passes_no_device_specs(tmp_path: Path) -> None:
    """PASS_DEVICE_SPECS=false: the hook injects the nodes, the plugin's /dev is irrelevant."""
    b = copy_example("uvm-missing", tmp_path)
    write(b, GPU_DEVICES_LIST, HEALTHY_GPU_LIST)
    write(b, f"/proc/{PLUGIN_PID}/environ", "PASS_DEVICE_SPECS=false\0DEVICE_LIST_STRATEGY=envvar\0")
    assert dev(open_dir(b), "GPU-DEV-001") == []


# --- GPU-DEV-002: runc update drops hook-injected devices --------------------------------------------


def test_cpu_manager_example_holds_incident3_list_verbatim() -> None:
    assert example_root("cpu-manager-device-loss").read_text(GPU_DEVICES_LIST) == INCIDENT3_BROKEN


@pytest.mark.rule("GPU-DEV-002", "positive")
def test_dev002_confirmed_on_cpu_manager_device_loss() -> None:
    (f,) = dev(example_root("cpu-manager-device-loss"), "GPU-DEV-002")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert who(f) == [TRAINER]
    assert "static CPU manager" in f.mechanism and "runc update" in f.mechanism
    ev = ev_lines(f)
    assert (f"{GPU_DEVICES_LIST}: /dev/nvidiactl (c 195:255): no entry allows c 195:255 rw "
            "(entries for major 195: c *:* m; b *:* m)") in ev
    assert any(line.startswith(f"{GPU_DEVICES_LIST}: /dev/nvidia0 (c 195:0): no entry allows") for line in ev)
    assert "/proc/3400/root/dev: present in the container's /dev but denied by its cgroup: /dev/nvidiactl, /dev/nvidia0" in ev
    assert any(line.startswith(f"{GPU_SPEC}: linux.devices lists no /dev/nvidia* node") for line in ev)
    assert "kubelet: cpuManagerPolicy=static (/var/lib/kubelet/config.yaml: cpuManagerPolicy: static)" in ev
    assert "runc --version: runc 1.0.0-rc92" in ev
    assert f.data["lost"] == {"4c2f0b8e9a7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b5a4938271605f4e3d":
                              ["/dev/nvidiactl", "/dev/nvidia0"]}
    assert "PASS_DEVICE_SPECS=true" in f.remedy


def _cpu_manager_intact(tmp_path: Path) -> Path:
    b = copy_example("cpu-manager-device-loss", tmp_path)
    write(b, GPU_DEVICES_LIST, HEALTHY_GPU_LIST)  # the hook's rules are still there
    return b


@pytest.mark.rule("GPU-DEV-002", "positive")
def test_dev002_at_risk_static_hook_injected_old_runc(tmp_path: Path) -> None:
    (f,) = dev(open_dir(_cpu_manager_intact(tmp_path)), "GPU-DEV-002")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM
    assert who(f) == [TRAINER]
    assert "runc 1.0.0-rc92 < 1.0.0 re-applies devices on update" in f.summary
    assert "runc --version: runc 1.0.0-rc92" in ev_lines(f)


@pytest.mark.rule("GPU-DEV-002", "positive")
def test_dev002_at_risk_when_runc_version_unknown(tmp_path: Path) -> None:
    b = _cpu_manager_intact(tmp_path)
    (b / "files/.gpuwarden/commands/runc-version.txt").unlink()
    edit_meta(b, lambda m: m.setdefault("remove", []).append("/.gpuwarden/commands/runc-version.txt"))
    (f,) = dev(open_dir(b), "GPU-DEV-002")
    # not sure, and said so at low severity: only rc92-rc95 drop them (run 21a: runc 1.3.6 kept them)
    assert f.status is Status.AT_RISK and f.severity is Severity.LOW
    assert "runc's version is not known here" in f.summary and "runc >= 1.0 keeps them" in f.summary
    assert "will drop them" not in f.summary


@pytest.mark.rule("GPU-DEV-002", "negative")
def test_dev002_negative_with_runc_1_0_and_devices_intact(tmp_path: Path) -> None:
    b = _cpu_manager_intact(tmp_path)
    write(b, "/.gpuwarden/commands/runc-version.txt", "runc version 1.0.0\ncommit: v1.0.0-0-g84113eef\nspec: 1.0.2-dev\n")
    assert dev(open_dir(b), "GPU-DEV-002") == []
    write(b, "/.gpuwarden/commands/runc-version.txt", "runc version 1.1.12\ncommit: v1.1.12-0-g51d5e946\n")
    assert dev(open_dir(b), "GPU-DEV-002") == []


@pytest.mark.rule("GPU-DEV-002", "negative")
def test_dev002_negative_without_static_cpu_manager(tmp_path: Path) -> None:
    b = _cpu_manager_intact(tmp_path)
    write(b, "/var/lib/kubelet/config.yaml", example_root("healthy").read_text("/var/lib/kubelet/config.yaml"))
    write(b, "/var/lib/kubelet/cpu_manager_state", '{"policyName":"none","defaultCpuSet":"","checksum":1353318690}')
    assert dev(open_dir(b), "GPU-DEV-002") == []


@pytest.mark.rule("GPU-DEV-002", "negative")
def test_dev002_negative_on_healthy() -> None:
    assert dev(example_root("healthy"), "GPU-DEV-002") == []


@pytest.mark.rule("GPU-DEV-002", "negative")
def test_dev002_negative_when_spec_lists_devices(tmp_path: Path) -> None:
    """Devices in the OCI spec survive `runc update`: static + rc92 is no exposure then."""
    b = _cpu_manager_intact(tmp_path)
    write(b, GPU_SPEC, example_root("healthy").read_text(GPU_SPEC))
    assert dev(open_dir(b), "GPU-DEV-002") == []


# --- GPU-DEV-003: systemd daemon-reload ------------------------------------------------------------


@pytest.mark.rule("GPU-DEV-003", "positive")
def test_dev003_confirmed_on_systemd_reload_device_loss() -> None:
    root = example_root("systemd-reload-device-loss")
    (f,) = dev(root, "GPU-DEV-003")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert who(f) == [TRAINER]
    assert "daemon-reload" in f.mechanism
    ev = ev_lines(f)
    assert "kubelet: cgroupDriver=systemd (/var/lib/kubelet/config.yaml: cgroupDriver: systemd)" in ev
    assert any("no entry allows c 195:255 rw" in line for line in ev)
    assert "runc --version: runc 1.1.5" in ev
    assert "create-dev-char-symlinks" in f.remedy
    assert dev(root, "GPU-DEV-002") == []  # one mechanism per node


@pytest.mark.rule("GPU-DEV-003", "positive")
def test_dev003_at_risk_hook_injected_under_systemd(tmp_path: Path) -> None:
    b = copy_example("systemd-reload-device-loss", tmp_path)
    write(b, SYSTEMD_GPU_DEVICES_LIST, HEALTHY_GPU_LIST)
    (f,) = dev(open_dir(b), "GPU-DEV-003")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM
    assert "/dev/char links missing: /dev/char/195:0, /dev/char/195:255" in f.summary


@pytest.mark.rule("GPU-DEV-003", "negative")
def test_dev003_negative_on_healthy() -> None:
    assert dev(example_root("healthy"), "GPU-DEV-003") == []


@pytest.mark.rule("GPU-DEV-003", "negative")
def test_dev003_negative_on_cgroupfs_loss() -> None:
    assert dev(example_root("cpu-manager-device-loss"), "GPU-DEV-003") == []


@pytest.mark.rule("GPU-DEV-003", "negative")
def test_dev003_negative_systemd_with_devices_in_spec(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, "/var/lib/kubelet/config.yaml",
          example_root("systemd-reload-device-loss").read_text("/var/lib/kubelet/config.yaml"))
    assert findings(open_dir(b)) == []


def test_loss_rules_do_not_confirm_on_a_corrupt_devices_list(tmp_path: Path) -> None:
    b = copy_example("cpu-manager-device-loss", tmp_path)
    write(b, GPU_DEVICES_LIST, INCIDENT3_BROKEN[:44])  # cut mid-line: "... c 1:8 rwm\nc 5:"
    # no NVIDIA line is visible, but a corrupt list proves no loss; the exposure is still real
    assert [(f.code, f.status) for f in findings(open_dir(b))] == [("GPU-DEV-002", Status.AT_RISK)]
