#!/usr/bin/env python3
"""The agent soak with the real NVIDIA device plugin beside it, registered, on a GPU host (as root).

    python3 bench/agent_soak_plugin.py [--plugin BINARY] [--wait 30] [agent_soak options] [-- agent options]

Starts the kubelet stand-in (tests/support/kubelet_standin.py: the Registration service, one
ListAndWatch stream, as the kubelet keeps) and the real plugin (tests/support/realplugin.py: the
binary from $GPUWARDEN_DEVICE_PLUGIN or ../shared/tools/nvidia-device-plugin/, checked against its
SHA256SUMS), both on a private device-plugin directory (the plugin in its own mount namespace, /var/lib
bound to a temp dir: nothing is written in the host's /var/lib), waits until the plugin has
registered `nvidia.com/gpu`, measures the plugin alone for --idle seconds (its own footprint), then runs bench/agent_soak.py (a process of its own) with `--plugin-pid` set to the plugin and
the agent's `--device-plugin-dir` on that directory (so each agent check probes the real plugin
over gRPC, as on a node), and stops both. Every other option goes to bench/agent_soak.py (default
`--root /`). The JSON gains `plugin`: the binary, whether it registered, its devices, its footprint alone, the
CPU that serving the agent's probes added per check, its RSS for --idle-after seconds once the agent has
stopped (does what the probes added come back?), its Go heap (the plugin runs with GODEBUG=gctrace=1,
whose lines give the live heap after each collection: a leak raises it, garbage not yet returned to the
kernel does not), the verdict on the plugin (FLAT / GROWING, as agent_soak.py's), and its log's tail.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

RESOURCE = "nvidia.com/gpu"
#: Go's gctrace line: "gc 12 @3.1s 0%: ... ms cpu, 4->4->2 MB, 5 MB goal, ..." (heap at start -> at end -> live)
_GCTRACE = re.compile(r"^gc (\d+) @([\d.]+)s .*?, (\d+)->(\d+)->(\d+) MB, (\d+) MB goal", re.M)


def main() -> int:
    argv = sys.argv[1:]
    agent_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, agent_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plugin", help="the plugin binary or its .xz (default: as tests/support/realplugin.py finds it)")
    ap.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the plugin's registration")
    ap.add_argument("--idle", type=float, default=60.0, help="seconds the plugin is measured alone first (its own "
                    "footprint; in the soak it also serves the agent's probes, one per check)")
    ap.add_argument("--idle-after", type=float, default=60.0, help="seconds the plugin is measured alone after the "
                    "soak (what the probes added, returned or not)")
    ap.add_argument("--out", default="bench/results/agent-soak-plugin.json")
    a, soak_args = ap.parse_known_args(argv)
    if a.plugin:
        os.environ["GPUWARDEN_DEVICE_PLUGIN"] = a.plugin
    from tests.support import realplugin

    binary = realplugin.unpack()
    var_lib = Path(tempfile.mkdtemp(prefix="gw-soak-varlib-"))
    kdir = var_lib / "kubelet" / "device-plugins"
    kdir.mkdir(parents=True)
    info: dict = {"binary": str(binary.name), "registered": False}
    try:
        rc = _run(a, soak_args, agent_args, binary, var_lib, kdir, info)
    finally:
        shutil.rmtree(var_lib, ignore_errors=True)
    if rc == 0:
        doc = json.loads(Path(a.out).read_text())
        soak = doc["summary"].get("plugins", {})
        if soak and info.get("alone", {}).get("cpu_s") is not None:
            p = next(iter(soak.values()))
            if p.get("cpu_s") is not None:  # what serving the agent's probes added, per check
                extra = p["cpu_s"] - info["alone"]["cpu_s"] / info["alone"]["window_s"] * doc["summary"]["window_s"]
                info["cpu_added_per_agent_check_s"] = extra / doc["summary"]["checks"]
        if soak:
            p = next(iter(soak.values()))
            info["flat"] = _plugin_verdict(p, info)
        doc["plugin"] = info
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    alone = info.get("alone", {})
    print(f"  plugin {info['binary']}: registered {info['registered']} {info.get('devices', '')}; alone for "
          f"{alone.get('window_s', 0):.0f} s: CPU {alone.get('cpu_pct_of_core')}% of a core, RSS {alone.get('rss_kb')} KiB; "
          f"serving the agent's probes added {info.get('cpu_added_per_agent_check_s')} s CPU per check")
    after, heap, fl = info.get("after", {}), info.get("go_heap", {}), info.get("flat", {})
    if after:
        print(f"  plugin RSS at the soak's end {after.get('rss_kb_start')} KiB, {after.get('window_s', 0):.0f} s later "
              f"{after.get('rss_kb_end')} KiB (min {after.get('rss_kb_min')})")
    if heap:
        print(f"  plugin Go heap (gctrace): {heap.get('collections')} collections; live after the first "
              f"{heap.get('live_mb_first')} MB, during the soak max {heap.get('live_mb_max_soak')} MB, last "
              f"{heap.get('live_mb_last')} MB (goal {heap.get('goal_mb_last')} MB)")
    if fl:
        slope, bound = fl.get("rss_slope_kib_per_100_checks"), fl.get("bound_kib_per_100_checks")
        quiet = ("RSS slope within the bound, fds floor flat" if slope is None or bound is None or slope <= bound else
                 f"RSS slope {slope:+.1f} KiB per 100 checks > {bound:g}, but its live Go heap stayed flat "
                 "(runtime memory, not objects), fds floor flat")
        print(f"  plugin {fl['verdict']}: {'; '.join(fl['why']) or quiet}")
    return rc


def go_heap(log: str, soak_from: float | None = None, soak_to: float | None = None) -> dict:
    """The live Go heap after each collection, from the plugin's gctrace lines (empty: none)."""
    gcs = [(float(m[2]), int(m[5]), int(m[6])) for m in _GCTRACE.finditer(log)]
    if not gcs:
        return {}
    soak = [live for t, live, _ in gcs if soak_from is not None and soak_from <= t <= (soak_to or t)]
    return {"collections": len(gcs), "live_mb_first": gcs[0][1], "live_mb_last": gcs[-1][1],
            "goal_mb_last": gcs[-1][2], "live_mb_max_soak": max(soak) if soak else None,
            "live_mb_max": max(live for _, live, _ in gcs)}


def _plugin_verdict(p: dict, info: dict) -> dict:
    """FLAT unless the plugin's RSS slope passes agent_soak's bound while its live Go heap also rose, or
    its fds floor rose. RSS alone is not a leak in a Go process: the heap grows to its goal (twice the
    live heap) and the runtime returns free pages to the kernel minutes later."""
    from agent_soak import FLAT_KIB_PER_100

    why = []
    slope = p["rss_kb"].get("slope_kib_per_100_checks")
    heap = info.get("go_heap", {})
    fds = p.get("fds", {})
    if fds.get("last_min") is not None and fds.get("first_min") is not None and fds["last_min"] > fds["first_min"]:
        why.append(f"fds floor {fds['first_min']} -> {fds['last_min']}")
    if slope is not None and slope > FLAT_KIB_PER_100:
        live_rose = heap and heap.get("live_mb_last", 0) > heap.get("live_mb_first", 0) + 1
        after = info.get("after", {})
        returned = after.get("rss_kb_min") is not None and after["rss_kb_min"] <= info.get("alone", {}).get("rss_kb", 0) + 1024
        if live_rose or not (heap or returned):
            why.append(f"RSS slope {slope:+.1f} KiB per 100 checks > {FLAT_KIB_PER_100:g}" +
                       (f", live Go heap {heap['live_mb_first']} -> {heap['live_mb_last']} MB" if heap else ""))
    return {"verdict": "GROWING" if why else "FLAT", "rss_slope_kib_per_100_checks": slope,
            "bound_kib_per_100_checks": FLAT_KIB_PER_100, "why": why}


def _alone(pid: int, seconds: float) -> dict:
    """The plugin's CPU and RSS over `seconds` with no agent running."""
    from agent_soak import _status_kb, proc_cpu

    c0, t0 = proc_cpu(pid), time.monotonic()
    time.sleep(seconds)
    c1, window = proc_cpu(pid), time.monotonic() - t0
    cpu = None if c0 is None or c1 is None else c1 - c0
    return {"window_s": window, "cpu_s": cpu, "cpu_pct_of_core": None if cpu is None else 100 * cpu / window,
            "rss_kb": _status_kb(str(pid), "VmRSS")}


def _after(pid: int, seconds: float) -> dict:
    """The plugin's RSS each second for `seconds` once the agent has stopped."""
    from agent_soak import _status_kb

    rss, t0 = [_status_kb(str(pid), "VmRSS")], time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(min(1.0, seconds))
        rss.append(_status_kb(str(pid), "VmRSS"))
    known = [x for x in rss if x is not None]
    return {"window_s": time.monotonic() - t0, "rss_kb_start": rss[0], "rss_kb_end": rss[-1],
            "rss_kb_min": min(known) if known else None}


def _run(a: argparse.Namespace, soak_args: list[str], agent_args: list[str], binary: Path, var_lib: Path,
         kdir: Path, info: dict) -> int:
    from tests.support import realplugin
    from tests.support.kubelet_standin import KubeletStandIn

    # gctrace: one line per collection on the plugin's stderr (its log), with the live heap
    env = {"GODEBUG": ",".join(x for x in (os.environ.get("GODEBUG", ""), "gctrace=1") if x)}
    with KubeletStandIn(kdir) as kubelet, realplugin.RealPlugin(binary, [], var_lib=var_lib, env=env) as plugin:
        try:
            ep = kubelet.wait_for(RESOURCE, timeout=a.wait)
            info.update(registered=True, devices=sorted(ep.devices))
        except TimeoutError as exc:
            info["registration"] = str(exc)
        if plugin.proc is not None and plugin.proc.poll() is not None:
            print(f"agent_soak_plugin: the plugin exited ({plugin.proc.returncode}): {plugin.log()[-1500:]}",
                  file=sys.stderr)
            return 1
        info["alone"] = _alone(plugin.pid, a.idle)
        t_soak = time.time() - plugin.started_at
        if not any(x == "--root" or x == "--example" for x in soak_args):
            soak_args = ["--root", "/", *soak_args]
        # a process of its own: the stand-in's gRPC threads stay here, out of the agent's figures
        rc = subprocess.run([sys.executable, str(REPO / "bench" / "agent_soak.py"), *soak_args,
                             "--plugin-pid", str(plugin.pid), "--out", a.out, "--",
                             "--device-plugin-dir", str(kdir), *agent_args], check=False).returncode
        t_end = time.time() - plugin.started_at
        info["after"] = _after(plugin.pid, a.idle_after)
        log = plugin.log()
        info["go_heap"] = go_heap(log, t_soak, t_end)
        info["log_tail"] = "\n".join(x for x in log.splitlines() if not _GCTRACE.match(x))[-2000:]
    return rc


if __name__ == "__main__":
    sys.exit(main())
