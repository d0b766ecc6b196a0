#!/usr/bin/env python3
"""Measure the agent's CPU share and memory at its default interval (docs/agent.md "Footprint").

    .venv/bin/python tools/measure_agent.py [--seconds 130] [--example uvm-missing] [--no-kube]

Starts etcd + the test API server (tests/support/apiserver.py) unless --no-kube, registers the
example's Node, runs `gpuwarden agent --example NAME` as a child at the default interval with
remediation in dry-run, and samples its /proc/<pid>/stat and /status once a second. Prints one
JSON object: CPU share over the run ((utime+stime, own and reaped children's) / wall), RSS (mean, max) and VmHWM, checks run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]


def sample(pid: int) -> tuple[float, int, int]:
    tick = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    # utime + stime + cutime + cstime: probe children (NVML, bpf) are reaped by the agent
    cpu = (int(parts[11]) + int(parts[12]) + int(parts[13]) + int(parts[14])) / tick
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return cpu, rss, hwm


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=130.0)
    ap.add_argument("--example", default="uvm-missing")
    ap.add_argument("--no-kube", action="store_true")
    ap.add_argument("--root", default="", help="measure on a live root (e.g. /) instead of an example")
    ap.add_argument("agent_args", nargs="*", help="more `gpuwarden agent` options (after --)")
    a = ap.parse_args()
    server = None
    where = ["--root", a.root] if a.root else ["--example", a.example]
    args = [sys.executable, "-m", "gpuwarden", "agent", *where, "--node-name", "gpu-node-a",
            "--listen", "127.0.0.1:0", "--boot-grace", "0", "--remediate", "dry-run"]
    args += a.agent_args
    if a.no_kube:
        args.append("--no-kube")
    else:
        from gpuwarden.kube.client import Kube
        from tests.support.apiserver import start_apiserver
        from tests.support.agent_kube import make_node

        server = start_apiserver()
        make_node(Kube(server.api_client()), "gpu-node-a")
        args += ["--kubeconfig", server.kubeconfig_path]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    try:
        t0 = time.monotonic()
        rss: list[int] = []
        cpu = hwm = 0
        while time.monotonic() - t0 < a.seconds and proc.poll() is None:
            cpu, r, hwm = sample(proc.pid)
            rss.append(r)
            time.sleep(1.0)
        wall = time.monotonic() - t0
        cpu, r, hwm = sample(proc.pid)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
        if server is not None:
            server.stop()
    checks = [json.loads(l) for l in err.splitlines() if l.startswith("{") and '"msg": "check"' in l]
    out = {"root": a.root or f"example:{a.example}", "kube": not a.no_kube, "interval_s": 60, "wall_s": round(wall, 1),
           "cpu_s": round(cpu, 2), "cpu_share_pct": round(100 * cpu / wall, 2),
           "rss_mean_mib": round(sum(rss) / len(rss) / 2**20, 1), "rss_max_mib": round(max(rss) / 2**20, 1),
           "vmhwm_mib": round(hwm / 2**20, 1), "checks": len(checks),
           "check_s": [c.get("duration_s") for c in checks]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
