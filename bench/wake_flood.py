#!/usr/bin/env python3
"""A kernel-log flood against the event-driven agent: its CPU, RSS, checks and API writes (issue 41).

    python3 bench/wake_flood.py --rate 100000 --seconds 10 --out flood.json   # as root (the tree's mknod)

The agent runs on a node tree of the `healthy` example at the chart's defaults with remediation on
against the offline API stand-in; a separate process appends `--rate` Xid 13 lines a second (a user
application's graphics exceptions, each line a finding line) to the tree's captured kernel log for
`--seconds` (or, with `--lines noise`, lines no kernel signature anchors), then one Xid 79. Reported: the agent process's CPU (getrusage, all its threads; the
writer is another process), its RSS before and after (VmRSS, VmHWM), the checks it ran, the API writes
it made (Node status patches, Events), and when the Xid 79 was raised after it was written.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if (REPO / "src" / "gpuwarden").is_dir():
    sys.path.insert(0, os.environ.get("GPUWARDEN_SRC") or str(REPO / "src"))
sys.path.insert(0, str(REPO))

WRITER = r"""
import sys, time
path, rate, seconds, kind = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
line = (b"4,1000,99999999,-;NVRM: Xid (PCI:0000:00:06): 13, pid=4242, Graphics SM Warp Exception\n" if kind == "xid13"
        else b"4,1000,99999999,-;mlx5_core 0000:3b:00.0 eth2: Link down, carrier lost, renegotiating\n")
chunk = max(1, rate // 100)
t0 = time.monotonic(); n = 0
with open(path, "ab") as f:
    while time.monotonic() - t0 < seconds:
        f.write(line * chunk); f.flush(); n += chunk
        nxt = t0 + n / rate
        d = nxt - time.monotonic()
        if d > 0:
            time.sleep(d)
print(n, round(time.monotonic() - t0, 2))
"""


def vm(field: str) -> int:
    for ln in open("/proc/self/status"):
        if ln.startswith(field + ":"):
            return int(ln.split()[1])
    return 0


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--lines", choices=("noise", "xid13"), default="xid13",
                    help="noise: a NIC's link flaps (no kernel signature: nothing wakes); xid13: every line a finding line")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)

    from gpuwarden.agent.config import AgentConfig
    from gpuwarden.agent.loop import Agent
    from gpuwarden.agent.offline import OfflineKube, example_pods
    from gpuwarden.examples import open_example
    from gpuwarden.kube.log import Log
    from gpuwarden.root import HostRoot
    from tests.support.bundles import materialize

    work = Path(tempfile.mkdtemp(prefix="gwflood", dir="/tmp"))
    tree = materialize(open_example("healthy"), work / "root")
    root = HostRoot(str(tree))
    out = io.StringIO()
    kube = OfflineKube("flood-node", example_pods(root, "flood-node"), out)
    cfg = AgentConfig(node_name="flood-node", kube=False, listen="", probes=False, grpc=False, boot_grace_s=0,
                      interval_s=60.0, remediate="on", log_format="text", memory_samples_file="")
    a = Agent(cfg, kube=kube, root=root, log=Log("text", node="flood-node", stream=io.StringIO()), out=out)
    t = threading.Thread(target=a.run, daemon=True)
    t.start()
    while a.checks < 1:
        time.sleep(0.01)
    time.sleep(0.5)
    rss0, c0, checks0, w0 = vm("VmRSS"), cpu(), a.checks, kube.written
    s0 = sum(1 for m, p, _ in list(kube.writes) if p.endswith("/status"))
    kmsg = tree / ".gpuwarden/logs/kmsg.txt"
    size0 = kmsg.stat().st_size
    w = subprocess.run([sys.executable, "-c", WRITER, str(kmsg), str(args.rate), str(args.seconds), args.lines],
                       capture_output=True, text=True)
    lines, took = w.stdout.split()
    t79 = time.monotonic()
    with open(kmsg, "a") as f:
        f.write("3,2000,99999999,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.\n")
    raised = None
    while time.monotonic() - t79 < 30:
        if a.debounce.raised("GPU-HW-002"):
            raised = time.monotonic() - t79
            break
        time.sleep(0.002)
    time.sleep(1.0)
    c1 = cpu()
    res = {"bench": "wake_flood", "line": args.lines, "rate_lines_per_s": args.rate, "lines": int(lines), "seconds": float(took),
           "log_grew_mib": round((kmsg.stat().st_size - size0) / 2**20, 1),
           "agent_cpu_s": round(c1 - c0, 2), "agent_cpu_share_pct": round((c1 - c0) / (float(took) + 1 + (raised or 0)) * 100, 1),
           "rss_kib_before": rss0, "rss_kib_after": vm("VmRSS"), "hwm_kib": vm("VmHWM"),
           "checks": a.checks - checks0, "targeted": a.loop.targeted, "api_writes": kube.written - w0,
           "node_status_writes": sum(1 for m, p, _ in list(kube.writes) if p.endswith("/status")) - s0,
           "xid79_raised_after_s": raised}
    a.stop()
    t.join(10)
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
