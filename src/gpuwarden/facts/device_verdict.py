"""One device-access verdict, and the kernel's rule for combining the two hierarchies that decide it.

The kernel asks both device policies on every open/mknod (security/device_cgroup.c,
devcgroup_check_permission): first the BPF_CGROUP_DEVICE programs effective on the
process's cgroup in the unified hierarchy, then the cgroup v1 devices controller.
Either may refuse; access needs both. On a pure v1 host only the list exists, on a pure
v2 host only the programs; on a hybrid host (v1 controllers plus cgroup2 mounted beside
them, systemd's "hybrid" layout) both do. Kept apart from gpu_access (which asks) and
bpf_programs (which evaluates programs) so that neither imports the other.
"""

from __future__ import annotations

from typing import Sequence

from msgspec import Struct

from gpuwarden.facts.driver import DeviceNode


class AccessVerdict(Struct, frozen=True):
    """Does the container's device policy allow `access` on a node?"""

    node: DeviceNode
    allowed: bool | None  # None: could not be decided (or not evaluated)
    how: str  # "devices.list" | "bpf" | "devices.list+bpf" | "open()" | ""
    evidence: str
    source: str
    #: for an open() probe's verdict: the verdict read from the policy that it superseded
    read: "AccessVerdict | None" = None
    #: for a refusal on a hybrid host: the hierarchies that allowed it (e.g. ("devices.list",))
    allowed_by: tuple[str, ...] = ()


def combine(node: DeviceNode, parts: Sequence[AccessVerdict]) -> AccessVerdict:
    """All must allow: a definite refusal by one hierarchy decides, whatever the other says;
    "allowed" needs every part to allow; anything else is undecided, with each part's reason."""
    if len(parts) == 1:
        return parts[0]
    refused = [p for p in parts if p.allowed is False]
    if refused:
        first = refused[0]
        # name the hierarchies that allow: the reader sees why one "allowed" reading is not the answer
        allow = "; ".join(f"{p.how} allows: {p.evidence}" for p in parts if p.allowed is True)
        return AccessVerdict(node, False, first.how, f"{first.evidence} ({allow})" if allow else first.evidence,
                       first.source, allowed_by=tuple(p.how for p in parts if p.allowed is True))
    how = "+".join(p.how for p in parts)
    text = "; ".join(f"{p.how}: {p.evidence}" for p in parts)
    source = " + ".join(p.source for p in parts)
    if all(p.allowed is True for p in parts):
        return AccessVerdict(node, True, how, text, source)
    return AccessVerdict(node, None, how, f"undecided: {text}", source)
