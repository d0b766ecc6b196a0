"""Throughput check for the log scanner (not a test): synthetic --v=4 kubelet log vs `grep -c`.

Usage: python tools/bench_log_scan.py [--mb 200] [--path /tmp/gw-kubelet-200m.log]

The synthetic lines are shaped after the incident 5 kubelet log (cadvisor factory chatter,
sandbox network stats, housekeeping) with a GPU admission every few thousand lines and one hung
GetPreferredAllocation near the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

NOISE = [
    'I0730 {t} 45878 factory.go:260] Factory "containerd" was unable to handle container "/user.slice/user-40489916.slice/session-{n}.scope"\n',
    'I0730 {t} 45878 factory.go:260] Factory "systemd" was unable to handle container "/system.slice/sssd-ssh.socket"\n',
    'I0730 {t} 45878 factory.go:253] Factory "raw" can handle container "/system.slice/nvidia-fabricmanager.service", but ignoring.\n',
    'I0730 {t} 45878 manager.go:919] ignoring container "/system.slice/sssd-ssh.socket"\n',
    'I0730 {t} 45878 cri_stats_provider.go:499] "Unable to find network stats for sandbox" sandboxID="4349bc2464369f69eba8add{n}"\n',
    'I0730 {t} 45878 fs.go:419] unable to determine file system type, partition mountpoint does not exist: /run/containerd/io.containerd.runtime.v2.task/k8s.io/{n}/rootfs\n',
    'I0730 {t} 45878 reflector.go:323] Listing and watching *v1.ConfigMap from object-"mck-test"/"kube-root-ca.crt"\n',
    'I0730 {t} 45878 status_manager.go:217] "Syncing updated statuses"\n',
    'I0730 {t} 45878 kubelet_pods.go:1591] "Got phase for pod" pod="mck-test/neal-0729-1-6f67d4dd6f-bw8pz" oldPhase=Running phase=Running\n',
    'I0730 {t} 45878 generic.go:224] "GenericPLEG: Relisting"\n',
]
ADMIT = [
    'I0730 {t} 45878 kubelet.go:2343] "SyncLoop ADD" source="api" pods=[mck-test/p-{n}]\n',
    'I0730 {t} 45878 manager.go:773] "Looking for needed resources" needed=1 resourceName="nvidia.com/gpu"\n',
    'I0730 {t} 45878 manager.go:548] "Need devices to allocate for pod" deviceNumber=1 resourceName="nvidia.com/gpu" podUID="uid-{n}" containerName="c-{n}"\n',
    'I0730 {t} 45878 manager.go:956] "Issuing a GetPreferredAllocation call for container" containerName="c-{n}" podUID="uid-{n}"\n',
    'I0730 {t} 45878 manager.go:819] "Making allocation request for device plugin" devices=[GPU-{n}] resourceName="nvidia.com/gpu"\n',
    'I0730 {t} 45878 kubelet.go:2392] "SyncLoop (housekeeping)"\n',
]


def make(path: Path, mb: int) -> None:
    target = mb << 20
    size = 0
    n = 0
    sec = 0
    with open(path, "w") as f:
        while size < target:
            n += 1
            if n % 50 == 0:
                sec += 1
            t = f"{(sec // 3600) % 24:02d}:{(sec // 60) % 60:02d}:{sec % 60:02d}.{n % 1000000:06d}"
            tpl = ADMIT[(n // 3000) % len(ADMIT)] if n % 3000 == 0 else NOISE[n % len(NOISE)]
            line = tpl.format(t=t, n=n)
            f.write(line)
            size += len(line)
        t = "23:59:58.000001"
        line = ADMIT[3].format(t=t, n="hung")
        f.write(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--path", default="/tmp/gw-kubelet-200m.log")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    p = Path(a.path)
    if not p.exists() or p.stat().st_size < (a.mb << 20):
        make(p, a.mb)
    from gpuwarden.logs import scanner as logfacts
    from gpuwarden.root import HostRoot

    size = p.stat().st_size
    root = HostRoot("/")
    subprocess.run(["cat", str(p)], stdout=subprocess.DEVNULL)  # warm the page cache
    logfacts.scan_path(root, __file__, "kubelet", "klog", ref_time=time.time())  # load tables
    tg = ts = float("inf")
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        out = subprocess.run(["grep", "-c", "Issuing a GetPreferredAllocation", str(p)],
                             capture_output=True, text=True)
        tg = min(tg, time.perf_counter() - t0)
        t0 = time.perf_counter()
        scan = logfacts.scan_path(root, str(p), "kubelet", "klog", ref_time=time.time())
        ts = min(ts, time.perf_counter() - t0)
    print(f"size {size / 1e6:.0f} MB, best of {a.repeat}")
    print(f"grep -c      : {tg:.3f} s  {size / tg / 1e6:.0f} MB/s  (count {out.stdout.strip()})")
    print(f"scan         : {ts:.3f} s  {size / ts / 1e6:.0f} MB/s  ({len(scan.events)} events kept, "
          f"{sum(scan.counts.values())} hits); throughput ratio to grep -c {tg / ts:.2f}")


if __name__ == "__main__":
    main()
