#!/usr/bin/env python3
"""Kernel-log scan speed (issue 23): the shipped kernel signatures vs `grep -c NVRM`, in one run.

    .venv/bin/python bench/kernel_scan.py [--compare OLD_log_signatures.yaml] [-n 9]

Builds a 64 MB rsyslog-style kern.log (cached in $GPUWARDEN_BENCH_DATA or ~/.cache/gpuwarden-bench)
with one NVRM line per 1000, an Xid per 20 000 and an SXid per 50 000 lines, and times the main pass
of the kernel log (`logscan.scan` with every kernel signature), interleaved with `grep -c NVRM` and,
with --compare, with the kernel signatures of another table (e.g. `git show c008075:src/gpuwarden/data/
log_signatures.yaml`). Median of n; page cache warm. Results: docs/performance.md §4.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import statistics
import subprocess
import time
from pathlib import Path

from gpuwarden.logs import signatures as logsignatures
from gpuwarden.logs.decode import decoder
from gpuwarden.logs.scan import scan

LINES = ("eth0: link up", 'audit: type=1400 audit(1700000000.1:2): apparmor="STATUS"',
         "EXT4-fs (nvme0n1p1): mounted filesystem", "IPv6: ADDRCONF(NETDEV_CHANGE): veth1234: link becomes ready",
         "cni0: port 3(veth5678) entered forwarding state")
NVRM = "NVRM: GPU at PCI:0000:18:00: GPU-5fc0bcec-c2e1-38dc-8994-2a9f9f3b709e"
XID = "NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=python3, Graphics SM Warp Exception"
SXID = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate"


def build(path: Path, size: int = 64 << 20) -> None:
    rnd = random.Random(1)
    with path.open("w") as f:
        n = 0
        while f.tell() < size:
            n += 1
            m = XID if n % 20000 == 0 else SXID if n % 50000 == 0 else NVRM if n % 1000 == 0 else rnd.choice(LINES)
            f.write(f"Nov 22 02:12:{n % 60:02d} gpu-node-1 kernel: [{n / 100:12.6f}] {m}\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", type=Path)
    ap.add_argument("-n", type=int, default=9)
    a = ap.parse_args()
    data = Path(os.environ.get("GPUWARDEN_BENCH_DATA", Path.home() / ".cache/gpuwarden-bench"))
    data.mkdir(parents=True, exist_ok=True)
    log = data / "kern-64m.log"
    if not log.exists():
        build(log)
    sets = {"shipped": logsignatures.for_log("kernel")}
    if a.compare:
        sets["compare"] = [s for s in logsignatures.load(a.compare.read_text()).values()
                           if s.applies_to("kernel") and s.phase == "main"]
    dec = decoder("kernel", 1795313561.0, dt.timezone.utc, 1795313527.0)
    times: dict[str, list[float]] = {k: [] for k in (*sets, "grep -c NVRM")}
    for _ in range(a.n):
        for name, sigs in sets.items():
            t = time.perf_counter()
            with log.open("rb") as f:
                scan(f, sigs, dec, log="kernel", source=str(log), fmt="kernel")
            times[name].append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run(["grep", "-c", "NVRM", str(log)], capture_output=True, check=False)
        times["grep -c NVRM"].append(time.perf_counter() - t)
    size = log.stat().st_size
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, m in med.items():
        anchors = f", {len({s.anchor for s in sets[k]})} anchors" if k in sets else ""
        print(f"{k:14s} {m * 1e3:7.0f} ms  {size / m / 1e6:6.0f} MB/s{anchors}")
    if "compare" in med:
        print(f"shipped / compare: {med['shipped'] / med['compare']:.2f}")
    print(f"shipped / grep -c: {med['shipped'] / med['grep -c NVRM']:.1f}")


if __name__ == "__main__":
    main()
