"""Incident 4 on today's driver, for real: GPU-driver memory escaping a pod's memory limit (issue 11).

Scenarios registered in validate.py:
- memory-egl: the GPU's memory filled with plain allocations, then a pod (memory.max 2 GiB) creates
  4096x4096 EGL framebuffers that the driver places in host RAM, charged to no cgroup. gpuwarden is
  sampled after every step as the agent would (MemoryHistory), then run as the CLI; a bundle is
  collected; the agent's dry-run plan is printed; then the agent with remediation on, no API server and
  `memory_local_kill` kills the pod's processes, and the memory returning is measured.
- memory-two-pods: the same leak beside a compute pod (a training loop with pinned and unified
  memory) and the filler in a pod of its own: the graphics client must be named, not the others.
- memory-legit-load: heavy legitimate load (training loop with pinned memory and unified memory within
  its limit, four more CUDA processes), no fill: nothing at medium or above from any rule.
- issue 17 (crowded node), issue 43 (arrival cannot tell) and issue 41 (incident 4 at the chart's defaults): see
  each function; ISSUE_43_41 lists the six of one GPU call (docs/validation.md "When arrival cannot tell").
  The `-api` scenarios run the test API server under the chart's RBAC (tools/gpu/memharness.py: ApiSession, a
  kubelet stand-in); `memory_scenarios.py render-authz FILE` renders that RBAC where the Helm SDK is.
Bounded: fixed object counts or a cap on MemAvailable's fall; plain device allocations only; every process and
cgroup is stopped/removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
#: the workloads these scenarios launch and the pod layout they build (tools/gpu)
TOOLS = REPO / "tools/gpu"
sys.path[:0] = [str(TOOLS), str(REPO / "src"), str(REPO)]

import memharness as H  # noqa: E402
import memprobe as M  # noqa: E402
from podlayout import Pod, clear_kubelet_state, kubelet_state  # noqa: E402
from tests.support.kubeconfigs import UNREACHABLE_KUBECONFIG  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
OUT = Path(os.environ.get("OUT", "/tmp/gw-validation"))


def src_path() -> str:
    """PYTHONPATH for gpuwarden's subprocesses: this checkout's src, then what the caller had (carried wheels)."""
    return os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))


def log(msg: str) -> None:
    print(msg, flush=True)


class Proc:
    """A child speaking one JSON line per command (gl_worker, gpu_fill, legit_load)."""

    def __init__(self, argv: list[str], pod: Pod | None = None, env: dict | None = None) -> None:
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=dict(os.environ, **(env or {})), preexec_fn=pod.enter if pod else None)
        self.first = self.read()

    def read(self) -> dict:
        line = self.p.stdout.readline()  # type: ignore[union-attr]
        if not line:
            err = self.p.stderr.read()[-1500:] if self.p.poll() is not None else ""  # type: ignore[union-attr]
            return {"error": f"exited {self.p.returncode}: {err}"}
        try:
            return json.loads(line)
        except ValueError:
            return {"error": line[-500:]}

    def cmd(self, c: str) -> dict:
        try:
            self.p.stdin.write(c + "\n")  # type: ignore[union-attr]
            self.p.stdin.flush()  # type: ignore[union-attr]
        except OSError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return self.read()

    def stop(self) -> None:
        try:
            self.p.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            self.p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def gl_env() -> dict:
    vend = Path("/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json")
    have = any(Path(d).glob("*nvidia*.json") for d in ("/usr/share/glvnd/egl_vendor.d", "/etc/glvnd/egl_vendor.d"))
    return {} if have or not vend.exists() else {"__EGL_VENDOR_LIBRARY_FILENAMES": str(vend)}


def gl_worker(pod: Pod) -> Proc:
    return Proc([sys.executable, str(TOOLS / "gl_worker.py")], pod, gl_env())


def cli(*args: str, timeout: float = 120) -> dict:
    e = dict(os.environ, PYTHONPATH=src_path())
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gpuwarden", *args], capture_output=True, text=True, timeout=timeout, env=e)
    out: dict[str, Any] = {"rc": p.returncode, "seconds": round(time.monotonic() - t0, 3), "stderr": p.stderr[-1500:]}
    try:
        out["report"] = json.loads(p.stdout)
    except ValueError:
        out["stdout"] = p.stdout[-6000:]
    return out


def findings(report: dict) -> list[dict]:
    return [{"code": f["code"], "status": f["status"], "severity": f["severity"], "summary": f["summary"],
             "affected": [f"{a.get('kind')}:{a.get('namespace', '')}/{a.get('name')}" for a in f.get("affected", [])],
             "evidence": [f"{e['source']}: {e['text']}" for e in f["evidence"]][:14],
             "escape": (f.get("data") or {}).get("escape"), "pod": (f.get("data") or {}).get("pod")}
            for f in report.get("findings", [])]


def in_process(hist: Any = None) -> dict:
    """One sample as the agent takes it: the memory section and GPU-NODE-001, in this process."""
    from gpuwarden import engine
    from gpuwarden.facts import NodeFacts, Settings
    from gpuwarden.root import HostRoot
    from gpuwarden.rules import get_rule

    facts = NodeFacts(HostRoot("/"), Settings(memory_history=hist, probe_timeout_s=10))
    rep = engine.run(facts, [get_rule("GPU-NODE-001")])
    m = facts.maybe("memory")
    if hist is not None and m is not None and m.sample is not None:
        hist.add(m.sample)  # as the agent does after each check
    e = m.escape if m is not None else None
    f = rep.findings[0] if rep.findings else None
    return {"t": round(time.monotonic(), 3), "gap": e.gap if e else None, "excess": e.excess if e else None,
            "contexts": e.contexts if e else None, "separation": e.separation.to_json() if e else None,
            "escape": e.escape.to_json() if e and e.escape else None,
            "trend": e.trend.to_json() if e and e.trend else None, "MemFree": M.meminfo()["MemFree"],
            "finding": None if f is None else {"status": f.status.value, "severity": f.severity.name.lower(),
                                               "summary": f.summary}}


def _cleanup(pods: list[Pod], procs: list[Proc]) -> None:
    for p in procs:
        p.stop()
    Path("/run/gpuwarden/memory-samples.json").unlink(missing_ok=True)  # what a scenario's agent kept
    time.sleep(0.5)
    for pod in pods:
        pod.remove()
    clear_kubelet_state()
    if _STANDIN is not None:  # before the API's pods go, or the stand-in would "stop" them
        _STANDIN.tracked.clear()
        _STANDIN.stopped.clear()
    _LAID.clear()
    if _SESSION is not None:
        _SESSION.clear()


# ----------------------------------------------------------------------------- the test API server (one a run)

_SESSION: Any = None
_STANDIN: Any = None
#: uid -> the pod laid out on the host, for the kubelet stand-in
_LAID: dict[str, Pod] = {}


def _api(res: dict) -> Any:
    """The run's test API server (started once, stopped at exit), or None with res["error"] saying why."""
    global _SESSION
    if _SESSION is None:
        try:
            _SESSION = H.ApiSession(NODE)
        except Exception as exc:  # no binary, no etcd, a start that failed: this scenario cannot run
            res["error"] = f"test API server: {type(exc).__name__}: {exc}"[:1500]
            return None
    return _SESSION


def _kubelet() -> Any:
    global _STANDIN
    if _STANDIN is None:
        _STANDIN = H.KubeletStandIn(_SESSION.node_pods, _stop_laid, finalize=_SESSION.remove).start()
    return _STANDIN


def _stop_laid(uid: str) -> str:
    """What the kubelet does for an evicted pod: its containers stopped (here: cgroup.kill of the pod's cgroup)."""
    pod = _LAID.get(uid)
    if pod is None:
        return "not laid out here"
    kill = pod.pod_dir / "cgroup.kill"
    if kill.exists():
        kill.write_text("1")
        return "cgroup.kill"
    for pid in pod_pids(pod):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    return "SIGKILL"


def _api_record(api: Any, t0: float) -> dict:
    st = _STANDIN.stopped if _STANDIN is not None else {}
    return {"kubelet_stopped": {v["ref"]: {"after_s": round(v["t"] - t0, 3), "why": v["why"], "result": v["result"]}
                                for v in st.values()},
            "api_pods_left": sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in api.node_pods()),
            "agent_requests_denied": api.denied(), "events": api.events()[:20], "authz": api.authz_note,
            "apiserver_start_s": api.start_s, "standin_errors": (_STANDIN.errors if _STANDIN else [])[-5:]}


def _fill(pods: list[Pod], procs: list[Proc], as_pod: bool = False, api: Any = None) -> dict:
    fpod = None
    if as_pod:
        fpod = _pod(api, "ml", "filler-0", "fill", None)
        pods.append(fpod)
        kubelet_state(pods)
    fill = Proc([sys.executable, str(TOOLS / "gpu_fill.py"), "1.5"], fpod)
    procs.append(fill)
    return fill.first


def memory_egl(fbs: int = 64, step: int = 8) -> dict:
    from gpuwarden.memory.trend import MemoryHistory

    pods: list[Pod] = []
    procs: list[Proc] = []
    res: dict[str, Any] = {"scenario": "memory-egl", "expect": "GPU-NODE-001", "expect_pod": "viz/render-0",
                           "injected": f"GPU memory filled (1.5 GiB left) with cudaMalloc; pod viz/render-0 "
                                       f"(memory.max 2 GiB) creates {fbs} 4096x4096 EGL framebuffers, {step} at a time"}
    try:
        res["gap_idle"] = in_process()["gap"]
        res["fill"] = _fill(pods, procs)
        res["gap_filled"] = in_process()["gap"]
        pod = Pod("viz", "render-0", "render", 2 * GIB, gpu="GPU-0").create()
        pods.append(pod)
        kubelet_state(pods)
        free0 = M.meminfo()["MemFree"]
        w = gl_worker(pod)
        procs.append(w)
        res["worker"] = w.first
        if "error" in w.first:
            res["error"] = f"GL worker: {w.first['error']}"
            return res
        hist = MemoryHistory(100, window_s=8.0, growth_bytes_per_min=256 * MIB, clock=time.monotonic)
        samples = [in_process(hist)]
        first: dict[str, float] = {}
        t_start = time.monotonic()
        for _ in range(fbs // step):
            r = w.cmd(f"fb {step}")
            time.sleep(1.0)
            s = in_process(hist)
            s["worker"] = {k: r.get(k) for k in ("counts", "seconds", "error")}
            s["memfree_drop"] = free0 - s["MemFree"]
            samples.append(s)
            st = (s["finding"] or {}).get("status")
            if st and st not in first:
                first[st] = s["t"] - t_start
            log(f"  fb {s['worker']['counts']}: MemFree -{s['memfree_drop'] / GIB:.2f} GiB, gap {s['gap'] / GIB:.2f} "
                f"GiB, {st or 'no finding'} {(s['finding'] or {}).get('severity', '')}")
        res["samples"] = samples
        res["first_status_after_s"] = first
        res["memfree_drop"] = free0 - M.meminfo()["MemFree"]
        res["cgroup"] = M.cgroup(pod.ctr_dir)
        res["nvml"] = M.nvml_processes()
        c = cli("check", "--root", "/", "--format", "json", "--fail-on", "critical")
        res["check_seconds"] = c["seconds"]
        res["findings"] = findings(c.get("report", {}))
        res["stderr"] = c["stderr"]
        res["text"] = cli("check", "--root", "/", "--no-color", "--select", "GPU-NODE").get("stdout", "")
        res["collect"] = {k: v for k, v in cli("collect", "-o", str(OUT / "egl-bundle.tar.gz"), timeout=240).items()
                          if k in ("rc", "seconds", "stderr")}
        dry = subprocess.run([sys.executable, "-m", "gpuwarden", "agent", "--root", "/", "--no-kube", "--listen", "",
                              "--select", "GPU-NODE", "--interval", "1s", "--cycles", "3", "--remediate", "dry-run", "--boot-grace", "0s",
                              "--memory-local-kill", "--log-format", "text"], capture_output=True, text=True,
                             timeout=120, env=dict(os.environ, PYTHONPATH=src_path()))
        res["dry_run"] = dry.stdout[-3000:] + dry.stderr[-3000:]
        w.cmd("quit")
        w.stop()
        procs.remove(w)
        res["guard"] = _guard(pod, fbs, step)
    finally:
        _cleanup(pods, procs)
    return res


def _guard(pod: Pod, fbs: int, step: int) -> dict:
    """The agent, remediation on, no API server, memory_local_kill: a new leak in the same pod is killed."""
    out: dict[str, Any] = {}
    free_before = M.meminfo()["MemFree"]
    agent = subprocess.Popen([sys.executable, "-m", "gpuwarden", "agent", "--root", "/", "--no-kube", "--listen", "",
                              "--select", "GPU-NODE", "--interval", "1s", "--remediate", "on", "--memory-local-kill", "--boot-grace", "0s",
                              "--memory-growth-window", "8s", "--log-format", "json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=src_path()))
    w = gl_worker(pod)
    try:
        out.update(_leak_until_killed(w, pod, fbs // step, step, free_before))
    finally:
        w.stop()
        agent.terminate()
        try:
            _, err = agent.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
            _, err = agent.communicate()
        out["agent_log"] = [ln for ln in err.splitlines() if "remediation" in ln or "fault-raised" in ln][:10]
    log(f"  guard: over limit after {out.get('over_limit_after_s')} s, killed after {out.get('killed_after_s')} s; "
        f"MemFree drop peak {out.get('memfree_drop_peak', 0) / GIB:.2f} GiB, after "
        f"{out.get('memfree_drop_after', 0) / GIB:.2f} GiB")
    return out


def _leak_until_killed(w: Proc, pod: Pod, rounds: int, step: int, free_before: int,
                       beside: Proc | None = None) -> dict:
    """Framebuffers every second until the worker dies: when it crossed limit + 1 GiB, when it was killed."""
    t0 = time.monotonic()
    over_at = killed_at = None
    peak = 0
    for _ in range(rounds):
        r = w.cmd(f"fb {step}")
        if beside is not None:
            beside.cmd("draw 2")
        now = time.monotonic()
        drop = free_before - M.meminfo()["MemFree"]
        peak = max(peak, drop)
        if over_at is None and drop > pod.limit + GIB:  # type: ignore[operator]
            over_at = now - t0
        if "error" in r:
            killed_at = now - t0
            break
        time.sleep(1.0)
    deadline = time.monotonic() + 20
    while killed_at is None and time.monotonic() < deadline:
        if w.p.poll() is not None:
            killed_at = time.monotonic() - t0
            break
        time.sleep(0.2)
    time.sleep(1.0)
    return {"worker_exit": w.p.poll(), "over_limit_after_s": over_at, "killed_after_s": killed_at,
            "memfree_drop_peak": peak, "memfree_drop_after": free_before - M.meminfo()["MemFree"]}


def memory_two_pods(fbs: int = 48, step: int = 16) -> dict:
    pods: list[Pod] = []
    procs: list[Proc] = []
    res: dict[str, Any] = {"scenario": "memory-two-pods", "expect": "GPU-NODE-001", "expect_pod": "viz/render-0",
                           "injected": "filler pod ml/filler-0 (compute), training pod ml/train-0 (pinned + 1 GiB "
                                       f"unified memory, limit 8 GiB), pod viz/render-0 with {fbs} framebuffers"}
    try:
        tpod = Pod("ml", "train-0", "trainer", 8 * GIB, gpu="GPU-0").create()
        pods.append(tpod)
        kubelet_state(pods)
        t = Proc([sys.executable, str(TOOLS / "legit_load.py"), "train", "120"], tpod)
        procs.append(t)
        res["train"] = t.first
        res["fill"] = _fill(pods, procs, as_pod=True)
        pod = Pod("viz", "render-0", "render", 2 * GIB, gpu="GPU-0").create()
        pods.append(pod)
        kubelet_state(pods)
        w = gl_worker(pod)
        procs.append(w)
        for _ in range(fbs // step):
            w.cmd(f"fb {step}")
        time.sleep(1.0)
        c = cli("check", "--root", "/", "--format", "json", "--fail-on", "critical")
        res["findings"] = findings(c.get("report", {}))
        res["check_seconds"] = c["seconds"]
        res["stderr"] = c["stderr"]
        res["nvml"] = M.nvml_processes()
        log(f"  two pods: {[(f['code'], f['status'], f['summary'][:120]) for f in res['findings']]}")
    finally:
        _cleanup(pods, procs)
    return res


def memory_legit_load(seconds: int = 60) -> dict:
    pods: list[Pod] = []
    procs: list[Proc] = []
    res: dict[str, Any] = {"scenario": "memory-legit-load", "expect": None,
                           "injected": "ml/train-0 (pinned 2 GiB, unified 1 GiB, limit 8 GiB) + 4 pods each a CUDA "
                                       "process with an 8192x8192 matmul loop (limit 4 GiB)"}
    try:
        res["gap_idle"] = in_process()["gap"]
        tpod = Pod("ml", "train-0", "trainer", 8 * GIB, gpu="GPU-0").create()
        smalls = [Pod("ml", f"infer-{i}", "server", 4 * GIB, gpu="GPU-0").create() for i in range(4)]
        pods.extend([tpod, *smalls])
        kubelet_state(pods)
        procs.append(Proc([sys.executable, str(TOOLS / "legit_load.py"), "train", str(seconds)], tpod))
        procs.extend(Proc([sys.executable, str(TOOLS / "legit_load.py"), "small", str(seconds)], p) for p in smalls)
        res["workers"] = [p.first for p in procs]
        time.sleep(5)
        s = in_process()
        res["gap_loaded"], res["contexts"], res["excess"] = s["gap"], s["contexts"], s["excess"]
        c = cli("check", "--root", "/", "--format", "json", "--fail-on", "critical")
        res["findings"] = findings(c.get("report", {}))
        res["check_seconds"] = c["seconds"]
        res["stderr"] = c["stderr"]
        log(f"  legit load: gap {s['gap'] / MIB:.0f} MiB with {s['contexts']} contexts; findings "
            f"{[(f['code'], f['status'], f['severity']) for f in res['findings']]}")
    finally:
        _cleanup(pods, procs)
    return res


def verdict(res: dict) -> bool:
    """The expected pod named CONFIRMED, with its escaped amount within 10 % of MemFree's drop (memory-egl)."""
    if res["scenario"] in CROWDED:
        return crowded_verdict(res)
    fs = [f for f in res.get("findings", []) if f["code"] == res["expect"] and f["status"] == "confirmed"]
    if not fs:
        return False
    f = fs[0]
    if not any(a.endswith(f":{res['expect_pod']}") for a in f["affected"]):
        return False
    if res["scenario"] == "memory-egl":
        esc = (f.get("escape") or {}).get("escape") or {}
        drop = res.get("memfree_drop") or 0
        total = (esc.get("charged") or 0) + (esc.get("uncharged") or 0)
        res["escaped_vs_memfree"] = round(total / drop, 3) if drop else None
        g = res.get("guard") or {}
        return bool(drop) and abs(total - drop) <= 0.10 * drop and g.get("killed_after_s") is not None
    return True


# ----------------------------------------------------------------------------- crowded node (issue 17)

CLK_TCK = os.sysconf("SC_CLK_TCK")


def pid_stat(pid: int) -> dict | None:
    """Start time (s since boot), user and kernel CPU seconds of a process: what separates candidates."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return {"start_s": int(f[19]) / CLK_TCK, "utime_s": int(f[11]) / CLK_TCK, "stime_s": int(f[12]) / CLK_TCK}


def pod_pids(pod: Pod) -> list[int]:
    try:
        return [int(x) for x in Path(pod.procs).read_text().split()]
    except OSError:
        return []


def raw_sample(pods: list[Pod], hist: Any = None) -> dict:
    """What the agent would see at one check, raw: the gap, NVML's per-process lists, per-pod processes with
    their start and CPU times (the recorded sample histories of tests/memory are built from these)."""
    s = in_process(hist)
    mi = M.meminfo()
    s.update({"epoch": round(time.time(), 3), "uptime_s": float(Path("/proc/uptime").read_text().split()[0]),
              "MemAvailable": mi.get("MemAvailable"), "nvml": M.nvml_processes(),
              "pods": {p.ref: {"uid": p.uid, "limit": p.limit, "current": M.cgroup(p.pod_dir).get("memory.current"),
                               "procs": {str(pid): pid_stat(pid) for pid in pod_pids(p)}} for p in pods}})
    return s


def agent_proc(remediate: str, window: str = "8s", extra: tuple[str, ...] = (), api: Any = None,
               interval: str = "1s") -> tuple[subprocess.Popen, Path]:
    """The agent watching the live host; the API server unreachable (a kubeconfig pointing at a closed port), or
    with `api` (memharness.ApiSession) the test API server, reached with the agent's node-bound token."""
    p = subprocess.Popen([sys.executable, "-m", "gpuwarden", "agent", *agent_target(api), "--listen", "",
                          "--select", "GPU-NODE", "--interval", interval,
                          "--remediate", remediate, "--memory-local-kill", "--boot-grace", "0s",
                          "--memory-growth-window", window, "--log-format", "json", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=src_path()))
    return p, Path(agent_target(api)[3])


NODE = "gpu-node-0"


def agent_target(api: Any = None) -> list[str]:
    """--root, --kubeconfig, --node-name (and --namespace with the API): the node and the API server it reports to."""
    if api is not None:
        return ["--root", "/", "--kubeconfig", api.agent_kubeconfig(), "--node-name", api.node, "--namespace",
                api.namespace]
    kc = Path("/tmp/gw-unreachable.kubeconfig")
    kc.write_text(UNREACHABLE_KUBECONFIG)  # an API server that does not answer at all
    return ["--root", "/", "--kubeconfig", str(kc), "--node-name", NODE]


def _pod(api: Any, ns: str, name: str, container: str, limit: int | None) -> Pod:
    """A pod laid out on the host; with `api`, first made in the API server (its uid is the cgroup's) and watched by
    the kubelet stand-in, which stops its processes once the API has evicted it."""
    if api is None:
        return Pod(ns, name, container, limit, gpu="GPU-0").create()
    pod = Pod(ns, name, container, limit, gpu="GPU-0", uid=api.pod(ns, name)).create()
    _kubelet().track(pod.uid, pod.ref)
    _LAID[pod.uid] = pod
    return pod


def agent_stop(p: subprocess.Popen) -> dict:
    p.terminate()
    try:
        out, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    recs, raw = [], []
    for ln in err.splitlines():
        try:
            recs.append(json.loads(ln))
        except ValueError:
            raw.append(ln[:300])
    keep = [r for r in recs if r.get("msg") in ("fault-raised", "remediation", "monitor-failed", "check-failed",
                                                 "remediation-failed", "memory-guard", "memory-unsure",
                                                 "memory-separation", "memory-fast-sampling")]
    failed = [r for r in keep if r.get("msg") == "remediation-failed"]
    keep = [r for r in keep if r.get("msg") != "remediation-failed" or r in failed[:3]]  # the API away: once a second
    return {"log": keep[:60], "remediation_failed": len(failed), "checks": sum(1 for r in recs if r.get("msg") == "check"),
            "monitor_failed": sum(1 for r in recs if r.get("msg") == "monitor-failed"),
            "stdout": out[-2000:], "not_json": raw[-20:],
            "first_check": next((r.get("ts") for r in recs if r.get("msg") == "check"), None)}


def _crowd(pods: list[Pod], procs: list[Proc], graphics: list[tuple[str, str]], api: Any = None,
           limits: dict[str, int] | None = None) -> dict[str, Proc]:
    """The filler pod (compute) fills the GPU; graphics pods start and render steadily (2 small framebuffers)."""
    _fill(pods, procs, as_pod=True, api=api)
    out = {}
    for ns, name in graphics:
        pod = _pod(api, ns, name, "render", (limits or {}).get(f"{ns}/{name}", 2 * GIB))
        pods.append(pod)
        kubelet_state(pods)
        w = gl_worker(pod)
        procs.append(w)
        w.cmd("fb 2 2048")
        out[pod.ref] = w
    return out


def _leak(w: Proc, steps: int, step: int, pods: list[Pod], hist: Any, steady: list[Proc], free0: int,
          samples: list) -> None:
    t0 = time.monotonic()
    for _ in range(steps):
        r = w.cmd(f"fb {step}")
        for s in steady:
            s.cmd("draw 4")
        time.sleep(1.0)
        s = raw_sample(pods, hist)
        s["leak_s"] = round(time.monotonic() - t0, 3)
        s["worker"] = {k: r.get(k) for k in ("counts", "seconds", "error")}
        s["memfree_drop"] = free0 - s["MemFree"]
        samples.append(s)
        log(f"  +{s['leak_s']:.1f} s fb {r.get('counts', {}).get('fb')}: MemFree -{s['memfree_drop'] / GIB:.2f} GiB, "
            f"gap {s['gap'] / GIB:.2f} GiB, {(s['finding'] or {}).get('status', 'no finding')} "
            f"{(s['finding'] or {}).get('summary', '')[:160]}")


def memory_late_leaker(steps: int = 6, step: int = 8) -> dict:
    """(b) two graphics pods on the full GPU, the leaker arriving later; (d) the guard with the API unreachable."""
    from gpuwarden.memory.trend import MemoryHistory

    pods: list[Pod] = []
    procs: list[Proc] = []
    res: dict[str, Any] = {"scenario": "memory-late-leaker", "expect": "GPU-NODE-001", "expect_pod": "viz/render-0",
                           "injected": "filler pod ml/filler-0 (compute, GPU full), graphics pod viz/steady-0 "
                                       "rendering steadily from the start, then graphics pod viz/render-0 arriving "
                                       f"and creating {steps * step} 4096x4096 framebuffers, {step} a second"}
    try:
        g = _crowd(pods, procs, [("viz", "steady-0")])
        steady = g["viz/steady-0"]
        agent, _ = agent_proc("dry-run")
        hist = MemoryHistory(100, window_s=8.0, growth_bytes_per_min=256 * MIB, clock=time.monotonic)
        samples = []
        for _ in range(3):
            steady.cmd("draw 4")
            time.sleep(1.0)
            samples.append(raw_sample(pods, hist))
        free0 = M.meminfo()["MemFree"]
        pod = Pod("viz", "render-0", "render", 2 * GIB, gpu="GPU-0").create()
        pods.append(pod)
        kubelet_state(pods)
        w = gl_worker(pod)
        procs.append(w)
        res["worker"] = w.first
        _leak(w, steps, step, pods, hist, [steady], free0, samples)
        res["samples"] = samples
        c = cli("check", "--root", "/", "--format", "json", "--fail-on", "critical")
        res["check_seconds"], res["findings"], res["stderr"] = c["seconds"], findings(c.get("report", {})), c["stderr"]
        res["text"] = cli("check", "--root", "/", "--no-color", "--select", "GPU-NODE").get("stdout", "")
        res["collect"] = {k: v for k, v in cli("collect", "-o", str(OUT / "late-leaker-bundle.tar.gz"),
                                               timeout=240).items() if k in ("rc", "seconds", "stderr")}
        time.sleep(2.0)
        res["agent"] = agent_stop(agent)
        w.cmd("quit")
        w.stop()
        procs.remove(w)
        time.sleep(1.0)
        res["guard"] = _late_guard(pods, pod, steady, procs, steps, step)
    finally:
        _cleanup(pods, procs)
    return res


def _late_guard(pods: list[Pod], pod: Pod, steady: Proc, procs: list[Proc], steps: int, step: int) -> dict:
    """(d): the agent watching, remediation on, memory_local_kill, API unreachable; the leaker arrives later."""
    out: dict[str, Any] = {}
    agent, _ = agent_proc("on")
    time.sleep(4.0)
    free_before = M.meminfo()["MemFree"]
    w = gl_worker(pod)
    try:
        out.update(_leak_until_killed(w, pod, steps * 2, step, free_before, steady))
        out["others_alive"] = {p.first.get("pid"): p.p.poll() is None for p in procs}
    finally:
        w.stop()
        out["agent"] = agent_stop(agent)
    log(f"  guard: over limit after {out.get('over_limit_after_s')} s, killed after {out.get('killed_after_s')} s; "
        f"others alive {out.get('others_alive')}")
    return out


def memory_two_graphics(steps: int = 6, step: int = 8) -> dict:
    """(c) two graphics pods from the start, one starts leaking later: both named, nothing acted on."""
    from gpuwarden.memory.trend import MemoryHistory

    pods: list[Pod] = []
    procs: list[Proc] = []
    res: dict[str, Any] = {"scenario": "memory-two-graphics", "expect": "GPU-NODE-001",
                           "expect_candidates": ["viz/steady-0", "viz/render-0"], "not_named": "ml/filler-0",
                           "injected": "filler pod ml/filler-0 (compute, GPU full); graphics pods viz/steady-0 and "
                                       "viz/render-0 both rendering from the start; later viz/render-0 creates "
                                       f"{steps * step} 4096x4096 framebuffers, {step} a second"}
    try:
        g = _crowd(pods, procs, [("viz", "steady-0"), ("viz", "render-0")])
        agent, _ = agent_proc("on")
        hist = MemoryHistory(100, window_s=8.0, growth_bytes_per_min=256 * MIB, clock=time.monotonic)
        samples = []
        for _ in range(3):
            for w in g.values():
                w.cmd("draw 4")
            time.sleep(1.0)
            samples.append(raw_sample(pods, hist))
        free0 = M.meminfo()["MemFree"]
        _leak(g["viz/render-0"], steps, step, pods, hist, [g["viz/steady-0"]], free0, samples)
        res["samples"] = samples
        c = cli("check", "--root", "/", "--format", "json", "--fail-on", "critical")
        res["check_seconds"], res["findings"], res["stderr"] = c["seconds"], findings(c.get("report", {})), c["stderr"]
        res["text"] = cli("check", "--root", "/", "--no-color", "--select", "GPU-NODE").get("stdout", "")
        res["collect"] = {k: v for k, v in cli("collect", "-o", str(OUT / "two-graphics-bundle.tar.gz"),
                                               timeout=240).items() if k in ("rc", "seconds", "stderr")}
        time.sleep(3.0)
        res["agent"] = agent_stop(agent)
        res["alive"] = {ref: w.p.poll() is None for ref, w in g.items()}
        res["filler_alive"] = procs[0].p.poll() is None
        res["memfree_drop"] = free0 - M.meminfo()["MemFree"]
    finally:
        _cleanup(pods, procs)
    return res


def memory_heavy_legit(checks: int = 3) -> dict:
    """(e) heavy legitimate load, unified and pinned memory inside limits: nothing at medium or above."""
    pods: list[Pod] = []
    procs: list[Proc] = []
    res: dict[str, Any] = {"scenario": "memory-heavy-legit", "expect": None,
                           "injected": "ml/train-0 (matmul loop, 4 GiB pinned, 2 GiB unified, limit 8 GiB), "
                                       "ml/uvm-0 (4 GiB unified, limit 16 GiB), ml/anon-0 (2 GiB anon, limit 4 GiB), "
                                       "4 inference pods (one CUDA process each, limit 4 GiB)"}
    try:
        res["gap_idle"] = in_process()["gap"]
        t = Pod("ml", "train-0", "trainer", 8 * GIB, gpu="GPU-0").create()
        u = Pod("ml", "uvm-0", "uvm", 16 * GIB, gpu="GPU-0").create()
        a = Pod("ml", "anon-0", "anon", 4 * GIB).create()
        smalls = [Pod("ml", f"infer-{i}", "server", 4 * GIB, gpu="GPU-0").create() for i in range(4)]
        pods.extend([t, u, a, *smalls])
        kubelet_state(pods)
        agent, _ = agent_proc("on", window="20s")
        lg = str(TOOLS / "legit_load.py")
        procs.append(Proc([sys.executable, lg, "train", "90"], t, {"GW_PINNED_GIB": "4", "GW_MANAGED_GIB": "2"}))
        procs.append(Proc([sys.executable, lg, "train", "90"], u, {"GW_PINNED_GIB": "0", "GW_MANAGED_GIB": "4"}))
        procs.append(Proc([sys.executable, lg, "anon", "90"], a))
        procs.extend(Proc([sys.executable, lg, "small", "90"], p) for p in smalls)
        res["workers"] = [p.first for p in procs]
        time.sleep(3)
        res["checks"] = []
        for i in range(checks):
            s = raw_sample(pods)
            c = cli("check", "--root", "/", "--format", "json")
            res["checks"].append({"gap": s["gap"], "contexts": s["contexts"], "excess": s["excess"],
                                  "seconds": c["seconds"], "findings": findings(c.get("report", {})),
                                  "pods": s["pods"]})
            log(f"  heavy legit {i}: gap {s['gap'] / MIB:.0f} MiB, {s['contexts']} contexts; findings "
                f"{[(f['code'], f['status'], f['severity']) for f in res['checks'][-1]['findings']]}")
            time.sleep(2)
        res["collect"] = {k: v for k, v in cli("collect", "-o", str(OUT / "heavy-legit-bundle.tar.gz"),
                                               timeout=240).items() if k in ("rc", "seconds", "stderr")}
        time.sleep(4)
        res["agent"] = agent_stop(agent)
        res["findings"] = [f for c in res["checks"] for f in c["findings"]]
    finally:
        _cleanup(pods, procs)
    return res


# ----------------------------------------------------------------------------- arrival cannot tell (issue 43)

def memory_late_leaker_separated(quiet_s: int = 6, steps: int = 12, step: int = 8, with_api: bool = False) -> dict:
    """Two graphics pods from the start, one leaks later, a compute pod filling the GPU: the leaker is named by its
    own signals (kernel time, faults, device mappings) tracking the growth, and stopped; the others untouched.
    API server unreachable: the local kill (`--memory-local-kill`). `with_api` (memory-late-leaker-separated-api):
    the test API server under the chart's RBAC, the action the eviction through the API, the kubelet stand-in
    stopping the evicted pod's processes. Bounded: at most steps x step framebuffers of 128 MiB (12 GiB)."""
    from gpuwarden.memory.trend import MemoryHistory

    name = "memory-late-leaker-separated" + ("-api" if with_api else "")
    pods: list[Pod] = []
    procs: list[Proc] = []
    res: dict[str, Any] = {"scenario": name, "expect": "GPU-NODE-001",
                           "expect_pod": "viz/render-0", "not_named": "viz/steady-0",
                           "injected": "filler pod ml/filler-0 (compute, GPU full); graphics pods viz/steady-0 and "
                                       f"viz/render-0 both rendering from the start for {quiet_s} s; then viz/render-0 "
                                       f"creates up to {steps * step} 4096x4096 framebuffers, {step} a second; "
                                       + ("the test API server up (chart RBAC), the action an eviction" if with_api
                                          else "the API server unreachable, the action the local kill")}
    api = _api(res) if with_api else None
    if with_api and api is None:
        return res
    try:
        g = _crowd(pods, procs, [("viz", "steady-0"), ("viz", "render-0")], api=api)
        agent, _ = agent_proc("on", extra=("--memory-unsure-policy", "alert"), api=api)
        hist = MemoryHistory(100, window_s=8.0, growth_bytes_per_min=256 * MIB, clock=time.monotonic)
        samples = []
        for _ in range(quiet_s):  # the quiet time: each pod's own baseline of kernel time, faults, mappings
            for w in g.values():
                w.cmd("draw 4")
            time.sleep(1.0)
            samples.append(raw_sample(pods, hist))
        free0 = M.meminfo()["MemFree"]
        leaker, t0 = g["viz/render-0"], time.monotonic()
        for _ in range(steps):  # the leak, sampled in this process as the agent samples it, until the agent kills it
            r = leaker.cmd(f"fb {step}")
            g["viz/steady-0"].cmd("draw 4")
            x = raw_sample(pods, hist)
            x["leak_s"], x["worker"] = round(time.monotonic() - t0, 3), {k: r.get(k) for k in ("counts", "error")}
            x["memfree_drop"] = free0 - x["MemFree"]
            samples.append(x)
            if "error" in r or leaker.p.poll() is not None:
                res["killed_after_s"] = x["leak_s"]
                break
            time.sleep(1.0)
        res["samples"] = samples
        res["separations"] = [(x.get("separation") or {}).get("method") for x in samples]
        res["named"] = [(x.get("separation") or {}).get("holder") for x in samples]
        time.sleep(2.0)
        res["agent"] = agent_stop(agent)
        res["alive"] = {ref: w.p.poll() is None for ref, w in g.items()}
        res["filler_alive"] = procs[0].p.poll() is None
        if api is not None:
            res.update(_api_record(api, t0))
        log(f"  separated{' (API)' if api else ''}: killed after {res.get('killed_after_s')} s; alive {res['alive']}, "
            f"filler {res['filler_alive']}" + (f"; stopped by the kubelet stand-in {res['kubelet_stopped']}, "
                                               f"API pods left {res['api_pods_left']}" if api else ""))
    finally:
        _cleanup(pods, procs)
    return res


def memory_late_leaker_separated_api() -> dict:
    return memory_late_leaker_separated(with_api=True)


def memory_unsure_last_resort(steps: int = 14, step: int = 8) -> dict:
    """Two graphics tenants leaking alike from the start (nothing can separate them, by construction), a compute pod
    filling the GPU; the agent with memory_unsure_policy=stop-graphics-candidates and the API unreachable: both
    graphics pods stopped through their cgroups once the growth has taken an eighth of the headroom with the min
    watermark under the bound; the compute pod untouched; the node survives. Bounded: at most
    2 x steps x step framebuffers of 128 MiB (28 GiB; the policy needs an eighth of the headroom, ~15 GiB on the
    125 GiB H200 host, before it acts)."""
    pods: list[Pod] = []
    procs: list[Proc] = []
    res: dict[str, Any] = {"scenario": "memory-unsure-last-resort", "expect": "GPU-NODE-001",
                           "expect_stopped": ["viz/render-0", "viz/render-1"], "not_named": "ml/filler-0",
                           "injected": "filler pod ml/filler-0 (compute, GPU full); graphics pods viz/render-0 and "
                                       f"viz/render-1 each creating {step} 4096x4096 framebuffers a second from the "
                                       f"start, at most {steps} seconds"}
    try:
        mi0 = M.meminfo()
        g = _crowd(pods, procs, [("viz", "render-0"), ("viz", "render-1")])
        agent, _ = agent_proc("on", extra=("--memory-unsure-policy", "stop-graphics-candidates",
                                           "--memory-unsure-bound", "600s"))
        time.sleep(3.0)
        t0 = time.monotonic()
        low = mi0.get("MemAvailable") or 0
        stopped: dict[str, float] = {}
        for _ in range(steps):
            for ref, w in g.items():
                if ref not in stopped and "error" in w.cmd(f"fb {step}"):
                    stopped[ref] = round(time.monotonic() - t0, 3)
            low = min(low, M.meminfo().get("MemAvailable") or 0)
            if len(stopped) == len(g):
                break
            time.sleep(1.0)
        time.sleep(3.0)
        res["stopped_after_s"] = stopped
        res["alive"] = {ref: w.p.poll() is None for ref, w in g.items()}
        res["filler_alive"] = procs[0].p.poll() is None
        res["memavailable_before"], res["memavailable_low"] = mi0.get("MemAvailable"), low
        res["memavailable_after"] = M.meminfo().get("MemAvailable")
        res["agent"] = agent_stop(agent)
        log(f"  unsure: stopped {stopped}; filler alive {res['filler_alive']}; MemAvailable low "
            f"{low / GIB:.1f} GiB of {(mi0.get('MemAvailable') or 0) / GIB:.1f}")
    finally:
        _cleanup(pods, procs)
    return res


def memory_graphics_legit_unsure(quiet_s: int = 8, legit_s: int = 16, tail_s: int = 8, scene_fbs: int = 24) -> dict:
    """Issue 43 (b): the same crowded layout with no leak, then legitimate graphics load, the unsure policy on
    (`stop-graphics-candidates`, the API unreachable, `--memory-local-kill`): nothing at medium or above, no action.

    A compute pod fills the GPU; viz/steady-0 renders steadily throughout; viz/resize-0 resizes its window every 2 s
    (its framebuffers released and made again at 3072 or 2048 square); viz/scene-0 (limit 6 GiB) loads a large but
    bounded scene, `scene_fbs` 4096x4096 framebuffers (128 MiB each, 3 GiB) 4 a second, then renders it. The agent
    runs at the chart's memory thresholds (growth 1 GiB/min over 300 s, unsure bound 300 s), every 2 s instead of
    60 s so that it samples the load many times. Bounded: 3 GiB for the scene, 2 x 36 MiB for each resize."""
    from gpuwarden.memory.trend import MemoryHistory

    pods: list[Pod] = []
    procs: list[Proc] = []
    res: dict[str, Any] = {"scenario": "memory-graphics-legit-unsure", "expect": None,
                           "injected": "filler pod ml/filler-0 (compute, GPU full); viz/steady-0 rendering, "
                                       "viz/resize-0 resizing every 2 s, viz/scene-0 (limit 6 GiB) loading "
                                       f"{scene_fbs} 4096x4096 framebuffers 4 a second then rendering; "
                                       f"{quiet_s} s quiet, {legit_s} s of load, {tail_s} s after; agent "
                                       "--memory-unsure-policy stop-graphics-candidates, API unreachable, local kill"}
    try:
        g = _crowd(pods, procs, [("viz", "steady-0"), ("viz", "resize-0"), ("viz", "scene-0")],
                   limits={"viz/scene-0": 6 * GIB})
        agent, _ = agent_proc("on", window="300s", interval="2s",
                              extra=("--memory-unsure-policy", "stop-graphics-candidates"))
        hist = MemoryHistory(200, window_s=300.0, growth_bytes_per_min=GIB, clock=time.monotonic)
        samples: list[dict] = []
        loaded, t0 = 0, time.monotonic()
        for i in range(quiet_s + legit_s + tail_s):
            phase = "quiet" if i < quiet_s else "load" if i < quiet_s + legit_s else "after"
            g["viz/steady-0"].cmd("draw 4")
            if phase == "load" and (i - quiet_s) % 2 == 0:
                g["viz/resize-0"].cmd("release")
                g["viz/resize-0"].cmd(f"fb 2 {3072 if (i - quiet_s) % 4 == 0 else 2048}")
            else:
                g["viz/resize-0"].cmd("draw 2")
            if phase == "load" and loaded < scene_fbs:
                r = g["viz/scene-0"].cmd(f"fb {min(4, scene_fbs - loaded)}")
                loaded = (r.get("counts") or {}).get("fb", loaded + 2) - 2  # the two it rendered from the start
            else:
                g["viz/scene-0"].cmd("draw 1")
            time.sleep(0.5)
            x = raw_sample(pods, hist)
            x["phase"], x["at_s"] = phase, round(time.monotonic() - t0, 3)
            samples.append(x)
        res["scene_loaded_fbs"] = loaded
        res["samples"] = samples
        res["sample_findings"] = [dict(x["finding"], phase=x["phase"]) for x in samples if x.get("finding")]
        res["named"] = sorted({h for x in samples if (h := (x.get("separation") or {}).get("holder"))})
        c = cli("check", "--root", "/", "--format", "json")
        res["check_seconds"], res["findings"], res["stderr"] = c["seconds"], findings(c.get("report", {})), c["stderr"]
        time.sleep(2.0)
        res["agent"] = agent_stop(agent)
        res["alive"] = {ref: w.p.poll() is None for ref, w in g.items()}
        res["filler_alive"] = procs[0].p.poll() is None
        log(f"  legit graphics load: scene {loaded} fbs; sample findings "
            f"{sorted({(f['status'], f['severity']) for f in res['sample_findings']})}; check "
            f"{[(f['code'], f['status'], f['severity']) for f in res['findings']]}; alive {res['alive']}")
    finally:
        _cleanup(pods, procs)
    return res


# ----------------------------------------------------------------------------- incident 4 at the defaults (issue 41)

#: the leak's target rate and the most a scenario leaks in all (a quarter of MemAvailable is issue 41's line)
FAST_RATE_GIB_MIN = float(os.environ.get("GW_FAST_LEAK_GIB_MIN", "40"))
FAST_CAP_BYTES = 32 * GIB
#: how long after the agent's first full check the leak begins (0.5 s: the worst phase, a full interval to the next)
FAST_PHASE_S = float(os.environ.get("GW_FAST_LEAK_PHASE_S", "0.5"))


def memory_fast_leak_defaults(with_api: bool = False, max_s: float = 75.0) -> dict:
    """Issue 41's incident-4 target: the agent at the chart's defaults (interval 60 s, event sources on, confirm
    0.2 s, fast memory sampling 0.5 s, growth 1 GiB/min over 300 s, debounce 2; every rule), with only what acting
    needs: `--remediate on --memory-local-kill`, `--boot-grace 0s` (the machine booted minutes ago), no metrics
    listener. A compute pod fills the GPU; viz/render-0 (limit 2 GiB, a graphics client) renders from the start;
    `FAST_PHASE_S` after the agent's first full check it leaks 4096x4096 framebuffers at `FAST_RATE_GIB_MIN`
    (paced on MemAvailable's fall). Measured: the rate achieved, MemAvailable's drop when the pod's processes
    stopped, the time from the leak's start to the stop, and what saw the growth first.
    The API server unreachable (the local kill), or `with_api` (memory-fast-leak-defaults-api): the test API server
    under the chart's RBAC, the eviction, the kubelet stand-in stopping the evicted pod.
    Bounded: the leak never passes a quarter of MemAvailable at its start nor 32 GiB (it holds there, and the
    target counts as missed), nor runs past `max_s`; everything stops when MemAvailable falls by 40 %."""
    name = "memory-fast-leak-defaults" + ("-api" if with_api else "")
    pods: list[Pod] = []
    procs: list[Proc] = []
    res: dict[str, Any] = {"scenario": name, "expect": "GPU-NODE-001", "expect_pod": "viz/render-0",
                           "target_rate_gib_per_min": FAST_RATE_GIB_MIN, "phase_after_first_check_s": FAST_PHASE_S,
                           "injected": f"filler pod ml/filler-0 (compute, GPU full); viz/render-0 (limit 2 GiB) "
                                       f"leaking 4096x4096 framebuffers at {FAST_RATE_GIB_MIN:g} GiB/min from "
                                       f"{FAST_PHASE_S:g} s after the agent's first full check; agent at the chart's "
                                       "defaults; " + ("the test API server up (chart RBAC)" if with_api
                                                       else "the API server unreachable")}
    api = _api(res) if with_api else None
    if with_api and api is None:
        return res
    watch = H.MemWatch().start()
    agent = None
    try:
        g = _crowd(pods, procs, [("viz", "render-0")], api=api)
        w = g["viz/render-0"]
        watch.watch("viz/render-0", w.p)
        watch.watch("ml/filler-0", procs[0].p)
        argv = [sys.executable, "-m", "gpuwarden", "agent", *agent_target(api), "--listen", "", "--remediate", "on",
                "--memory-local-kill", "--boot-grace", "0s", "--log-format", "json"]
        agent = H.AgentRun(argv, env=dict(os.environ, PYTHONPATH=src_path()))
        first = agent.wait_for(H.full_check, timeout=90)
        if first is None:
            res["error"] = "the agent logged no full check within 90 s"
            return res
        res["first_check_after_start_s"] = round(first[0] - agent.t0, 3)
        time.sleep(FAST_PHASE_S)
        res.update(_fast_leak(w, watch, max_s))
        t0 = res.pop("_t0")
        try:  # the worker stopped answering (killed): let its exit and the watch's next poll land (run 20b: the
            w.p.wait(timeout=5)  # loop broke on the dead pipe before the watch thread had seen the exit)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(3 * watch.period)
        res["worker_exit"] = w.p.poll()
        t_stop = watch.died.get("viz/render-0")
        if t_stop is None and res.get("_gone_at") is not None and res["worker_exit"] is not None:
            t_stop = res["_gone_at"]  # the first command it could not answer
        res.pop("_gone_at", None)
        if api is not None:
            stop = next((v["t"] for v in (_STANDIN.stopped if _STANDIN else {}).values() if v["ref"] == "viz/render-0"),
                        None)
            t_stop = stop if stop is not None and (t_stop is None or stop < t_stop) else t_stop
        res["stopped_after_s"] = round(t_stop - t0, 3) if t_stop is not None else None
        held = t0 + res["capped_after_s"] if res.get("capped_after_s") is not None else None
        res["figures"] = H.leak_figures(watch.samples, t0, t_stop if t_stop is not None else time.monotonic(), held)
        time.sleep(1.0)
        res["memavailable_after"] = watch.available()
        res["filler_alive"] = procs[0].p.poll() is None
        res["agent"] = agent.stop(since=t0)
        res["seen"] = _first_seen(res["agent"]["log"], res["agent"]["check_lines"])
        if api is not None:
            res.update(_api_record(api, t0))
        f = res["figures"]
        log(f"  fast leak{' (API)' if api else ''}: {f.get('rate_gib_per_min')} GiB/min; stopped after "
            f"{res['stopped_after_s']} s with MemAvailable down {f.get('drop_at_stop', 0) / GIB:.1f} GiB of "
            f"{f.get('memavailable_at_start', 0) / GIB:.1f} ({f.get('drop_share')}); capped at "
            f"{res.get('capped_after_s')} s; first seen {res['seen']}")
    finally:
        if agent is not None and agent.p.poll() is None:
            res.setdefault("agent", agent.stop())
        watch.stop()
        _cleanup(pods, procs)
    return res


def memory_fast_leak_defaults_api() -> dict:
    return memory_fast_leak_defaults(with_api=True)


def _fast_leak(w: Proc, watch: Any, max_s: float) -> dict:
    """Leak at FAST_RATE_GIB_MIN until the worker dies, holding at the cap; at most `max_s` s."""
    avail0 = watch.available()
    cap = min(avail0 // 4, FAST_CAP_BYTES)
    rate = FAST_RATE_GIB_MIN * GIB / 60
    t0 = time.monotonic()
    made, made_moving, per_fb = 0, 0, 128 * MIB
    moving_at: tuple[float, int] | None = None  # (t, drop) once the GPU's last free memory is used and RAM falls
    capped_at = None
    cmds: list[dict] = []
    gone_at = None
    while time.monotonic() - t0 < max_s and w.p.poll() is None:
        now = time.monotonic()
        drop = avail0 - watch.available()
        if drop > 0.4 * avail0:  # never: the cap is a quarter; a guard against a runaway all the same
            w.p.kill()
            return {"_t0": t0, "error": f"MemAvailable fell by {drop / GIB:.1f} GiB: the leaker killed by the scenario"}
        if moving_at is None and drop > 256 * MIB:
            moving_at = (now, drop)
        if moving_at is not None and made_moving >= 4 and drop > moving_at[1]:
            per_fb = int(min(256 * MIB, max(32 * MIB, (drop - moving_at[1]) / made_moving)))
        if moving_at is None:
            n = 2  # filling the GPU's last free memory: nothing reaches RAM yet
        else:
            n = H.fbs_due(rate, now - moving_at[0], drop - moving_at[1], per_fb, cap - moving_at[1], 6)
        if n == 0 and moving_at is not None and drop + per_fb > cap and capped_at is None:
            capped_at = round(now - t0, 3)
        if n:
            r = w.cmd(f"fb {n}")
            made += n
            made_moving += n if moving_at is not None else 0
            cmds.append({"at_s": round(now - t0, 3), "n": n, "seconds": r.get("seconds"), "error": r.get("error")})
            if "error" in r:
                gone_at = time.monotonic()
                break
        time.sleep(0.02 if n else 0.1)  # behind the rate: the next command at once
    return {"_t0": t0, "_gone_at": gone_at, "fbs_made": made, "per_fb_bytes": per_fb, "cap_bytes": cap,
            "capped_after_s": capped_at,
            "leak_cmds": cmds[-40:], "gpu_full_after_s": round(moving_at[0] - t0, 3) if moving_at else None,
            "worker_exit": w.p.poll()}


def _first_seen(lines: list[dict], checks: list[dict]) -> dict:
    """What in the agent first saw the leak (its times from the leak's start): fast sampling begun, the raise and the
    check that raised it (periodic, a wake-up's source, or the confirming read)."""
    fast = next((r for r in lines if r.get("msg") == "memory-fast-sampling" and r["at_s"] >= 0), None)
    raised = next((r for r in lines if r.get("msg") == "fault-raised" and r.get("code") == "GPU-NODE-001"
                   and r["at_s"] >= 0), None)
    seen = next((c for c in checks if c["at_s"] >= 0 and "GPU-NODE-001" in (c.get("transitions") or {})), None)
    act = next((r for r in lines if r.get("msg") == "remediation" and r["at_s"] >= 0), None)
    return {"fast_sampling_at_s": fast and fast["at_s"], "raised_at_s": raised and raised["at_s"],
            "raised_by": seen and {k: seen.get(k) for k in ("scope", "source", "confirming", "at_s")},
            "action": act and {k: act.get(k) for k in ("action", "target", "result", "at_s")},
            "full_checks_after_start": [c["at_s"] for c in checks if c["at_s"] >= 0 and "scope" not in c][:5]}


def _medium_or_above(fs: list[dict]) -> list[dict]:
    return [f for f in fs if f["severity"] in ("medium", "high", "critical")]


CROWDED = ("memory-late-leaker", "memory-two-graphics", "memory-heavy-legit", "memory-late-leaker-separated",
           "memory-unsure-last-resort", "memory-late-leaker-separated-api", "memory-graphics-legit-unsure",
           "memory-fast-leak-defaults", "memory-fast-leak-defaults-api")
#: issue 43's done-when and issue 41's incident-4 target on the GPU host: one call, in this order (README of the run:
#: docs/validation.md "When arrival cannot tell (issue 43)")
ISSUE_43_41 = ("memory-late-leaker-separated", "memory-late-leaker-separated-api", "memory-graphics-legit-unsure",
               "memory-unsure-last-resort", "memory-fast-leak-defaults", "memory-fast-leak-defaults-api")


def _kills(res: dict, action: str) -> set[str]:
    return {r.get("target") for r in (res.get("agent") or {}).get("log", [])
            if r.get("msg") == "remediation" and r.get("action") == action and r.get("result") == "done"}


def _agent_named(res: dict) -> tuple[bool, set]:
    """From the agent's own memory-separation lines: whether it named viz/render-0 by tracking, and every holder it
    ever named (the agent's decision is what acted; the scenario's in-process samples are a second reading)."""
    lines = [r for r in (res.get("agent") or {}).get("log", []) if r.get("msg") == "memory-separation"]
    named = {r.get("holder") for r in lines if r.get("holder")}
    return any(r.get("method") == "tracking" and r.get("holder") == "viz/render-0" for r in lines), named


def _separated_by_tracking(res: dict) -> bool:
    by_agent, agent_named = _agent_named(res)
    return ((by_agent or "tracking" in (res.get("separations") or [])) and "viz/steady-0" not in agent_named
            and "viz/steady-0" not in (res.get("named") or []))


def separated_api_verdict(res: dict) -> bool:
    """The leaker named by tracking and evicted through the API under the chart's RBAC (nothing refused), its
    processes stopped by the kubelet stand-in; the quiet pod and the compute pod untouched, in the API and alive."""
    return (_kills(res, "evict-pod-for-memory") == {"pod viz/render-0"} and not _kills(res, "kill-pod-processes")
            and set(res.get("kubelet_stopped") or {}) == {"viz/render-0"} and res.get("killed_after_s") is not None
            and _separated_by_tracking(res)
            and (res.get("alive") or {}).get("viz/steady-0") is True and res.get("filler_alive") is True
            and {"viz/steady-0", "ml/filler-0"} <= set(res.get("api_pods_left") or [])
            and "viz/render-0" not in (res.get("api_pods_left") or []) and res.get("agent_requests_denied") == [])


def legit_unsure_verdict(res: dict) -> bool:
    """No leak, then legitimate graphics load with stop-graphics-candidates on: nothing at medium or above (the
    agent's samples, its raises, the one-shot check) and no action; every pod alive."""
    lines = (res.get("agent") or {}).get("log", [])
    return (res.get("samples") is not None and not _medium_or_above(res.get("findings", []))
            and not [f for f in res.get("sample_findings", []) if f.get("severity") in ("medium", "high", "critical")]
            and not [r for r in lines if r.get("msg") == "remediation"]
            and not [r for r in lines if r.get("msg") == "memory-unsure" and r.get("act")]
            and not [r for r in lines if r.get("msg") == "fault-raised" and r.get("code") == "GPU-NODE-001"]
            and all((res.get("alive") or {}).values()) and res.get("filler_alive") is True)


def fast_leak_verdict(res: dict) -> bool:
    """Issue 41: at >= 30 GiB/min, the pod's processes stopped by the agent's action before MemAvailable fell by a
    quarter (a leak held at its cap never counts as before it); the compute pod alive."""
    f = res.get("figures") or {}
    api = res["scenario"].endswith("-api")
    by_agent = (_kills(res, "evict-pod-for-memory") == {"pod viz/render-0"}
                and set(res.get("kubelet_stopped") or {}) == {"viz/render-0"}) if api else \
        _kills(res, "kill-pod-processes") == {"pod viz/render-0"}
    return ((f.get("rate_gib_per_min") or 0) >= 30 and by_agent and res.get("stopped_after_s") is not None
            and res.get("capped_after_s") is None and f.get("before_a_quarter") is True
            and res.get("filler_alive") is True and (not api or res.get("agent_requests_denied") == []))


VERDICTS: dict[str, Callable[[dict], bool]] = {
    "memory-late-leaker-separated-api": separated_api_verdict,
    "memory-graphics-legit-unsure": legit_unsure_verdict,
    "memory-fast-leak-defaults": fast_leak_verdict,
    "memory-fast-leak-defaults-api": fast_leak_verdict,
}


def crowded_verdict(res: dict) -> bool:
    """Issue 17's Done-when, per scenario."""
    name = res["scenario"]
    if name in VERDICTS:
        return VERDICTS[name](res)
    fs = [f for f in res.get("findings", []) if f["code"] == "GPU-NODE-001"]
    agent_log = (res.get("agent") or {}).get("log", [])
    kills = [r for r in agent_log if r.get("msg") == "remediation" and r.get("result") == "done"]
    if name == "memory-heavy-legit":
        raised = [r for r in agent_log if r.get("msg") == "fault-raised"]
        return not _medium_or_above(res.get("findings", [])) and not raised
    if name == "memory-unsure-last-resort":
        unsure = [r for r in agent_log if r.get("msg") == "memory-unsure" and r.get("act")]
        killed = {r.get("target") for r in kills if r.get("action") == "kill-pod-processes"}
        return (bool(unsure) and killed == {"pod viz/render-0", "pod viz/render-1"} and res.get("filler_alive") is True
                and not any((res.get("alive") or {}).values())
                and (res.get("memavailable_low") or 0) > 0.5 * (res.get("memavailable_before") or 0))
    if name == "memory-late-leaker-separated":
        done = {r.get("target") for r in kills}
        return (done == {"pod viz/render-0"} and res.get("killed_after_s") is not None
                and _separated_by_tracking(res)
                and (res.get("alive") or {}).get("viz/steady-0") is True and res.get("filler_alive") is True)
    if name == "memory-two-graphics":
        # issue 17: arrival cannot tell them apart, so both stay candidates and nothing is done; since issue 43 the
        # leaker's own signals may separate it (the agent's memory-separation by tracking): then only it is stopped
        named = " ".join(fs[0]["affected"]) + " " + fs[0]["summary"] if fs else ""
        by_tracking, agent_named = _agent_named(res)
        done = {r.get("target") for r in kills}
        ambiguous = (bool(fs) and fs[0]["status"] != "confirmed" and "viz/steady-0" in named and "viz/render-0" in named
                     and "ml/filler-0" not in named and not kills and all((res.get("alive") or {}).values()))
        separated = (by_tracking and done == {"pod viz/render-0"} and "viz/steady-0" not in agent_named
                     and (res.get("alive") or {}).get("viz/steady-0") is True and res.get("filler_alive") is True)
        return ambiguous or separated
    if not fs:
        return False
    f = fs[0]
    if name == "memory-late-leaker":
        g = res.get("guard") or {}
        raised = [r for r in agent_log if r.get("msg") == "fault-raised" and "viz/render-0" in r.get("summary", "")]
        return (f["status"] == "confirmed" and any(a.endswith(":viz/render-0") for a in f["affected"])
                and not any(a.endswith(":viz/steady-0") or a.endswith(":ml/filler-0") for a in f["affected"])
                and bool(raised) and g.get("killed_after_s") is not None and all((g.get("others_alive") or {}).values()))
    return False


SCENARIOS: dict[str, Callable[[], dict]] = {
    "memory-egl": memory_egl,
    "memory-two-pods": memory_two_pods,
    "memory-legit-load": memory_legit_load,
    "memory-late-leaker": memory_late_leaker,
    "memory-two-graphics": memory_two_graphics,
    "memory-heavy-legit": memory_heavy_legit,
    "memory-late-leaker-separated": memory_late_leaker_separated,
    "memory-unsure-last-resort": memory_unsure_last_resort,
    "memory-late-leaker-separated-api": memory_late_leaker_separated_api,
    "memory-graphics-legit-unsure": memory_graphics_legit_unsure,
    "memory-fast-leak-defaults": memory_fast_leak_defaults,
    "memory-fast-leak-defaults-api": memory_fast_leak_defaults_api,
}


def leak(n: int) -> None:
    """`memory_scenarios.py leak N`: fill the GPU, make N framebuffers in a host process, report, clean up
    (the workload of tools/gpu/fentry_probe.py, which counts the driver's allocations per process)."""
    procs: list[Proc] = []
    try:
        free0 = M.meminfo()["MemFree"]
        procs.append(Proc([sys.executable, str(TOOLS / "gpu_fill.py"), "1.5"]))
        w = Proc([sys.executable, str(TOOLS / "gl_worker.py")], None, gl_env())
        procs.append(w)
        r = w.cmd(f"fb {n}")
        print(json.dumps({"fill_pid": procs[0].first.get("pid"), "gl_pid": w.first.get("pid"), "fb": r,
                          "memfree_drop": free0 - M.meminfo()["MemFree"]}), flush=True)
        w.cmd("quit")
    finally:
        for p in procs:
            p.stop()


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "leak":
    leak(int(sys.argv[2]))
elif __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "render-authz":
    # the chart's RBAC for the -api scenarios, rendered where the Helm SDK is (GW_MEM_AUTHZ_FILE on the GPU host)
    H.render_authz(sys.argv[2], NODE)
