"""What the kubelet log says about device-plugin calls: which returned, which never did.

The kubelet device manager logs a line *before* each plugin call and nothing after it
(kubernetes pkg/kubelet/cm/devicemanager/manager.go):

    "Issuing a GetPreferredAllocation call for container" containerName=… podUID=…   (V4)
    "Making allocation request for device plugin" devices=[…] resourceName=…         (V3/V4)

So a call's return is inferred from what follows it in the same kubelet process:
- the next device-manager line (admission is serial: a later call means this one returned;
  after GetPreferredAllocation the Allocate line is its direct successor), an rpc error;
- else, searched only after the call (follow-up phase, usually a few bytes away): a sync-loop
  line (`"SyncLoop …"` comes from the same goroutine that is blocked during admission), any line
  naming the pod's UID, or an admission failure — the call returned; a "Kubelet version" line
  or another process id first — the kubelet was restarted with the call still pending;
- nothing at all: the call is still open. Pods the kubelet's config layer saw after it
  ("Adding new pods from source", "Gracefully deleting pods from source") are queued behind it.
"""

from __future__ import annotations

from typing import Callable

from msgspec import Struct, field
from msgspec.structs import replace

from gpuwarden.logs import signatures as logsignatures
from gpuwarden.logs.scan import LogEvent, LogScan, Signature
from gpuwarden.parsers import klog, lazyre

GPA = "GetPreferredAllocation"
ALLOCATE = "Allocate"

_CALL_SIGS = {"kubelet.gpa.issue": GPA, "kubelet.allocate.issue": ALLOCATE}
_RETURN_SIGS = ("kubelet.gpa.issue", "kubelet.allocate.issue", "kubelet.gpa.failed")
_UID = lazyre.compile(r"[0-9a-fA-F-]{8,}")

#: follow(start_offset, signatures, first_only, align) -> LogScan of the same log from start_offset;
#: align: start_offset may fall inside a line (a window before an offset), begin at the next line;
#: an optional fifth argument, stop, ends the search at that offset (a line start)
Follow = Callable[..., LogScan]
#: how far back from an open call to look for the "SyncLoop ADD" of the pod being admitted
ADD_WINDOW = 256 << 10


class PluginCall(Struct, frozen=True):
    """One device-plugin call the kubelet's log records, with its pod."""
    rpc: str  # "GetPreferredAllocation" | "Allocate"
    event: LogEvent  # the line that announced the call
    pod_uid: str
    pod: str  # "ns/name" when the line names it
    container: str
    resource: str
    #: "returned" | "failed" | "kubelet-restarted" | "open" | "unknown" (a restart followed an
    #: Allocate that names no pod: whether it was pending cannot be told)
    outcome: str
    followed_by: LogEvent | None = None
    #: open: reference time - call time; restarted: restart - call time (None: unknown)
    waited_s: float | None = None
    #: open calls: seconds of log the same kubelet wrote after the call (None: unknown)
    log_after_s: float | None = None

    @property
    def who(self) -> str:
        pod = self.pod or (f"pod UID {self.pod_uid}" if self.pod_uid else "unknown pod")
        return f"{pod} container {self.container}" if self.container else pod


class DeviceManagerLog(Struct):
    """The kubelet's device-manager calls and whether any is still unanswered."""
    calls: list[PluginCall]
    ref_time: float
    #: pod-config lines (add/delete) seen after the earliest open call: work queued behind it
    queued: list[LogEvent] = field(default_factory=list)
    #: sync-loop lines after the earliest open call (None: not looked, 0: the loop is silent)
    syncloop_after: int | None = None
    problems: list[str] = field(default_factory=list)

    def open_calls(self) -> list[PluginCall]:
        return [c for c in self.calls if c.outcome == "open"]

    def stalled(self, stall_s: float) -> list[PluginCall]:
        """Open calls pending for at least stall_s (by the reference time or the log itself)."""
        out = []
        for c in self.open_calls():
            waited = max(c.waited_s or 0.0, c.log_after_s or 0.0)
            if waited >= stall_s:
                out.append(c)
        return out

    def restarted_stalls(self, stall_s: float) -> list[PluginCall]:
        """Calls that were still pending, stall_s or more, when the kubelet was restarted."""
        return [c for c in self.calls
                if c.outcome == "kubelet-restarted" and c.waited_s is not None and c.waited_s >= stall_s]

    def queued_pods(self) -> list[tuple[str, str, LogEvent]]:
        """(op, "ns/name", event) for each pod named in the queued config lines."""
        out = []
        for e in self.queued:
            op = {"Adding new": "add", "Gracefully deleting": "delete", "Removing": "remove",
                  "Updating": "update"}.get(e.get("op"), e.get("op"))
            pods = klog.split_list(e.get("pods")) if e.get("pods") else []
            for p in pods or [""]:
                out.append((op, p, e))
        return out


def _who(ev: LogEvent, prev: LogEvent | None) -> dict[str, str]:
    """podUID/pod/containerName/resourceName of a call line.

    Before ~1.30 the Allocate line names only the resource; when the line before it in the same
    process is a GetPreferredAllocation, both belong to the same container (admission is serial).
    """
    f = ev.fields
    who = {k: f.get(k, "") for k in ("podUID", "pod", "containerName", "resourceName")}
    if (ev.sig == "kubelet.allocate.issue" and not who["podUID"] and not who["pod"] and prev is not None
            and prev.sig == "kubelet.gpa.issue" and _same_process(prev, ev)):
        for k in ("podUID", "pod", "containerName"):
            who[k] = who[k] or prev.fields.get(k, "")
    return who


def _call(ev: LogEvent, rpc: str, who: dict[str, str], outcome: str, followed: LogEvent | None = None,
          waited: float | None = None, log_after: float | None = None) -> PluginCall:
    return PluginCall(rpc, ev, who["podUID"], who["pod"], who["containerName"], who["resourceName"],
                      outcome, followed, waited, log_after)


def _same_process(a: LogEvent, b: LogEvent) -> bool:
    return a.pid is None or b.pid is None or a.pid == b.pid


def _delta(a: LogEvent, b: LogEvent | None) -> float | None:
    if b is None or a.time is None or b.time is None:
        return None
    return b.time - a.time


def interpret(scan: LogScan, follow: Follow | None, ref_time: float) -> DeviceManagerLog:
    """Pair each device-plugin call with what followed it; find the ones still open."""
    out = DeviceManagerLog([], ref_time)
    timeline = scan.of(*_RETURN_SIGS)
    followups = logsignatures.for_log("kubelet", phase="follow-up")
    progress = [s for s in followups if s.id in ("kubelet.syncloop", "kubelet.start", "kubelet.allocate.failed")]
    for idx, ev in enumerate(timeline):
        rpc = _CALL_SIGS.get(ev.sig)
        if rpc is None:
            continue
        nxt = timeline[idx + 1] if idx + 1 < len(timeline) else None
        who = _who(ev, timeline[idx - 1] if idx else None)
        if nxt is not None and _same_process(ev, nxt):
            failed = nxt.sig == "kubelet.gpa.failed" and rpc == GPA
            out.calls.append(_call(ev, rpc, who, "failed" if failed else "returned", nxt, _delta(ev, nxt)))
            continue
        # nothing after it in this process among the device-manager lines: look closer
        first: LogEvent | None = None
        if follow is not None:
            sigs = list(progress)
            uid = who["podUID"]
            if uid and _UID.fullmatch(uid):
                sigs.append(Signature("kubelet.pod-uid", uid.encode("ascii")))
            try:
                found = follow(_line_end(ev), sigs, True, False)
                first = found.events[0] if found.events else None
                out.problems.extend(found.problems)
            except Exception as exc:  # the follow-up is a refinement: never fail the fact on it
                out.problems.append(f"follow-up search failed: {type(exc).__name__}: {exc}")
        if first is None and nxt is not None:
            first = nxt  # only a later process's lines: the kubelet restarted
        if first is not None:
            if first.sig == "kubelet.start" or not _same_process(ev, first):
                # GetPreferredAllocation is always followed by an Allocate or an error line when it
                # returns; an Allocate only by the pod's own lines, so without its UID a restart
                # says nothing about whether it was pending
                outcome = "kubelet-restarted" if rpc == GPA or who["podUID"] else "unknown"
                out.calls.append(_call(ev, rpc, who, outcome, first, _delta(ev, first)))
            elif first.sig == "kubelet.allocate.failed":
                out.calls.append(_call(ev, rpc, who, "failed", first, _delta(ev, first)))
            else:
                out.calls.append(_call(ev, rpc, who, "returned", first, _delta(ev, first)))
            continue
        waited = ref_time - ev.time if ev.time is not None else None
        log_after = None
        if ev.time is not None and scan.last_time is not None and (
                scan.last_pid is None or ev.pid is None or scan.last_pid == ev.pid):
            log_after = max(0.0, scan.last_time - ev.time)
        out.calls.append(_call(ev, rpc, who, "open", None, waited, log_after))
    if follow is not None:
        for i, c in enumerate(out.calls):
            if c.outcome == "open" and not c.pod:
                pod = _admitted_pod(c, follow, out)
                if pod:
                    out.calls[i] = replace(c, pod=pod)
    opened = out.open_calls()
    if opened and follow is not None:
        start = min(_line_end(c.event) for c in opened)
        sigs = [s for s in followups if s.id in ("kubelet.pods-from-source", "kubelet.syncloop")]
        try:
            after = follow(start, sigs, False, False)
            out.queued = [e for e in after.of("kubelet.pods-from-source")
                          if e.get("op") in ("Adding new", "Gracefully deleting", "Removing")]
            out.syncloop_after = after.count("kubelet.syncloop")
            out.problems.extend(after.problems)
        except Exception as exc:
            out.problems.append(f"queue search failed: {type(exc).__name__}: {exc}")
    return out


def _admitted_pod(c: PluginCall, follow: Follow, out: DeviceManagerLog) -> str:
    """The pod of an open call: the last "SyncLoop ADD" of that kubelet shortly before it, when it
    names exactly one pod (admission runs right after the sync loop hands the pods over)."""
    syncloop = [s for s in logsignatures.for_log("kubelet", phase="follow-up") if s.id == "kubelet.syncloop"]
    try:
        # only lines before the call count: the search ends there, not at the end of the log
        window = follow(max(0, c.event.offset - ADD_WINDOW), syncloop, False, True, c.event.offset)
    except Exception as exc:
        out.problems.append(f"pod lookup failed: {type(exc).__name__}: {exc}")
        return ""
    adds = [e for e in window.of("kubelet.syncloop")
            if e.offset < c.event.offset and e.get("op") == "ADD" and _same_process(e, c.event)]
    if not adds:
        return ""
    pods = klog.split_list(adds[-1].get("pods"))
    return pods[0] if len(pods) == 1 else ""


def _line_end(ev: LogEvent) -> int:
    """Offset just after the event's line (its next line starts there)."""
    return ev.end or ev.offset + len(ev.line.encode("utf-8", "replace")) + 1
