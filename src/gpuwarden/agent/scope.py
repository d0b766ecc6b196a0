"""What a wake-up re-checks: a topic names the fact sections it changes, and the rules reading them follow.

Declarative on both sides: the table below says which sections each topic can change, the rules already
say which sections they read (`needs`, `uses`), so a new rule is re-checked on the right wake-ups
without being listed anywhere. Monitors (what only the agent's history shows) are listed per topic.
A check with no scope is the full, periodic one: every rule, every monitor, every fact section read
afresh. A targeted check re-reads only the sections its topics change (`Scope.sections`) and takes the
others from the last check's facts (the agent keeps them: facts/node.py `NodeFacts.inherit`).
"""

from __future__ import annotations

from typing import Iterable

from msgspec import Struct

#: topic -> the fact sections a change on it can alter (wake/base.TOPICS)
SECTIONS: dict[str, frozenset[str]] = {
    "log": frozenset({"logs", "xids"}),
    # the driver section lists /dev/nvidia* (GPU-DRV-003: nvidia-uvm loaded, its node missing): a change there
    # re-reads most rules, and is rare
    "devices": frozenset({"dev_char", "gpu_access", "driver"}),
    "plugins": frozenset({"plugin_sockets", "plugin", "kubelet"}),
    "cdi": frozenset({"gpu_access", "dra"}),
    "dra": frozenset({"dra", "dra_probe", "plugin_sockets"}),
    "memory": frozenset({"memory"}),
    "gpu": frozenset({"probes", "nvidia_smi", "xids"}),
    "admission": frozenset({"admissions"}),
}

#: topic -> the agent's monitors it concerns (agent/loop.py runs only these in a targeted check)
MONITORS: dict[str, frozenset[str]] = {
    "devices": frozenset({"grpc", "device-access"}),
    "plugins": frozenset({"grpc", "device-access", "repeated-timeouts"}),
    "cdi": frozenset({"device-access"}),
    "dra": frozenset({"dra-api"}),
    "memory": frozenset({"memory-growth"}),
    "gpu": frozenset({"repeated-timeouts", "dra-api"}),
    "admission": frozenset({"dra-api"}),
}

ALL_MONITORS = frozenset({"grpc", "device-access", "memory-growth", "repeated-timeouts", "dra-api"})


class Scope(Struct, frozen=True):
    """One check's reach. `topics` empty: the full check. `why` is the wake-up that asked for it:
    ("periodic", "") or (source, topic) of the earliest wake, with `seen` its time (latency's start)."""

    topics: frozenset[str] = frozenset()
    source: str = "periodic"
    seen: float = 0.0
    confirm: frozenset[str] = frozenset()  # codes this check re-reads to confirm (a moment after a first bad)

    @property
    def full(self) -> bool:
        return not self.topics and not self.confirm

    @property
    def label(self) -> str:
        return ",".join(sorted(self.topics)) or ("confirm" if self.confirm else "all")

    def wants_rule(self, rule: object) -> bool:
        """A confirming read: the codes it confirms only. A wake-up: the rules reading a section one of its
        topics changes."""
        if self.full:
            return True
        if self.confirm:
            return getattr(rule, "code", "") in self.confirm
        touched = set(getattr(rule, "needs", ())) | set(getattr(rule, "uses", ()))
        return any(SECTIONS.get(t, frozenset()) & touched for t in self.topics)

    def sections(self, rules: Iterable[object]) -> frozenset[str] | None:
        """The fact sections this check reads again; every other one is taken from the last check's facts
        (NodeFacts.inherit, with what was built from a re-read one). A wake-up: what its topics can change.
        A confirming read: everything the confirmed rules read (a second observation is a second reading);
        None (everything read again) when it confirms a code no rule reports: a monitor's, whose sections
        are not declared."""
        out: set[str] = set()
        for t in self.topics:
            out |= SECTIONS.get(t, frozenset())
        found: set[str] = set()
        for r in rules:
            if getattr(r, "code", "") in self.confirm:
                found.add(r.code)  # type: ignore[attr-defined]
                out |= set(getattr(r, "needs", ())) | set(getattr(r, "uses", ()))
        if self.confirm - found:
            return None
        return frozenset(out)

    def wants_monitor(self, name: str) -> bool:
        if self.full:
            return True
        if self.confirm and not self.topics:
            return True  # confirming what a full check saw: its monitors may be what saw it
        return any(name in MONITORS.get(t, frozenset()) for t in self.topics)


def topics_of(rules: Iterable[object], code: str) -> set[str]:
    """The topics whose wake-ups re-check `code` (docs and the latency's labels)."""
    for r in rules:
        if getattr(r, "code", "") == code:
            touched = set(getattr(r, "needs", ())) | set(getattr(r, "uses", ()))
            return {t for t, s in SECTIONS.items() if s & touched}
    return set()
