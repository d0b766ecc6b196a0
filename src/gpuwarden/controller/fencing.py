"""The fence storm: many GPU nodes fenced for the same code at once (pure: no API calls).

Every fence gpuwarden's agents put up is an action Event about the Node (reportingComponent
gpuwarden, `action` taint-node, cordon-node or taint-device; message "CODE: ..."): a node taint for
a critical driver or hardware fault (GPU-DRV-*, GPU-HW-*, the GPUDriver and GPUHardware conditions),
the lost-GPU fence (GPU-K8S-012) and a DRA device taint alike. One bad driver rolled out everywhere,
or one Xid that every node logs, is not N bad nodes: when at least `storm_nodes` GPU nodes, and at
least `storm_fraction` of them (never fewer than two), were fenced for the same code within
`storm_window_s`, the controller opens the agents' breaker and further fencing halts.

The storm passes when fewer nodes than that still show the code: a gpuwarden condition True with
its reason, or a Warning Event of the code not followed by its "...Cleared" Event (within
`event_hold_s`); a fence alone does not (a node whose fault cleared lifts its fence once the
breaker is closed). Nodes the breaker halted keep their
condition, so a fault that is still everywhere keeps the breaker open; once it is fixed (the driver
rolled back) their conditions clear, and the controller closes the breaker it opened itself.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Iterable, Mapping

from msgspec import Struct, field

from gpuwarden.controller.model import clock_time, conditions, involved_node, md, parse_time
from gpuwarden.kube.conditions import CONDITION_TYPES, code_from_reason
from gpuwarden.parsers.wallclock import format_rfc3339

#: the agents' actions that fence (remediation/plan.py; Events of remediation/executor.py)
FENCE_ACTIONS = ("taint-node", "cordon-node", "taint-device")
FENCE_REASONS = ("TaintedNode", "CordonedNode", "TaintedDevice")
_CODE = re.compile(r"^(GPU-[A-Z0-9]+-\d{3}):")
#: the breaker note's reason starts with this when a fence storm opened it (closed again when it passes)
REASON_PREFIX = "fence storm:"


class Fence(Struct, frozen=True):
    node: str
    code: str
    at: float
    action: str


class FenceStorm(Struct):
    code: str
    fences: list[Fence]  # first fence per node within the window, oldest first
    total: int  # GPU nodes known
    window_s: float
    showing: int = 0  # nodes that still show the code

    def summary(self) -> str:
        listed = ", ".join(f"{f.node} {clock_time(f.at)} ({f.action})" for f in self.fences[:20])
        more = f" and {len(self.fences) - 20} more" if len(self.fences) > 20 else ""
        return (f"{REASON_PREFIX} {len(self.fences)} of {self.total} GPU nodes fenced for {self.code} within "
                f"{int(self.window_s)}s: one cause everywhere (a driver rollout, a fleet-wide Xid), not "
                f"{len(self.fences)} bad nodes; further fencing halts until fewer nodes show it: {listed}{more}")

    def to_json(self) -> dict:
        return {"code": self.code, "gpuNodes": self.total, "windowSeconds": self.window_s,
                "nodes": [{"node": f.node, "fencedAt": format_rfc3339(f.at), "action": f.action} for f in self.fences]}


class FenceDetection(Struct):
    started: list[FenceStorm] = field(default_factory=list)
    ongoing: dict[str, int] = field(default_factory=dict)  # code in storm -> nodes still showing it
    passed: dict[str, int] = field(default_factory=dict)  # code whose storm passed -> nodes still showing it


@lru_cache(maxsize=1 << 16)
def _epoch(s: str) -> float | None:
    return parse_time(s)  # Events' times repeat (seconds): 25,000 Events of a window share a few hundred


def _first(ev: Mapping) -> float | None:
    """model.event_first, its times parsed once per distinct string."""
    for s in (ev.get("firstTimestamp"), ev.get("eventTime"), md(ev).get("creationTimestamp")):
        if isinstance(s, str) and s and (t := _epoch(s)) is not None:
            return t
    return None


def _last(ev: Mapping) -> float | None:
    """model.event_last, likewise."""
    for s in (ev.get("lastTimestamp"), (ev.get("series") or {}).get("lastObservedTime")):
        if isinstance(s, str) and s and (t := _epoch(s)) is not None:
            return t
    return _first(ev)


def over(n: int, total: int, cfg: Any) -> bool:
    """The storm rule's thresholds (controller/detect.py): n nodes of `total` GPU nodes."""
    return (n >= 2 and (cfg.storm_nodes > 0 or cfg.storm_fraction > 0)
            and (cfg.storm_nodes <= 0 or n >= cfg.storm_nodes)
            and (cfg.storm_fraction <= 0 or n >= cfg.storm_fraction * total))


def fences(events: Iterable[Mapping], now: float, window_s: float) -> list[Fence]:
    """The agents' fences within the window, from their action Events about Nodes."""
    out = []
    for ev in events:
        if ev.get("action") not in FENCE_ACTIONS or ev.get("reason") not in FENCE_REASONS:
            continue  # a RemediationFailed Warning carries the action too: no fence went up
        node = involved_node(ev)
        m = _CODE.match(str(ev.get("message") or ""))
        at = _last(ev)
        if not node or m is None or at is None or now - at > window_s:
            continue
        out.append(Fence(node, m.group(1), _first(ev) or at, str(ev.get("action"))))
    return out


def showing(nodes: Iterable[Mapping], events: Iterable[Mapping], now: float, hold_s: float) -> dict[str, set[str]]:
    """code -> nodes that show it now: a gpuwarden condition True with its reason, or its Warning Event
    within `hold_s` and not followed by the "...Cleared" one."""
    out: dict[str, set[str]] = {}
    for node in nodes:
        name = md(node).get("name", "")
        for t, c in conditions(node).items():
            code = code_from_reason(c.get("reason", "")) if t in CONDITION_TYPES and c.get("status") == "True" else None
            if code:
                out.setdefault(code, set()).add(name)
    warned: dict[tuple[str, str], float] = {}
    cleared: dict[tuple[str, str], float] = {}
    for ev in events:
        node, reason = involved_node(ev), str(ev.get("reason") or "")
        if not node:
            continue
        if reason.endswith("Cleared"):
            code = code_from_reason(reason[: -len("Cleared")])
            if code:
                cleared[(node, code)] = max(cleared.get((node, code), 0.0), _last(ev) or 0.0)
        elif ev.get("type") == "Warning" and (code := code_from_reason(reason)):
            warned[(node, code)] = max(warned.get((node, code), 0.0), _last(ev) or 0.0)
    for (node, code), last in warned.items():
        if now - last <= hold_s and cleared.get((node, code), 0.0) < last:
            out.setdefault(code, set()).add(node)
    return out


def detect(nodes: Iterable[Mapping], events: Iterable[Mapping], now: float, cfg: Any, gpu_nodes: set[str],
           in_storm: Iterable[str], passed_at: Mapping[str, float] | None = None) -> FenceDetection:
    """Fence storms that start now, go on, or passed, per code (`in_storm`: the codes in storm before;
    `passed_at`: when a code's last storm passed: only fences after it can start a new one, else the
    storm's own fences, still within the window, would open the breaker again at once)."""
    nodes, events = list(nodes), list(events)
    out = FenceDetection()
    per_code: dict[str, dict[str, Fence]] = {}
    passed_at = passed_at or {}
    for f in sorted(fences(events, now, cfg.storm_window_s), key=lambda f: f.at):
        if f.node in gpu_nodes and f.at > passed_at.get(f.code, float("-inf")):
            per_code.setdefault(f.code, {}).setdefault(f.node, f)
    shown = showing(nodes, events, now, cfg.event_hold_s)
    total = len(gpu_nodes)
    before = set(in_storm)
    for code in sorted(before | set(per_code)):
        fenced = per_code.get(code, {})
        still = len(shown.get(code, set()) & gpu_nodes)
        if code in before:
            if over(still, total, cfg):
                out.ongoing[code] = still
            else:
                out.passed[code] = still
        elif over(len(fenced), total, cfg):
            out.started.append(FenceStorm(code, sorted(fenced.values(), key=lambda f: (f.at, f.node)), total,
                                          cfg.storm_window_s, still))
    return out
