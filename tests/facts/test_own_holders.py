"""gpuwarden's own processes (this one and its children: the NVML probe and event children) hold /dev/nvidia* open
and must never be taken for a tenant of incident 4 (run 20a on the H200: the agent's NVML event child, started as
`python3 -m gpuwarden`, was a host-process candidate 'python3 (pid 1305)' that blocked the separation)."""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.facts.memory import OWN_NAME, scan_holders
from gpuwarden.facts.node import NodeFacts
from gpuwarden.root.host import HostRoot

STAT = "{pid} (python3) S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0 10 5 0 0 20 0 1 0 1000 0 0"


def tree(tmp_path: Path, procs: dict[int, int], self_pid: int | None, moved: tuple[int, ...] = ()) -> HostRoot:
    """A live-shaped tree: /proc/<pid>/{fd/3 -> /dev/nvidiactl, stat (ppid), comm, cgroup}, and /proc/self;
    `moved` pids are in a pod's cgroup."""
    for pid, ppid in procs.items():
        d = tmp_path / "proc" / str(pid)
        (d / "fd").mkdir(parents=True)
        os.symlink("/dev/nvidiactl", d / "fd" / "3")
        (d / "stat").write_text(STAT.format(pid=pid, ppid=ppid))
        (d / "comm").write_text("python3\n")
        (d / "cgroup").write_text("0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-ab.scope\n" if pid in moved
                                  else "0::/system.slice/x.service\n")
    if self_pid is not None:
        os.symlink(str(self_pid), tmp_path / "proc" / "self")
    return HostRoot(str(tmp_path))


def names(root) -> dict[int, str]:
    holders, _ = scan_holders(NodeFacts(root))
    return {h.pid: h.name for h in holders}


def test_this_process_and_its_children_are_gpuwarden(tmp_path):
    got = names(tree(tmp_path, {50: 1, 51: 50, 52: 50, 200: 1, 201: 200}, self_pid=50))
    assert got == {50: OWN_NAME, 51: OWN_NAME, 52: OWN_NAME, 200: "python3", 201: "python3"}
    holders, _ = scan_holders(NodeFacts(tree(tmp_path / "b", {50: 1, 51: 50}, self_pid=50)))
    assert all(h.infra for h in holders)  # infrastructure: never a candidate


def test_without_proc_self_nobody_is_ours(tmp_path):
    """The negative: a root with no /proc/self that is this process (a copied tree, another pid namespace)."""
    assert names(tree(tmp_path, {50: 1, 51: 50}, self_pid=None)) == {50: "python3", 51: "python3"}


def test_a_garbage_proc_self_is_no_one(tmp_path):
    (tmp_path / "proc").mkdir()
    os.symlink("../../etc", tmp_path / "proc" / "self")
    assert names(tree(tmp_path, {50: 1}, self_pid=None)) == {50: "python3"}


def test_a_child_moved_into_a_pods_cgroup_is_that_pods(tmp_path):
    """The negative of the first: a child this process started and moved into a pod's cgroup (the GPU scenarios'
    workers) is a tenant, never ours (runs 21/22 on the H200: the scenario's own separation lost its pods)."""
    got = names(tree(tmp_path, {50: 1, 51: 50, 60: 50}, self_pid=50, moved=(60,)))
    assert got == {50: OWN_NAME, 51: OWN_NAME, 60: "python3"}
