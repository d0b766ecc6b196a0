"""GPU-K8S-002 … 010 (except 001/007) and GPU-DEV-004/005 on variants of the healthy example.

Log lines follow the upstream format strings: the device plugin's klog lines ("Incompatible
strategy detected auto" / "If this is a GPU node, did you configure the NVIDIA Container
Toolkit?" / "No devices found. Waiting indefinitely." as posted in public issues; "XidCriticalError:
Xid=%d on Device=%s; marking device as unhealthy." and "Error waiting for event: %v; marking all
devices as unhealthy" from internal/rm/health.go; "failed to create FS watcher: %v" from
cmd/nvidia-device-plugin/main.go), containerd's logrus lines, the NVIDIA hook's "requirement error:
unsatisfied condition: cuda>=…". The containerd config is what `nvidia-ctk runtime configure`
writes (config version 2); the CDI spec is the shape `nvidia-ctk cdi generate` writes.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from gpuwarden import engine
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.findings import Severity, Status
from gpuwarden.root import HostRoot
from gpuwarden.rules.runtime import requirement_met
from tests.support.gpunode import (
    GPU_UUID,
    add_kmsg,
    checkpoint,
    edit_meta,
    edit_smi,
    found,
    healthy,
    one,
    plugin_log,
    skipped,
    write,
)
from tests.support.bundles import GPU_SPEC, bundle_file

DP = "/var/lib/kubelet/device-plugins"
CONTAINERD_LOG = "/.gpuwarden/logs/containerd.log"
X63 = "NVRM: Xid (PCI:0000:00:06): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate."
NVIDIA_RUNTIME_V2 = '''version = 2

[plugins]

  [plugins."io.containerd.grpc.v1.cri"]

    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_engine = ""
          runtime_root = ""
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
'''
PLAIN_V2 = '''version = 2

[plugins]

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"

    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = true
'''


def klog(sev: str, src: str, msg: str) -> str:
    return f"{sev}1122 02:12:30.123456       1 {src}] {msg}"


def ctrd(level: str, msg: str, err: str) -> str:
    return f'time="2026-11-22T02:12:30.100000000Z" level={level} msg="{msg}" error="{err}"\n'


def set_listing(b: Path, names: list[str]) -> None:
    edit_meta(b, lambda m: m["listdir"].__setitem__(DP, names))


def plugin_env(b: Path, **env: str) -> None:
    f = bundle_file(b, "/proc/2301/environ")
    f.write_bytes(f.read_bytes() + b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


# --- GPU-K8S-002 -------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-K8S-002", "positive")
def test_k8s002_plugin_runs_without_a_socket(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    set_listing(b, ["DEPRECATION", "kubelet.sock", "kubelet_internal_checkpoint"])
    plugin_log(b, klog("I", "main.go:381", "No devices found. Waiting indefinitely."))
    f = one(b, "GPU-K8S-002")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.evidence[0] == f.evidence[0].__class__(DP, "contains DEPRECATION, kubelet.sock, kubelet_internal_checkpoint")
    assert any("No devices found" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-K8S-002", "positive")
def test_k8s002_socket_older_than_kubelet_sock(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    t = 1795313540.0

    def socks(m: dict) -> None:
        m["stat"][f"{DP}/nvidia-gpu.sock"] = {"path": f"{DP}/nvidia-gpu.sock", "kind": "other", "mtime": t - 600}
        m["stat"][f"{DP}/kubelet.sock"] = {"path": f"{DP}/kubelet.sock", "kind": "other", "mtime": t}
    edit_meta(b, socks)
    f = one(b, "GPU-K8S-002")
    assert f.status is Status.CONFIRMED and "10m00s older than kubelet.sock" in f.summary


@pytest.mark.rule("GPU-K8S-002", "positive")
def test_k8s002_no_plugin_at_all_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    shutil.rmtree(b / "files/proc/2301")
    set_listing(b, ["kubelet.sock", "kubelet_internal_checkpoint"])
    f = one(b, "GPU-K8S-002")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM


@pytest.mark.rule("GPU-K8S-002", "negative")
def test_k8s002_registered_plugin(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    t = 1795313540.0

    def socks(m: dict) -> None:  # the plugin re-registered after the kubelet's restart
        m["stat"][f"{DP}/nvidia-gpu.sock"] = {"path": f"{DP}/nvidia-gpu.sock", "kind": "other", "mtime": t + 5}
        m["stat"][f"{DP}/kubelet.sock"] = {"path": f"{DP}/kubelet.sock", "kind": "other", "mtime": t}
    edit_meta(b, socks)
    assert found(b, "GPU-K8S-002") == []


# --- GPU-K8S-003 -------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-K8S-003", "positive")
def test_k8s003_plugin_marked_unhealthy_on_xid63(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_log(b, klog("I", "health.go:214", f"XidCriticalError: Xid=63 on Device={GPU_UUID}; marking device as unhealthy."))
    f = one(b, "GPU-K8S-003")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH  # the node's only GPU
    assert f.data == {"gpu": GPU_UUID, "xids": [63]}
    assert any("NVIDIA action IGNORE" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-K8S-003", "positive")
def test_k8s003_kernel_xid_after_plugin_start_and_checkpoint(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X63, usec=31_000_000)  # the plugin started 29 s after boot
    checkpoint(b, lambda d: d["RegisteredDevices"].__setitem__("nvidia.com/gpu", []))
    f = one(b, "GPU-K8S-003")
    assert f.status is Status.CONFIRMED
    assert any("no longer lists" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-K8S-003", "positive")
def test_k8s003_kernel_xid_without_checkpoint_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X63, usec=31_000_000)
    (b / "files/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint").unlink()
    f = one(b, "GPU-K8S-003")
    assert f.status is Status.AT_RISK


@pytest.mark.rule("GPU-K8S-003", "positive")
def test_k8s003_all_devices_unhealthy(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_log(b, klog("I", "health.go:190", "Error waiting for event: ERROR_UNKNOWN; marking all devices as unhealthy"))
    f = one(b, "GPU-K8S-003")
    assert f.status is Status.CONFIRMED and f.data == {"error": "ERROR_UNKNOWN"}


@pytest.mark.rule("GPU-K8S-003", "negative")
def test_k8s003_real_faults_restarts_and_ignored_xids(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    # a real fault (GPU-HW-003's), an Xid the plugin ignores before its start, and an old instance's mark
    plugin_log(b, klog("I", "health.go:214", f"XidCriticalError: Xid=63 on Device={GPU_UUID}; marking device as unhealthy."),
               n=0)
    plugin_log(b, klog("I", "health.go:214", f"XidCriticalError: Xid=48 on Device={GPU_UUID}; marking device as unhealthy."),
               n=1)
    add_kmsg(b, X63, usec=20_000_000)  # before the plugin started: it never saw it
    assert found(b, "GPU-K8S-003") == []


# --- GPU-K8S-004 -------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-K8S-004", "positive")
def test_k8s004_plugin_finds_no_nvml(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, "/etc/containerd/config.toml", PLAIN_V2)
    plugin_log(b, klog("E", "factory.go:112", "Incompatible strategy detected auto"),
               klog("E", "factory.go:113", "If this is a GPU node, did you configure the NVIDIA Container Toolkit?"),
               klog("I", "main.go:381", "No devices found. Waiting indefinitely."))
    f = one(b, "GPU-K8S-004")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert any("Incompatible strategy detected auto" in e.text for e in f.evidence)
    assert any("containerd config version 2: runtimes runc; default runc" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-K8S-004", "positive")
def test_k8s004_no_runtime_for_nvidia(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, CONTAINERD_LOG, ctrd("error", "RunPodSandbox for &PodSandboxMetadata{Name:trainer-0,} failed",
                                  'failed to get sandbox runtime: no runtime for \\"nvidia\\" is configured'))
    f = one(b, "GPU-K8S-004")
    assert f.status is Status.CONFIRMED and "nvidia RuntimeClass" in f.summary


@pytest.mark.rule("GPU-K8S-004", "positive")
def test_k8s004_config_without_nvidia_or_cdi_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, "/etc/containerd/config.toml", PLAIN_V2)
    write(b, "/.gpuwarden/commands/containerd-version.txt",
          "containerd containerd.io 1.6.33 d2d58213f83a351ca8f528a95fbd145f5654e957\n")
    f = one(b, "GPU-K8S-004")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM
    assert any("containerd 1.6.33: no CDI support before 1.7.0" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-K8S-004", "negative")
def test_k8s004_nvidia_runtime_via_import_or_cdi(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, "/etc/containerd/config.toml", 'imports = ["/etc/containerd/conf.d/*.toml"]\n' + PLAIN_V2)
    write(b, "/etc/containerd/conf.d/99-nvidia.toml", NVIDIA_RUNTIME_V2)
    assert found(b, "GPU-K8S-004") == []
    c = healthy(tmp_path / "cdi")
    write(c, "/etc/containerd/config.toml", PLAIN_V2.replace('sandbox_image', 'enable_cdi = true\n    sandbox_image'))
    write(c, "/.gpuwarden/commands/containerd-version.txt", "containerd github.com/containerd/containerd v1.7.22 7f7fdf5\n")
    assert found(c, "GPU-K8S-004") == []


# --- GPU-K8S-005 -------------------------------------------------------------------------------------

def drop_gpu_node_from_trainer(b: Path) -> None:
    def edit(m: dict) -> None:
        m["listdir"]["/proc/3400/root/dev"] = [n for n in m["listdir"]["/proc/3400/root/dev"] if n != "nvidia0"]
        m["stat"].pop("/proc/3400/root/dev/nvidia0", None)
    edit_meta(b, edit)


@pytest.mark.rule("GPU-K8S-005", "positive")
def test_k8s005_allocated_but_absent(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    drop_gpu_node_from_trainer(b)
    f = one(b, "GPU-K8S-005")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert (f.affected[0].name, f.affected[0].namespace) == ("trainer-0/trainer", "ml")
    assert any(e.source == "/proc/3400/root/dev" and e.text.startswith("no /dev/nvidia<N>") for e in f.evidence)


@pytest.mark.rule("GPU-K8S-005", "positive")
def test_k8s005_unrequested_container_sees_gpus(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    checkpoint(b, lambda d: d.__setitem__("PodDeviceEntries", []))
    f = one(b, "GPU-K8S-005")
    assert f.status is Status.AT_RISK and "NVIDIA_VISIBLE_DEVICES=GPU-517551a5" in f.evidence[0].text


@pytest.mark.rule("GPU-K8S-005", "negative")
def test_k8s005_healthy(tmp_path: Path) -> None:
    assert found(healthy(tmp_path), "GPU-K8S-005") == []


# --- GPU-K8S-006 -------------------------------------------------------------------------------------

MIG_ON = (("<current_mig>Disabled</current_mig>", "<current_mig>Enabled</current_mig>"),
          ("<pending_mig>Disabled</pending_mig>", "<pending_mig>Enabled</pending_mig>"))


@pytest.mark.rule("GPU-K8S-006", "positive")
def test_k8s006_strategy_none_with_mig_enabled(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_smi(b, *MIG_ON)
    plugin_env(b, MIG_STRATEGY="none")
    f = one(b, "GPU-K8S-006")
    assert f.status is Status.CONFIRMED and f.severity is Severity.MEDIUM
    assert f.evidence[0].text == "MIG_STRATEGY=none"


@pytest.mark.rule("GPU-K8S-006", "positive")
def test_k8s006_invalid_config_logged_and_pending_mode(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_log(b, klog("E", "mig-strategy.go:94", "Invalid configuration detected for mig-strategy=single: "
                                                  "at least one MIG device is enabled but empty"))
    assert one(b, "GPU-K8S-006").status is Status.CONFIRMED
    c = healthy(tmp_path / "pending")
    edit_smi(c, ("<pending_mig>Disabled</pending_mig>", "<pending_mig>Enabled</pending_mig>"))
    f = one(c, "GPU-K8S-006")
    assert f.status is Status.AT_RISK and "pending Enabled" in f.evidence[0].text


@pytest.mark.rule("GPU-K8S-006", "negative")
def test_k8s006_matching_strategies(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_env(b, MIG_STRATEGY="single")  # MIG off everywhere: single advertises full GPUs
    assert found(b, "GPU-K8S-006") == []
    c = healthy(tmp_path / "mig")
    edit_smi(c, *MIG_ON)
    plugin_env(c, MIG_STRATEGY="mixed")
    assert found(c, "GPU-K8S-006") == []


# --- GPU-K8S-008 -------------------------------------------------------------------------------------

FSW = (klog("I", "main.go:279", "Starting FS watcher."),
       "Error: failed to create FS watcher: too many open files")


@pytest.mark.rule("GPU-K8S-008", "positive")
def test_k8s008_fs_watcher_crash_loop(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_log(b, *FSW, n=3)
    write(b, "/proc/sys/fs/inotify/max_user_instances", "128\n")
    f = one(b, "GPU-K8S-008")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.data == {"max_user_instances": "128"}


@pytest.mark.rule("GPU-K8S-008", "positive")
def test_k8s008_previous_instance_only_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_log(b, *FSW, n=3)
    plugin_log(b, klog("I", "main.go:279", "Starting FS watcher."), klog("I", "main.go:290", "Starting OS watcher."), n=4)
    assert one(b, "GPU-K8S-008").status is Status.AT_RISK


@pytest.mark.rule("GPU-K8S-008", "negative")
def test_k8s008_normal_start(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_log(b, klog("I", "main.go:279", "Starting FS watcher."), klog("I", "main.go:290", "Starting OS watcher."))
    assert found(b, "GPU-K8S-008") == []


# --- GPU-K8S-009 -------------------------------------------------------------------------------------

DRIVER_READY = ("IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\nDRIVER_ROOT_CTR_PATH=/run/nvidia/driver\n"
                "NVIDIA_DEV_ROOT=/run/nvidia/driver\nDEV_ROOT_CTR_PATH=/run/nvidia/driver\n")


@pytest.mark.rule("GPU-K8S-009", "positive")
def test_k8s009_stuck_at_toolkit_live(tmp_path: Path) -> None:
    d = tmp_path / "host/run/nvidia/validations"
    d.mkdir(parents=True)
    (d / "driver-ready").write_text(DRIVER_READY)
    (d / "workload-type").write_text("container")
    old = time.time() - 3600
    os.utime(d / "driver-ready", (old, old))
    facts = NodeFacts(HostRoot(str(tmp_path / "host")), Settings(probes=False))
    rep = engine.run(facts, engine.select(engine.all_rules(), ("GPU-K8S-009",)))
    (f,) = rep.findings
    assert f.status is Status.CONFIRMED and f.data["first_missing"] == "toolkit-ready"
    assert f.data["points_at"] == ["GPU-K8S-004"] and "1h00m" in f.summary


@pytest.mark.rule("GPU-K8S-009", "positive")
def test_k8s009_bundle_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, "/run/nvidia/validations/driver-ready", DRIVER_READY)
    write(b, "/run/nvidia/validations/toolkit-ready", "")
    f = one(b, "GPU-K8S-009")
    assert f.status is Status.AT_RISK and f.data["first_missing"] == "cuda-ready"


@pytest.mark.rule("GPU-K8S-009", "negative")
def test_k8s009_all_stages_done_or_vm_node(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    for s in ("driver-ready", "toolkit-ready", "cuda-ready", "plugin-ready"):
        write(b, f"/run/nvidia/validations/{s}", "")
    assert found(b, "GPU-K8S-009") == []
    c = healthy(tmp_path / "vm")
    write(c, "/run/nvidia/validations/workload-type", "vm-passthrough")
    assert found(c, "GPU-K8S-009") == []


# --- GPU-K8S-010 -------------------------------------------------------------------------------------

def cuda_req(version: str) -> str:
    return ctrd("error", "StartContainer for \\\"4c2f0b8e9a7d\\\" failed",
                "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
                "failed: unable to start container process: error during container init: error running hook #0: "
                "error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\\n"
                f"nvidia-container-cli: requirement error: unsatisfied condition: cuda>={version}, please update your "
                "driver to a newer version, or use an earlier cuda container: unknown")


@pytest.mark.rule("GPU-K8S-010", "positive")
def test_k8s010_requirement_error_logged(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, CONTAINERD_LOG, cuda_req("13.1"))
    f = one(b, "GPU-K8S-010")
    assert f.status is Status.CONFIRMED and f.severity is Severity.MEDIUM
    assert f.data == {"required": "13.1", "driver_cuda": "13.0"}


@pytest.mark.rule("GPU-K8S-010", "positive")
def test_k8s010_running_container_requires_newer(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    f = bundle_file(b, GPU_SPEC)
    doc = json.loads(f.read_text())
    doc["process"]["env"].append("NVIDIA_REQUIRE_CUDA=cuda>=13.1 brand=tesla,driver>=535,driver<536")
    f.write_text(json.dumps(doc))
    got = one(b, "GPU-K8S-010")
    assert got.status is Status.AT_RISK


@pytest.mark.rule("GPU-K8S-010", "negative")
def test_k8s010_requirement_met_by_the_driver_now(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, CONTAINERD_LOG, cuda_req("12.8"))  # logged before the driver upgrade to CUDA 13.0
    assert found(b, "GPU-K8S-010") == []


def test_require_cuda_evaluation() -> None:
    req = "cuda>=12.8 brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=535,driver<536"
    assert requirement_met(req, "12.4", "535.104.05", "NVIDIA") is True  # forward-compat alternative
    assert requirement_met(req, "12.4", "550.54.14", "NVIDIA") is False
    assert requirement_met(req, "12.4", "535.104.05", None) is None  # brand unknown: undecided
    assert requirement_met(req, "12.4", "550.54.14", None) is False  # no alternative can hold
    assert requirement_met("cuda>=12.8", "13.0", "580.159.04", "NVIDIA") is True


# --- GPU-DEV-004 -------------------------------------------------------------------------------------

CDI_SPEC = """---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidia-modeset
  - path: /dev/nvidia-uvm
  - path: /dev/nvidia-uvm-tools
  - path: /dev/nvidiactl
  mounts:
  - containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{v}
    hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{v}
    options: [ro, nosuid, nodev, bind]
  - containerPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}
    hostPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}
    options: [ro, nosuid, nodev, bind]
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: "0"
kind: nvidia.com/gpu
"""


@pytest.mark.rule("GPU-DEV-004", "positive")
def test_dev004_stale_node_link_and_cdi(tmp_path: Path) -> None:
    b = healthy(tmp_path)

    def edit(m: dict) -> None:
        m["stat"]["/dev/nvidia-uvm"]["major"] = 237  # made when nvidia-uvm had major 237
        m["readlink"]["/dev/char/195:0"] = "../nvidia0"
        m["readlink"]["/dev/char/195:1"] = "../nvidia1"  # a GPU that is gone
    edit_meta(b, edit)
    write(b, "/var/run/cdi/nvidia.yaml", CDI_SPEC.format(v="570.158.01"))
    f = one(b, "GPU-DEV-004")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.data["kinds"] == ["stale_cdi_libs", "stale_link", "stale_node"]
    texts = [f"{e.source}: {e.text}" for e in f.evidence]
    assert "/dev/nvidia-uvm: char 237:0, but /proc/devices says 238 nvidia-uvm" in texts
    assert "/dev/char/195:1: -> ../nvidia1, which does not exist" in texts
    assert any(t.startswith("/var/run/cdi/nvidia.yaml: mounts driver libraries of version 570.158.01") for t in texts)


@pytest.mark.rule("GPU-DEV-004", "negative")
def test_dev004_current_links_and_spec(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_meta(b, lambda m: m["readlink"].update({"/dev/char/195:0": "../nvidia0", "/dev/char/238:0": "../nvidia-uvm"}))
    write(b, "/var/run/cdi/nvidia.yaml", CDI_SPEC.format(v="580.159.04"))
    assert found(b, "GPU-DEV-004") == []


# --- GPU-DEV-005 -------------------------------------------------------------------------------------

AVC = ('type=AVC msg=audit(1795313550.123:412): avc:  denied  { read write } for  pid=3400 comm="nvidia-smi" '
       'name="nvidiactl" dev="devtmpfs" ino=1234 scontext=system_u:system_r:container_t:s0:c123,c456 '
       'tcontext=system_u:object_r:xserver_misc_device_t:s0 tclass=chr_file permissive=0\n')


@pytest.mark.rule("GPU-DEV-005", "positive")
def test_dev005_insufficient_permissions_with_selinux_enforcing(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_log(b, klog("E", "factory.go:95", "Failed to initialize NVML: Insufficient Permissions."))
    write(b, "/sys/fs/selinux/enforce", "1")
    f = one(b, "GPU-DEV-005")
    assert f.status is Status.CONFIRMED and f.data["enforcing"] is True


@pytest.mark.rule("GPU-DEV-005", "positive")
def test_dev005_avc_denial(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, "/.gpuwarden/logs/audit.log", "type=SERVICE_START msg=audit(1795313530.1:1): pid=1 uid=0\n" + AVC)
    f = one(b, "GPU-DEV-005")
    assert f.status is Status.CONFIRMED and f.data["avc"] == 1
    assert 'comm="nvidia-smi" name="nvidiactl"' in f.evidence[0].text


@pytest.mark.rule("GPU-DEV-005", "positive")
def test_dev005_without_selinux_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_log(b, klog("E", "factory.go:95", "Failed to initialize NVML: Insufficient Permissions."))
    f = one(b, "GPU-DEV-005")
    assert f.status is Status.AT_RISK and f.severity is Severity.LOW


@pytest.mark.rule("GPU-DEV-005", "negative")
def test_dev005_enforcing_without_errors(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, "/sys/fs/selinux/enforce", "1")
    assert found(b, "GPU-DEV-005") == []
    assert "GPU-DEV-005" not in skipped(b, "GPU-DEV-005")


# --- GPU-DEV-003: runc 1.1.3-1.1.6 and missing /dev/char links (data/known_versions.yaml) ---------------

@pytest.mark.rule("GPU-DEV-003", "positive")
def test_dev003_spec_devices_at_risk_with_runc_devchar_skip(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    f = bundle_file(b, "/var/lib/kubelet/config.yaml")
    f.write_text(f.read_text().replace("cgroupDriver: cgroupfs", "cgroupDriver: systemd"))
    write(b, "/.gpuwarden/commands/runc-version.txt", "runc version 1.1.4\ncommit: v1.1.4-0-g5fd4c4d1\nspec: 1.0.2-dev\n")
    got = [x for x in found(b, "GPU-DEV-003") if "/dev/char" in x.summary]
    assert len(got) == 1 and got[0].status is Status.AT_RISK
    assert got[0].data["missing_links"] == ["/dev/char/195:0", "/dev/char/195:255"]


@pytest.mark.rule("GPU-DEV-003", "negative")
def test_dev003_spec_devices_fine_with_links_or_fixed_runc(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    f = bundle_file(b, "/var/lib/kubelet/config.yaml")
    f.write_text(f.read_text().replace("cgroupDriver: cgroupfs", "cgroupDriver: systemd"))
    write(b, "/.gpuwarden/commands/runc-version.txt", "runc version 1.1.4\n")
    edit_meta(b, lambda m: m["readlink"].update({"/dev/char/195:0": "../nvidia0", "/dev/char/195:255": "../nvidiactl"}))
    assert found(b, "GPU-DEV-003") == []
    c = healthy(tmp_path / "fixed")
    f = bundle_file(c, "/var/lib/kubelet/config.yaml")
    f.write_text(f.read_text().replace("cgroupDriver: cgroupfs", "cgroupDriver: systemd"))
    assert found(c, "GPU-DEV-003") == []  # runc 1.1.12


def test_collect_records_plugin_socket_mtimes() -> None:
    """`collect` keeps the device-plugin sockets' stat (GPU-K8S-002 compares their mtimes)."""
    import socket
    import tempfile

    from gpuwarden.bundle.archive import open_bundle
    from gpuwarden.bundle.collect import collect

    base = Path(tempfile.mkdtemp(prefix="gw", dir="/tmp"))  # AF_UNIX paths are limited to 108 bytes
    try:
        d = base / "r/var/lib/kubelet/device-plugins"
        d.mkdir(parents=True)
        socks = []
        for name in ("nvidia-gpu.sock", "kubelet.sock"):
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(d / name))
            socks.append(s)
            time.sleep(0.01)
        old = time.time() - 900
        os.utime(d / "nvidia-gpu.sock", (old, old), follow_symlinks=False)
        collect(str(base / "r"), str(base / "b.tgz"), cmd_timeout=2)
        root, keep = open_bundle(str(base / "b.tgz"))
        try:
            st = root.stat(f"{DP}/nvidia-gpu.sock", follow=False)
            assert st.kind == "other" and abs(st.mtime - old) < 2
            assert sorted(n for n in root.listdir(DP) if n.endswith(".sock")) == ["kubelet.sock", "nvidia-gpu.sock"]
        finally:
            keep.cleanup()
        for s in socks:
            s.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
