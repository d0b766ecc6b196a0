"""The `boot` fact: when the node booted (/proc/stat btime), the line between this boot's events and older ones."""

from __future__ import annotations

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import proc_pid


@fact("boot")
def collect_boot(facts: NodeFacts) -> float:
    """Epoch seconds of the boot; unavailable when /proc/stat is unreadable or has no btime."""
    boot = proc_pid.boot_time(facts.read_text("/proc/stat") or "")
    if boot is None:
        raise FactUnavailable("/proc/stat: no readable btime")
    return boot


def boot_time(facts: NodeFacts) -> float | None:
    """The boot time, or None when it cannot be read."""
    return facts.maybe("boot")
