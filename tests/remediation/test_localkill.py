"""The memory guard's last resort: kill exactly one pod's processes through its cgroup, nothing else.

The real kill runs on real cgroups (v1 memory hierarchy or v2) where this machine lets root make them;
on the GPU machine the agent did it for real (docs/validation.md, memory-egl).
"""

from __future__ import annotations

import io
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.examples import open_example
from gpuwarden.remediation.localkill import kill_pod, refuse
from gpuwarden.root import HostRoot

UID = "a6234a7e-29ef-434f-b254-d3cccc28be4e"
U_ = UID.replace("-", "_")


@pytest.mark.parametrize("path", [
    f"/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice",
    f"/sys/fs/cgroup/kubepods/burstable/pod{UID}",
    f"/sys/fs/cgroup/memory/kubepods/besteffort/pod{UID}",
    f"/sys/fs/cgroup/kubepods.slice/kubepods-pod{U_}.slice",
])
def test_refuse_accepts_only_the_pods_own_cgroup(path):
    assert refuse(path, UID) is None


@pytest.mark.parametrize("path,uid", [
    ("/sys/fs/cgroup/kubepods.slice", UID),
    ("/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice", UID),
    (f"/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/cri-containerd-"
     + "a" * 64 + ".scope", UID),  # a container, not the pod
    (f"/sys/fs/cgroup/kubepods/burstable/pod{UID}", "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"),  # another pod
    (f"/sys/fs/cgroup/system.slice/pod{UID}", UID),  # not under kubepods
    (f"/sys/fs/cgroup/kubepods/../system.slice/pod{UID}", UID),
    (f"/tmp/kubepods/pod{UID}", UID),
    (f"/sys/fs/cgroup/kubepods/burstable/pod{UID}", ""),
])
def test_refuse_rejects_everything_else(path, uid):
    assert refuse(path, uid)


def _cgroup_base() -> tuple[str, str] | None:
    """A writable cgroup hierarchy here: (mount point, node-style prefix)."""
    for mnt in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.isfile(f"{mnt}/cgroup.procs") and os.access(mnt, os.W_OK):
            return mnt, mnt
    return None


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or _cgroup_base() is None, reason="needs root and a writable cgroup hierarchy")
def test_kill_pod_kills_its_processes_and_nothing_else():
    mnt, _ = _cgroup_base()  # type: ignore[misc]
    uid = str(uuid.uuid4())
    kube = Path(mnt) / f"kubepods-gwtest-{uuid.uuid4().hex[:8]}"
    pod = kube / f"pod{uid}"
    ctr = pod / ("c" * 64)
    bystander = subprocess.Popen(["sleep", "60"])
    victims = []
    try:
        ctr.mkdir(parents=True)
        for _ in range(2):
            p = subprocess.Popen(["sleep", "60"])
            (ctr / "cgroup.procs").write_text(str(p.pid))
            victims.append(p)
        r = kill_pod(HostRoot("/"), str(pod), uid, timeout_s=10)
        assert r.ok, r.describe()
        assert sorted(r.pids_before) == sorted(p.pid for p in victims) and r.pids_after == []
        for p in victims:
            assert p.wait(timeout=5) == -9
        assert bystander.poll() is None  # outside the pod: untouched
        assert "killed 2 process(es)" in r.describe()
    finally:
        bystander.kill()
        bystander.wait()
        for p in victims:
            p.kill()
            p.wait()
        for d in (ctr, pod, kube):
            for _ in range(20):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or _cgroup_base() is None, reason="needs root and a writable cgroup hierarchy")
def test_a_pid_no_longer_in_the_cgroup_is_not_signalled():
    """The SIGKILL path pins each pid (pidfd) and signals only those the kernel still lists in the cgroup:
    a pid read earlier that has left (or was reused by another process) is spared."""
    from gpuwarden.remediation.localkill import _sigkill_members

    mnt, _ = _cgroup_base()  # type: ignore[misc]
    pod = Path(mnt) / f"kubepods-gwtest-{uuid.uuid4().hex[:8]}"
    member, bystander = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        pod.mkdir()
        (pod / "cgroup.procs").write_text(str(member.pid))
        top = os.open(pod, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _sigkill_members(top, [member.pid, bystander.pid, 2 ** 22 + 1])  # as if all three had been listed
        finally:
            os.close(top)
        assert member.wait(timeout=5) == -9
        assert bystander.poll() is None
    finally:
        for p in (member, bystander):
            p.kill()
            p.wait()
        for _ in range(20):
            try:
                pod.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)


def test_kill_pod_refuses_a_foreign_cgroup_before_touching_it(tmp_path):
    r = kill_pod(HostRoot(str(tmp_path)), "/sys/fs/cgroup/kubepods.slice", UID)
    assert not r.ok and r.error.startswith("refused") and r.pids_before == []


def test_agent_never_kills_on_a_bundle_or_example(tmp_path):
    """The example's cgroup.procs name another machine's pids: the last resort refuses on anything not live."""
    # (no `example` in the config: with it and no API, the agent would answer from the example offline,
    # agent/offline.py; here the API is simply off, as when it is unreachable)
    cfg = AgentConfig(kube=False, remediate="on", memory_local_kill=True,
                      listen="", select=["GPU-NODE"], boot_grace_s=0, node_name="n1")
    out = io.StringIO()
    a = Agent(cfg, root=open_example("egl-framebuffer-escape"), out=out, clock=lambda: 1_800_000_000.0)
    a.check()
    r = a.check()
    assert [(o.action.kind, o.result) for o in r.outcomes] == [("kill-pod-processes", "refused")]
    assert "not a live node" in r.outcomes[0].detail


def test_the_pid_walk_follows_no_link_and_skips_a_cgroup_removed_under_it(tmp_path, monkeypatch):
    """_pids on a stand-in tree (is_cgroupfs forced true): links are never followed, and a cgroup that
    vanished while walked (no cgroup.procs: ENOENT, as a removed cgroup answers) is nothing left."""
    from gpuwarden import confine
    from gpuwarden.remediation import localkill

    monkeypatch.setattr(confine, "is_cgroupfs", lambda fd: True)
    (tmp_path / "a/gone").mkdir(parents=True)
    (tmp_path / "cgroup.procs").write_text("11\n12\n")
    (tmp_path / "a/cgroup.procs").write_text("13\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/cgroup.procs").write_text("99\n")
    top = tmp_path / "top"
    top.mkdir()
    for n in ("cgroup.procs", "a"):
        os.rename(tmp_path / n, top / n)
    os.symlink(tmp_path / "outside", top / "l")
    os.symlink(tmp_path / "outside/cgroup.procs", top / "a/gone/cgroup.procs.link")
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert localkill._pids(fd) == [11, 12, 13]
        monkeypatch.setattr(confine, "is_cgroupfs", lambda fd: False)
        with pytest.raises(localkill.Refused):
            localkill._pids(fd)
    finally:
        os.close(fd)
