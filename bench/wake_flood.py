#!/usr/bin/env python3
"""A kernel-log flood against the event-driven agent: its CPU, RSS, checks and API writes (issue 41).

    python3 bench/wake_flood.py --rate 100000 --seconds 10 --out flood.json   # as root (the tree's mknod)
    python3 bench/wake_flood.py --during --trials 10 --seconds 4              # the Xid 79 inside the flood
    python3 bench/wake_flood.py --during --trials 10 --seconds 4 --no-bulk    # the peer: every line read

The agent runs on a node tree of the `healthy` example at the chart's defaults with remediation on
against the offline API stand-in; a separate process appends `--rate` Xid 13 lines a second (a user
application's graphics exceptions, each line a finding line) to the tree's captured kernel log for
`--seconds` (or, with `--lines noise`, lines no kernel signature anchors), then one Xid 79. Reported: the agent process's CPU (getrusage, all its threads; the
writer is another process), its RSS before and after (VmRSS, VmHWM), the checks it ran, the API writes
it made (Node status patches, Events), and when the Xid 79 was raised after it was written. With
`--during` the writer puts the Xid 79 in the middle of the flood (the flood goes on after it): the case of
issue 41 where a flood of one code must not delay a later, different one; `--trials` gives P50 / P99.
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
path, rate, seconds, kind, at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], float(sys.argv[5])
line = (b"4,1000,99999999,-;NVRM: Xid (PCI:0000:00:06): 13, pid=4242, Graphics SM Warp Exception\n" if kind == "xid13"
        else b"4,1000,99999999,-;mlx5_core 0000:3b:00.0 eth2: Link down, carrier lost, renegotiating\n")
X79 = b"3,2000,99999999,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.\n"
chunk = max(1, rate // 100)
t0 = time.monotonic(); n = 0; t79 = 0.0
with open(path, "ab") as f:
    while time.monotonic() - t0 < seconds:
        if at >= 0 and not t79 and time.monotonic() - t0 >= at:  # the later fault, in the middle of the flood
            f.write(X79); f.flush(); t79 = time.monotonic()
        f.write(line * chunk); f.flush(); n += chunk
        nxt = t0 + n / rate
        d = nxt - time.monotonic()
        if d > 0:
            time.sleep(d)
print(n, round(time.monotonic() - t0, 2), t79)
"""


def vm(field: str) -> int:
    for ln in open("/proc/self/status"):
        if ln.startswith(field + ":"):
            return int(ln.split()[1])
    return 0


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None


def trial(args: argparse.Namespace, tree: Path, original: bytes, at: float) -> dict:
    """One agent on the tree (its kernel log restored), one flood, the Xid 79 `at` s into it (or after it)."""
    from gpuwarden.agent.config import AgentConfig
    from gpuwarden.agent.loop import Agent
    from gpuwarden.agent.offline import OfflineKube, example_pods
    from gpuwarden.kube.log import Log
    from gpuwarden.root import HostRoot

    kmsg = tree / ".gpuwarden/logs/kmsg.txt"
    kmsg.write_bytes(original)
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
    rss0, c0, checks0, w0, wall0 = vm("VmRSS"), cpu(), a.checks, kube.written, time.monotonic()
    s0 = sum(1 for m, p, _ in list(kube.writes) if p.endswith("/status"))
    size0 = kmsg.stat().st_size
    raised: list[float] = []

    def watch() -> None:  # the raise, seen while the flood goes on
        while not raised and not stop.is_set():
            if a.debounce.raised("GPU-HW-002"):
                raised.append(time.monotonic())
                return
            time.sleep(0.002)

    stop = threading.Event()
    wt = threading.Thread(target=watch, daemon=True)
    wt.start()
    w = subprocess.run([sys.executable, "-c", WRITER, str(kmsg), str(args.rate), str(args.seconds), args.lines,
                        str(at)], capture_output=True, text=True)
    lines, took, t79s = w.stdout.split()
    t79 = float(t79s)
    if at < 0:  # after the flood
        t79 = time.monotonic()
        with open(kmsg, "a") as f:
            f.write("3,2000,99999999,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.\n")
    wt.join(max(0.0, t79 + 30 - time.monotonic()))
    stop.set()
    time.sleep(1.0)
    c1, wall = cpu(), time.monotonic() - wall0
    res = {"lines": int(lines), "seconds": float(took), "xid79_at_s": round(at, 2) if at >= 0 else "after",
           "log_grew_mib": round((kmsg.stat().st_size - size0) / 2**20, 1),
           "agent_cpu_s": round(c1 - c0, 2), "wall_s": round(wall, 2),
           "agent_cpu_share_pct": round((c1 - c0) / wall * 100, 1),
           "rss_kib_before": rss0, "rss_kib_after": vm("VmRSS"), "hwm_kib": vm("VmHWM"),
           "checks": a.checks - checks0, "targeted": a.loop.targeted, "api_writes": kube.written - w0,
           "node_status_writes": sum(1 for m, p, _ in list(kube.writes) if p.endswith("/status")) - s0,
           "xid79_raised_after_s": round(raised[0] - t79, 3) if raised else None}
    a.stop()
    t.join(10)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--lines", choices=("noise", "xid13"), default="xid13",
                    help="noise: a NIC's link flaps (no kernel signature: nothing wakes); xid13: every line a finding line")
    ap.add_argument("--during", action="store_true",
                    help="write the Xid 79 in the middle of the flood (at a random point of its middle half), not after it")
    ap.add_argument("--trials", type=int, default=1, help="agents run one after another (P50 / P99 of the raise)")
    ap.add_argument("--no-bulk", action="store_true",
                    help="the peer: every matching line read one by one (no flood class counted in bulk, logs/flood.py)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)

    import random

    from gpuwarden.examples import open_example
    from gpuwarden.logs import flood
    from tests.support.bundles import materialize

    if args.no_bulk:
        flood.MAX_CLASSES = 0
    work = Path(tempfile.mkdtemp(prefix="gwflood", dir="/tmp"))
    tree = materialize(open_example("healthy"), work / "root")
    original = (tree / ".gpuwarden/logs/kmsg.txt").read_bytes()
    rng = random.Random(41)
    runs = []
    for _ in range(max(1, args.trials)):
        at = rng.uniform(args.seconds / 4, args.seconds * 3 / 4) if args.during else -1.0
        runs.append(trial(args, tree, original, at))
    lat = [r["xid79_raised_after_s"] for r in runs]
    res = {"bench": "wake_flood", "line": args.lines, "rate_lines_per_s": args.rate, "seconds": args.seconds,
           "xid79": "during the flood" if args.during else "after the flood",
           "bulk": not args.no_bulk, "trials": len(runs), "not_raised_in_30s": sum(1 for x in lat if x is None),
           "xid79_raised_p50_s": pct(lat, 0.5), "xid79_raised_p99_s": pct(lat, 0.99),
           "agent_cpu_share_pct_max": max(r["agent_cpu_share_pct"] for r in runs),
           "rss_kib_after_max": max(r["rss_kib_after"] for r in runs),
           "api_writes_max": max(r["api_writes"] for r in runs),
           "load_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(), "runs": runs}
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
