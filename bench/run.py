#!/usr/bin/env python3
"""gpuwarden benchmarks (issue #7). Not part of the test suite: numbers, not pass/fail.

    .venv/bin/python bench/run.py              # everything, ~15 min the first time (builds ~1.6 GB of nodes)
    .venv/bin/python bench/run.py --quick      # fewer repeats, no 1 GB log, 65 s of agent (~4 min)
    .venv/bin/python bench/run.py --only check,e2e,imports,scaling,logscan,agent

Sections (docs/performance.md explains each, with results):
  check    in-process `gpuwarden check` of the synthetic 8-GPU / 110-pod / 250-container node with a
           200 MB --v=4 kubelet log (cgroup v1/cgroupfs and v2/systemd): whole-file scan,
           --log-window 15m, and the agent's incremental scan (LogCursors) after 60 s of new log;
           median of N fresh NodeFacts in one warm process; plus where the time goes (one run)
  e2e      `gpuwarden check --format json --bundle DIR` as a process (startup included), median
           of N, interleaved with `python -c pass`; peak RSS
  imports  -X importtime of that command, and which heavy modules it loaded (none may be
           kubernetes, grpc, google.protobuf)
  scaling  in-process check at 1/8/32 GPUs, 10/110/500 pods, and 10 MB/200 MB/1 GB kubelet logs
  logscan  kubelet main-pass scan vs `grep -c` of the same file in one run (interleaved), as MB/s
  agent    the agent (bench/agent_bundle.py = `gpuwarden agent` on a bundle) at its default 60 s
           interval on the synthetic node: CPU share of one core and peak RSS over a few minutes

Synthetic nodes come from bench/synth.py and are cached in --data (default
$GPUWARDEN_BENCH_DATA or ~/.cache/gpuwarden-bench; never inside the repository). Results: a
table on stdout and JSON in --out (default bench/results/latest.json).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# $GPUWARDEN_SRC: measure another checkout's src/ (--compare) with these benchmarks
sys.path[:0] = [str(REPO / "bench"), os.environ.get("GPUWARDEN_SRC") or str(REPO / "src"), str(REPO)]
PY = sys.executable

import synth  # noqa: E402

BIG = dict(gpus=8, pods=110, containers=250, log_mb=200.0)
WINDOW = "15m"


# -- helpers ---------------------------------------------------------------------------------------

def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def ms(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x == x else "-"


def node(data: Path, **kw) -> Path:
    spec = synth.Spec(**{**BIG, **kw})
    name = f"node-g{spec.gpus}-p{spec.pods}-c{spec.containers}-{spec.cgroup}-{spec.log_mb:g}mb"
    path = data / name
    t0 = time.monotonic()
    synth.build(path, spec)
    if time.monotonic() - t0 > 1:
        print(f"  built {path} in {time.monotonic() - t0:.0f} s", flush=True)
    return path


def child(name: str, src: str | None = None, **args) -> dict:
    """Run one measurement in a fresh interpreter (so one section's imports and caches stay out
    of the next), of this checkout or of `src`; it prints one JSON object."""
    env = dict(os.environ, GPUWARDEN_SRC=src) if src else None
    out = subprocess.run([PY, __file__, "--child", name, json.dumps(args)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"child {name} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def env_info() -> dict:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        mem = int(open("/proc/meminfo").readline().split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass

    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
            "cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(mem / 2**30, 1), "kernel": platform.release(),
            "python": platform.python_version(), "commit": git("rev-parse", "--short", "HEAD"),
            "dirty_files": len(git("status", "--porcelain").splitlines()), "loadavg_start": os.getloadavg()}


# -- children (run in a fresh interpreter) --------------------------------------------------------------

def _facts(d: str, **settings):
    from gpuwarden.examples import open_bundle_dir
    from gpuwarden.facts import NodeFacts, Settings

    return NodeFacts(open_bundle_dir(Path(d), label=f"bundle:{d}"), Settings(**settings))


def _check(d: str, **settings):
    from gpuwarden import engine

    f = _facts(d, **settings)
    return engine.run(f, engine.all_rules(), mode="bundle"), f


def _settings(window: str | None, cursors=None) -> dict:
    from gpuwarden.parsers.duration import parse_duration

    s: dict = {"probes": False}
    if window:
        s["log_window_s"] = parse_duration(window, positive=True)
    if cursors is not None:
        s["log_cursors"] = cursors
    return s


def child_inproc(a: dict) -> dict:
    """Median of N in-process checks (fresh NodeFacts each: what the agent does every interval)."""
    d, n = a["dir"], a["n"]
    cursors = None
    if a.get("incremental"):
        from gpuwarden.logs.cursors import LogCursors

        cursors = LogCursors()
        log = Path(d) / "files/.gpuwarden/logs/kubelet.log"
        block = _tail_block(log, a.get("grow_bytes", 240_000))
    settings = _settings(a.get("window"), cursors)
    _check(d, **settings)  # warm: imports, tables, page cache (and the cursors' first, full scan)
    wall, cpu = [], []
    r = f = None
    for _ in range(n):
        if cursors is not None:
            with open(log, "ab") as fh:  # the kubelet kept logging for an interval
                fh.write(block)
        t0, c0 = time.perf_counter(), time.process_time()
        r, f = _check(d, **settings)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    k = f.maybe("logs").kubelet if f.maybe("logs") else None
    return {"wall": wall, "cpu": cpu, "findings": sorted({x.code for x in r.findings}),
            "kubelet_scanned": (k.size or 0) - k.start if k else None, "kubelet_size": k.size if k else None,
            "rules_run": r.rules_run}


def _tail_block(log: Path, n: int) -> bytes:
    """About n bytes of whole lines from the log's end, with no device-plugin or sync-loop line
    (new noise: what a healthy minute adds)."""
    with open(log, "rb") as fh:
        fh.seek(max(0, log.stat().st_size - 4 * n))
        lines = fh.read().split(b"\n")[1:-1]
    keep = [x for x in lines if b"SyncLoop" not in x and b"llocation" not in x and b"pods from source" not in x]
    out, size = [], 0
    for x in keep:
        out.append(x + b"\n")
        size += len(x) + 1
        if size >= n:
            break
    return b"".join(out)


def child_breakdown(a: dict) -> dict:
    """Where one check's time goes: each fact section (leaves first), then each rule."""
    from gpuwarden import engine
    from gpuwarden.facts import FactUnavailable
    from gpuwarden.facts.node import registered_facts

    d = a["dir"]
    settings = _settings(a.get("window"))
    _check(d, **settings)
    f = _facts(d, **settings)
    order = ["processes", "identity", "driver", "kubelet", "containers", "memory", "logs", "mps", "plugin",
             "gpu_access", "bpf_programs", "runtime", "probes"]
    order += [x for x in registered_facts() if x not in order]
    facts_t = {}
    for name in order:
        t0 = time.perf_counter()
        try:
            f.get(name)
        except FactUnavailable:
            pass
        facts_t[name] = time.perf_counter() - t0
    rules_t = {}
    for r in engine.all_rules():
        t0 = time.perf_counter()
        try:
            list(r.func(f) or ())
        except Exception:
            pass
        rules_t[r.code] = time.perf_counter() - t0
    return {"facts": facts_t, "rules": dict(sorted(rules_t.items(), key=lambda kv: -kv[1])[:8]),
            "rules_total": sum(rules_t.values())}


def child_modules(a: dict) -> dict:
    """Run `gpuwarden check` in this process, then list the heavy modules it imported."""
    import runpy

    sys.argv = ["gpuwarden", "check", "--format", "json", "--bundle", a["dir"], "-o", os.devnull]
    try:
        runpy.run_module("gpuwarden", run_name="__main__")
    except SystemExit:
        pass
    heavy = ("kubernetes", "grpc", "google.protobuf", "urllib3", "requests", "prometheus_client", "yaml")
    return {"loaded": [m for m in heavy if m in sys.modules], "modules": len(sys.modules)}


def child_logscan(a: dict) -> dict:
    """The kubelet main pass (logs.scan_path) and the whole logs section vs grep -c, interleaved."""
    from gpuwarden.logs import scanner as logfacts, signatures as logsignatures
    from gpuwarden.root import HostRoot

    path, d, n = a["log"], a["dir"], a["n"]
    size = os.path.getsize(path)
    root = HostRoot("/")
    anchors = sorted({s.anchor.decode() for s in logsignatures.for_log("kubelet")})
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL)  # page cache warm
    logfacts.scan_path(root, path, "kubelet", "klog", ref_time=synth.CAPTURED)
    # grep must write its count to a pipe: with stdout on /dev/null GNU grep stops at the first match
    cmds = {"grep1": ["grep", "-c", "-F", "GetPreferredAllocation", path],
            "grep_all": ["grep", "-c", "-F", *[x for anc in anchors for x in ("-e", anc)], path]}
    t: dict[str, list[float]] = {k: [] for k in ("grep1", "grep_all", "scan", "logs_section", "logs_section_window")}
    counts = {}
    for _ in range(n):
        for k, cmd in cmds.items():
            t0 = time.perf_counter()
            counts[k] = subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
            t[k].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        s = logfacts.scan_path(root, path, "kubelet", "klog", ref_time=synth.CAPTURED)
        t["scan"].append(time.perf_counter() - t0)
        for key, window in (("logs_section", None), ("logs_section_window", WINDOW)):
            f = _facts(d, **_settings(window))
            t0 = time.perf_counter()
            f.get("logs")
            t[key].append(time.perf_counter() - t0)
    return {"size": size, "anchors": anchors, "times": t, "counts": counts, "scan_hits": sum(s.counts.values())}


CHILDREN = {"inproc": child_inproc, "breakdown": child_breakdown, "modules": child_modules, "logscan": child_logscan}


# -- sections ------------------------------------------------------------------------------------------------

def sec_check(a, data: Path, res: dict) -> None:
    n = 5 if a.quick else 15
    out = {}
    for cg in ("v1", "v2"):
        d = node(data, cgroup=cg)
        nolog = node(data, cgroup=cg, log_mb=0)
        rows = {"full": child("inproc", dir=str(d), n=n),
                "window": child("inproc", dir=str(d), n=n, window=WINDOW),
                "no_log": child("inproc", dir=str(nolog), n=n)}
        if a.compare:  # the same, by the other checkout, right after
            rows.update({"window [compare]": child("inproc", a.compare, dir=str(d), n=n, window=WINDOW),
                         "no_log [compare]": child("inproc", a.compare, dir=str(nolog), n=n)})
        with tempfile.TemporaryDirectory(dir=data) as tmp:  # the agent's steady state on a copy of the log
            cp = Path(tmp) / "node"
            shutil.copytree(d, cp, copy_function=os.link)
            log = cp / "files/.gpuwarden/logs/kubelet.log"
            log.unlink()
            shutil.copyfile(d / "files/.gpuwarden/logs/kubelet.log", log)
            rows["incremental"] = child("inproc", dir=str(cp), n=n, incremental=True, grow_bytes=60 * synth.Spec().log_rate)
            if a.compare:
                log.unlink()
                shutil.copyfile(d / "files/.gpuwarden/logs/kubelet.log", log)
                rows["incremental [compare]"] = child("inproc", a.compare, dir=str(cp), n=n, incremental=True,
                                                      grow_bytes=60 * synth.Spec().log_rate)
        rows["breakdown"] = child("breakdown", dir=str(d))
        rows["breakdown_window"] = child("breakdown", dir=str(d), window=WINDOW)
        out[cg] = rows
        for k in [k for k in rows if not k.startswith("breakdown")]:
            r = rows[k]
            print(f"  check {cg} {k:20} median {ms(med(r['wall']))} (cpu {ms(med(r['cpu']))}, min {ms(min(r['wall']))}) "
                  f"kubelet scanned {r['kubelet_scanned'] or 0:,} B; findings {r['findings']}", flush=True)
    res["check"] = out


def sec_e2e(a, data: Path, res: dict) -> None:
    n = 5 if a.quick else 15
    d = node(data)
    base = [PY, "-m", "gpuwarden", "check", "--format", "json", "--bundle", str(d)]
    cmds = {"python -c pass": [PY, "-c", "pass"],
            "import gpuwarden.cli": [PY, "-c", "import gpuwarden.cli"],
            "check --format json": base,
            f"check --format json --log-window {WINDOW}": base + ["--log-window", WINDOW],
            "check --format json (no log)": base[:-1] + [str(node(data, log_mb=0))]}
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    t: dict[str, list[float]] = {k: [] for k in cmds}
    cpu: dict[str, list[float]] = {k: [] for k in cmds}
    rss: dict[str, int] = {}
    for k, c in cmds.items():  # warm the page cache and .pyc files
        subprocess.run(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir())
    for _ in range(n):
        for k, c in cmds.items():
            t0 = time.perf_counter()
            p = subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                 cwd=tempfile.gettempdir())
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            t[k].append(time.perf_counter() - t0)
            cpu[k].append(ru.ru_utime + ru.ru_stime)
            rss[k] = max(rss.get(k, 0), ru.ru_maxrss << 10)
    out = {k: {"wall": t[k], "cpu": cpu[k], "max_rss": rss[k]} for k in cmds}
    for k in cmds:
        print(f"  e2e {k:44} median {ms(med(t[k]))} (cpu {ms(med(cpu[k]))}, min {ms(min(t[k]))}), "
              f"max RSS {rss[k] / 2**20:.0f} MiB", flush=True)
    res["e2e"] = out


def sec_imports(a, data: Path, res: dict) -> None:
    d = node(data)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    p = subprocess.run([PY, "-X", "importtime", "-m", "gpuwarden", "check", "--format", "json", "--bundle", str(d),
                        "-o", os.devnull], capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    self_us, top = 0, {}
    for line in p.stderr.splitlines():  # "import time:  self |  cumulative | <2 spaces per level>name"
        parts = line.split(":", 1)[-1].split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        self_us += int(parts[0])
        if parts[2].startswith(" ") and not parts[2].startswith("  "):  # top level: imported by the command
            top[parts[2].strip()] = int(parts[1])
    heavy = child("modules", dir=str(d))
    out = {"total_import_s": self_us / 1e6, "top": dict(sorted(top.items(), key=lambda kv: -kv[1])[:12]),
           "heavy_loaded": heavy["loaded"], "modules": heavy["modules"]}
    print(f"  imports: {out['total_import_s'] * 1000:.0f} ms of imports, {heavy['modules']} modules; "
          f"heavy loaded: {heavy['loaded'] or 'none'}", flush=True)
    print("  top-level imports (cumulative ms): " + ", ".join(f"{k} {v / 1000:.0f}" for k, v in list(out['top'].items())[:8]))
    res["imports"] = out


def sec_scaling(a, data: Path, res: dict) -> None:
    n = 3 if a.quick else 7
    axes = {"gpus": [(g, dict(gpus=g, log_mb=10.0)) for g in (1, 8, 32)],
            "pods": [(p, dict(pods=p, containers=max(p, round(p * 250 / 110)), log_mb=10.0)) for p in (10, 110, 500)],
            "log_mb": [(m, dict(log_mb=m)) for m in ((10.0, 200.0) if a.quick else (10.0, 200.0, 1024.0))]}
    out = {}
    for axis, specs in axes.items():
        rows = []
        for x, kw in specs:
            d = node(data, **kw)
            full = child("inproc", dir=str(d), n=n)
            win = child("inproc", dir=str(d), n=n, window=WINDOW) if axis == "log_mb" else None
            row = {"x": x, "spec": kw, "full": med(full["wall"]), "full_cpu": med(full["cpu"]),
                   "window": med(win["wall"]) if win else None}
            rows.append(row)
            print(f"  scaling {axis:7} {x!s:>6}: check {ms(row['full'])} (cpu {ms(row['full_cpu'])})"
                  + (f", --log-window {WINDOW} {ms(row['window'])}" if win else ""), flush=True)
        out[axis] = rows
    res["scaling"] = out


def sec_logscan(a, data: Path, res: dict) -> None:
    d = node(data)
    log = d / "files/.gpuwarden/logs/kubelet.log"
    r = child("logscan", log=str(log), dir=str(d), n=3 if a.quick else 9)
    size = r["size"]
    t = {k: med(v) for k, v in r["times"].items()}
    mbs = {k: size / v / 1e6 for k, v in t.items()}
    r.update({"median_s": t, "mb_per_s": mbs, "ratio_vs_grep1": t["grep1"] / t["scan"],
              "ratio_vs_grep_all": t["grep_all"] / t["scan"]})
    print(f"  logscan {size / 1e6:.0f} MB: grep -c (1 anchor) {mbs['grep1']:.0f} MB/s, grep -c (all "
          f"{len(r['anchors'])} anchors) {mbs['grep_all']:.0f} MB/s, gpuwarden main pass {mbs['scan']:.0f} MB/s "
          f"-> {r['ratio_vs_grep1']:.2f}x / {r['ratio_vs_grep_all']:.2f}x of grep; whole logs section "
          f"{ms(t['logs_section'])}, with --log-window {WINDOW} {ms(t['logs_section_window'])}", flush=True)
    res["logscan"] = r


def _proc_sample(pid: int) -> tuple[float, int, int]:
    tick = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    cpu = (int(parts[11]) + int(parts[12])) / tick
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) << 10
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) << 10
    return cpu, rss, hwm


def _agent_run(d: Path, seconds: float, extra: list[str], src: str | None = None) -> dict:
    args = [PY, str(REPO / "bench/agent_bundle.py"), str(d), "--listen", "127.0.0.1:0",
            "--node-name", "gpu-node-synth", *extra]
    env = dict(os.environ, PYTHONPATH=src or str(REPO / "src"))
    if src:
        env["GPUWARDEN_SRC"] = src  # bench/agent_bundle.py runs that checkout's agent
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    samples = []
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < seconds and proc.poll() is None:
            samples.append((time.monotonic() - t0, *_proc_sample(proc.pid)))
            time.sleep(1.0)
        wall = time.monotonic() - t0
        cpu, rss, hwm = _proc_sample(proc.pid)
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    checks = []
    for line in err.splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if j.get("msg") == "check":
            checks.append(j.get("duration_s"))
    # after start-up (imports, first check): from the first sample 5 s in to the end
    after = [s for s in samples if s[0] >= 5.0]
    steady = ((cpu - after[0][1]) / (wall - after[0][0])) if after and wall > after[0][0] else None
    return {"command": " ".join(args[1:]), "interval_s": 60, "wall_s": wall, "cpu_s": cpu,
            "cpu_share": cpu / wall, "cpu_share_after_start": steady, "rss_end": rss, "vmhwm": hwm,
            "rss_max_sampled": max((s[2] for s in samples), default=0), "checks": checks,
            "exit": proc.returncode, "stderr_tail": err[-600:] if not checks else ""}


def _apiserver():
    """The test API server (tests/support/apiserver.py) with the synthetic node registered, or None."""
    binary = REPO / ".cache/testapiserver/bin/testapiserver"
    if not os.environ.get("GPUWARDEN_TESTAPISERVER") and binary.exists():
        os.environ["GPUWARDEN_TESTAPISERVER"] = str(binary)
    try:
        from gpuwarden.kube.client import Kube
        from tests.support.agent_kube import make_node
        from tests.support.apiserver import find_binary, start_apiserver

        server = start_apiserver(find_binary(build=False))
        make_node(Kube(server.api_client()), "gpu-node-synth")
        return server
    except Exception as exc:  # no etcd, no binary: measure without Kubernetes
        print(f"  (no test API server: {type(exc).__name__}: {exc}; the agent runs with --no-kube)", flush=True)
        return None


def sec_agent(a, data: Path, res: dict) -> None:
    d = node(data)
    seconds = 65 if a.quick else a.agent_seconds
    out: dict = {}
    server = None if a.agent_no_kube else _apiserver()
    kube = ["--kubeconfig", server.kubeconfig_path] if server else ["--no-kube"]
    out["kube"] = server is not None
    try:
        variants = [("agent", kube, None)] + ([("agent [compare]", kube, a.compare)] if a.compare else [])
        for name, extra, src in variants:
            r = out[name] = _agent_run(d, seconds, extra, src)
            print(f"  agent {name:16} ({'API server' if server else 'no kube'}) {r['wall_s']:.0f} s at the default 60 s "
                  f"interval: cpu {r['cpu_s']:.2f} s = {100 * r['cpu_share']:.2f}% of a core "
                  f"({100 * (r['cpu_share_after_start'] or 0):.2f}% after start-up); peak RSS {r['vmhwm'] / 2**20:.0f} MiB; "
                  f"checks (s) {[round(c, 2) for c in r['checks'] if c is not None]}", flush=True)
    finally:
        if server is not None:
            server.stop()
    res["agent"] = out


SECTIONS = {"check": sec_check, "e2e": sec_e2e, "imports": sec_imports, "scaling": sec_scaling,
            "logscan": sec_logscan, "agent": sec_agent}


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        print(json.dumps(CHILDREN[sys.argv[2]](json.loads(sys.argv[3]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--data", default=os.environ.get("GPUWARDEN_BENCH_DATA") or
                    str(Path.home() / ".cache/gpuwarden-bench"))
    ap.add_argument("--out", default=str(REPO / "bench/results/latest.json"))
    ap.add_argument("--agent-seconds", type=float, default=185.0)
    ap.add_argument("--compare", metavar="SRC", help="check, agent: also measure another checkout (its src/ directory)")
    ap.add_argument("--agent-no-kube", action="store_true", help="run the agent with --no-kube even when the "
                    "test API server (tools/testapiserver, etcd) is there")
    a = ap.parse_args()
    data = Path(a.data)
    data.mkdir(parents=True, exist_ok=True)
    res: dict = {"env": env_info(), "quick": a.quick}
    print(f"gpuwarden bench: {res['env']['date']} {res['env']['cpu']} x{res['env']['cores']}, "
          f"python {res['env']['python']}, commit {res['env']['commit']}, load {res['env']['loadavg_start']}", flush=True)
    for name in a.only.split(","):
        print(f"[{name}]", flush=True)
        SECTIONS[name](a, data, res)
    res["env"]["loadavg_end"] = os.getloadavg()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
