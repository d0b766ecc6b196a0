"""The `inotify` fact: the node's inotify instance limit (a device plugin that cannot watch its directory exits)."""

from __future__ import annotations

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact

MAX_USER_INSTANCES = "/proc/sys/fs/inotify/max_user_instances"


@fact("inotify")
def collect_inotify(facts: NodeFacts) -> dict[str, str]:
    """{path: value} of the limits read; unavailable when none could be."""
    limit = facts.read_text(MAX_USER_INSTANCES)
    if not limit:
        raise FactUnavailable(f"{MAX_USER_INSTANCES}: unreadable")
    return {MAX_USER_INSTANCES: limit.strip()}
