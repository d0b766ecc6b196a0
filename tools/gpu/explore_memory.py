#!/usr/bin/env python3
"""Measures which driver allocations land in host memory, charged or not, on this GPU host (issue 11).

Run as root on the GPU machine: python3 tools/gpu/explore_memory.py --out DIR
Bounded: a fixed number of objects per step; the GPU memory is filled with plain allocations only
(never managed memory); every process and cgroup it makes is stopped and removed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "src"), str(REPO / "tests/gpu")]  # memory_scenarios: Proc, gl_env

import memprobe as M  # noqa: E402
from memory_scenarios import Proc, gl_env  # noqa: E402
from podlayout import Pod, clear_kubelet_state, kubelet_state  # noqa: E402

GIB = 1 << 30


def log(msg: str) -> None:
    print(msg, flush=True)


def sample(label: str, pod: Pod | None, pid: int | None, base: dict) -> dict:
    mi = M.meminfo()
    d = {k: mi.get(k, 0) - base.get(k, 0) for k in ("MemFree", "MemAvailable", "Cached", "AnonPages", "Slab",
                                                     "SUnreclaim", "VmallocUsed", "Percpu", "Mapped", "Shmem",
                                                     "PageTables", "KernelStack")}
    return {"label": label, "t": round(M.now(), 3), "meminfo_delta": d, "MemFree": mi["MemFree"],
            "cgroup": M.cgroup(pod.ctr_dir) if pod else None, "proc": M.proc_status(pid) if pid else None,
            "slab_nvidia": sum(M.slab_nvidia().values())}


def gpuwarden(*args: str, timeout: float = 120) -> dict:
    e = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    t0 = M.now()
    p = subprocess.run([sys.executable, "-m", "gpuwarden", *args], capture_output=True, text=True, timeout=timeout, env=e)
    out = {"rc": p.returncode, "seconds": round(M.now() - t0, 3), "stderr": p.stderr[-1500:]}
    try:
        doc = json.loads(p.stdout)
        out["findings"] = [{k: f.get(k) for k in ("code", "status", "severity", "summary")} for f in doc.get("findings", [])]
        out["memory"] = next((f.get("data") for f in doc.get("findings", []) if f["code"].startswith("GPU-NODE")), None)
    except ValueError:
        out["stdout"] = p.stdout[-3000:]
    return out


def path_run(name: str, cmds: list[str], pod: Pod, results: list, trace: "M.KprobeTrace | None",
             during=None) -> None:
    """One GL worker in POD running CMDS, sampling host memory after each."""
    base = M.meminfo()
    w = Proc([sys.executable, str(HERE / "gl_worker.py")], pod, gl_env())
    steps = [{"worker": w.first}]
    if "error" in w.first:
        results.append({"path": name, "steps": steps})
        w.stop()
        return
    pid = w.first["pid"]
    steps.append(sample("ready", pod, pid, base))
    for c in cmds:
        r = w.cmd(c)
        s = sample(c, pod, pid, base)
        s["worker"] = r
        steps.append(s)
        log(f"  {name} {c}: MemFree {s['meminfo_delta']['MemFree'] / GIB:+.2f} GiB, cgroup "
            f"{(s['cgroup'] or {}).get('memory.current', 0) / GIB:.2f} GiB, {r.get('seconds')} s {r.get('error', '')}")
    steps.append({"nvml": M.nvml_processes()})
    if during:
        steps.append({"during": during()})
    t0 = M.now()
    w.cmd("quit")
    w.stop()
    time.sleep(1.0)
    after = sample("after-exit", pod, None, base)
    after["seconds_to_exit"] = round(M.now() - t0, 3)
    steps.append(after)
    results.append({"path": name, "steps": steps})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gw-explore"))
    ap.add_argument("--fbs", type=int, default=64)
    ap.add_argument("--objects-only", action="store_true",
                    help="only the other-objects paths with the GPU full (textures as render targets included)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "uname": os.uname().release}
    res["smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                                 "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
    syms = M.kallsyms_nvidia()
    (out / "kallsyms-nvidia-alloc.txt").write_text("\n".join(syms))
    wanted = ("nvos_create_alloc", "nvos_free_alloc", "nv_alloc_pages", "nv_free_pages", "nv_alloc_system_pages",
              "nv_alloc_contig_pages")
    res["symbols"] = {w: any(s.split()[2] == w for s in syms if len(s.split()) > 2) for w in wanted}
    res["btf"] = {p: Path(p).exists() for p in ("/sys/kernel/btf/vmlinux", "/sys/kernel/btf/nvidia")}
    res["bpf_kprobe"] = {s: M.bpf_kprobe_attach(s) for s in ("nvos_create_alloc", "nv_alloc_pages")}
    log(f"== {res['date']} {res['smi']} kernel {res['uname']}\n   symbols {res['symbols']}\n   btf {res['btf']}\n"
        f"   bpf {res['bpf_kprobe']}")
    res["meminfo_start"] = M.meminfo()
    paths: list = []
    res["paths"] = paths
    fill = None
    trace = None
    pods: list[Pod] = []
    try:
        # 1. GPU memory full: framebuffers, with the driver's allocation path traced
        fill = Proc([sys.executable, str(HERE / "gpu_fill.py"), "1.5"])
        res["fill"] = fill.first
        log(f"   filler: {fill.first}")
        probes = {}
        if args.objects_only:
            pass
        elif res["symbols"].get("nvos_create_alloc"):
            probes["gw_nvalloc"] = "nvos_create_alloc pages=%si:u64"
            probes["gw_nvalloc_ret"] = "nvos_create_alloc ret=$retval:x64"
        if res["symbols"].get("nvos_free_alloc"):
            probes["gw_nvfree"] = "nvos_free_alloc at=%di:x64"
        if res["symbols"].get("nv_alloc_pages"):
            probes["gw_nvallocpages"] = "nv_alloc_pages count=%si:u32"
        trace = M.KprobeTrace(probes) if probes else None
        res["trace_setup"] = {"defined": trace.defined if trace else [], "errors": trace.errors if trace else ["no symbols"]}
        log(f"   trace {res['trace_setup']}")
        if args.objects_only:
            pod = Pod("viz", "objects-0", "render", 2 * GIB, gpu="GPU-x").create()
            pods.append(pod)
            kubelet_state(pods)
            path_run("textures-as-render-targets-gpu-full", ["texfb 8", "texfb 8"], pod, paths, None)
            path_run("textures-empty-then-drawn-gpu-full", ["tex 8", "texfb 8 1024x1024"], pod, paths, None)
            path_run("framebuffers-2048-gpu-full", ["fb 16 2048x2048", "fb 16 2048x2048"], pod, paths, None)
            raise StopIteration
        pod = Pod("viz", "render-0", "render", 2 * GIB, gpu="GPU-x").create()
        pods.append(pod)
        kubelet_state(pods)
        step = 16
        cmds = [f"fb {step}"] * (args.fbs // step)
        def during() -> dict:
            r = {"check": gpuwarden("check", "--root", "/", "--format", "json", "--fail-on", "critical")}
            log(f"   check while held: {[(f['code'], f['status']) for f in r['check'].get('findings', [])]} "
                f"{r['check'].get('stderr', '')[-300:]}")
            r["collect"] = gpuwarden("collect", "-o", str(out / "egl-bundle.tar.gz"), timeout=180)
            return r

        path_run("framebuffers-gpu-full", cmds, pod, paths, trace, during)
        if trace:
            evs = M.parse_trace(trace.text())
            per: dict = {}
            for e in evs:
                k = (e["ev"], e["pid"], e["comm"])
                a = per.setdefault(k, {"n": 0, "pages": 0})
                a["n"] += 1
                v = e["args"].get("pages") or e["args"].get("count")
                if v:
                    a["pages"] += int(v, 0)
            res["trace_per_pid"] = [{"ev": k[0], "pid": k[1], "comm": k[2], **v} for k, v in per.items()]
            (out / "trace-sample.txt").write_text("\n".join(trace.text().splitlines()[:400]))
            log(f"   trace per pid: {res['trace_per_pid'][:12]}")
        # 1b. tracing cost: the same steps with the probes on and off
        if trace and trace.defined:
            w = Proc([sys.executable, str(HERE / "gl_worker.py")], pod, gl_env())
            cost = {}
            for on in (True, False, True, False):
                trace.set_enabled(on)
                r = w.cmd("fb 8")
                cost.setdefault("on" if on else "off", []).append(r.get("seconds"))
                w.cmd("release")
            trace.set_enabled(True)
            w.cmd("quit")
            w.stop()
            res["trace_cost_fb8_seconds"] = cost
            log(f"   trace cost {cost}")
        # 2. other objects with the GPU memory full
        pod2 = Pod("viz", "objects-0", "render", 2 * GIB, gpu="GPU-x").create()
        pods.append(pod2)
        kubelet_state(pods)
        path_run("textures-empty-gpu-full", ["tex 8", "tex 8"], pod2, paths, trace)
        path_run("textures-uploaded-gpu-full", ["texdata 8 2048x2048", "texdata 8 2048x2048"], pod2, paths, trace)
        path_run("buffers-gpu-full", ["buf 8 256", "buf 8 256"], pod2, paths, trace)
        path_run("contexts-gpu-full", ["ctx 8", "ctx 8"], pod2, paths, trace)
        path_run("renderbuffers-small-many-gpu-full", ["fb 64 1024x1024", "fb 64 1024x1024"], pod2, paths, trace)
        # 3. the same framebuffers with free GPU memory
        fill.stop()
        fill = None
        time.sleep(2)
        path_run("framebuffers-gpu-free", [f"fb {step}", f"fb {step}"], pod2, paths, trace)
        # 4. heavy legitimate load: a training loop with pinned memory and unified memory within its limit,
        #    and four more CUDA processes, each in a pod with a limit above its use
        lp = Pod("ml", "train-0", "trainer", 8 * GIB, gpu="GPU-x").create()
        pods.append(lp)
        smalls = [Pod("ml", f"infer-{i}", "server", 4 * GIB, gpu="GPU-x").create() for i in range(4)]
        pods.extend(smalls)
        kubelet_state(pods)
        base = M.meminfo()
        load = [Proc([sys.executable, str(HERE / "legit_load.py"), "train", "90"], lp)]
        load += [Proc([sys.executable, str(HERE / "legit_load.py"), "small", "90"], p) for p in smalls]
        time.sleep(8)
        res["legit_load"] = {"workers": [w.first for w in load], "sample": sample("load", lp, None, base),
                             "check": gpuwarden("check", "--root", "/", "--format", "json", "--fail-on", "critical")}
        log(f"   legit load: {[(f['code'], f['status'], f['severity']) for f in res['legit_load']['check'].get('findings', [])]}"
            f" MemFree {res['legit_load']['sample']['meminfo_delta']['MemFree'] / GIB:+.2f} GiB")
        for w in load:
            w.stop()
    except StopIteration:
        pass
    finally:
        if fill:
            fill.stop()
        if trace:
            res["trace_close_errors"] = trace.errors
            trace.close()
        for p in pods:
            p.remove()
        clear_kubelet_state()
    res["meminfo_end"] = M.meminfo()
    (out / "explore.json").write_text(json.dumps(res, indent=1))
    log("== done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
