#!/usr/bin/env python3
"""The agent's footprint on its node: CPU per check, steady RSS, open fds, and their growth.

    python3 bench/agent_soak.py --root / --out soak.json                  # a GPU node (as root)
    python3 bench/agent_soak.py --root / --plugin-name nvidia-device-plugin --out soak.json
    python3 bench/agent_soak.py --example healthy --checks 1000 --out soak.json   # no GPU: an example

Runs the real agent (gpuwarden.agent.loop.Agent, its own `run` loop, as `gpuwarden agent --no-kube`
does) in this process for --checks checks at a short --interval, and after each check reads what the
process itself has used: CPU (user + sys of getrusage(2), the process's threads and, separately, its
reaped probe children), VmRSS and the open fds (/proc/self). It reports CPU seconds per check, the
steady RSS and fds, and their growth from the first 100 checks to the last 100 (means). With
--plugin-pid (repeatable) it reads another process's CPU (utime + stime of /proc/PID/stat, children
reaped by it included) and RSS over the same window: the NVIDIA device plugin beside the agent
(--plugin-name finds it by its argv[0]).

The default interval (0.2 s) makes 1,000 checks last ~4 minutes on a GPU node; the agent's CPU
share at its default 60 s interval is the CPU per check divided by 60 s (`cpu_share_at_60s_pct`).
The HTTP server (/metrics, /healthz) runs on 127.0.0.1 on a free port and is scraped every
--scrape-every checks, so its sockets count in the fd figures. Options after `--` go to the agent
(`gpuwarden agent --help`). Needs only gpuwarden's own dependencies; prints a summary, writes JSON.
"""

from __future__ import annotations

import argparse
import array
import functools
import json
import os
import platform
import resource
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if (REPO / "src" / "gpuwarden").is_dir():
    sys.path.insert(0, os.environ.get("GPUWARDEN_SRC") or str(REPO / "src"))

WINDOW = 100  # checks averaged at the start and at the end
#: "flat": the least-squares slope of RSS over the last three quarters of the checks (the first quarter
#: is warm-up: imports, histories and time windows filling) is at most this many KiB per 100 checks,
#: and the floors of fds and threads are the same in the first and the last WINDOW checks of it.
#: 8 KiB per 100 checks is ~115 KiB a day at the agent's 60 s interval; one page (4 KiB) of noise
#: over 750 checks moves the slope by ~0.5 KiB per 100.
FLAT_KIB_PER_100 = 8.0
MIN_FIT = 150  # fewer checks after warm-up: no verdict (UNDECIDED)
TICK = os.sysconf("SC_CLK_TCK")


def _status_kb(pid: str, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _status_kbs(pid: str, keys: tuple[str, ...]) -> tuple[int | None, ...]:
    """Several `KEY: N kB` fields of /proc/PID/status in one read (None: absent or unreadable)."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                k, _, rest = line.partition(":")
                if k in keys:
                    found[k] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return tuple(found.get(k) for k in keys)


#: VmRSS = RssAnon (heap, stacks: what a leak grows) + RssFile (pages of the binary and its libraries
#: faulted in as code paths run: bounded by their size, dropped by the kernel under pressure) + RssShmem
RSS_KEYS = ("VmRSS", "RssAnon", "RssFile")


def _fds(pid: str) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _cpu() -> tuple[float, float]:
    """(this process's user + sys, its reaped children's) in seconds."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def pids_named(name: str) -> list[int]:
    """Processes whose argv[0] has this base name (the comm of /proc is cut at 15 characters), not this one."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            argv0 = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if os.path.basename(argv0) == name:
            found.append(int(d))
    return sorted(found)


def proc_cpu(pid: int) -> float | None:
    """utime + stime + cutime + cstime of /proc/PID/stat, seconds (None: gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return sum(int(f) for f in fields[11:15]) / TICK
    except (OSError, ValueError, IndexError):
        return None


class Sampler:
    """One row per check: the check's CPU (self, children), VmRSS and fds after it, and the plugins'.

    The rows live in arrays allocated before the first check, so that the bench's own bookkeeping does
    not grow the process it measures (a dict per check was ~0.45 KiB a check, half the slope once seen).
    """

    FLOATS = ("cpu_s", "child_cpu_s", "wall_s")
    INTS = ("rss_kb", "rss_anon_kb", "rss_file_kb", "fds", "threads", "py_blocks", "malloc_used_kb")
    PLUGIN = ("rss_kb", "rss_anon_kb", "rss_file_kb", "fds", "threads")

    def __init__(self, plugin_pids: list[int], checks: int = 0) -> None:
        self.n = 0
        self.plugin_pids = plugin_pids
        self.plugin_start = {p: proc_cpu(p) for p in plugin_pids}
        size = max(1, checks)
        self.cols = {k: array.array("d", bytes(8 * size)) for k in self.FLOATS}
        self.cols.update({k: array.array("q", bytes(8 * size)) for k in self.INTS})
        self.pcols = {p: {k: array.array("q", bytes(8 * size)) for k in self.PLUGIN} for p in plugin_pids}

    def before(self) -> tuple[float, float, float]:
        return (*_cpu(), time.perf_counter())

    def after(self, start: tuple[float, float, float]) -> None:
        i = self.n
        if i >= len(self.cols["rss_kb"]):  # more checks than announced: grow (only then)
            for cols in (self.cols, *self.pcols.values()):
                for col in cols.values():
                    col.extend(col[:1] * len(col))
        me, kids = _cpu()
        c = self.cols
        c["cpu_s"][i], c["child_cpu_s"][i], c["wall_s"][i] = me - start[0], kids - start[1], time.perf_counter() - start[2]
        c["rss_kb"][i], c["rss_anon_kb"][i], c["rss_file_kb"][i] = map(_int, _status_kbs("self", RSS_KEYS))
        c["fds"][i], c["threads"][i] = _int(_fds("self")), _int(_threads())
        c["py_blocks"][i], c["malloc_used_kb"][i] = sys.getallocatedblocks(), _int(_malloc_used_kb())
        for p, pc in self.pcols.items():
            pc["rss_kb"][i], pc["rss_anon_kb"][i], pc["rss_file_kb"][i] = map(_int, _status_kbs(str(p), RSS_KEYS))
            pc["fds"][i], pc["threads"][i] = _int(_fds(str(p))), _int(_threads(str(p)))
        self.n = i + 1

    @property
    def rows(self) -> list[dict[str, Any]]:
        def val(col: array.array, i: int) -> Any:
            return None if col.typecode == "q" and col[i] < 0 else col[i]

        return [{**{k: val(col, i) for k, col in self.cols.items()},
                 "plugins": {str(p): {k: val(col, i) for k, col in pc.items()} for p, pc in self.pcols.items()}}
                for i in range(self.n)]


@functools.cache
def _mallinfo2() -> Any:
    """glibc's mallinfo2, ready to call; None without it."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = MallInfo2
    return fn


def _malloc_used_kb() -> int | None:
    """Bytes glibc's malloc has handed out and not taken back (mallinfo2: uordblks + hblkhd), in KiB.

    With `py_blocks` (Python's live objects) this tells a leak from fragmentation: a leak raises the
    live figures with RSS; an allocator that keeps freed pages raises RSS alone. None without glibc."""
    fn = _mallinfo2()
    if fn is None:
        return None
    m = fn()
    return (m.uordblks + m.hblkhd) // 1024


def _int(x: int | None) -> int:
    return -1 if x is None else x


def _threads(pid: str = "self") -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _marks(n: int) -> list[int]:
    """Check numbers at which RSS is reported: growth that stops reads differently from a leak."""
    return sorted({i for i in (1, 10, 100, n // 4, n // 2, 3 * n // 4, n) if 1 <= i <= n})


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _growth(xs: list) -> dict[str, Any]:
    n = min(WINDOW, len(xs) // 2) or 1
    first, last = _mean(xs[:n]), _mean(xs[-n:])
    lows = [min((x for x in part if x is not None), default=None) for part in (xs[:n], xs[-n:])]
    return {"window": n, "first_mean": first, "last_mean": last,
            "growth": None if first is None or last is None else last - first,
            # the floor: on a live node a probe's reader thread or pipe may still be open when a sample
            # is taken (fds and threads then vary from check to check); a leak raises the floor
            "first_min": lows[0], "last_min": lows[1],
            "max": max((x for x in xs if x is not None), default=None)}


def slope_per_100(xs: list) -> float | None:
    """Least-squares slope of xs against the check number, per 100 checks (None: fewer than 2 values)."""
    pts = [(i, x) for i, x in enumerate(xs) if x is not None]
    if len(pts) < 2 or len({i for i, _ in pts}) < 2:
        return None
    fit = statistics.linear_regression([i for i, _ in pts], [x for _, x in pts])
    return 100 * fit.slope


def verdict(rss_kb: list, fds: list, threads: list, bound_kib: float = FLAT_KIB_PER_100) -> dict[str, Any]:
    """FLAT, GROWING or UNDECIDED over the checks after warm-up (the first quarter), with the slope and why."""
    start = len(rss_kb) // 4
    tail = rss_kb[start:]
    out: dict[str, Any] = {"from_check": start + 1, "to_check": len(rss_kb), "bound_kib_per_100_checks": bound_kib,
                           "rss_slope_kib_per_100_checks": slope_per_100(tail), "why": []}
    n = min(WINDOW, len(tail) // 2) or 1
    for name, xs in (("fds", fds[start:]), ("threads", threads[start:])):
        floors = [min((x for x in part if x is not None), default=None) for part in (xs[:n], xs[-n:])]
        out[f"{name}_floor"] = floors
        if None in floors or floors[1] > floors[0]:
            out["why"].append(f"{name} floor {floors[0]} -> {floors[1]}")
    if len(tail) < MIN_FIT or out["rss_slope_kib_per_100_checks"] is None:
        out["verdict"] = "UNDECIDED"
        out["why"].append(f"{len(tail)} checks after warm-up (at least {MIN_FIT} are needed)")
        return out
    if out["rss_slope_kib_per_100_checks"] > bound_kib:
        out["why"].append(f"RSS slope {out['rss_slope_kib_per_100_checks']:+.1f} KiB per 100 checks > {bound_kib:g}")
    out["verdict"] = "GROWING" if out["why"] else "FLAT"
    return out


def _parts(rows: list[dict[str, Any]],
           keys: tuple[str, ...] = ("rss_anon_kb", "rss_file_kb", "py_blocks", "malloc_used_kb")) -> dict[str, Any]:
    """RssAnon, RssFile, malloc's bytes in use (KiB) and Python's live blocks: their slopes after warm-up
    (per 100 checks) and values at the marks (what grows with RSS: live memory or only the heap's pages)."""
    out: dict[str, Any] = {}
    for key in keys:
        xs = [r.get(key) for r in rows]
        out[key] = {"slope_kib_per_100_checks": slope_per_100(xs[len(xs) // 4:]),
                    "at_check": {str(i): xs[i - 1] for i in _marks(len(xs))}}
    return out


def summarize(rows: list[dict[str, Any]], window_s: float, plugin_cpu: dict[int, tuple]) -> dict[str, Any]:
    """Per-check CPU (the first check, which imports the rules, apart), steady RSS/fds, growth."""
    steady = rows[1:] or rows
    cpu = [r["cpu_s"] + r["child_cpu_s"] for r in steady]
    per_check = statistics.median(cpu)
    out: dict[str, Any] = {
        "checks": len(rows),
        "first_check_cpu_s": rows[0]["cpu_s"] + rows[0]["child_cpu_s"] if rows else None,
        "cpu_per_check_s": {"median": per_check, "mean": statistics.fmean(cpu),
                            "p90": sorted(cpu)[int(0.9 * (len(cpu) - 1))],
                            "self_mean": statistics.fmean(r["cpu_s"] for r in steady),
                            "children_mean": statistics.fmean(r["child_cpu_s"] for r in steady)},
        "check_wall_s_median": statistics.median(r["wall_s"] for r in steady),
        "cpu_share_at_60s_pct": round(100 * statistics.fmean(cpu) / 60.0, 4),
        "rss_kb": {"steady_median_last": statistics.median(r["rss_kb"] for r in rows[-WINDOW:]),
                   **_growth([r["rss_kb"] for r in rows]),
                   "at_check": {str(i): rows[i - 1]["rss_kb"] for i in _marks(len(rows))}},
        "rss_parts": _parts(rows),
        "fds": {"steady_last": rows[-1]["fds"], **_growth([r["fds"] for r in rows])},
        "threads": {"steady_last": rows[-1]["threads"], **_growth([r["threads"] for r in rows])},
        "window_s": window_s,
        "flat": verdict([r["rss_kb"] for r in rows], [r["fds"] for r in rows], [r["threads"] for r in rows]),
    }
    plugins = {}
    for pid, (c0, c1) in plugin_cpu.items():
        rss = [r["plugins"][str(pid)]["rss_kb"] for r in rows]
        fds = [r["plugins"][str(pid)]["fds"] for r in rows]
        cpu_s = None if c0 is None or c1 is None else c1 - c0
        plugins[str(pid)] = {
            "comm": _comm(pid), "cpu_s": cpu_s,
            "cpu_pct_of_core": None if cpu_s is None else round(100 * cpu_s / window_s, 4),
            "rss_kb": {"steady_median_last": _median(rss[-WINDOW:]),
                       "slope_kib_per_100_checks": slope_per_100(rss[len(rss) // 4:]), **_growth(rss)},
            "rss_parts": _parts([r["plugins"][str(pid)] for r in rows], ("rss_anon_kb", "rss_file_kb")),
            "fds": _growth(fds), "threads": _growth([r["plugins"][str(pid)]["threads"] for r in rows])}
    if plugins:
        out["plugins"] = plugins
    return out


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def soak(checks: int, interval_s: float, target: list[str], agent_args: list[str] = (),
         plugin_pids: list[int] = (), scrape_every: int = 25) -> dict[str, Any]:
    """Run the agent for `checks` checks in this process; the summary and the per-check rows."""
    t_import = time.perf_counter()
    cpu_import = _cpu()[0]
    from gpuwarden.agent.config import parse_args
    from gpuwarden.agent.loop import Agent
    from gpuwarden.kube.log import Log

    sampler = Sampler(list(plugin_pids), checks)
    devnull = open(os.devnull, "w")  # noqa: SIM115 (open for the whole run, before the first sample)
    argv = ["--no-kube", "--interval", f"{interval_s}", "--cycles", str(checks), "--listen", "127.0.0.1:0",
            *target, *agent_args]
    cfg, _ = parse_args(argv)
    cfg = cfg.resolved()

    class SoakAgent(Agent):
        def check(self):  # noqa: ANN202 (the agent's own check, measured)
            start = sampler.before()
            try:
                return super().check()
            finally:
                sampler.after(start)
                n = sampler.n
                if scrape_every and self.server is not None and n % scrape_every == 0:
                    with urllib.request.urlopen(f"http://{self.server.address}/metrics", timeout=5) as r:
                        r.read()

    agent = SoakAgent(cfg, out=devnull, log=Log(cfg.log_format, stream=devnull, node=cfg.node_name or "soak"))
    startup = {"import_and_construct_wall_s": time.perf_counter() - t_import,
               "import_and_construct_cpu_s": _cpu()[0] - cpu_import}
    t0 = time.monotonic()
    try:
        agent.run()
    finally:
        devnull.close()
    window_s = time.monotonic() - t0
    plugin_cpu = {p: (sampler.plugin_start[p], proc_cpu(p)) for p in sampler.plugin_pids}
    rows = sampler.rows
    summary = summarize(rows, window_s, plugin_cpu)
    summary["startup"] = startup
    summary["mode"] = agent.mode
    summary["root"] = getattr(agent.root, "label", "")
    return {"summary": summary, "rows": rows}


def _machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "loadavg": os.getloadavg(),
            "mem_total_kb": _meminfo("MemTotal")}


def _meminfo(key: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _mib(kb: float | None) -> str:
    return "?" if kb is None else f"{kb / 1024:.1f}"


def _slope(x: float | None) -> str:
    return "?" if x is None else f"{x:+.1f}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    agent_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, agent_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--root", help="the node's root (a live node: /)")
    where.add_argument("--example", help="a built-in example node (no GPU needed)")
    ap.add_argument("--checks", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=0.2, help="seconds from one check's start to the next's")
    ap.add_argument("--plugin-pid", type=int, action="append", default=[],
                    help="also measure this process (the device plugin); repeatable")
    ap.add_argument("--plugin-name", action="append", default=[],
                    help="also measure the processes whose argv[0] is named so (e.g. nvidia-device-plugin); repeatable")
    ap.add_argument("--scrape-every", type=int, default=25, help="GET /metrics every N checks (0: never)")
    ap.add_argument("--rows", action="store_true", help="keep the per-check rows in the JSON")
    ap.add_argument("--out", default="bench/results/agent-soak.json")
    a = ap.parse_args(argv)
    target = ["--example", a.example] if a.example else ["--root", a.root or "/"]
    machine = _machine()
    plugin_pids = list(a.plugin_pid)
    for name in a.plugin_name:
        found = pids_named(name)
        if not found:
            print(f"agent_soak: no process named {name!r}", file=sys.stderr)
            return 2
        plugin_pids += found
    started = time.time()
    res = soak(a.checks, a.interval, target, agent_args, plugin_pids, a.scrape_every)
    s = res["summary"]
    doc = {"bench": "agent_soak", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
           "argv": sys.argv, "agent_args": target + agent_args, "interval_s": a.interval,
           "machine": machine, "loadavg_end": os.getloadavg(), "summary": s}
    if a.rows:
        doc["rows"] = res["rows"]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    c, rss, fds = s["cpu_per_check_s"], s["rss_kb"], s["fds"]
    print(f"agent on {s['root']} ({s['mode']}): {s['checks']} checks in {s['window_s']:.0f} s, "
          f"load {machine['loadavg'][0]:.1f} -> {doc['loadavg_end'][0]:.1f} on {machine['cpus']} CPUs")
    print(f"  CPU per check: median {1000 * c['median']:.1f} ms, mean {1000 * c['mean']:.1f} ms "
          f"(children {1000 * c['children_mean']:.1f} ms), p90 {1000 * c['p90']:.1f} ms; first check "
          f"{1000 * s['first_check_cpu_s']:.0f} ms; at a 60 s interval {s['cpu_share_at_60s_pct']:.3f}% of a core")
    print(f"  RSS: steady {rss['steady_median_last'] / 1024:.1f} MiB; first {rss['window']} checks "
          f"{rss['first_mean'] / 1024:.1f} MiB, last {rss['last_mean'] / 1024:.1f} MiB "
          f"(growth {rss['growth']:+.0f} KiB), max {rss['max'] / 1024:.1f} MiB")
    print("  RSS at check " + ", ".join(f"{k}: {v / 1024:.1f}" for k, v in rss["at_check"].items()) + " MiB")
    parts = s["rss_parts"]
    print("  of it: " + "; ".join(
        f"{name} " + ", ".join(_mib(v) for v in parts[key]["at_check"].values())
        + f" MiB (slope {_slope(parts[key]['slope_kib_per_100_checks'])} KiB per 100 checks)"
        for name, key in (("RssAnon", "rss_anon_kb"), ("RssFile", "rss_file_kb"))))
    live = [(name, parts[key]) for name, key in (("malloc in use", "malloc_used_kb"), ("Python blocks", "py_blocks"))
            if key in parts and parts[key]["slope_kib_per_100_checks"] is not None]
    if live:  # a leak raises these with RSS; pages the allocator keeps raise RSS alone
        print("  live: " + "; ".join(f"{name} " + ", ".join(str(v) for v in p["at_check"].values())
                                     + f" (slope {_slope(p['slope_kib_per_100_checks'])} per 100 checks)"
                                     for name, p in live) + " (KiB; blocks)")
    th = s["threads"]
    print(f"  fds: mean {fds['first_mean']:.1f} -> {fds['last_mean']:.1f} (growth {fds['growth']:+.2f}), floor "
          f"{fds['first_min']} -> {fds['last_min']}, max {fds['max']}; threads mean {th['first_mean']:.1f} -> "
          f"{th['last_mean']:.1f}, floor {th['first_min']} -> {th['last_min']}, max {th['max']}")
    fl = s["flat"]
    slope = fl["rss_slope_kib_per_100_checks"]
    print(f"  {fl['verdict']}: RSS slope over checks {fl['from_check']}-{fl['to_check']} "
          f"{'?' if slope is None else f'{slope:+.1f}'} KiB per 100 checks (flat: <= {fl['bound_kib_per_100_checks']:g}), "
          f"fds floor {fl['fds_floor'][0]} -> {fl['fds_floor'][1]}, threads floor {fl['threads_floor'][0]} -> "
          f"{fl['threads_floor'][1]}" + (f"; {'; '.join(fl['why'])}" if fl["why"] else ""))
    for pid, p in s.get("plugins", {}).items():
        prss = p["rss_kb"]
        print(f"  pid {pid} ({p['comm']}): CPU {p['cpu_s']} s over the window = {p['cpu_pct_of_core']}% of a core; "
              f"RSS {prss['steady_median_last']} KiB (growth {prss['growth']} KiB, slope "
              f"{prss['slope_kib_per_100_checks']} KiB per 100 checks)")
    print(f"  -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
