#!/usr/bin/env python3
"""Build the incident-5 example nodes: `mig-nvml-hang` (5a) and `mps-binary-missing` (5b).

Both overlay `healthy` (see tools/build_examples.py). Log lines the write-up quotes are copied
verbatim (../shared/incidents/5-mig-nvml-hang-kubelet-blocked.zh.md); every other file is
derived, and each example's ORIGIN.md says which is which.

    python tools/build_incident5_examples.py   # rewrites src/gpuwarden/examples/{mig-nvml-hang,mps-binary-missing}
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "src/gpuwarden/examples"
TEMPLATE_XML = REPO / "tests/fixtures/captures/h200-2026-11-22/files/.gpuwarden/commands/nvidia-smi-q-x.xml"
TEMPLATE_INFO = OUT / "healthy/files/proc/driver/nvidia/gpus/0000:00:06.0/information"
INCIDENT = "../shared/incidents/5-mig-nvml-hang-kubelet-blocked.zh.md"

# -- incident 5, verbatim --------------------------------------------------------------------
# nvidia-smi -L and the nvidia-smi table: GPU index -> (UUID, bus id, MIG devices)
GPUS = [
    ("GPU-2f815c32-768d-d782-1073-db01d7b90215", "00000000:0F:00.0", [
        ("3g.48gb", "MIG-e76cc178-e1f3-5596-a9e1-84fa6bffa030"), ("1g.24gb", "MIG-160ae368-7334-5d1e-91ad-d6eb55ec6f67"),
        ("1g.12gb", "MIG-ac6829e7-b466-50e4-917c-b77aee4c5016"), ("1g.12gb", "MIG-4e18003f-f745-5d17-b03f-203b7cbb671b")]),
    ("GPU-bafcf1f7-1006-01e5-85e2-684fee364617", "00000000:34:00.0", [
        ("3g.48gb", "MIG-f28b28ea-2a63-569d-8e74-0068dd6efb1c"), ("1g.24gb", "MIG-9244fc71-c9b9-5a4c-8588-8b991d1df2a1"),
        ("1g.12gb", "MIG-70b0f862-2a3b-5056-89f6-4e1bc03f0913"), ("1g.12gb", "MIG-a93cbeea-c3ce-5933-9512-35fde18fe2fd")]),
    ("GPU-b0c5b618-67d0-f464-9905-e1fd41226305", "00000000:48:00.0", [
        ("3g.48gb", "MIG-de57fa99-1a2b-5462-9a2e-71d72261a6c2"), ("1g.24gb", "MIG-e25ff671-e5b4-55ca-ae65-7d82bdc026f7"),
        ("1g.12gb", "MIG-9429d092-1945-524b-8a22-474247772105"), ("1g.12gb", "MIG-e99237a2-b951-5f96-af7b-d0c5ecedb6f4")]),
    ("GPU-4695a002-ab2d-092d-6db9-44e9ae3cb5a6", "00000000:5A:00.0", []),
    ("GPU-39862681-62c1-28f7-0244-5563c070a260", "00000000:87:00.0", []),
    ("GPU-f055d080-1808-96f1-1c87-70fad19d9040", "00000000:AE:00.0", []),
    ("GPU-4650fca3-dbba-f168-d6bd-338a4ba8f044", "00000000:C2:00.0", []),
    ("GPU-9648f14e-6ab2-46f0-221f-777f7652630b", "00000000:D7:00.0", []),
]
HOSTNAME = "ai-app-8-1-msxf"
KERNEL = "5.15.0-1078-nvidia"

# "正常启动的Pod日志" (pid 26361, 19:37:03): an admission that completed
KUBELET_OK = """\
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.951650 26361 manager.go:773] "Looking for needed resources" needed=1 resourceName="nvidia.com/mig-3g.48gb"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.951690 26361 manager.go:523] "Pods to be removed" podUIDs=[bc17fe76-a3c2-4ed6-b203-816dc0c24188]
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.951716 26361 manager.go:548] "Need devices to allocate for pod" deviceNumber=1 resourceName="nvidia.com/mig-3g.48gb" podUID="cf97dd7e-bc61-44c1-8241-b47204a2e9b1" containerName="neal-0729-1"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.951749 26361 manager.go:956] "Issuing a GetPreferredAllocation call for container" containerName="neal-0729-1" podUID="cf97dd7e-bc61-44c1-8241-b47204a2e9b1"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.952761 26361 manager.go:819] "Making allocation request for device plugin" devices=[MIG-5e2f454b-6cf3-51c3-a060-0a34ba38dfe4] resourceName="nvidia.com/mig-3g.48gb"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.953459 26361 manager.go:773] "Looking for needed resources" needed=12 resourceName="cpu"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.953490 26361 manager.go:773] "Looking for needed resources" needed=50331648000 resourceName="memory"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.954888 26361 pod_workers.go:770] "Pod is being synced for the first time" pod="mck-test/neal-0729-1-6f67d4dd6f-bw8pz" podUID=cf97dd7e-bc61-44c1-8241-b47204a2e9b1 updateType="create"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.954940 26361 pod_workers.go:965] "Notifying pod of pending update" pod="mck-test/neal-0729-1-6f67d4dd6f-bw8pz" podUID=cf97dd7e-bc61-44c1-8241-b47204a2e9b1 workType="sync"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.954987 26361 pod_workers.go:1226] "Processing pod event" pod="mck-test/neal-0729-1-6f67d4dd6f-bw8pz" podUID=cf97dd7e-bc61-44c1-8241-b47204a2e9b1 updateType="sync"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.955043 26361 kubelet.go:1666] "SyncPod enter" pod="mck-test/neal-0729-1-6f67d4dd6f-bw8pz" podUID=cf97dd7e-bc61-44c1-8241-b47204a2e9b1
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.955087 26361 kubelet_pods.go:1578] "Generating pod status" podIsTerminal=false pod="mck-test/neal-0729-1-6f67d4dd6f-bw8pz"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.955140 26361 kubelet_pods.go:1591] "Got phase for pod" pod="mck-test/neal-0729-1-6f67d4dd6f-bw8pz" oldPhase=Pending phase=Pending
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.955346 26361 reflector.go:287] Starting reflector *v1.ConfigMap (0s) from object-"mck-test"/"kube-root-ca.crt"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.955363 26361 reflector.go:323] Listing and watching *v1.ConfigMap from object-"mck-test"/"kube-root-ca.crt"
Jul 30 19:37:03 ai-app-8-1-msxf kubelet[26361]: I0730 19:37:03.955346 26361 status_manager.go:217] "Syncing updated statuses"
"""
# "异常启动(阻塞在Pending状态)的Pod日志" (pid 45878, 20:39:03): the call that never returns
KUBELET_HUNG = """\
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.752764 45878 kubelet.go:2343] "SyncLoop ADD" source="api" pods=[mck-test/neal-0729-6-8686d45f8c-rgsr9]
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.752799 45878 topology_manager.go:212] "Topology Admit Handler"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.752952 45878 manager.go:773] "Looking for needed resources" needed=1 resourceName="nvidia.com/gpu"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.752987 45878 manager.go:548] "Need devices to allocate for pod" deviceNumber=1 resourceName="nvidia.com/gpu" podUID="69e0758e-d625-4013-9258-df8b7ddf04e2" containerName="neal-0729-6"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.753013 45878 manager.go:956] "Issuing a GetPreferredAllocation call for container" containerName="neal-0729-6" podUID="69e0758e-d625-4013-9258-df8b7ddf04e2"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804100 45878 factory.go:260] Factory "containerd" was unable to handle container "/system.slice/sssd-ssh.socket"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804115 45878 factory.go:260] Factory "systemd" was unable to handle container "/system.slice/sssd-ssh.socket"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804121 45878 factory.go:253] Factory "raw" can handle container "/system.slice/sssd-ssh.socket", but ignoring.
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804129 45878 manager.go:919] ignoring container "/system.slice/sssd-ssh.socket"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804134 45878 factory.go:260] Factory "containerd" was unable to handle container "/system.slice/nvidia-fabricmanager.service"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804138 45878 factory.go:260] Factory "systemd" was unable to handle container "/system.slice/nvidia-fabricmanager.service"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804142 45878 factory.go:253] Factory "raw" can handle container "/system.slice/nvidia-fabricmanager.service", but ignoring.
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804148 45878 manager.go:919] ignoring container "/system.slice/nvidia-fabricmanager.service"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804152 45878 factory.go:260] Factory "containerd" was unable to handle container "/user.slice/user-40489916.slice/session-8529.scope"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804155 45878 factory.go:260] Factory "systemd" was unable to handle container "/user.slice/user-40489916.slice/session-8529.scope"
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804159 45878 factory.go:253] Factory "raw" can handle container "/user.slice/user-40489916.slice/session-8529.scope", but ignoring.
Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.804164 45878 manager.go:919] ignoring container "/user.slice/user-40489916.slice/session-8529.scope"
"""
# derived: what the kubelet's pod config (V4, pkg/kubelet/config/config.go) prints while the sync
# loop is blocked: the pod from the write-up's Events (Scheduled, no kubelet event) arriving, and the
# stuck pod being deleted (it stays Terminating)
KUBELET_QUEUED = """\
Jul 30 20:41:12 ai-app-8-1-msxf kubelet[45878]: I0730 20:41:12.318452 45878 config.go:398] "Adding new pods from source" source="api" pods=[mck-test/neal-0729-6-68b4895fb7-6868w]
Jul 30 20:52:30 ai-app-8-1-msxf kubelet[45878]: I0730 20:52:30.602117 45878 config.go:404] "Gracefully deleting pods from source" source="api" pods=[mck-test/neal-0729-6-8686d45f8c-rgsr9]
"""
# "看到一些可疑的信息" (21:01:46, 21:02:03): the same kubelet still logging 23 minutes later
# (journalctl cut the long lines at the terminal width: the trailing '>' is journalctl's)
KUBELET_LATER = """\
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.109395 45878 fs.go:419] unable to determine file system type, partition mountpoint does not exist: /run/containerd/io>
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.110307 45878 fs.go:419] unable to determine file system type, partition mountpoint does not exist: /home/kubelet/pods>
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.110316 45878 fs.go:419] unable to determine file system type, partition mountpoint does not exist: /run/containerd/io>
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.110440 45878 fs.go:419] unable to determine file system type, partition mountpoint does not exist: /home/kubelet/pods>
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.110529 45878 fs.go:419] unable to determine file system type, partition mountpoint does not exist: /run/containerd/io>
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.149822 45878 cri_stats_provider.go:499] "Unable to find network stats for sandbox" sandboxID="4349bc2464369f69eba8add>
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.149948 45878 cri_stats_provider.go:499] "Unable to find network stats for sandbox" sandboxID="07dea91cfecc5008f2d99b6>
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.150046 45878 cri_stats_provider.go:499] "Unable to find network stats for sandbox" sandboxID="766ed5f4f36f5de9bf0dc80>
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.150181 45878 cri_stats_provider.go:499] "Unable to find network stats for sandbox" sandboxID="df5fd0dc977bb03adf9fc54>
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.150273 45878 cri_stats_provider.go:499] "Unable to find network stats for sandbox" sandboxID="023989878ee015cc9a97e9d>
Jul 30 21:01:46 ai-app-8-1-msxf kubelet[45878]: I0730 21:01:46.150401 45878 cri_stats_provider.go:499] "Unable to find network stats for sandbox" sandboxID="df5fd0dc977bb03adf9fc54>
Jul 30 21:02:03 ai-app-8-1-msxf kubelet[45878]: I0730 21:02:03.804312 45878 factory.go:260] Factory "containerd" was unable to handle container "/user.slice/user-40492906.slice/ses>
Jul 30 21:02:03 ai-app-8-1-msxf kubelet[45878]: I0730 21:02:03.804315 45878 factory.go:260] Factory "systemd" was unable to handle container "/user.slice/user-40492906.slice/sessio>
Jul 30 21:02:03 ai-app-8-1-msxf kubelet[45878]: I0730 21:02:03.804319 45878 factory.go:253] Factory "raw" can handle container "/user.slice/user-40492906.slice/session-8458.scope",>
Jul 30 21:02:03 ai-app-8-1-msxf kubelet[45878]: I0730 21:02:03.804324 45878 manager.go:919] ignoring container "/user.slice/user-40492906.slice/session-8458.scope"
Jul 30 21:02:03 ai-app-8-1-msxf kubelet[45878]: I0730 21:02:03.804328 45878 factory.go:260] Factory "containerd" was unable to handle container "/user.slice/user-40489916.slice/ses>
Jul 30 21:02:03 ai-app-8-1-msxf kubelet[45878]: I0730 21:02:03.804332 45878 factory.go:260] Factory "systemd" was unable to handle container "/user.slice/user-40489916.slice/sessio>
Jul 30 21:02:03 ai-app-8-1-msxf kubelet[45878]: I0730 21:02:03.804336 45878 factory.go:253] Factory "raw" can handle container "/user.slice/user-40489916.slice/session-8529.scope",>
Jul 30 21:02:03 ai-app-8-1-msxf kubelet[45878]: I0730 21:02:03.804340 45878 manager.go:919] ignoring container "/user.slice/user-40489916.slice/session-8529.scope"
"""
# "dmesg -T" section: the write-up's viewer line numbers (66636 …) removed, Jul 29 block put first
KERNEL_LOG = """\
Jul 29 17:54:57 ai-app-8-1-msxf kernel: [341115.681608] INFO: task containerd-shim:7663 blocked for more than 5 seconds.
Jul 29 17:54:57 ai-app-8-1-msxf kernel: [341115.681664] Tainted: P OE 5.15.0-1078-nvidia #79-Ubuntu
Jul 29 17:54:57 ai-app-8-1-msxf kernel: [341115.681692] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
Jul 29 17:54:57 ai-app-8-1-msxf kernel: [341115.681718] task:containerd-shim state:D stack: 0 pid: 7663 ppid: 1 flags:0x00004000
Jul 29 17:54:57 ai-app-8-1-msxf kernel: [341115.681729] Call Trace:
Jul 30 19:46:12 ai-app-8-1-msxf kernel: [434189.944726] XFS (dm-3): Invalid superblock magic number
Jul 30 19:46:35 ai-app-8-1-msxf kernel: [434213.828068] XFS (dm-3): Mounting V5 Filesystem
Jul 30 19:46:35 ai-app-8-1-msxf kernel: [434213.837526] XFS (dm-3): Ending clean mount
Jul 30 19:46:35 ai-app-8-1-msxf kernel: [434213.842750] xfs filesystem being mounted at /pdata supports timestamps until 2038-01-19 (0x7fffffff)
"""
# section 5.2: mps-control-daemon-ctr's log (klog lines, container clock in UTC)
MPS_LINES = """\
I0805 08:40:16.021509 303 main.go:197] Retrieving MPS daemons.
I0805 08:40:16.157726 303 manager.go:88] "Resource is not shared" resource="resource" nvidia.com/gpu="(MISSING)"
I0805 08:40:16.431605 303 daemon.go:100] "Staring MPS daemon" resource="nvidia.com/gpu.shared"
I0805 08:40:16.431671 303 daemon.go:153] "SELinux disabled, not updating context" path="/mps/nvidia.com/gpu.shared/pipe"
E0805 08:40:16.431856 303 main.go:213] Failed to start MPS daemon: exec: "nvidia-cuda-mps-control": executable file not found in $PATH
I0805 08:40:16.431895 303 main.go:132] Failed to start one or more MPS deamons. Retrying in 30s...
W0805 08:40:46.441659 303 main.go:228] Failed to remove .ready file: remove /mps/.ready: no such file or directory
I0805 08:40:46.441705 303 main.go:230] Stopping MPS daemons.
E0805 08:40:46.441879 303 main.go:84] error stopping plugins from previous run: error sending quit message: failed to start NVIDIA MPS command: exec: "nvidia-cuda-mps-control": executable file not found in $PATH
"""
MPS_POD = "nvidia-device-plugin-mps-control-daemon-rpm7r"
MPS_POD_UID = "5b0d7c1e-2f43-4a8e-9c61-3d7e8f902a14"  # derived: the write-up gives no UID
MPS_CONTAINER = "mps-control-daemon-ctr"


class Example:
    def __init__(self, name: str, description: str, captured_at: float) -> None:
        self.name = name
        self.dir = OUT / name
        self.files: dict[str, bytes] = {}
        self.meta: dict = {"format": "gpuwarden.bundle/v1", "base": "healthy", "description": description,
                           "captured_at": captured_at, "stat": {}, "readlink": {}, "listdir": {}, "missing": {},
                           "remove": []}
        self.origin: list[str] = []

    def file(self, path: str, text: str | bytes, origin: str) -> None:
        self.files[path] = text.encode() if isinstance(text, str) else text
        self.origin.append(f"- `{path}`: {origin}")

    def write(self) -> None:
        if self.dir.exists():
            shutil.rmtree(self.dir)
        for path, data in self.files.items():
            p = self.dir / "files" / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        (self.dir / "meta.json").write_text(json.dumps(self.meta, indent=1, sort_keys=True) + "\n")
        head = (f"# Origin of the example node `{self.name}`\n\n{self.meta['description']}\n\n"
                f"Generated by `tools/build_incident5_examples.py` from `{INCIDENT}` (incident 5).\n"
                "Overlays `healthy`: every file not listed here is the healthy node's (see its ORIGIN.md).\n\n")
        (self.dir / "ORIGIN.md").write_text(head + "\n".join(self.origin) + "\n")


def smi_xml(driver: str, cuda: str, timestamp: str, mig: bool, compute_mode: str) -> str:
    """`nvidia-smi -q -x` for the incident's eight H20s, in the real schema of the H200 capture."""
    tpl = TEMPLATE_XML.read_text()
    head, rest = tpl.split("\t<gpu id=", 1)
    gpu_tpl = "\t<gpu id=" + rest.rsplit("</nvidia_smi_log>", 1)[0]
    head = head.replace("nvsmi_device_v13.dtd", "nvsmi_device_v12.dtd")
    head = re.sub(r"<timestamp>.*</timestamp>", f"<timestamp>{timestamp}</timestamp>", head)
    head = re.sub(r"<driver_version>.*</driver_version>", f"<driver_version>{driver}</driver_version>", head)
    head = re.sub(r"<cuda_version>.*</cuda_version>", f"<cuda_version>{cuda}</cuda_version>", head)
    head = re.sub(r"<attached_gpus>.*</attached_gpus>", f"<attached_gpus>{len(GPUS)}</attached_gpus>", head)
    out = [head]
    for minor, (uuid, bus, migs) in enumerate(GPUS):
        g = gpu_tpl.replace('id="00000000:00:06.0"', f'id="{bus}"')
        g = g.replace("<pci_bus_id>00000000:00:06.0</pci_bus_id>", f"<pci_bus_id>{bus}</pci_bus_id>")
        g = re.sub(r"<pci_bus>[0-9A-Fa-f]+</pci_bus>", f"<pci_bus>{bus.split(':')[1]}</pci_bus>", g)
        g = g.replace("NVIDIA H200", "NVIDIA H20")
        g = re.sub(r"<uuid>.*</uuid>", f"<uuid>{uuid}</uuid>", g)
        g = re.sub(r"<minor_number>.*</minor_number>", f"<minor_number>{minor}</minor_number>", g)
        g = re.sub(r"<persistence_mode>.*</persistence_mode>", "<persistence_mode>Disabled</persistence_mode>", g)
        g = re.sub(r"<compute_mode>.*</compute_mode>", f"<compute_mode>{compute_mode}</compute_mode>", g)
        on = mig and bool(migs)
        state = "Enabled" if on else "Disabled"
        g = re.sub(r"<mig_mode>.*?</mig_mode>",
                   f"<mig_mode>\n\t\t\t<current_mig>{state}</current_mig>\n\t\t\t<pending_mig>{state}</pending_mig>\n\t\t</mig_mode>",
                   g, flags=re.S)
        if on:
            devs = []
            for i, (profile, _mig_uuid) in enumerate(migs):
                gi = {"3g.48gb": 2, "1g.24gb": 3, "1g.12gb": 9 + i}[profile]
                mem = {"3g.48gb": "47488 MiB", "1g.24gb": "23680 MiB", "1g.12gb": "11776 MiB"}[profile]
                sm = {"3g.48gb": "60", "1g.24gb": "16", "1g.12gb": "16"}[profile]
                devs.append(
                    "\t\t\t<mig_device>\n"
                    f"\t\t\t\t<index>{i}</index>\n\t\t\t\t<gpu_instance_id>{gi}</gpu_instance_id>\n"
                    "\t\t\t\t<compute_instance_id>0</compute_instance_id>\n"
                    f"\t\t\t\t<device_attributes>\n\t\t\t\t\t<shared>\n\t\t\t\t\t\t<multiprocessor_count>{sm}</multiprocessor_count>\n"
                    "\t\t\t\t\t</shared>\n\t\t\t\t</device_attributes>\n"
                    f"\t\t\t\t<fb_memory_usage>\n\t\t\t\t\t<total>{mem}</total>\n\t\t\t\t\t<reserved>0 MiB</reserved>\n"
                    "\t\t\t\t\t<used>12 MiB</used>\n\t\t\t\t</fb_memory_usage>\n"
                    "\t\t\t</mig_device>\n")
            g = re.sub(r"<mig_devices>.*?</mig_devices>", "<mig_devices>\n" + "".join(devs) + "\t\t</mig_devices>",
                       g, flags=re.S)
        out.append(g)
    out.append("</nvidia_smi_log>\n")
    return "".join(out)


def gpu_information(driver: str) -> dict[str, str]:
    tpl = TEMPLATE_INFO.read_text()
    out = {}
    for minor, (uuid, bus, _) in enumerate(GPUS):
        loc = "0000:" + bus.split(":", 1)[1].lower()
        t = tpl.replace("NVIDIA H200", "NVIDIA H20")
        t = re.sub(r"GPU UUID: \t .*", f"GPU UUID: \t {uuid}", t)
        t = re.sub(r"Bus Location: \t .*", f"Bus Location: \t {loc}", t)
        t = re.sub(r"Device Minor: \t .*", f"Device Minor: \t {minor}", t)
        t = re.sub(r"GPU Firmware: \t .*", f"GPU Firmware: \t {driver}", t)
        out[f"/proc/driver/nvidia/gpus/{loc}/information"] = t
    return out


def driver_files(ex: Example, driver: str, built: str) -> None:
    ex.file("/proc/driver/nvidia/version",
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  {built}\n"
            "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04)\n",
            f"derived: driver {driver} from the write-up, in the proprietary module's format (the hung-task "
            "trace shows the kernel tainted `P`); build date and GCC line invented")
    ex.file("/sys/module/nvidia/version", f"{driver}\n", f"derived: driver {driver}")
    ex.meta["remove"].append("/proc/driver/nvidia/gpus/0000:00:06.0")
    for path, text in gpu_information(driver).items():
        ex.file(path, text, "derived: the healthy capture's format; model, UUID, bus and minor of the write-up's "
                            "`nvidia-smi -L` / `nvidia-smi` table")


def build_mig_hang() -> Example:
    ex = Example("mig-nvml-hang",
                 "Incident 5a: H20 GPUs with MIG on driver 570.158.01; the NVIDIA device plugin hangs in nvmlInit, so "
                 "the kubelet's GetPreferredAllocation call never returns and every later pod stays Pending "
                 "(deleted ones Terminating).",
                 1753880700.0)  # 2025-07-30 21:05:00 +08:00, three minutes after the last kubelet line
    ex.meta["node_name"] = HOSTNAME
    ex.file("/.gpuwarden/logs/kubelet.log", KUBELET_OK + KUBELET_HUNG + KUBELET_QUEUED + KUBELET_LATER,
            "`journalctl -u kubelet` lines verbatim from the write-up (section 3.1.6: the completed admission of "
            "19:37:03 by kubelet 26361, the hung one of 20:39:03 by kubelet 45878, and its lines of 21:01:46 and "
            "21:02:03, journalctl's '>' truncation included), in time order; the two `config.go` lines of 20:41:12 "
            "and 20:52:30 are derived (upstream's V4 \"Adding new pods from source\" / \"Gracefully deleting pods "
            "from source\" for the write-up's pod neal-0729-6-68b4895fb7-6868w arriving and the stuck pod being "
            "deleted)")
    ex.file("/.gpuwarden/logs/kernel.log", KERNEL_LOG,
            "`dmesg`/syslog kernel lines verbatim from the write-up (section 3.1.4), its viewer's line numbers "
            "removed and the Jul 29 block put before the Jul 30 one")
    ex.file("/.gpuwarden/commands/nvidia-smi-q-x.xml",
            smi_xml("570.158.01", "12.8", "Wed Jul 30 21:04:51 2025", mig=True, compute_mode="Default"),
            "derived: the real `nvidia-smi -q -x` schema of the healthy H200 capture (DTD v12 as 570 prints), with the "
            "write-up's eight H20s: UUIDs and MIG devices from `nvidia-smi -L`, bus ids, persistence Off, compute "
            "mode Default, MIG Enabled on GPUs 0-2 from its `nvidia-smi` table, driver 570.158.01 / CUDA 12.8; GPU "
            "instance ids and MIG memory sizes invented; other per-GPU values are the H200's")
    driver_files(ex, "570.158.01", "Release Build  (dvs-builder@U16-I3-B13-4-3)  Fri Jun  6 01:07:48 UTC 2025")
    ex.file("/proc/sys/kernel/hostname", HOSTNAME + "\n", "verbatim: the write-up's node name")
    ex.file("/proc/sys/kernel/osrelease", KERNEL + "\n", "verbatim: `uname -a` in the write-up")
    ex.file("/etc/timezone", "Asia/Shanghai\n",
            "assumption: the write-up's journal and klog times are local; the team is in China (UTC+8)")
    return ex


def cri(lines: str, offset_s: int, zone: str = "+08:00") -> str:
    """Wrap klog lines as containerd writes them to /var/log/pods (host clock +08:00, klog's UTC)."""
    out = []
    for line in lines.splitlines():
        m = re.match(r"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6})", line)
        mon, day, h, mi, s, us = (int(x) for x in m.groups())
        h = h + offset_s // 3600
        out.append(f"2025-{mon:02d}-{day:02d}T{h:02d}:{mi:02d}:{s:02d}.{us:06d}{(us * 7) % 1000:03d}{zone} stderr F {line}")
    return "\n".join(out) + "\n"


def build_mps_missing() -> Example:
    ex = Example("mps-binary-missing",
                 "Incident 5b: after the driver upgrade to 570.172.08 the host lost nvidia-cuda-mps-control (the "
                 "compute-utils package went away, nvidia-smi stayed); the MPS control daemon crash-loops with "
                 "`exec: \"nvidia-cuda-mps-control\": executable file not found in $PATH`.",
                 1754383380.0)  # 2025-08-05 16:43:00 +08:00, two minutes after the last daemon line
    d = f"/var/log/pods/gpu-operator_{MPS_POD}_{MPS_POD_UID}/{MPS_CONTAINER}"
    ex.file(f"{d}/12.log", cri(MPS_LINES, 8 * 3600),
            "the mps-control-daemon-ctr log lines verbatim from the write-up (section 5.2), wrapped in the CRI "
            "log format containerd writes (timestamp on the host clock +08:00, stderr, F); pod name and restart "
            "count 12 from its `kubectl get pod`, pod UID invented")
    ex.file("/.gpuwarden/commands/nvidia-smi-q-x.xml",
            smi_xml("570.172.08", "12.8", "Tue Aug  5 16:42:40 2025", mig=False, compute_mode="Exclusive_Process"),
            "derived: the same eight H20s after the upgrade to 570.172.08 (the write-up's fix), MIG off; compute "
            "mode Exclusive_Process is inferred: the daemon sets it before exec'ing nvidia-cuda-mps-control and "
            "resets it only on a clean stop (k8s-device-plugin cmd/mps-control-daemon/mps/daemon.go Start/Stop)")
    driver_files(ex, "570.172.08", "Release Build  (dvs-builder@U16-I3-B13-4-3)  Tue Jul 29 00:27:11 UTC 2025")
    ex.meta["stat"]["/usr/bin/nvidia-smi"] = {"path": "/usr/bin/nvidia-smi", "kind": "file", "mode": 33261,
                                              "ctime": 1754300000.0, "mtime": 1753720000.0, "size": 1218168}
    ex.meta["missing"]["/usr/bin/nvidia-cuda-mps-control"] = ["missing", "removed with nvidia-compute-utils-570"]
    ex.origin.append("- `/usr/bin/nvidia-smi` (stat) present and `/usr/bin/nvidia-cuda-mps-control` missing: the "
                     "write-up's finding on the host (\"宿主机上...不存在nvidia-cuda-mps-control\"); stat values invented")
    ex.file("/etc/timezone", "Asia/Shanghai\n", "assumption: the team is in China (UTC+8)")
    return ex


def main() -> None:
    for ex in (build_mig_hang(), build_mps_missing()):
        ex.write()
        print("wrote", ex.dir.relative_to(REPO))


if __name__ == "__main__":
    main()
