"""Named sources: what the collectors read, declared once so `collect` captures exactly that.

Globs are expanded through the root. Each entry: (path or glob, byte cap).
Process, cgroup and log sources are found dynamically by bundle.collect.
"""

from __future__ import annotations

KB, MB = 1 << 10, 1 << 20

FILES: tuple[tuple[str, int], ...] = (
    ("/proc/sys/kernel/hostname", KB),
    ("/proc/sys/kernel/osrelease", KB),
    ("/proc/devices", 64 * KB),
    ("/proc/modules", MB),
    ("/proc/stat", MB),
    ("/proc/meminfo", 64 * KB),
    ("/proc/slabinfo", 4 * MB),
    ("/proc/zoneinfo", 4 * MB),
    ("/proc/vmstat", MB),
    ("/proc/pressure/memory", KB),
    ("/proc/pressure/io", KB),
    ("/proc/pressure/cpu", KB),
    ("/proc/driver/nvidia/version", 64 * KB),
    ("/proc/driver/nvidia/params", 64 * KB),
    ("/proc/driver/nvidia/gpus/*/information", 64 * KB),
    ("/proc/driver/nvidia-caps/mig-minors", MB),
    ("/proc/driver/nvidia/capabilities/gpu*/mig/gi*/access", KB),
    ("/sys/module/nvidia/version", KB),
    ("/var/lib/kubelet/config.yaml", MB),
    ("/var/lib/kubelet/cpu_manager_state", MB),
    ("/var/lib/kubelet/memory_manager_state", MB),
    ("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint", 16 * MB),
    ("/etc/nvidia-container-runtime/config.toml", MB),
    ("/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml", MB),
    ("/etc/containerd/config.toml", MB),
    ("/etc/cdi/*", 4 * MB),
    ("/var/run/cdi/*", 4 * MB),
    ("/etc/os-release", 64 * KB),
    ("/etc/timezone", KB),
    # memory ledger: root and system cgroups (v2, then v1 memory hierarchy)
    ("/sys/fs/cgroup/memory.stat", 64 * KB),
    ("/sys/fs/cgroup/memory.pressure", KB),
    ("/sys/fs/cgroup/system.slice/memory.stat", 64 * KB),
    ("/sys/fs/cgroup/memory/memory.stat", 64 * KB),
    ("/sys/fs/cgroup/memory/memory.usage_in_bytes", KB),
    ("/sys/fs/cgroup/memory/memory.kmem.usage_in_bytes", KB),
    ("/sys/fs/cgroup/memory/system.slice/memory.stat", 64 * KB),
    ("/run/gpuwarden/memory-samples.json", 4 * MB),  # the agent's memory samples (memory/trend.py)
    # hardware (GPU-HW-*): NVIDIA functions are picked out by `vendor`; config is read only in
    # its first 64 bytes (all 0xff = the device fell off the bus, lspci's "rev ff")
    ("/sys/bus/pci/devices/*/vendor", KB),
    ("/sys/bus/pci/devices/*/device", KB),
    ("/sys/bus/pci/devices/*/class", KB),
    ("/sys/bus/pci/devices/*/current_link_speed", KB),
    ("/sys/bus/pci/devices/*/max_link_speed", KB),
    ("/sys/bus/pci/devices/*/current_link_width", KB),
    ("/sys/bus/pci/devices/*/max_link_width", KB),
    ("/sys/bus/pci/devices/*/aer_dev_correctable", 4 * KB),
    ("/sys/bus/pci/devices/*/aer_dev_nonfatal", 4 * KB),
    ("/sys/bus/pci/devices/*/aer_dev_fatal", 4 * KB),
    ("/sys/bus/pci/devices/*/config", 64),
    # runtime and plugin (GPU-K8S-*, GPU-DEV-005)
    ("/etc/containerd/conf.d/*", MB),
    ("/etc/crio/crio.conf", MB),
    ("/etc/crio/crio.conf.d/*", MB),
    ("/proc/sys/fs/inotify/max_user_instances", KB),
    ("/proc/sys/fs/inotify/max_user_watches", KB),
    ("/sys/fs/selinux/enforce", KB),
    ("/run/nvidia/validations/*", 4 * KB),
    # the MPS control daemon's host root (the Helm chart's mps.root, /mps in its container): its
    # readiness files and each shared resource's (<domain>/<name>) MPS control log (GPU-K8S-007/011)
    ("/run/nvidia/mps/.ready", KB),
    ("/run/nvidia/mps/*/*/.started", KB),
    ("/run/nvidia/mps/*/*/log/control.log", 256 * KB),
    ("/run/nvidia/mps/*/*/pipe/nvidia-cuda-mps-control.pid", KB),
    # DRA (facts/dra.py, GPU-DRA-*): the kubelet's claim state and the NVIDIA DRA driver's checkpoint
    ("/var/lib/kubelet/dra_manager_state", 16 * MB),
    ("/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json", 16 * MB),
    # the DRA driver's per-claim MPS control daemons (facts/mps.py, GPU-K8S-011)
    ("/var/lib/kubelet/plugins/gpu.nvidia.com/mps/*/log/startup.log", KB),
    ("/var/lib/kubelet/plugins/gpu.nvidia.com/mps/*/log/control.log", 256 * KB),
    ("/var/lib/kubelet/plugins/gpu.nvidia.com/mps/*/pipe/nvidia-cuda-mps-control.pid", KB),
)

#: device nodes and links whose stat/readlink the rules need
DEVICE_GLOBS: tuple[str, ...] = (
    "/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/char/*", "/etc/localtime",
    # the driver bound to each PCI function (GPU-HW-007: vfio-pci is not a missing GPU)
    "/sys/bus/pci/devices/*/driver",
    # the user-space NVML library's version is in its link target (GPU-DRV-002)
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1", "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
)

#: sockets whose stat (mtime) the rules need: GPU-K8S-002 compares the plugin's with kubelet.sock
SOCKET_GLOBS: tuple[str, ...] = ("/var/lib/kubelet/device-plugins/*.sock", "/run/nvidia/mps/*/*/pipe/*",
                                  # DRA drivers' registration and service sockets (facts/dra.py): existence and type
                                  "/var/lib/kubelet/plugins_registry/*-reg.sock", "/var/lib/kubelet/plugins/*/dra.sock")

#: paths whose stat alone (mtime) the rules need: systemd re-creates its generator directories on
#: every daemon-reload, so they date the last one (facts/reapply.py, GPU-DEV-003)
STAT_PATHS: tuple[str, ...] = ("/run/systemd/generator", "/run/systemd/generator.late")

#: directories whose listing the rules need (globs expanded through the root)
LISTINGS: tuple[str, ...] = (
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins",
    "/var/lib/kubelet/plugins/gpu.nvidia.com/mps", "/var/lib/kubelet/plugins/gpu.nvidia.com/mps/*",
    "/var/lib/kubelet/plugins/gpu.nvidia.com/mps/*/pipe", "/var/lib/kubelet/plugins/gpu.nvidia.com/mps/*/log",
    "/etc/cdi", "/var/run/cdi",
    "/var/log/pods",
    "/var/log/containers",
    "/sys/fs/cgroup",
    "/usr/bin",
    "/sys/bus/pci/devices",
    "/run/nvidia/validations",
    "/run/nvidia/mps", "/run/nvidia/mps/*", "/run/nvidia/mps/*/*", "/run/nvidia/mps/*/*/pipe", "/run/nvidia/mps/*/*/log",
)

#: processes worth capturing whole (argv, stat, environ allow-list, /dev view)
PROCESS_NAMES: tuple[str, ...] = (
    "kubelet", "containerd", "dockerd", "crio", "nvidia-device-plugin", "k8s-device-plugin",
    "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-persistenced", "nv-fabricmanager",
    "mps-control-daemon", "gpuwarden", "gpu-kubelet-plugin",
)

#: per-cgroup files kept for every pod and container cgroup
CGROUP_FILES: tuple[str, ...] = (
    "devices.list", "cgroup.procs", "memory.stat", "memory.current", "memory.max", "memory.min",
    "memory.pressure", "memory.events", "memory.low", "memory.usage_in_bytes", "memory.limit_in_bytes",
    "memory.kmem.usage_in_bytes", "memory.max_usage_in_bytes", "cpuset.cpus", "cpuset.cpus.effective",
)

#: commands whose output is captured (argv, output name); each bounded by --timeout
COMMANDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("nvidia-smi", "-q", "-x"), "nvidia-smi-q-x.xml"),
    (("runc", "--version"), "runc-version.txt"),
    (("containerd", "--version"), "containerd-version.txt"),
    (("systemctl", "--version"), "systemctl-version.txt"),
    (("nvidia-ctk", "--version"), "nvidia-ctk-version.txt"),
    (("nvidia-container-cli", "--version"), "nvidia-container-cli-version.txt"),
)

#: journald units captured as `journalctl -o json` lines
JOURNAL_UNITS: tuple[str, ...] = ("kubelet", "containerd")
LOG_FILES: dict[str, tuple[str, ...]] = {
    "kubelet.log": ("/var/log/kubelet.log", "/var/log/kubelet/kubelet.log"),
    "containerd.log": ("/var/log/containerd.log",),
}
