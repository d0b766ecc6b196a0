"""The memory guard's last resort: kill one pod's processes on this node when the API cannot evict it.

Eviction through the API is the right action (kubelet stops the pod, the controller sees the Event,
the workload's owner recreates it elsewhere under quarantine). But a node losing memory to an escaped
pod may lose the API first. Then, and only with `memory_local_kill` enabled, the agent kills exactly
the attributed pod's processes by writing `1` to `cgroup.kill` of the pod's own cgroup (cgroup v2,
Linux 5.14+; SIGKILL to every pid of the pod's cgroups elsewhere). The driver frees the memory when
the processes exit. kubelet sees the containers die and restarts or fails them as their
restartPolicy says; nothing outside that pod's cgroup is touched.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

from gpuwarden.probes.bounded import run_func

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


@dataclass
class KillResult:
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
        if self.error:
            return f"local kill of {self.cgroup} failed: {self.error}"
        left = f"; {len(self.pids_after)} still present" if self.pids_after else ""
        return (f"killed {len(self.pids_before)} process(es) of {self.cgroup} with {self.method} in "
                f"{self.seconds:.2f}s{left}")


def _pids(host_dir: str) -> list[int]:
    out: list[int] = []
    for d, _, files in os.walk(host_dir):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    out += [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                pass
    return sorted(set(out))


def _kill(host_dir: str, wait_s: float) -> tuple[str, list[int], list[int], float]:
    """Runs in the child: kill, then wait for the cgroup to empty."""
    t0 = time.monotonic()
    before = _pids(host_dir)
    kill_file = os.path.join(host_dir, "cgroup.kill")
    if os.path.exists(kill_file):
        with open(kill_file, "w") as f:
            f.write("1")
        method = "cgroup.kill"
    else:
        method = "sigkill"
        for pid in before:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    after = before
    while time.monotonic() - t0 < wait_s:
        after = _pids(host_dir)
        if not after:
            break
        time.sleep(0.05)
    return method, before, after, time.monotonic() - t0


def kill_pod(host_dir: str, cgroup: str, uid: str, timeout_s: float = 10.0) -> KillResult:
    """Kill pod `uid`'s processes through its cgroup (`cgroup` as the node names it, `host_dir` where this
    process sees it), in a killable child with a deadline."""
    why = refuse(cgroup, uid)
    if why:
        return KillResult(cgroup, "", [], [], 0.0, f"refused: {why}")
    out = run_func(_kill, host_dir, max(0.5, timeout_s - 1.0), timeout=timeout_s)
    if not out.ok:
        return KillResult(cgroup, "", [], [], out.elapsed_s, f"{out.status}: {out.detail or out.value}")
    method, before, after, secs = out.value
    return KillResult(cgroup, method, before, after, secs)
