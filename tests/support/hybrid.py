"""A hybrid-cgroup node, live: the built-in `healthy` example's tree with this host's real v1 devices
hierarchy and its cgroup2 (unified) hierarchy mounted into it, a GPU container whose v1 list allows
everything (`a *:* rwm`) and whose unified cgroup carries a device program that denies nvidia-uvm.

The kernel applies both (security/device_cgroup.c, devcgroup_check_permission): open() gets EPERM
from inside both cgroups and not from inside the v1 one alone. `gpuwarden check --root <tree>` must
say so, with and without --probe-access, and must not call bpf(2) under --no-probes.

Root only. Everything happens in one child process (``python -m tests.support.hybrid WORK NAME``)
that joins two scratch cgroups NAME (one per hierarchy) and then a new cgroup and mount namespace,
so the mounts show only those scratch subtrees and vanish with it; pytest itself never joins a
cgroup. The caller removes the two scratch cgroups afterwards (`cleanup`). Prints a JSON report.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.devprog import attach, cgroup2_mount, detach, load_program, rules, runc_program
from tests.support.bundles import CID_GPU, POD_UID, REPO, example_root, materialize

V1_DEVICES = "/sys/fs/cgroup/devices"
GPU_REL = f"kubepods/besteffort/pod{POD_UID}/{CID_GPU}"
#: the example's nvidia-uvm (its /proc/devices says 238): the one device the unified program denies
DENIED = "c 238:0 rwm"
CLONE_NEWNS, CLONE_NEWCGROUP = 0x00020000, 0x02000000
MS_REC, MS_PRIVATE = 0x4000, 0x40000

_OPEN_CHILD = r"""
import errno, json, os, sys
for procs in json.loads(sys.argv[1]):
    with open(procs, "w") as fh:
        fh.write(str(os.getpid()))
out = {}
for path in json.loads(sys.argv[2]):
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY))
        out[path] = "OK"
    except OSError as exc:
        out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""


def why_not() -> str | None:
    """Why this machine cannot run the scenario (None: it can try)."""
    if os.geteuid() != 0:
        return "needs root (cgroup and mount namespaces, bpf(2) program load/attach, mknod)"
    if not os.path.isfile(f"{V1_DEVICES}/devices.list"):
        return f"no cgroup v1 devices hierarchy at {V1_DEVICES} (not a v1/hybrid host)"
    mnt = cgroup2_mount()
    if mnt is None or mnt == "/sys/fs/cgroup":
        return "no cgroup2 hierarchy mounted beside the v1 controllers (not a hybrid host)"
    try:
        own = Path("/proc/self/cgroup").read_text()
    except OSError:
        return "/proc/self/cgroup unreadable"
    for line in own.splitlines():
        _, ctrls, path = line.split(":", 2)
        if "devices" in ctrls.split(",") and Path(V1_DEVICES, path.lstrip("/"), "devices.list").read_text().strip() \
                != "a *:* rwm":
            return "this process sits in a restricting v1 devices cgroup: a scratch child could not allow all"
    return None


def cleanup(name: str) -> None:
    """Remove the scratch cgroups (bottom-up; the child has exited, so they are empty)."""
    for top in (Path(V1_DEVICES, name), Path(cgroup2_mount() or "/nonexistent", name)):
        if not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                d.rmdir()
            except OSError:
                pass
        try:
            top.rmdir()
        except OSError:
            pass


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _kernel(procs: list[str], paths: list[str]) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-I", "-S", "-c", _OPEN_CHILD, json.dumps(procs), json.dumps(paths)],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout)


def _gpuwarden(node: Path, *flags: str, strace: Path | None = None) -> dict:
    argv = [sys.executable, "-m", "gpuwarden", "check", "--root", str(node), "--select", "GPU-DEV",
            "--format", "json", "--fail-on", "critical", "--probe-timeout", "20", *flags]
    if strace is not None:
        argv = ["strace", "-f", "-qq", "-e", "trace=bpf", "-o", str(strace), *argv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"gpuwarden check {' '.join(flags)} exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def _bpf_calls(trace: Path) -> list[str]:
    """The bpf(2) calls strace logged (lines "<pid> bpf(...) = ...")."""
    calls = []
    for line in trace.read_text().splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].startswith("bpf("):
            calls.append(parts[1])
    return calls


def run(work: Path, name: str) -> dict:
    """The scenario, in this (already dedicated) process."""
    libc = _libc()
    node = materialize(example_root("healthy"), work / "node")
    mounts = {"devices": node / "sys/fs/cgroup/devices", "unified": node / "sys/fs/cgroup/unified"}
    for m in mounts.values():
        shutil.rmtree(m, ignore_errors=True)
        m.mkdir(parents=True)
    tops = {"devices": Path(V1_DEVICES, name), "unified": Path(cgroup2_mount() or "", name)}
    for top in tops.values():
        top.mkdir()
        (top / "cgroup.procs").write_text(str(os.getpid()))
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWCGROUP), "unshare")
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(libc.mount(b"cgroup", str(mounts["devices"]).encode(), b"cgroup", 0, b"devices"), "mount cgroup v1 devices")
    _check(libc.mount(b"cgroup2", str(mounts["unified"]).encode(), b"cgroup2", 0, None), "mount cgroup2")
    gpu = {k: m / GPU_REL for k, m in mounts.items()}
    report: dict = {"scratch": {k: str(v) for k, v in tops.items()}, "kernel_release": os.uname().release}
    fd = -1
    try:
        for d in gpu.values():
            d.mkdir(parents=True)
        report["v1_devices_list"] = (gpu["devices"] / "devices.list").read_text()
        fd = load_program(runc_program(rules(DENIED, allow=False), default_allow=True), "Apache", "deny_uvm")
        attach(gpu["unified"], fd)
        from gpuwarden.bpf.syscall import prog_info

        info = prog_info(fd)
        report["program"] = {"name": info.name, "rule": f"deny {DENIED}, allow the rest", "xlated": info.xlated.hex()}
        devs = [str(node / "dev/nvidia-uvm"), str(node / "dev/nvidiactl")]
        procs = {k: str(d / "cgroup.procs") for k, d in gpu.items()}
        report["kernel"] = {
            "both": _kernel([procs["devices"], procs["unified"]], devs),
            "v1_only": _kernel([procs["devices"]], devs),
            "unified_only": _kernel([procs["unified"]], devs),
        }
        report["check"] = _gpuwarden(node)
        report["check_probe_access"] = _gpuwarden(node, "--probe-access")
        if shutil.which("strace"):
            traces = {k: work / f"strace-{k}.txt" for k in ("probes", "no_probes")}
            report["check_traced"] = _gpuwarden(node, strace=traces["probes"])
            report["check_no_probes"] = _gpuwarden(node, "--no-probes", strace=traces["no_probes"])
            report["bpf_calls"] = {k: _bpf_calls(t) for k, t in traces.items()}
        else:
            report["check_no_probes"] = _gpuwarden(node, "--no-probes")
            report["bpf_calls"] = None
    finally:
        if fd >= 0:
            try:
                detach(gpu["unified"], fd)
            except OSError:
                pass
            os.close(fd)
        for k, d in gpu.items():  # leaves first; the namespace and its mounts go with this process
            p = d
            while p != mounts[k]:
                try:
                    p.rmdir()
                except OSError:
                    break
                p = p.parent
    return report


def main() -> int:
    work, name = Path(sys.argv[1]), sys.argv[2]
    reason = why_not()
    if reason:
        print(json.dumps({"skip": reason}))
        return 0
    print(json.dumps(run(work, name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
