"""What the agent decided to tell the API server and could not yet: bounded, on the node's disk.

An outage must not lose a fault's Warning Event (it is raised once) or a condition change. The
agent writes each such item here when the API does not take it, and sends the backlog, oldest
first, as soon as a call succeeds again (the next check, or a restart: the file is kept under
`--state-dir`, a hostPath, so a restarted agent sends what its predecessor could not).

- **Events** are aggregated while they wait, like the kubelet's recorder: a repeat of the same
  (object, type, reason, message) bumps `count` and `lastTimestamp` of the waiting Event instead of
  adding one. Each keeps the name it was given when decided, so a create whose answer was lost
  (and that the server did store) comes back as 409 AlreadyExists on the retry: delivered, once.
  An Event read back from the disk (left by the previous agent) is not counted again when the new
  agent, which could not read its Node to learn the fault was raised, raises the same one: that is
  the same occurrence (count 1), not a second; a further repeat is.
- **Conditions**: the latest entry per condition type, with the time it was decided
  (lastTransitionTime); a newer decision about a type replaces the waiting one.
- **Bounded**: at most `limit` Events; beyond it the oldest Normal Event goes first, then the oldest
  Warning, and `dropped` counts them (a metric and a log line say so).

The file is rewritten atomically on every change, through the root it lies under like every write
of the agent (HostRoot.write_file: an exclusive temporary file, fsync, rename within the directory
resolved beneath the root; docs/security.md); an unreadable file is copied aside (`.corrupt`) and
the outbox starts empty.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from gpuwarden.root import HostRoot, Missing

LIMIT = 500
VERSION = 1


class Outbox:
    def __init__(self, path: str = "", limit: int = LIMIT, log: Any = None, root: HostRoot | None = None) -> None:
        """`path` is a node path under `root` (the agent's: the state directory lies on the host), or,
        without a root, a path of this process's own filesystem."""
        self.path = path if root is not None or not path else os.path.abspath(path)
        self.root = root if root is not None else HostRoot("/")
        self.limit = limit
        self.log = log
        self.events: list[dict] = []  # {"key": str, "namespace": str, "body": Event}
        self.conditions: dict[str, dict] = {}  # type -> condition entry as it would be patched
        self.dropped = 0
        self.delivered = 0
        self._load()

    # -- persistence -------------------------------------------------------------------------------
    def _load(self) -> None:
        if not self.path:
            return
        raw = self.root.read_bytes(self.path)
        if isinstance(raw, Missing) and raw.kind == "missing":
            return
        try:
            if isinstance(raw, Missing):
                raise OSError(str(raw))
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                raise ValueError("not an outbox of this version")
            self.events = [e for e in doc.get("events") or [] if isinstance(e, dict) and "body" in e][-self.limit:]
            for e in self.events:
                e["carried"] = True  # decided by a previous agent: its repeat by this one is no new occurrence
            self.conditions = {k: v for k, v in (doc.get("conditions") or {}).items() if isinstance(v, dict)}
        except (OSError, ValueError, RecursionError) as exc:
            if self.log:
                self.log.warn("outbox-unreadable", path=self.path, error=str(exc))
            if isinstance(raw, bytes):
                try:
                    self.root.write_file(self.path + ".corrupt", raw)
                except OSError:
                    pass
            self.events, self.conditions = [], {}
            return
        if self.log and self.pending:
            self.log.info("outbox-loaded", path=self.path, events=len(self.events),
                          conditions=sorted(self.conditions))

    def _save(self) -> None:
        if not self.path:
            return
        doc = {"version": VERSION, "events": self.events, "conditions": self.conditions}
        try:
            self.root.write_file(self.path, json.dumps(doc, separators=(",", ":")).encode())
        except OSError as exc:  # a full or read-only disk: the outbox still works in memory
            if self.log:
                self.log.warn("outbox-not-saved", path=self.path, error=str(exc))

    # -- queries -----------------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self.events) + len(self.conditions)

    # -- events ------------------------------------------------------------------------------------
    def put_event(self, key: str, namespace: str, body: dict) -> None:
        """Queue an Event (aggregated with a waiting one of the same key)."""
        for e in self.events:
            if e["key"] == key:
                b = e["body"]
                if e.pop("carried", False):
                    self._save()
                    return
                b["count"] = int(b.get("count") or 1) + int(body.get("count") or 1)
                b["lastTimestamp"] = body.get("lastTimestamp") or b.get("lastTimestamp")
                self._save()
                return
        self.events.append({"key": key, "namespace": namespace, "body": body})
        while len(self.events) > self.limit:
            i = next((i for i, e in enumerate(self.events) if e["body"].get("type") == "Normal"), 0)
            gone = self.events.pop(i)
            self.dropped += 1
            if self.log:
                self.log.warn("outbox-full", dropped_reason=gone["body"].get("reason"), limit=self.limit,
                              dropped_total=self.dropped)
        self._save()

    def flush_events(self, send: Callable[[str, dict], Any], stop: Callable[[Exception], bool]) -> int:
        """Send waiting Events oldest first; `stop(exc)` says whether a failure ends the flush (the
        API is away: keep the rest) or drops just that Event (the API refused it for good)."""
        sent = 0
        while self.events:
            e = self.events[0]
            try:
                send(e["namespace"], e["body"])
            except Exception as exc:
                if getattr(exc, "status", None) == 409:  # created by an attempt whose answer was lost
                    pass
                elif stop(exc):
                    break
                elif self.log:
                    self.log.warn("outbox-event-refused", reason=e["body"].get("reason"), error=str(exc))
            self.events.pop(0)
            sent += 1
            self._save()
        self.delivered += sent
        return sent

    # -- conditions --------------------------------------------------------------------------------
    def put_conditions(self, entries: list[dict]) -> None:
        for c in entries:
            prev = self.conditions.get(c["type"])
            if prev and prev.get("status") == c.get("status"):
                c = {**c, "lastTransitionTime": prev.get("lastTransitionTime") or c.get("lastTransitionTime")}
            self.conditions[c["type"]] = c
        self._save()

    def take_conditions(self, types: set[str]) -> None:
        """These types were delivered (by a later patch that carried them)."""
        if any(t in self.conditions for t in types):
            for t in types:
                self.conditions.pop(t, None)
            self._save()
