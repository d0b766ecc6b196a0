#!/usr/bin/env python3
"""What the event sources cost on a healthy, idle node: wake-ups per idle minute, CPU per hour (issue 41).

    python3 bench/wake_idle.py --minutes 2 --out idle.json            # a node tree (the healthy example; root: mknod)
    python3 bench/wake_idle.py --root / --minutes 5 --out idle.json   # this host, as the DaemonSet runs (as root)

Runs the real agent's event loop at the chart's interval (60 s) twice for --minutes each: with the event
sources on (the default) and off (`--no-wake`: the periodic check alone), and reports for each the
wake-ups the sources emitted, the checks run (full and targeted), and the process's CPU time
(getrusage: every thread, the sources' included) per hour. On an idle node the two should be the same:
the sources sleep in poll(2) with no timeout and nothing wakes them. Writes JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if (REPO / "src" / "gpuwarden").is_dir():
    sys.path.insert(0, os.environ.get("GPUWARDEN_SRC") or str(REPO / "src"))
sys.path.insert(0, str(REPO))


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def run(root_dir: str, minutes: float, wake: bool, live_probes: bool) -> dict[str, Any]:
    from gpuwarden.agent.config import AgentConfig
    from gpuwarden.agent.loop import Agent
    from gpuwarden.kube.log import Log
    from gpuwarden.root import HostRoot

    cfg = AgentConfig(node_name="idle-bench", kube=False, listen="", probes=live_probes, grpc=live_probes,
                      boot_grace_s=0, interval_s=60.0, wake=wake, log_format="text", memory_samples_file="")
    log = io.StringIO()
    a = Agent(cfg, root=HostRoot(root_dir), log=Log("text", node="idle-bench", stream=log), out=io.StringIO())
    t = threading.Thread(target=a.run, daemon=True)
    c0, t0 = cpu_s(), time.monotonic()
    t.start()
    time.sleep(minutes * 60)
    child = _nvml_child_cpu_s(a)  # read before stop: the child is killed with its source
    a.stop()
    t.join(30)
    took, cpu = time.monotonic() - t0, cpu_s() - c0
    reg = a.metrics.registry
    wakeups = sum(s.value for m in reg.collect() if m.name == "gpuwarden_wakeups" for s in m.samples
                  if s.name.endswith("_total"))
    by = {f'{s.labels["source"]}/{s.labels["topic"]}': s.value for m in reg.collect() if m.name == "gpuwarden_wakeups"
          for s in m.samples if s.name.endswith("_total")}
    up = {s.labels["source"]: s.value for m in reg.collect() if m.name == "gpuwarden_wake_source_up" for s in m.samples}
    loop = a.loop
    return {"wake": wake, "seconds": round(took, 1), "wakeups": wakeups, "wakeups_by_source_topic": by,
            "wakeups_per_idle_minute": round(wakeups / (took / 60), 3), "full_checks": loop.checks,
            "targeted_checks": loop.targeted, "cpu_s": round(cpu, 3),
            "cpu_s_per_hour": round(cpu / took * 3600, 2), "sources_up": up,
            "nvml_child_cpu_s": child,  # the NVML event child's own CPU since its start (not in cpu_s: not yet reaped)
            "unavailable": [ln.split("why=", 1)[-1][:200] for ln in log.getvalue().splitlines()
                            if "wake-source-unavailable" in ln]}


def _nvml_child_cpu_s(agent: Any) -> float | None:
    """utime + stime of the NVML event child (wake/nvml.py) from /proc, None without one."""
    loop = agent.loop
    src = next((x for x in (loop.running if loop else []) if getattr(x, "name", "") == "nvml"), None)
    pid = getattr(src, "child_pid", None)
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 3)


def warm(root_dir: str, live: bool) -> None:
    from gpuwarden.agent.config import AgentConfig
    from gpuwarden.agent.loop import Agent
    from gpuwarden.kube.log import Log
    from gpuwarden.root import HostRoot

    cfg = AgentConfig(node_name="idle-bench", kube=False, listen="", probes=live, grpc=live, boot_grace_s=0,
                      memory_samples_file="")
    Agent(cfg, root=HostRoot(root_dir), log=Log("text", node="idle-bench", stream=io.StringIO()),
          out=io.StringIO()).check()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="", help="a live root (/); empty: a node tree of the healthy example")
    ap.add_argument("--minutes", type=float, default=2.0, help="per mode (sources on, then off)")
    ap.add_argument("--modes", default="on,off", help="which runs: on (the sources), off (--no-wake), or both")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip() in ("on", "off")]
    work = None
    if args.root:
        root = args.root
    else:
        from gpuwarden.examples import open_example
        from tests.support.bundles import materialize

        work = Path(tempfile.mkdtemp(prefix="gwidle", dir="/tmp"))
        root = str(materialize(open_example("healthy"), work / "root"))
    try:
        live = bool(args.root)
        warm(root, live)  # imports and first-check caches paid before either measurement
        res = {"bench": "wake_idle", "host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
               "root": args.root or "tree:healthy", "interval_s": 60, "minutes_each": args.minutes}
        for m in modes:
            res[m] = run(root, args.minutes, m == "on", live)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    if "on" in res:
        on = res["on"]
        print(f"sources on : {on['wakeups_per_idle_minute']} wake-ups/idle min, {on['targeted_checks']} targeted checks, "
              f"{on['cpu_s_per_hour']} CPU s/h ({on['full_checks']} full checks); up: {on['sources_up']}; "
              f"NVML child CPU {on['nvml_child_cpu_s']} s; unavailable: {on['unavailable']}")
    if "off" in res:
        print(f"sources off: {res['off']['cpu_s_per_hour']} CPU s/h ({res['off']['full_checks']} full checks)")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
