"""One pass over /proc: argv and start time of every process (kubelet, plugin, holders)."""

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


@fact("processes")
def collect_processes(facts: NodeFacts) -> ProcessTable:
    names = facts.root.listdir("/proc")
    if isinstance(names, Missing):
        raise FactUnavailable(f"/proc cannot be listed: {names.kind}")
    procs: dict[int, Proc] = {}
    for n in names:
        if not n.isdigit():
            continue
        raw = facts.root.read_bytes(f"/proc/{n}/cmdline", 65536)
        if isinstance(raw, Missing) or not raw:
            continue  # kernel thread, or exited meanwhile
        procs[int(n)] = Proc(int(n), tuple(proc_pid.cmdline(raw)))
    boot = proc_pid.boot_time(facts.read_text("/proc/stat") or "")
    meta = getattr(facts.root, "meta_merged", {}) or {}
    clk = int(meta.get("clk_tck") or (os.sysconf("SC_CLK_TCK") if facts.root.live else 100))
    return ProcessTable(procs, boot, clk)
