#!/usr/bin/env python3
"""Reproduce each fault on a real GPU host and record gpuwarden's verdict (docs/validation.md).

Run as root on the GPU machine:  python3 tests/gpu/validate.py [--out DIR] [--only NAME ...] [--list]

Each scenario builds, for real, what a kubelet + runc node would have: a pod/container
cgroup laid out as kubelet names it, device rules that deny one node (cgroup v1
devices.list, or a cgroup v2 BPF program of runc's shape), a process inside it that
tries CUDA and NVML, and the kubelet files gpuwarden reads. Then it runs
`gpuwarden check` against the live host and compares the verdict with the expected
code. The GPU's settings are never changed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: what the scenarios launch (workers, workloads, shims, probes) and the pod layout they build
TOOLS = REPO / "tools/gpu"
sys.path[:0] = [str(REPO / "src"), str(REPO), str(REPO / "tests/gpu"), str(TOOLS)]

import memory_scenarios  # noqa: E402
from memory_scenarios import src_path  # noqa: E402

RUNC_DEFAULT = ["c 1:5 rwm", "c 1:3 rwm", "c 1:9 rwm", "c 1:8 rwm", "c 5:0 rwm", "c 5:1 rwm", "c *:* m",
                "b *:* m", "c 1:7 rwm", "c 136:* rwm", "c 5:2 rwm", "c 10:200 rwm"]
FAKE_HOST = Path("/tmp/gw-host")  # a /host-style root for the cgroup v1 scenarios
NS, POD, CTR = "ml", "cuda-job-0", "cuda"


def log(msg: str) -> None:
    print(msg, flush=True)


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def uvm_major() -> int:
    for line in Path("/proc/devices").read_text().splitlines():
        f = line.split()
        if len(f) == 2 and f[1] == "nvidia-uvm":
            return int(f[0])
    raise SystemExit("nvidia-uvm is not loaded on this host")


def gpu_uuid() -> str:
    for info in Path("/proc/driver/nvidia/gpus").glob("*/information"):
        for line in info.read_text().splitlines():
            if line.startswith("GPU UUID:"):
                return line.split(":", 1)[1].strip()
    raise SystemExit("no GPU in /proc/driver/nvidia/gpus")


def gpuwarden(root: str, *extra: str, env: dict | None = None, timeout: float = 120,
              prefix: list[str] | tuple[str, ...] = ()) -> tuple[dict, str, float]:
    """`gpuwarden check --format json` on `root`; `prefix` runs it elsewhere (nsenter into a mount namespace)."""
    cmd = [*prefix, sys.executable, "-m", "gpuwarden", "check", "--root", root, "--format", "json", "--fail-on", "critical", *extra]
    e = dict(os.environ, PYTHONPATH=src_path(), **(env or {}))
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    dt = time.monotonic() - t0
    try:
        return json.loads(p.stdout), p.stderr, dt
    except ValueError:
        return {"error": p.stdout[-2000:] + p.stderr[-2000:], "rc": p.returncode}, p.stderr, dt


def gpuwarden_text(root: str, *extra: str, env: dict | None = None, prefix: list[str] | tuple[str, ...] = ()) -> str:
    cmd = [*prefix, sys.executable, "-m", "gpuwarden", "check", "--root", root, "--no-color", *extra]
    e = dict(os.environ, PYTHONPATH=src_path(), **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=e).stdout


def kubelet_files(root: Path, uid: str, cid: str, policy: str, driver: str, gpu: str) -> None:
    kl = root / "var/lib/kubelet"
    (kl / "device-plugins").mkdir(parents=True, exist_ok=True)
    (kl / "config.yaml").write_text(
        f"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: {driver}\n"
        f"cpuManagerPolicy: {policy}\n")
    entry = {"PodUID": uid, "ContainerName": CTR, "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"-1": [gpu]}}
    (kl / "device-plugins/kubelet_internal_checkpoint").write_text(
        json.dumps({"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": {"nvidia.com/gpu": [gpu]}},
                    "Checksum": 0}))
    logs = root / "var/log/containers"
    if logs.exists():
        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    (logs / f"{POD}_{NS}_{CTR}-{cid}.log").write_text("")
    pods = root / "var/log/pods"
    if pods.exists():
        shutil.rmtree(pods)
    (pods / f"{NS}_{POD}_{uid}" / CTR).mkdir(parents=True)


def start_worker(procs_files: list[str]) -> tuple[subprocess.Popen, dict]:
    def enter() -> None:
        for pf in procs_files:
            with open(pf, "w") as f:
                f.write(str(os.getpid()))

    p = subprocess.Popen([sys.executable, str(TOOLS / "cuda_worker.py")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=enter)
    line = p.stdout.readline()  # type: ignore[union-attr]
    try:
        return p, json.loads(line)
    except ValueError:
        return p, {"error": line + (p.stderr.read() if p.poll() is not None else "")}  # type: ignore[union-attr]


def fake_plugin_without_uvm() -> subprocess.Popen:
    """A process named nvidia-device-plugin whose /dev (own mount namespace) lacks nvidia-uvm."""
    script = ("mount -t tmpfs tmpfs /dev && mknod -m 666 /dev/nvidiactl c 195 255 && "
              "mknod -m 666 /dev/nvidia0 c 195 0 && exec -a nvidia-device-plugin sleep 600")
    return subprocess.Popen(["unshare", "-m", "--propagation", "private", "bash", "-c", script])


def summarize(report: dict) -> list[dict]:
    return [{"code": f["code"], "status": f["status"], "severity": f["severity"], "summary": f["summary"],
             "evidence": [f"{e['source']}: {e['text']}" for e in f["evidence"]]} for f in report.get("findings", [])]


# --- cgroup v1 (devices controller mounted beside v2, under a /host-style root) -------------------

def v1_setup() -> Path:
    for d in ("proc", "dev", "sys/fs/cgroup/devices", "var/lib/kubelet", "run"):
        (FAKE_HOST / d).mkdir(parents=True, exist_ok=True)
    mounted = Path("/proc/self/mountinfo").read_text()
    if f" {FAKE_HOST}/proc " not in mounted:
        sh("mount", "--bind", "/proc", str(FAKE_HOST / "proc"))
        sh("mount", "--bind", "/dev", str(FAKE_HOST / "dev"))
        sh("mount", "-t", "cgroup", "-o", "devices", "devices", str(FAKE_HOST / "sys/fs/cgroup/devices"))
    return FAKE_HOST


def v1_teardown() -> None:
    for d in ("sys/fs/cgroup/devices", "dev", "proc"):
        sh("umount", "-l", str(FAKE_HOST / d), check=False)


def v1_scenario(name: str, deny: list[str], policy: str, expect: str | None) -> dict:
    root = v1_setup()
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    rel = Path("kubepods/besteffort") / f"pod{uid}" / cid
    cg = root / "sys/fs/cgroup/devices" / rel
    cg.mkdir(parents=True)
    uvm = uvm_major()
    nvidia = ["c 195:255 rw", "c 195:0 rw", f"c {uvm}:0 rw", f"c {uvm}:1 rw"]
    (cg / "devices.deny").write_text("a")
    for r in RUNC_DEFAULT + [n for n in nvidia if n not in deny]:
        (cg / "devices.allow").write_text(r)
    kubelet_files(root, uid, cid, policy, "cgroupfs", gpu_uuid())
    plugin = fake_plugin_without_uvm() if "uvm" in name else None
    worker, wout = start_worker([str(cg / "cgroup.procs")])
    time.sleep(0.5)
    try:
        report, err, dt = gpuwarden(str(root))
        probe_report, _, _ = gpuwarden(str(root), "--probe-access")
        text = gpuwarden_text(str(root))
        res = {"scenario": name, "cgroup": "v1", "cgroup_path": str(cg), "devices.list": (cg / "devices.list").read_text(),
               "denied": deny, "worker": wout, "expect": expect, "findings": summarize(report),
               "probe_access_findings": summarize(probe_report), "check_seconds": round(dt, 3), "text": text,
               "stderr": err[-2000:]}
    finally:
        worker.kill()
        worker.wait()
        if plugin:
            plugin.kill()
            plugin.wait()
        for d in (cg, cg.parent, cg.parent.parent, cg.parent.parent.parent):
            try:
                d.rmdir()
            except OSError:
                pass
    return res


# --- cgroup v2 (a BPF device program of runc's shape, attached by this script) ---------------------

def v2_scenario(name: str, deny: list[str], policy: str, driver: str, expect: str | None) -> dict:
    from tests.support import devprog

    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    base = Path("/sys/fs/cgroup")
    cg = base / "kubepods/besteffort" / f"pod{uid}" / cid
    cg.mkdir(parents=True)
    uvm = uvm_major()
    nvidia = ["c 195:255 rw", "c 195:0 rw", f"c {uvm}:0 rw", f"c {uvm}:1 rw"]
    allowed = [r for r in RUNC_DEFAULT if not r.startswith("b *")] + ["b *:* m"] + [n for n in nvidia if n not in deny]
    prog = devprog.runc_program(devprog.rules(*allowed))
    fd = devprog.load_program(prog, name="gw_validate")
    devprog.attach(str(cg), fd, multi=True)
    kubelet_files(Path("/"), uid, cid, policy, driver, gpu_uuid())
    worker, wout = start_worker([str(cg / "cgroup.procs")])
    time.sleep(0.5)
    try:
        report, err, dt = gpuwarden("/")
        probe_report, _, _ = gpuwarden("/", "--probe-access")
        text = gpuwarden_text("/")
        res = {"scenario": name, "cgroup": "v2", "cgroup_path": str(cg), "program_rules": allowed, "denied": deny,
               "worker": wout, "expect": expect, "findings": summarize(report),
               "probe_access_findings": summarize(probe_report), "check_seconds": round(dt, 3), "text": text,
               "stderr": err[-2000:]}
    finally:
        worker.kill()
        worker.wait()
        try:
            devprog.detach(str(cg), fd)
        except OSError:
            pass
        os.close(fd)
        for d in (cg, cg.parent, cg.parent.parent, cg.parent.parent.parent):
            try:
                d.rmdir()
            except OSError:
                pass
        shutil.rmtree("/var/lib/kubelet", ignore_errors=True)
        shutil.rmtree("/var/log/containers", ignore_errors=True)
        shutil.rmtree("/var/log/pods", ignore_errors=True)
    return res


def memory_uvm(gib: float = 4.0) -> dict:
    """Incident 4's mechanism on this driver: UVM pages in host RAM, charged to the pod as `kernel`."""
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    base = Path("/sys/fs/cgroup")
    levels = [base / "kubepods", base / "kubepods/besteffort", base / "kubepods/besteffort" / f"pod{uid}"]
    cg = levels[-1] / cid
    cg.mkdir(parents=True)
    for d in [base] + levels:
        try:
            (d / "cgroup.subtree_control").write_text("+memory")
        except OSError:
            pass
    kubelet_files(Path("/"), uid, cid, "none", "cgroupfs", gpu_uuid())
    before = Path("/proc/meminfo").read_text()
    p = subprocess.Popen([sys.executable, str(TOOLS / "uvm_worker.py"), str(gib)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: (cg / "cgroup.procs").write_text(str(os.getpid())))
    wout = p.stdout.readline()  # type: ignore[union-attr]
    time.sleep(1.0)
    try:
        report, err, dt = gpuwarden("/")
        text = gpuwarden_text("/", "--select", "GPU-NODE")
        stat = (cg / "memory.stat").read_text()
        try:
            plan = guard_plan("/")
        except Exception as exc:  # the plan is a record, not the verdict
            plan = f"plan failed: {type(exc).__name__}: {exc}"
        res = {"scenario": "memory-uvm", "cgroup": "v2", "cgroup_path": str(cg), "injected": f"{gib} GiB cudaMallocManaged touched on the host",
               "worker": json.loads(wout) if wout.strip().startswith("{") else {"error": wout + p.stderr.read()},  # type: ignore[union-attr]
               "expect": "GPU-NODE-001", "expect_status": "at-risk", "findings": summarize(report), "check_seconds": round(dt, 3), "text": text,
               "memory.stat": stat, "guard_plan": plan, "meminfo_before": before, "meminfo_after": Path("/proc/meminfo").read_text(),
               "stderr": err[-2000:]}
    finally:
        p.kill()
        p.wait()
        time.sleep(0.5)
        for d in [cg] + levels[::-1]:
            try:
                d.rmdir()
            except OSError:
                pass
        shutil.rmtree("/var/lib/kubelet", ignore_errors=True)
        shutil.rmtree("/var/log/containers", ignore_errors=True)
        shutil.rmtree("/var/log/pods", ignore_errors=True)
    return res


def guard_plan(root: str, node: str = "gpu-node") -> str:
    """The memory guard's dry-run plan for this root, with the node's pods as the API would list them.

    No API server runs on the GPU machine, so the pod objects are made from what gpuwarden saw on the
    node (each owned by a ReplicaSet, i.e. recreatable); the plan is computed by the same
    remediation.plan.build the agent uses, and nothing is executed.
    """
    from gpuwarden import engine
    from gpuwarden.facts import NodeFacts
    from gpuwarden.remediation.plan import ClusterState, Options, build
    from gpuwarden.root import HostRoot

    facts = NodeFacts(HostRoot(root))
    report = engine.run(facts, engine.select(engine.all_rules(), ["GPU-NODE"]))
    ctrs = facts.maybe("containers")
    pods = []
    for p in (ctrs.pods if ctrs else []):
        pods.append({"metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid,
                                  "ownerReferences": [{"kind": "ReplicaSet", "name": f"{p.name}-rs", "controller": True}]},
                     "spec": {"nodeName": node}, "status": {"phase": "Running"}})
    state = ClusterState({"metadata": {"name": node}, "spec": {}}, pods, [])
    return build(report.findings, state, Options()).render()


def nvml_hang() -> dict:
    shim = Path("/tmp/libnvidia-ml-hang.so")
    sh("gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(shim), str(TOOLS / "nvml_hang_shim.c"))
    report, err, dt = gpuwarden("/", "--probe-timeout", "3", env={"GPUWARDEN_NVML_LIBRARY": str(shim)})
    res = {"scenario": "nvml-hang", "injected": f"GPUWARDEN_NVML_LIBRARY={shim} (nvmlInit blocks in pause())",
           # one check sees one timeout: gpuwarden's own deadline missed, at-risk (issue 32); the agent's
           # K of N (3 of its last checks, the latest included) confirms it
           "expect": "GPU-DRV-006", "expect_status": "at-risk", "findings": summarize(report),
           "check_seconds": round(dt, 3), "stderr": err[-2000:]}
    res["agent"] = agent_nvml_repeats(shim)
    if res["agent"]["statuses"] != ["at-risk", "at-risk", "confirmed"]:
        res["error"] = f"the agent's checks said {res['agent']['statuses']}, not at-risk, at-risk, confirmed"
    return res


def agent_nvml_repeats(shim: Path, checks: int = 3) -> dict:
    """The agent (no API server, probes on, 3 s deadline) on the live host with NVML hung: GPU-DRV-006 per check."""
    from gpuwarden.agent.config import AgentConfig
    from gpuwarden.agent.loop import Agent
    from gpuwarden.root import HostRoot

    class Quiet:
        def info(self, *a: object, **k: object) -> None: ...
        warn = error = info

    old = os.environ.get("GPUWARDEN_NVML_LIBRARY")
    os.environ["GPUWARDEN_NVML_LIBRARY"] = str(shim)
    try:
        a = Agent(AgentConfig(node_name="gpu-node", kube=False, listen="", grpc=False, boot_grace_s=0,
                              probe_timeout_s=3.0), root=HostRoot("/"), log=Quiet())
        statuses, raised = [], []
        for _ in range(checks):
            r = a.check()
            statuses.append(next((f.status.value for f in r.findings if f.code == "GPU-DRV-006"), "none"))
            raised.append(r.transitions.get("GPU-DRV-006", ""))
    finally:
        if old is None:
            os.environ.pop("GPUWARDEN_NVML_LIBRARY", None)
        else:
            os.environ["GPUWARDEN_NVML_LIBRARY"] = old
    return {"statuses": statuses, "transitions": raised}


def untouched() -> dict:
    report, err, dt = gpuwarden("/")
    return {"scenario": "untouched-host", "expect": None, "findings": summarize(report), "check_seconds": round(dt, 3),
            "not_evaluated": report.get("not_evaluated"), "text": gpuwarden_text("/"), "stderr": err[-2000:]}


SCENARIOS = {
    "v1-deny-uvm": lambda: v1_scenario("v1-deny-uvm", [f"c {uvm_major()}:0 rw", f"c {uvm_major()}:1 rw"], "none", "GPU-DEV-001"),
    "v1-deny-nvidiactl": lambda: v1_scenario("v1-deny-nvidiactl", ["c 195:255 rw", "c 195:0 rw"], "static", "GPU-DEV-002"),
    "v1-allow-all": lambda: v1_scenario("v1-allow-all", [], "none", None),
    "v2-deny-uvm": lambda: v2_scenario("v2-deny-uvm", [f"c {uvm_major()}:0 rw", f"c {uvm_major()}:1 rw"], "none", "cgroupfs", "GPU-DEV-001"),
    "v2-deny-nvidiactl": lambda: v2_scenario("v2-deny-nvidiactl", ["c 195:255 rw", "c 195:0 rw"], "none", "systemd", "GPU-DEV-003"),
    "v2-allow-all": lambda: v2_scenario("v2-allow-all", [], "none", "cgroupfs", None),
    "memory-uvm": memory_uvm,
    "nvml-hang": nvml_hang,
    "untouched-host": untouched,
    **memory_scenarios.SCENARIOS,
}
from tests.gpu import plugin_scenarios  # noqa: E402  the real device plugin's scenarios
SCENARIOS.update(plugin_scenarios.SCENARIOS)
import mps_scenarios  # noqa: E402  the real MPS control daemon's (incident 5b)
SCENARIOS.update(mps_scenarios.SCENARIOS)
import dra_scenarios  # noqa: E402  the real DRA kubelet plugin's (one session; dra-teardown ends it)
SCENARIOS.update(dra_scenarios.SCENARIOS)
import cri_scenarios  # noqa: E402  real containerd + runc through CRI (issue 42)
SCENARIOS.update(cri_scenarios.SCENARIOS)


def verdict(res: dict) -> bool:
    if res.get("expect_pod") or res["scenario"] in memory_scenarios.CROWDED:
        return memory_scenarios.verdict(res)
    want = res.get("expect_status", "confirmed")
    codes = {f["code"] for f in res.get("findings", []) if f["status"] == want}
    serious = [f for f in res.get("findings", []) if f["severity"] in ("medium", "high", "critical")]
    if res["expect"] is None:
        return not serious
    return res["expect"] in codes


def launched_files() -> list[Path]:
    """Every file under tools/gpu that a scenario module names (`TOOLS / "..."`): what the scenarios launch."""
    import re

    names: set[str] = set()
    for mod in (Path(__file__), *(Path(m.__file__) for m in (memory_scenarios, plugin_scenarios, mps_scenarios,
                                                              dra_scenarios, cri_scenarios))):
        names.update(re.findall(r'TOOLS / "([\w.-]+\.(?:py|c))"', mod.read_text()))
    return sorted(TOOLS / n for n in names)


def list_scenarios() -> int:
    """The scenarios, and the files they launch; non-zero when one of those files is missing (no GPU needed)."""
    for name in SCENARIOS:
        log(name)
    missing = 0
    for f in launched_files():
        ok = f.is_file()
        missing += not ok
        log(f"launches {f.relative_to(REPO)}{'' if ok else '  MISSING'}")
    return 1 if missing else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gw-validation"))
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--list", action="store_true", help="list the scenarios and the files they launch, run nothing")
    args = ap.parse_args()
    if args.list:
        return list_scenarios()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    memory_scenarios.OUT = out
    mps_scenarios.OUT = out
    smi = sh("nvidia-smi", "--query-gpu=name,driver_version,uuid", "--format=csv,noheader", check=False).stdout.strip()
    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "gpu": smi, "kernel": platform.release(),
           "uvm_major": uvm_major()}
    log(f"== gpuwarden GPU validation: {env}")
    results = []
    try:
        for name, fn in SCENARIOS.items():
            if args.only and name not in args.only:
                continue
            try:
                res = fn()
            except Exception as exc:  # record and go on: one broken scenario must not hide the others
                res = {"scenario": name, "expect": "?", "error": f"{type(exc).__name__}: {exc}", "findings": []}
            res["pass"] = "error" not in res and verdict(res)
            results.append(res)
            codes = [f"{f['code']}:{f['status']}" for f in res.get("findings", [])]
            log(f"[{'PASS' if res['pass'] else 'FAIL'}] {name}: expect {res.get('expect')}; gpuwarden said {codes or 'nothing'}"
                f"; worker {res.get('worker', {}).get('open', '')} cuInit={res.get('worker', {}).get('cuInit', '-')} "
                f"nvml={res.get('worker', {}).get('nvmlInit', '-')}; {res.get('check_seconds', '?')}s {res.get('error', '')}")
    finally:
        v1_teardown()
    (out / "validation.json").write_text(json.dumps({"env": env, "results": results}, indent=1))
    passed = sum(r["pass"] for r in results)
    log(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
