"""One pass over /proc: argv and start time of every process (kubelet, plugin, holders).

Reading /proc/<pid>/cmdline or environ takes the target's memory-map lock: a process stuck in
the kernel holding it (a D-state nvidia-smi, incident 5) makes that read block forever, the way
`ps` hangs. On a live node these reads therefore run in a killable child with a deadline; when it
times out the table falls back to /proc/<pid>/comm (no mm lock) and says so.
"""

from __future__ import annotations

import os
import time

from msgspec import Struct

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import plausible, proc_pid
from gpuwarden.root import Missing


class Proc(Struct, frozen=True):
    """A process of the node: pid and argv."""
    pid: int
    argv: tuple[str, ...]

    @property
    def exe_name(self) -> str:
        return os.path.basename(self.argv[0]) if self.argv else ""


class ProcessTable(Struct):
    """The node's processes, with the boot time and clock rate that date their starts."""
    procs: dict[int, Proc]
    boot_time: float | None
    clk_tck: int

    def by_name(self, *names: str) -> list[Proc]:
        return [p for p in self.procs.values() if p.exe_name in names]

    def start_time(self, facts: NodeFacts, pid: int) -> float | None:
        text = facts.read_text(f"/proc/{pid}/stat")
        ticks = proc_pid.start_ticks(text or "")
        if ticks is None or self.boot_time is None:
            return None
        return self.boot_time + ticks / self.clk_tck


#: how long one process's /proc files may take before that process is skipped (a D-state target)
PER_PROCESS_S = 1.0


def read_bounded(facts: NodeFacts, pids: list[int], names: tuple[str, ...]) -> dict[int, dict[str, bytes]] | None:
    """The named /proc/<pid>/ files of each pid, through the root; None when none could be read.

    Each read goes through the root's bounded reader (a FIFO or device planted at a /proc path is
    refused at once, never opened blocking). On a live node the reads run in a killable child: a
    process whose file blocks (its memory-map lock held in D state) costs PER_PROCESS_S and is
    left out with a gap; the others are still read.
    """
    root = facts.root

    def one(pid: int) -> dict[str, bytes]:
        return {n: b for n in names if isinstance(b := root.read_bytes(f"/proc/{pid}/{n}", 1 << 20), bytes)}

    if not root.live:
        return {pid: got for pid in pids if (got := one(pid))}
    from gpuwarden.probes.bounded import map_func

    got, stuck, finished = map_func(one, pids, timeout=facts.settings.probe_timeout_s,
                                    per_item=min(PER_PROCESS_S, facts.settings.probe_timeout_s))
    for i in stuck:
        facts.gap(f"/proc/{pids[i]}/{'|'.join(names)}", f"reading blocked for {PER_PROCESS_S:g}s (skipped): the process "
                                                        "may hold its memory-map lock (D state)")
    if not finished:
        facts.gap(f"/proc/*/{'|'.join(names)}", f"reading stopped after {facts.settings.probe_timeout_s:g}s "
                                                f"({len(got)} of {len(pids)} processes read)")
    if not got and pids:
        return None
    return {pids[i]: v for i, v in got.items() if v}


@fact("processes")
def collect_processes(facts: NodeFacts) -> ProcessTable:
    names = facts.root.listdir("/proc")
    if isinstance(names, Missing):
        raise FactUnavailable(f"/proc cannot be listed: {names.kind}")
    pids = [int(n) for n in names if plausible.decimal(n)]
    files = read_bounded(facts, pids, ("cmdline",))
    procs: dict[int, Proc] = {}
    for pid, got in (files or {}).items():
        raw = got.get("cmdline")
        if raw:  # empty: kernel thread, or exited meanwhile
            procs[pid] = Proc(pid, tuple(proc_pid.cmdline(raw)))
    # degraded, for the processes whose argv could not be read on a live node, or that a bundle lists by
    # name only (collect keeps argv for the processes it captures whole): task names (15 characters),
    # which need no mm lock
    unread = pids if files is None else [p for p in pids if p not in files]
    for pid in unread:
        comm = facts.root.read_text(f"/proc/{pid}/comm", 64)
        if isinstance(comm, str) and comm.strip():
            procs[pid] = Proc(pid, (comm.strip(),))
    boot = _precise_boot(facts, facts.maybe("boot"))
    meta = getattr(facts.root, "meta_merged", {}) or {}
    clk = meta.get("clk_tck")
    if not (isinstance(clk, int) and 1 <= clk <= 100_000):  # a bundle's claim; USER_HZ is 100 everywhere
        clk = os.sysconf("SC_CLK_TCK") if facts.root.live else 100
    return ProcessTable(procs, boot, clk)


def _precise_boot(facts: NodeFacts, btime: float | None) -> float | None:
    """The boot time to date process starts by: btime, or on a live node `now - /proc/uptime` where it agrees.

    btime is whole seconds, rounded down by the kernel, so a start dated from it is up to 1 s early: a
    plugin restarted within a second of its last failed allocation would seem to have logged that
    failure itself (GPU-K8S-012 confirmed after the GPU came back, seen on the GPU machine). /proc/uptime
    is good to 10 ms; read at the same moment as the clock, the boot it gives is used when it lies in
    btime's second. A bundle's uptime pairs with a capture time of unknown distance: btime there."""
    if btime is None or not facts.root.live:
        return btime
    text = facts.root.read_text("/proc/uptime", 256)
    up = proc_pid.uptime(text) if isinstance(text, str) else None
    if up is None:
        return btime
    precise = time.time() - up
    return precise if btime - 0.05 <= precise < btime + 1.05 else btime
