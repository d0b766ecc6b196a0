"""NodeConditions, one per rule family, in node-problem-detector's convention: the agent's publisher.

status "True" = the problem is present; reason = the finding code in CamelCase ("GpuDev001", see
kube/conditions.py for the types and reasons); message = one line: code, what is wrong, and the
first step of the fix.

Only our condition types are ever sent, as a strategic-merge patch of nodes/<name>/status
(`conditions` merges on `type`), so the kubelet's Ready/MemoryPressure and NPD's conditions are
never touched. lastTransitionTime is kept unless the status changes.

Writes: a PATCH only when a condition changes, or when the heartbeat is due (every `heartbeat_s`,
all our conditions in one patch). Between those the publisher sends nothing, not even the GET
that the merge needs: 5,000 quiet nodes then cost the API server ~17 GETs and ~17 PATCHes a
second at the 5-minute default, instead of a GET per node per check (~83 a second at 60 s).
A condition changed on the Node by someone else is seen, and corrected, at the next heartbeat.

Outages: a patch the API does not take waits in the agent's `Outbox` (agent/outbox.py), on the
node's disk, with the time it was decided; `flush()` sends it first when the API serves again. A
change decided while the Node cannot even be read is planned against the conditions as last read
(or sent), and waits the same way: it is delivered with the time it was decided, not stamped with
the time the API came back.
Until the Node's conditions have been read once (`initial`), nothing but problems is sent: a
restarted agent never declares False a type that a previous agent left True (docs/agent.md).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from msgspec import Struct

from gpuwarden.kube.conditions import CONDITION_TYPES, healthy_reason, one_line, reason_for
from gpuwarden.kube.errors import retryable
from gpuwarden.parsers.wallclock import format_rfc3339, rfc3339_epoch

def first_step(remedy: str) -> str:
    """The first step of a remedy, without its list number."""
    for line in (remedy or "").splitlines():
        line = line.strip()
        if line:
            return re.sub(r"^\d+[.)]\s*", "", line)
    return ""


class Desired(Struct):
    """What one of our conditions should say now."""

    type: str
    problem: bool
    reason: str
    message: str


def fault_message(findings: Iterable[Any]) -> tuple[str, str]:
    """(reason, message) for a condition raised by these findings (most severe first)."""
    fs = sorted(findings, key=lambda f: (-int(f.severity), f.code))
    if not fs:
        return "Unknown", ""
    parts = []
    for f in fs:
        fix = first_step(f.remedy)
        gpus = ", ".join(g.gpu_label() + (f" {g.uuid}" if g.uuid else "") for g in f.gpus())
        parts.append(f"{f.code}" + (f" [{gpus}]" if gpus else "") + f": {f.summary}" + (f" Fix: {fix}" if fix else ""))
    return reason_for(fs[0].code), one_line(" | ".join(parts))


def merge_conditions(current: list[dict], desired: Iterable[Desired], now: float,
                     heartbeat_s: float = 300.0) -> list[dict]:
    """The condition entries to send: changed ones, and unchanged ones whose heartbeat is due.

    lastTransitionTime is copied from the current condition unless the status flips.
    """
    by_type = {c.get("type"): c for c in current or []}
    ts = format_rfc3339(now)
    out = []
    for d in desired:
        status = "True" if d.problem else "False"
        cur = by_type.get(d.type)
        if cur and cur.get("status") == status:
            transition = cur.get("lastTransitionTime") or ts
            unchanged = cur.get("reason") == d.reason and cur.get("message") == d.message
            if unchanged and not _heartbeat_due(cur.get("lastHeartbeatTime"), now, heartbeat_s):
                continue
        else:
            transition = ts
        out.append({"type": d.type, "status": status, "reason": d.reason, "message": d.message,
                    "lastHeartbeatTime": ts, "lastTransitionTime": transition})
    return out


def _heartbeat_due(last: str | None, now: float, heartbeat_s: float) -> bool:
    t = rfc3339_epoch(last or "")
    return t is None or now - t >= heartbeat_s


class ConditionPublisher:
    """Reads and patches our conditions on one Node."""

    def __init__(self, kube: Any, node_name: str, heartbeat_s: float = 300.0, outbox: Any = None) -> None:
        self.kube = kube
        self.node = node_name
        self.heartbeat_s = heartbeat_s
        self.outbox = outbox
        self.patches = 0
        #: what our conditions said after the last publish, and when the next heartbeat is due:
        #: until then an unchanged desired state needs no request at all
        self._said: dict[str, tuple[bool, str, str]] | None = None
        self._due = 0.0
        self._seen: list[dict] | None = None  # our conditions as last read from the Node (None: never read)

    def current(self) -> list[dict]:
        node = self.kube.get_node(self.node)
        self._seen = list((node.get("status") or {}).get("conditions") or [])
        return list(self._seen)

    def initial(self, now: float) -> dict[str, bool]:
        """Declare our absent condition types False; return which of ours are already True.

        A condition already True (a previous agent raised it) stays True: the debouncer starts
        raised, so only `debounce_clear` clean observations clear it.
        """
        cur = self.current()
        ours = {c.get("type"): c for c in cur if c.get("type") in CONDITION_TYPES}
        waiting = dict(self.outbox.conditions) if self.outbox is not None else {}
        missing = [Desired(t, False, healthy_reason(t), f"gpuwarden: no {t} problem found")
                   for t in CONDITION_TYPES if t not in ours and t not in waiting]
        self.flush()
        if missing:
            self._patch(merge_conditions(cur, missing, now, self.heartbeat_s))
        out = {t: (c.get("status") == "True") for t, c in ours.items()}
        # decided True by a previous agent during an outage, not delivered: as good as on the Node
        out.update({t: True for t, c in waiting.items() if c.get("status") == "True"})
        return out

    def hold(self, desired: Iterable[Desired], now: float) -> None:
        """Before the Node was read: keep the problems decided (the Outbox sends them later)."""
        if self.outbox is not None:
            problems = [d for d in desired if d.problem]
            if problems:
                self.outbox.put_conditions(merge_conditions([], problems, now, 0.0))

    def flush(self) -> bool:
        """Send the condition changes waiting in the outbox; True when none is left."""
        if self.outbox is None or not self.outbox.conditions:
            return True
        self._patch(list(self.outbox.conditions.values()))
        return True

    def publish(self, desired: Iterable[Desired], now: float) -> list[dict]:
        """Send what changed, or everything when the heartbeat is due; nothing (no request) otherwise."""
        desired = list(desired)
        if not desired:
            return []
        said = {d.type: (d.problem, d.reason, d.message) for d in desired}
        if said == self._said and now < self._due:
            return []
        try:
            self.flush()  # changes decided during an outage go first, with the times they were decided
            cur = self.current()
        except Exception as exc:
            self._hold_changes(desired, said, now, exc)
            raise
        entries = merge_conditions(cur, desired, now, self.heartbeat_s)
        if entries:
            # one heartbeat for all of ours: they stay in step, one patch per period
            entries = merge_conditions(cur, desired, now, 0.0)
            self._patch(entries)
            self._due = now + self.heartbeat_s
        else:  # all current: the next heartbeat is due when the oldest of ours is
            beats = [rfc3339_epoch(c.get("lastHeartbeatTime") or "") for c in cur if c.get("type") in said]
            self._due = min((b for b in beats if b is not None), default=now) + self.heartbeat_s
        self._said = said
        return entries

    def _hold_changes(self, desired: list[Desired], said: dict, now: float, exc: Exception) -> None:
        """The Node could not be read: queue what changed since we last said it, planned against the
        conditions as last read, so that it keeps the time it was decided (`now`)."""
        if self.outbox is None or self._seen is None or not retryable(exc):
            return
        changed = [d for d in desired if (self._said or {}).get(d.type) != said[d.type]]
        entries = merge_conditions(self._seen, changed, now, 0.0)
        if entries:
            self.outbox.put_conditions(entries)

    def _patch(self, entries: list[dict]) -> None:
        try:
            self.kube.patch_node_status(self.node, {"status": {"conditions": entries}})
        except Exception as exc:
            if self.outbox is not None and retryable(exc):
                self.outbox.put_conditions(entries)
            raise
        self.patches += 1
        if self._seen is not None:  # what the Node says now, as far as we know
            by_type = {c.get("type"): c for c in self._seen}
            by_type.update({c["type"]: c for c in entries})
            self._seen = list(by_type.values())
        if self.outbox is not None:
            self.outbox.take_conditions({c["type"] for c in entries})

