"""When the node last re-applied cgroup settings wholesale: the dates the device-loss rules can prove a cause by.

systemd flushes and re-creates its generator directories (/run/systemd/generator,
/run/systemd/generator.late) on every `systemctl daemon-reload` (src/core/manager.c,
manager_run_generators), so their mtime dates the last reload; the kubelet's CPU manager
writes cpu_manager_state when an assignment changes, after which its reconcile loop updates
containers' cpusets. Only dates are kept: whether they matter is the rules' question.

A bundle keeps the generator directories' stat in its meta (the collector records it); the
state file's date is read on a live node only, because a copied file carries the date it was
unpacked, not the node's.
"""

from __future__ import annotations

from msgspec import Struct

from gpuwarden.facts.node import NodeFacts, fact
from gpuwarden.root import StatInfo

GENERATOR_DIRS = ("/run/systemd/generator", "/run/systemd/generator.late")
CPU_MANAGER_STATE = "/var/lib/kubelet/cpu_manager_state"


class ReapplyDates(Struct, frozen=True):
    """When something last re-applied containers' device cgroups (daemon-reload, CPU manager)."""
    reload_at: float | None  # the last daemon-reload, from the newest generator directory
    reload_source: str
    cpu_manager_state_at: float | None  # the CPU manager's last assignment change


def _mtime(facts: NodeFacts, path: str) -> float | None:
    st = facts.root.stat(path)
    return st.mtime if isinstance(st, StatInfo) and st.mtime else None


@fact("reapply")
def collect_reapply(facts: NodeFacts) -> ReapplyDates:
    reload_at, source = None, ""
    for p in GENERATOR_DIRS:
        t = _mtime(facts, p)
        if t is not None and (reload_at is None or t > reload_at):
            reload_at, source = t, p
    return ReapplyDates(reload_at, source, _mtime(facts, CPU_MANAGER_STATE) if facts.root.live else None)
