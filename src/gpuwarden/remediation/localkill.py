"""The memory guard's last resort: kill one pod's processes on this node when the API cannot evict it.

Eviction through the API is the right action (kubelet stops the pod, the controller sees the Event,
the workload's owner recreates it elsewhere under quarantine). But a node losing memory to an escaped
pod may lose the API first. Then, and only with `memory_local_kill` enabled, the agent kills exactly
the attributed pod's processes by writing `1` to `cgroup.kill` of the pod's own cgroup (cgroup v2,
Linux 5.14+; SIGKILL to every pid of the pod's cgroups elsewhere). The driver frees the memory when
the processes exit. kubelet sees the containers die and restarts or fails them as their
restartPolicy says; nothing outside that pod's cgroup is touched.

Confined like every side effect (docs/security.md): the cgroup directory is opened beneath the root
(HostRoot.open_dir: no link followed out), and must lie on the kernel's own cgroup filesystem
(statfs type CGROUP2_SUPER_MAGIC or CGROUP_SUPER_MAGIC): a copied tree, a bundle or an example
names pids of another machine, and its `cgroup.kill` may be a link to anything. `cgroup.kill` is
opened in that directory fd without following a link. Without it each pid is pinned first
(pidfd_open), checked to be in the pod's cgroup by the kernel's own `cgroup.procs` read after the
pin, and only then signalled through its pidfd: a pid reused meanwhile is never hit.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from typing import Any

from msgspec import Struct

from gpuwarden import confine
from gpuwarden.probes.bounded import run_func
from gpuwarden.root import read_fd

#: a pod's cgroup subtree holds a few containers; past this many cgroups it is not a pod's
_MAX_CGROUPS = 4096
#: what cgroupfs answers for a cgroup removed while it is walked (or a directory that is no cgroup)
_GONE = frozenset({errno.ENOENT, errno.ENODEV})

_UID = re.compile(r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}")


def refuse(cgroup: str, uid: str) -> str | None:
    """Why this cgroup path must not be killed as pod `uid`'s; None when it is that pod's cgroup.

    The last component must be the pod's own cgroup (cgroupfs `pod<uid>`, systemd
    `kubepods-<qos>-pod<uid_>.slice`) under a kubepods hierarchy: never kubepods itself, a QoS
    slice, another pod's or a container's.
    """
    if not uid or not _UID.fullmatch(uid.lower()):
        return f"no valid pod UID ({uid!r})"
    norm = os.path.normpath(cgroup)
    if norm != cgroup.rstrip("/") or ".." in cgroup.split("/"):
        return f"cgroup path {cgroup!r} is not normalised"
    if not norm.startswith("/sys/fs/cgroup/") or "kubepods" not in norm:
        return f"{cgroup} is not under a kubepods cgroup"
    last = norm.rsplit("/", 1)[-1]
    want = (f"pod{uid}", f"pod{uid.replace('-', '_')}")
    if not (last in want or (last.startswith("kubepods-") and last.endswith(f"-{want[1]}.slice"))):
        return f"{last} is not pod {uid}'s own cgroup"
    return None


class KillResult(Struct):
    cgroup: str
    method: str  # "cgroup.kill" | "sigkill"
    pids_before: list[int]
    pids_after: list[int]
    seconds: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and not self.pids_after

    def describe(self) -> str:
        if self.error.startswith("refused: "):
            return f"local kill of {self.cgroup} refused: {self.error[len('refused: '):]}"
        if self.error:
            return f"local kill of {self.cgroup} failed: {self.error}"
        left = f"; {len(self.pids_after)} still present" if self.pids_after else ""
        return (f"killed {len(self.pids_before)} process(es) of {self.cgroup} with {self.method} in "
                f"{self.seconds:.2f}s{left}")


class Refused(Exception):
    """Why the child did not act: the cgroup is not the kernel's, or not reachable inside the root."""


def _pids(top: int) -> list[int]:
    """Every pid of the cgroup open at `top` and of the cgroups below it, as the kernel lists them.

    Each directory is opened relative to its parent without following a link, and must itself lie
    on a cgroup filesystem (nothing mounted over a part of the subtree is read).
    """
    out: set[int] = set()
    todo = [os.dup(top)]
    seen = 0
    try:
        while todo:
            d = todo.pop()
            try:
                seen += 1
                if seen > _MAX_CGROUPS or not confine.is_cgroupfs(d):
                    raise Refused("the cgroup's subtree is not all on the kernel's cgroup filesystem")
                fd = os.open("cgroup.procs", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
                try:
                    out.update(int(x) for x in read_fd(fd, 1 << 20).split() if x.isdigit())
                finally:
                    os.close(fd)
                with os.scandir(d) as it:
                    for e in it:
                        if e.is_dir(follow_symlinks=False):
                            todo.append(os.open(e.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                                dir_fd=d))
            except OSError as exc:  # a container's cgroup removed under us as its processes die: nothing left in it
                if exc.errno not in _GONE:
                    raise
            finally:
                os.close(d)
    finally:
        for d in todo:
            os.close(d)
    return sorted(out)


def _sigkill_members(top: int, pids: list[int]) -> None:
    """SIGKILL each pid still in the cgroup, by the kernel's view read after the pid was pinned."""
    pinned: dict[int, int] = {}
    try:
        for pid in pids:
            try:
                pinned[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
        members = set(_pids(top))  # after every pin: a pid listed now is the pinned process
        for pid, pfd in pinned.items():
            if pid in members:
                try:
                    signal.pidfd_send_signal(pfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    finally:
        for pfd in pinned.values():
            os.close(pfd)


def _kill(root: Any, cgroup: str, wait_s: float) -> tuple[str, list[int], list[int], float, str]:
    """Runs in the child: resolve the cgroup beneath the root, check it is the kernel's, kill, then wait
    for it to empty. (method, pids before, pids after, seconds, why refused)."""
    t0 = time.monotonic()
    try:
        pfd = root.open_dir(cgroup)
    except OSError as exc:
        return "", [], [], time.monotonic() - t0, f"{cgroup} cannot be opened inside the root: {exc.strerror or exc}"
    try:
        magic = confine.fs_magic(pfd)
        if not confine.is_cgroupfs(pfd):
            return "", [], [], time.monotonic() - t0, (
                f"{cgroup} is not on the kernel's cgroup filesystem (statfs type "
                f"{'unknown' if magic is None else hex(magic)}): not a live node")
        top = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pfd)
    finally:
        os.close(pfd)
    try:
        before = _pids(top)
        try:
            kfd = os.open("cgroup.kill", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
        except FileNotFoundError:
            kfd = -1
        if kfd >= 0:
            method = "cgroup.kill"
            try:
                os.write(kfd, b"1")
            finally:
                os.close(kfd)
        else:
            if not hasattr(os, "pidfd_open"):
                return "", before, before, time.monotonic() - t0, ("no pidfd_open (Linux 5.3+): a pid could be "
                                                                   "reused between the check and the signal")
            method = "sigkill"
            _sigkill_members(top, before)
        after = before
        while time.monotonic() - t0 < wait_s:
            after = _pids(top)
            if not after:
                break
            time.sleep(0.05)
        return method, before, after, time.monotonic() - t0, ""
    except Refused as exc:
        return "", [], [], time.monotonic() - t0, str(exc)
    finally:
        os.close(top)


def kill_pod(root: Any, cgroup: str, uid: str, timeout_s: float = 10.0) -> KillResult:
    """Kill pod `uid`'s processes through its cgroup (`cgroup` as the node names it, resolved beneath the
    live root `root`, a HostRoot), in a killable child with a deadline."""
    why = refuse(cgroup, uid)
    if why:
        return KillResult(cgroup, "", [], [], 0.0, f"refused: {why}")
    if not getattr(root, "live", False) or not hasattr(root, "open_dir"):
        return KillResult(cgroup, "", [], [], 0.0, "refused: not a live node: nothing local to kill")
    out = run_func(_kill, root, cgroup, max(0.5, timeout_s - 1.0), timeout=timeout_s)
    if not out.ok:
        return KillResult(cgroup, "", [], [], out.elapsed_s, f"{out.status}: {out.detail or out.value}")
    method, before, after, secs, refused = out.value
    if refused:
        return KillResult(cgroup, method, before, after, secs, f"refused: {refused}")
    return KillResult(cgroup, method, before, after, secs)
