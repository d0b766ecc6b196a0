"""Run a plan: breaker -> cooldown -> rate limit -> act -> Event + structured log + metric.

Modes: "dry-run" evaluates every guard exactly as "on" would (the breaker is read, cooldowns and
token buckets are consulted but not consumed) and prints the plan with what would happen to each
action; it writes nothing to the cluster. "on" acts.

Cooldowns live in memory and are rebuilt at start from our own action Events (label
`gpuwarden.io/node=<node>`, reportingComponent=gpuwarden, action set), so a restarted agent does
not repeat an action inside the cooldown. The label selector makes that read O(this node): the
agent never lists another node's Events.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable, TextIO

from msgspec import Struct

from gpuwarden.kube.events import ObjectRef, event_pod, node_ref, node_selector
from gpuwarden.remediation import actions as act
from gpuwarden.remediation.breaker import BreakerOpen, BreakerState, Gate, check
from gpuwarden.remediation.guard import Cooldowns, TokenBucket
from gpuwarden.remediation.plan import KINDS, Action, RemediationPlan, epoch_or_zero

EVENT_REASON = {
    "restart-device-plugin": "RestartedDevicePlugin",
    "delete-pod": "DeletedPod",
    "evict-pod-for-memory": "EvictedPod",
    "cordon-node": "CordonedNode",
    "taint-node": "TaintedNode",
    "untaint-node": "UntaintedNode",
    "taint-device": "TaintedDevice",
    "untaint-device": "UntaintedDevice",
}


#: annotations of our action Events about a pod: the cascade controller reads them (controller/detect.py)
OWNER_KIND, OWNER_NAME, POD_CREATED, NODE = ("gpuwarden.io/owner-kind", "gpuwarden.io/owner-name",
                                             "gpuwarden.io/pod-created", "gpuwarden.io/node")


def owner_annotations(t: Any, node: str) -> dict[str, str] | None:
    if t.kind != "Pod":
        return None
    out = {NODE: node}
    if t.owner:
        out.update({OWNER_KIND: t.owner[0], OWNER_NAME: t.owner[1]})
    if t.created:
        out[POD_CREATED] = t.created
    return out


class RemediationOutcome(Struct):
    action: Action
    result: str  # done | failed | dry-run | breaker-open | cooldown | rate-limited
    detail: str = ""


class Executor:
    def __init__(self, kube: Any, cfg: Any, recorder: Any = None, metrics: Any = None, log: Any = None,
                 clock: Callable[[], float] = time.time, out: TextIO | None = None) -> None:
        self.kube = kube
        self.cfg = cfg
        self.recorder = recorder
        self.metrics = metrics
        self.log = log
        self.clock = clock
        self.out = out if out is not None else sys.stdout
        self.cooldowns = Cooldowns(cfg.cooldown_s, clock)
        self.buckets = {k: TokenBucket(cfg.rate_burst, cfg.rate_per_hour, clock) for k in KINDS}
        self.breaker: BreakerState | None = None
        #: the breaker read again right before each write of an action, atomic with its send
        self.gate = Gate(kube, cfg.namespace, cfg.breaker_configmap)
        self._printed = ""
        self.history: list[RemediationOutcome] = []

    # -- state -------------------------------------------------------------------------------------
    def plugin_restarted_at(self) -> float | None:
        t = self.cooldowns.since("restart-device-plugin", f"node/{self.cfg.node_name}")
        return t if t is not None and self.clock() - t < self.cfg.cooldown_s else None

    def rebuild_from_events(self) -> int:
        """Mark cooldowns from our own action Events still inside the cooldown; returns how many.

        Streamed a page at a time, each Event dropped once read: a node with 25,000 Events is read in
        the memory of one page (docs/performance.md)."""
        n = 0
        now = self.clock()
        try:
            for ev in self.kube.iter_events(field_selector="reportingComponent=gpuwarden",
                                            label_selector=node_selector(self.cfg.node_name)):
                n += self._rebuild_one(ev, now)
        except Exception as exc:
            if self.log:
                self.log.warn("cooldown-rebuild-failed", error=str(exc), rebuilt=n)
        return n

    def _rebuild_one(self, ev: dict, now: float) -> int:
        """1 when `ev` is one of our actions still inside its cooldown (marked), else 0."""
        kind = ev.get("action") or ""
        if kind not in KINDS or ev.get("reportingInstance") != self.cfg.node_name:
            return 0
        t = epoch_or_zero(ev.get("lastTimestamp") or ev.get("firstTimestamp"))
        if not t or now - t >= self.cfg.cooldown_s:
            return 0
        io = event_pod(ev) or ev.get("involvedObject") or {}
        key = f"{io.get('namespace', '')}/{io.get('name', '')}" if io.get("kind") == "Pod" else f"node/{io.get('name', '')}"
        self.cooldowns.mark(kind, key, t)
        if kind == "restart-device-plugin":
            self.cooldowns.mark(kind, f"node/{self.cfg.node_name}", t)
        return 1

    # -- run ---------------------------------------------------------------------------------------
    def execute(self, plan: RemediationPlan, mode: str, findings: dict[str, Any] | None = None) -> list[RemediationOutcome]:
        dry = mode != "on"
        outcomes: list[RemediationOutcome] = []
        if plan.actions:
            self.breaker = self.gate.state = check(self.kube, self.cfg.namespace, self.cfg.breaker_configmap)
        for a in plan.actions:
            o = self._one(a, dry, (findings or {}).get(a.code))
            outcomes.append(o)
            if self.metrics is not None:
                self.metrics.action(a.kind, o.result, dry)
            if self.log:
                self.log.info("remediation", action=a.kind, target=a.target.ref, uid=a.target.uid, code=a.code,
                              result=o.result, dry_run=dry, detail=o.detail, why=a.why)
        self.history.extend(outcomes)
        if dry and not plan.empty():
            self._print(plan, outcomes)
        return outcomes

    def _one(self, a: Action, dry: bool, finding: Any) -> RemediationOutcome:
        if self.breaker is not None and self.breaker.open:
            return RemediationOutcome(a, "breaker-open", self.breaker.why)
        left = self.cooldowns.remaining(a.kind, a.target.key)
        if left > 0:
            return RemediationOutcome(a, "cooldown", f"{a.kind} on {a.target.key} was done {self.cfg.cooldown_s - left:.0f}s ago; "
                                          f"{left:.0f}s of cooldown left")
        if a.kind == "restart-device-plugin":
            left = self.cooldowns.remaining(a.kind, f"node/{self.cfg.node_name}")
            if left > 0:
                return RemediationOutcome(a, "cooldown", f"the device plugin on this node was restarted recently; {left:.0f}s left")
        bucket = self.buckets[a.kind]
        if dry:
            if not bucket.available():
                return RemediationOutcome(a, "rate-limited", f"{a.kind}: token bucket empty ({self.cfg.rate_per_hour:g}/h)")
            return RemediationOutcome(a, "dry-run", "would " + a.describe())
        if not bucket.take():
            return RemediationOutcome(a, "rate-limited", f"{a.kind}: token bucket empty ({self.cfg.rate_per_hour:g}/h)")
        try:
            detail = self._apply(a)
        except BreakerOpen as exc:  # opened since the plan's read: nothing was sent (no Event: nothing done)
            bucket.give_back()
            self.breaker = self.gate.state
            return RemediationOutcome(a, "breaker-open", str(exc))
        except Exception as exc:
            self._event(a, finding, ok=False, detail=str(exc))
            return RemediationOutcome(a, "failed", str(exc))
        self.cooldowns.mark(a.kind, a.target.key)
        if a.kind == "restart-device-plugin":
            self.cooldowns.mark(a.kind, f"node/{self.cfg.node_name}")
        self._event(a, finding, ok=True, detail=detail)
        return RemediationOutcome(a, "done", detail)

    def _apply(self, a: Action) -> str:
        """The action's API calls, each write passing the breaker's gate right before it is sent (its
        Event, written after, does not)."""
        from gpuwarden.kube.client import WRITE_GATE

        token = WRITE_GATE.set(self.gate.write)
        try:
            return act.apply(self.kube, a)
        finally:
            WRITE_GATE.reset(token)

    def _event(self, a: Action, finding: Any, ok: bool, detail: str) -> None:
        if self.recorder is None:
            return
        t = a.target
        # always on this Node (the only object the chart's policy lets an agent report about); the pod acted
        # on is the Event's `related` object; a device's Events are about its node (the node view reads them)
        obj = node_ref(self.cfg.node_name) if t.kind in ("Pod", "Device") else ObjectRef("Node", t.name, uid=t.uid)
        pod = ObjectRef("Pod", t.name, t.namespace, t.uid) if t.kind == "Pod" else None
        summary = f" Finding: {finding.summary}" if finding is not None else ""
        if ok:
            owner = f" (owner {t.owner[0]}/{t.owner[1]})" if t.owner else ""
            self.recorder.emit(obj, "Normal", EVENT_REASON.get(a.kind, "Remediated"),
                               f"{a.code}: {detail}{owner}: {a.why}.{summary}", action=a.kind, related=pod,
                               annotations=owner_annotations(t, self.cfg.node_name))
        else:
            self.recorder.emit(obj, "Warning", "RemediationFailed", f"{a.code}: {a.kind} failed on "
                               f"{t.ref}: {detail}.{summary}", action=a.kind, related=pod)

    def _print(self, plan: RemediationPlan, outcomes: list[RemediationOutcome]) -> None:
        lines = [f"[dry-run] {plan.render().splitlines()[0]}"]
        if self.breaker is not None:
            lines.append(f"[dry-run]   breaker: {'OPEN' if self.breaker.open else 'closed'} ({self.breaker.why})")
        for i, o in enumerate(outcomes, 1):
            verdict = "WOULD DO" if o.result == "dry-run" else f"would NOT do ({o.result}: {o.detail})"
            lines.append(f"[dry-run]   {i}. {verdict}: {o.action.describe()}")
            if o.action.kind == "taint-device":  # the exact object it would create
                lines.append("[dry-run]      " + json.dumps(o.action.detail.get("rule"), sort_keys=True))
        lines += [f"[dry-run]   later: {d.describe()}" for d in plan.deferred]
        lines += [f"[dry-run]   never: {s.describe()}" for s in plan.skipped]
        text = "\n".join(lines)
        if text != self._printed:
            print(text, file=self.out, flush=True)
            self._printed = text
