#!/usr/bin/env python3
"""Fault -> condition raised and fault -> fence, per fault class, at the chart's defaults (issue 41).

    python3 bench/event_latency.py --out latency.json                   # a node tree (needs root: mknod)
    python3 bench/event_latency.py --live --runs 50 --out latency.json  # a GPU host: also /dev/kmsg's follower

Runs the real agent (gpuwarden.agent.loop.Agent, its own event loop, as `gpuwarden agent` runs it) at
the chart's defaults: interval 60 s, debounce 2, confirm_delay 0.2 s, remediation on against the
offline API stand-in (agent/offline.py: every write is taken and answered at once, so "fence" is the
agent's own time, without an API server's round trip). Each run builds a fresh node tree from the
`healthy` example (device nodes by mknod), starts the agent, waits for its first full check, injects
one fault and times, from the injection, the condition raised (the debouncer) and the fence done
(taint-node, cordon-node or taint-device). Fault classes:

- `xid79`: an Xid 79 line appended to the tree's captured kernel log (never to the live kernel log);
- `uvm-removed`: the tree's /dev/nvidia-uvm (a mknod'd copy) unlinked;
- `plugin-socket-gone`: the device plugin's socket in the tree's device-plugins directory removed;
- `kmsg-marker` (with --live): a benign marker line (`gpuwarden-bench: marker N`) written to the live
  /dev/kmsg, timed until the follower (wake/kmsg.py) sees it: the live source's share of the latency;
- `nvml-lost`: the NVML event source (gpuwarden.wake.nvml) as the run's only source, over the stand-in
  libnvidia-ml.so.1 of tests/wake (built with gcc), reporting the GPU lost as the driver's Xid 79 line is
  appended to the tree's log: GPU-HW-002 raised because NVML woke the agent (`inject_nvml_lost`);
- `pod-rejected`: the pods watch (gpuwarden.wake.pods) on the real test API server (GPUWARDEN_TESTAPISERVER;
  else "not run"), a node whose plugin says "GPU is lost": pod rejected -> GPU-K8S-012 CONFIRMED, and the
  node's taint written to that server (`inject_pod_rejected`).

Writes JSON: per class the runs' latencies, P50 / P99 (nearest rank) and the issue's targets (raised
P50 <= 0.5 s, P99 <= 2 s; fence P99 <= 3 s), met or missed. Needs only gpuwarden's own dependencies
(run it with the repository's `src` on PYTHONPATH, or the wheel installed, as tests/gpu/validate.py does).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if (REPO / "src" / "gpuwarden").is_dir():
    sys.path.insert(0, os.environ.get("GPUWARDEN_SRC") or str(REPO / "src"))
sys.path.insert(0, str(REPO))

TARGETS = {"raised_p50_s": 0.5, "raised_p99_s": 2.0, "fenced_p99_s": 3.0}
XID79 = "3,{seq},{usec},-;NVRM: Xid (PCI:0000:00:06): 79, pid=2024, GPU has fallen off the bus.\n"
FENCES = ("taint-node", "cordon-node", "taint-device")


def pct(xs: list[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not xs:
        return None
    ys = sorted(xs)
    k = max(0, min(len(ys) - 1, int(-(-p * len(ys) // 100)) - 1))
    return ys[k]


def template(dest: Path) -> Path:
    """The healthy example as a real tree (tests/support/bundles.materialize: files, mknod'd device nodes)."""
    from gpuwarden.examples import open_example
    from tests.support.bundles import materialize

    return materialize(open_example("healthy"), dest)


class Run:
    """One agent on a fresh copy of the tree, its event loop in a thread, remediation on (offline API)."""

    def __init__(self, tree: Path, timeout_s: float, kube: Any = None, sources: list | None = None, **cfg: Any) -> None:
        from gpuwarden.agent.config import AgentConfig
        from gpuwarden.agent.loop import Agent
        from gpuwarden.agent.offline import OfflineKube, example_pods
        from gpuwarden.kube.log import Log
        from gpuwarden.root import HostRoot

        self.tree = tree
        self.timeout_s = timeout_s
        root = HostRoot(str(tree))
        base = dict(node_name="bench-node", kube=False, listen="", probes=False, grpc=False, boot_grace_s=0,
                    interval_s=60.0, remediate="on", log_format="text", state_dir="")
        base.update(cfg)
        self.out = io.StringIO()
        if kube is None:
            kube = OfflineKube("bench-node", example_pods(root, "bench-node"), self.out)
        else:
            base["kube"] = True
        self.log = io.StringIO()
        self.agent = Agent(AgentConfig(**base), kube=kube, root=root, log=Log("text", node="bench-node", stream=self.log),
                           out=self.out)
        self.fenced_at: float | None = None
        ex = self.agent.executor
        if ex is not None:  # time the fence where it is done: the executor's outcome
            real = ex.execute

            def timed(plan: Any, mode: str, by_code: Any) -> Any:
                outs = real(plan, mode, by_code)
                if self.fenced_at is None and any(o.result == "done" and o.action.kind in FENCES for o in outs):
                    self.fenced_at = time.monotonic()
                return outs

            ex.execute = timed
        self.thread = threading.Thread(target=self.agent.run, daemon=True)

    def __enter__(self) -> "Run":
        self.thread.start()
        t0 = time.monotonic()
        while self.agent.checks < 1 and time.monotonic() - t0 < 60:
            time.sleep(0.005)
        time.sleep(0.1)  # the first check's own actions (none on a healthy tree) are done
        return self

    def __exit__(self, *exc: Any) -> None:
        self.agent.stop()
        self.thread.join(10)

    def measure(self, inject: Callable[[], None], code: str) -> dict:
        a = self.agent
        t0 = time.monotonic()
        inject()
        raised = fenced = None
        while time.monotonic() - t0 < self.timeout_s:
            if raised is None and a.debounce.raised(code):
                raised = time.monotonic() - t0
            if self.fenced_at is not None:
                fenced = self.fenced_at - t0
            if raised is not None and fenced is not None:
                break
            time.sleep(0.001)
        return {"raised_s": raised, "fenced_s": fenced, "checks": a.checks}


def append(path: Path, text: str) -> Callable[[], None]:
    def go() -> None:
        with open(path, "a") as f:
            f.write(text)
    return go


CLASSES: dict[str, tuple[str, Callable[[Path, int], Callable[[], None]]]] = {
    "xid79": ("GPU-HW-002", lambda t, i: append(t / ".gpuwarden/logs/kmsg.txt",
                                                XID79.format(seq=1000 + i, usec=10_000_000 + i))),
    "uvm-removed": ("GPU-DRV-003", lambda t, i: lambda: os.unlink(t / "dev/nvidia-uvm")),
    "plugin-socket-gone": ("GPU-K8S-002", lambda t, i: lambda: os.unlink(t / "var/lib/kubelet/device-plugins/nvidia-gpu.sock")),
}


def _fake_nvml(work: Path) -> str | None:
    """The stand-in libnvidia-ml.so.1 of tests/wake (events and GPU lost on trigger files), built here."""
    import subprocess

    src = REPO / "tests" / "wake" / "nvml_events_fake.c"
    so = work / "libnvidia-ml-fake.so"
    if not shutil.which("gcc") or not src.exists():
        return None
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(so), str(src)], check=True)
    return str(so)


def _host_nvml_shim(work: Path) -> str | None:
    """On a host with the NVIDIA driver: tools/gpu/nvml_inject_shim.c linked over its libnvidia-ml.so.1, else None."""
    import subprocess

    from tests.support.realdra import host_nvml

    real = host_nvml() if os.path.isdir("/proc/driver/nvidia") else ""
    src = REPO / "tools" / "gpu" / "nvml_inject_shim.c"
    if not real or not shutil.which("gcc") or not src.exists():
        return None
    so = work / "nvml_inject_shim.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(so), str(src), "-Wl,--no-as-needed", real, "-ldl"],
                   check=True, timeout=120)
    os.environ["GW_NVML_REAL"] = real
    return str(so)


def inject_nvml_lost(work: Path, runs: int, timeout_s: float) -> dict:
    """NVML reports the GPU lost: the event child (wake/nvml.py) through the stand-in NVML of tests/wake
    (the wait answers NVML_ERROR_GPU_IS_LOST once its trigger file exists), as the driver logs Xid 79 into
    the tree's kernel log. The NVML source is the agent's only source here, so the line is read because
    NVML woke the agent. On the GPU host the library is tools/gpu/nvml_inject_shim.c over the real
    libnvidia-ml.so.1 (GW_NVML_WAIT_LOST_FILE), built when the host has the driver."""
    from gpuwarden.root import HostRoot
    from gpuwarden.wake.nvml import NvmlEvents

    lib, trigger_env, what = _host_nvml_shim(work), "GW_NVML_WAIT_LOST_FILE", (
        "the host's NVML through tools/gpu/nvml_inject_shim.c (the wait answers NVML_ERROR_GPU_IS_LOST while "
        "its trigger exists; every other call is the real driver's, nothing reaches the GPU)")
    if lib is None:
        lib, trigger_env, what = _fake_nvml(work), "FAKE_NVML_LOST_FILE", (
            "stand-in NVML (tests/wake/nvml_events_fake.c) on this host")
    if lib is None:
        return {"not_run": "gcc (or tests/wake/nvml_events_fake.c) not available to build the stand-in NVML"}
    rows = []
    for i in range(runs):
        tree = work / f"nvml-lost-{i}"
        template(tree)
        lost = work / f"nvml-lost-{i}.trigger"
        os.environ[trigger_env] = str(lost)
        src = NvmlEvents(HostRoot("/"), lib, init_timeout_s=5.0, wait_ms=100, tick_s=1.0)
        with Run(tree, timeout_s, sources=[src]) as run:
            t_end = time.monotonic() + 15
            while src.state != "ready" and time.monotonic() < t_end:
                time.sleep(0.005)

            def go() -> None:
                append(tree / ".gpuwarden/logs/kmsg.txt", XID79.format(seq=1000 + i, usec=10_000_000 + i))()
                lost.write_text("")
            rows.append(run.measure(go, "GPU-HW-002"))
        lost.unlink(missing_ok=True)
        shutil.rmtree(tree, ignore_errors=True)
    s = summarise(rows)
    s["code"] = "GPU-HW-002"
    s["what"] = f"{what}: GPU lost -> nvml wake -> raised / taint"
    return s


def inject_pod_rejected(work: Path, runs: int, timeout_s: float) -> dict:
    """A pod the kubelet rejects for a lost GPU, seen by the pods watch, on the real test API server
    (GPUWARDEN_TESTAPISERVER). The node's device plugin already says "GPU is lost" (GPU-K8S-012 at-risk,
    no fence): the rejected pod is the proof, so `raised_s` is pod created -> the first check whose
    GPU-K8S-012 is CONFIRMED, and `fenced_s` pod created -> the node tainted on that API server."""
    if not os.environ.get("GPUWARDEN_TESTAPISERVER"):
        return {"not_run": "no API server: set GPUWARDEN_TESTAPISERVER (tools/testapiserver/build.sh)"}
    from gpuwarden.kube.client import Kube
    from tests.k8s.test_agent_admission_fence import plugin_lost_node, rejected_pod
    from tests.rules.test_lost_gpu import GPA_LOST
    from tests.support.agent_kube import ensure_namespace, make_node
    from tests.support.apiserver import ApiServerUnavailable, start_apiserver

    try:
        server = start_apiserver()
    except ApiServerUnavailable as exc:
        return {"not_run": f"the test API server did not start: {exc}"}
    rows = []
    with server as srv:
        admin = Kube(srv.api_client())
        for ns in ("gpuwarden", "ml"):
            ensure_namespace(admin, ns)
        for i in range(runs):
            node = f"bench-node-{i}"  # a node of its own: an earlier run's action Event would be a cooldown
            make_node(admin, node)
            tree = plugin_lost_node(work / f"pod-rejected-{i}") / "files"
            with Run(tree, timeout_s, kube=Kube(srv.api_client()), namespace="gpuwarden", node_name=node) as run:
                confirmed: list[float] = []
                check = run.agent.check

                def recording(*a: Any) -> Any:
                    res = check(*a)
                    if not confirmed and any(f.code == "GPU-K8S-012" and f.status.value == "confirmed"
                                             for f in res.findings):
                        confirmed.append(time.monotonic())
                    return res
                run.agent.check = recording
                t_end = time.monotonic() + 10
                while not any(getattr(x, "name", "") == "pods" and getattr(x, "up", False)
                              for x in (run.agent.loop.running if run.agent.loop else [])) and time.monotonic() < t_end:
                    time.sleep(0.005)
                time.sleep(0.5)  # the first check's confirming read is done
                t0 = time.monotonic()
                rejected_pod(admin, "ml", f"storm-{i}", node, GPA_LOST, t=time.time())
                while time.monotonic() - t0 < timeout_s and not (confirmed and run.fenced_at):
                    time.sleep(0.001)
                rows.append({"raised_s": confirmed[0] - t0 if confirmed else None,
                             "fenced_s": run.fenced_at - t0 if run.fenced_at else None, "checks": run.agent.checks})
            admin.request("DELETE", f"/api/v1/namespaces/ml/pods/storm-{i}")
    s = summarise(rows)
    s["code"] = "GPU-K8S-012"
    s["what"] = ("real test API server on this host: pod rejected -> pods watch -> CONFIRMED / node taint "
                 "(a real API write)")
    return s


def kmsg_marker(runs: int) -> dict:
    """The live /dev/kmsg follower: a benign marker written, timed until the source emits it."""
    import re

    from gpuwarden.root import HostRoot
    from gpuwarden.wake.kmsg import KmsgSource

    got: list = []
    tag = f"{os.getpid()}"
    src = KmsgSource(HostRoot("/"), words=re.compile(rb"gpuwarden-bench: marker " + tag.encode() + rb"-\d+"))
    why = src.start(got.append)
    if why is not None:
        return {"not_run": why}
    lat = []
    try:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
        for i in range(runs):
            n = len(got)
            t0 = time.time()
            os.write(fd, f"gpuwarden-bench: marker {tag}-{i}\n".encode())
            t_end = time.monotonic() + 5
            while len(got) == n and time.monotonic() < t_end:
                time.sleep(0.0002)
            if len(got) > n:
                lat.append(got[-1].seen - t0)
            time.sleep(0.02)
        os.close(fd)
    finally:
        src.stop()
    return {"runs": runs, "seen_s": lat, "seen_p50_s": pct(lat, 50), "seen_p99_s": pct(lat, 99),
            "what": "marker written -> the follower's wake (its `seen`), no check"}


def summarise(rows: list[dict]) -> dict:
    raised = [r["raised_s"] for r in rows if r["raised_s"] is not None]
    fenced = [r["fenced_s"] for r in rows if r["fenced_s"] is not None]
    out = {"runs": len(rows), "raised": len(raised), "fenced": len(fenced),
           "raised_p50_s": pct(raised, 50), "raised_p99_s": pct(raised, 99),
           "fenced_p50_s": pct(fenced, 50), "fenced_p99_s": pct(fenced, 99), "rows": rows}
    out["targets"] = {
        "raised_p50": "met" if raised and len(raised) == len(rows) and out["raised_p50_s"] <= TARGETS["raised_p50_s"] else "missed",
        "raised_p99": "met" if raised and len(raised) == len(rows) and out["raised_p99_s"] <= TARGETS["raised_p99_s"] else "missed",
        "fenced_p99": ("n/a: the agent fences nothing for this fault (not a node or GPU fault: its remedy is "
                       "another action)") if not fenced else
                      "met" if len(fenced) == len(rows) and out["fenced_p99_s"] <= TARGETS["fenced_p99_s"] else "missed",
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs per fault class (a fresh tree and agent each)")
    ap.add_argument("--classes", default=",".join(list(CLASSES) + ["nvml-lost", "pod-rejected"]))
    ap.add_argument("--live", action="store_true", help="also time the live /dev/kmsg follower with marker lines")
    ap.add_argument("--timeout", type=float, default=10.0, help="per run: give up after this long (s)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root: the tree's device nodes are made with mknod", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gwlat", dir="/tmp"))
    result: dict[str, Any] = {"bench": "event_latency", "host": platform.node(), "python": platform.python_version(),
                              "kernel": platform.release(), "cpus": os.cpu_count(), "when": time.time(),
                              "defaults": {"interval_s": 60, "debounce_raise": 2, "confirm_delay_s": 0.2,
                                           "remediate": "on (offline API stand-in)"},
                              "targets": TARGETS, "classes": {}}
    try:
        wanted = [c.strip() for c in args.classes.split(",") if c.strip()]
        for name in wanted:
            if name in CLASSES:
                code, make = CLASSES[name]
                rows = []
                for i in range(args.runs):
                    tree = work / f"{name}-{i}"
                    template(tree)  # device nodes cannot be copied as files: each run materialises its own
                    with Run(tree, args.timeout) as run:
                        rows.append(run.measure(make(tree, i), code))
                    shutil.rmtree(tree, ignore_errors=True)
                s = summarise(rows)
                s["code"] = code
                result["classes"][name] = s
                print(f"{name:20} {code}: raised P50 {s['raised_p50_s']} P99 {s['raised_p99_s']}  "
                      f"fenced P50 {s['fenced_p50_s']} P99 {s['fenced_p99_s']}  ({s['raised']}/{s['runs']} raised)",
                      flush=True)
            elif name in ("nvml-lost", "pod-rejected"):
                hook = inject_nvml_lost if name == "nvml-lost" else inject_pod_rejected
                s = result["classes"][name] = hook(work, args.runs, args.timeout)
                if "not_run" in s:
                    print(f"{name:20} not run: {s['not_run']}", flush=True)
                else:
                    print(f"{name:20} {s['code']}: raised P50 {s['raised_p50_s']} P99 {s['raised_p99_s']}  "
                          f"fenced P50 {s['fenced_p50_s']} P99 {s['fenced_p99_s']}  ({s['raised']}/{s['runs']} raised)",
                          flush=True)
        if args.live:
            result["classes"]["kmsg-marker"] = k = kmsg_marker(args.runs)
            print(f"{'kmsg-marker':20} seen P50 {k.get('seen_p50_s')} P99 {k.get('seen_p99_s')} {k.get('not_run', '')}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(result, indent=1, default=str)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
