"""One pass over /proc: argv and start time of every process (kubelet, plugin, holders).

Reading /proc/<pid>/cmdline or environ takes the target's memory-map lock: a process stuck in
the kernel holding it (a D-state nvidia-smi, incident 5) makes that read block forever, the way
`ps` hangs. On a live node these reads therefore run in a killable child with a deadline; when it
times out the table falls back to /proc/<pid>/comm (no mm lock) and says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import proc_pid
from gpuwarden.root import Missing


@dataclass(frozen=True)
class Proc:
    pid: int
    argv: tuple[str, ...]

    @property
    def exe_name(self) -> str:
        return os.path.basename(self.argv[0]) if self.argv else ""


@dataclass
class ProcessTable:
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


def read_proc_files(proc_dir: str, pids: list[int], names: tuple[str, ...], cap: int = 65536) -> dict[int, dict[str, bytes]]:
    """Runs in a child: the named /proc/<pid>/ files of each pid (missing ones left out)."""
    out: dict[int, dict[str, bytes]] = {}
    for pid in pids:
        got = {}
        for name in names:
            try:
                with open(f"{proc_dir}/{pid}/{name}", "rb") as f:
                    got[name] = f.read(cap)
            except OSError:
                pass
        if got:
            out[pid] = got
    return out


def read_bounded(facts: NodeFacts, pids: list[int], names: tuple[str, ...]) -> dict[int, dict[str, bytes]] | None:
    """read_proc_files through the root: in a killable child on a live node; None when it timed out."""
    if not facts.root.live:
        out: dict[int, dict[str, bytes]] = {}
        for pid in pids:
            got = {n: b for n in names if isinstance(b := facts.root.read_bytes(f"/proc/{pid}/{n}", 1 << 20), bytes)}
            if got:
                out[pid] = got
        return out
    from gpuwarden.probes.bounded import run_func

    res = run_func(read_proc_files, facts.root.host_path("/proc"), pids, names, timeout=facts.settings.probe_timeout_s)
    if not res.ok:
        facts.gap(f"/proc/*/{'|'.join(names)}", f"reading timed out or failed ({res.detail}): a process may hold "
                                                 "its memory-map lock (D state)")
        return None
    return res.value


@fact("processes")
def collect_processes(facts: NodeFacts) -> ProcessTable:
    names = facts.root.listdir("/proc")
    if isinstance(names, Missing):
        raise FactUnavailable(f"/proc cannot be listed: {names.kind}")
    pids = [int(n) for n in names if n.isdigit()]
    files = read_bounded(facts, pids, ("cmdline",))
    procs: dict[int, Proc] = {}
    if files is not None:
        for pid, got in files.items():
            raw = got.get("cmdline")
            if raw:  # empty: kernel thread, or exited meanwhile
                procs[pid] = Proc(pid, tuple(proc_pid.cmdline(raw)))
    else:  # degraded: task names only (15 characters), which need no mm lock
        for pid in pids:
            comm = facts.root.read_text(f"/proc/{pid}/comm", 64)
            if isinstance(comm, str) and comm.strip():
                procs[pid] = Proc(pid, (comm.strip(),))
    boot = proc_pid.boot_time(facts.read_text("/proc/stat") or "")
    meta = getattr(facts.root, "meta_merged", {}) or {}
    clk = int(meta.get("clk_tck") or (os.sysconf("SC_CLK_TCK") if facts.root.live else 100))
    return ProcessTable(procs, boot, clk)
