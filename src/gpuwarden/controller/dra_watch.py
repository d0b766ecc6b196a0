"""The controller's DRA duties (`--dra-driver`): watch the driver's ResourceSlices and gpuwarden's own
DeviceTaintRules, report the slices of a node deleted or NotReady past `--slice-stale`, and report
(dry run) or delete (`--execute --actions ...,fences`) a gpuwarden fence whose node is gone or whose
agent has been silent past `--fence-orphan`, so that a fence never outlives its node.

Cost grows with the work, not the cluster: one watch of the driver's slices
(`fieldSelector=spec.driver=<driver>`, the GPU nodes' own objects), one watch of gpuwarden's rules
(`labelSelector=gpuwarden.io/node,app.kubernetes.io/managed-by=gpuwarden`), both listed a page at a
time; a node missing from the cache is confirmed gone by one list by `metadata.name` (the node list
grant the controller holds) before anything is said or done about it. With `--node-selector` (a
pool), only nodes this instance once saw in the pool are judged gone: another pool's nodes cost no
request, and a pool node deleted before the controller started is left to the fleet view.

Guards, as every controller action: dry run by default (the Event and the log show the exact rule
and the DELETE it would send), `fences` must be among `--actions`, a token bucket
(`--max-fence-deletes`, `--fence-deletes-per-hour`), leader only (checked before each delete, and
the Lease fence on every write), the rule's uid a precondition of the delete. A rule that is not
gpuwarden's (`controller.dra.owned_node`) is never touched, and a healthy node's slices are never
acted on: they are reported, nothing more.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable

from msgspec import Struct, field

from gpuwarden.controller.actions import ControllerOutcome
from gpuwarden.controller.dra import OrphanFence, StaleSlices, by_node, orphan_fences, stale_slices
from gpuwarden.controller.model import md
from gpuwarden.kube import dra as kdra
from gpuwarden.kube.errors import KubeError
from gpuwarden.kube.events import ObjectRef
from gpuwarden.kube.informer import Informer, start_informers
from gpuwarden.remediation.guard import TokenBucket

RULE_SELECTOR = f"{kdra.NODE_LABEL},{kdra.MANAGED_LABEL}={kdra.MANAGED_BY}"
#: how often to ask discovery again for DeviceTaintRule when the server served none
DISCOVERY_RETRY_S = 600.0
#: a node found to exist outside the controller's cache (another pool) is not asked about again this long
EXISTS_TTL_S = 600.0
REASONS = ("StaleResourceSlices", "StaleResourceSlicesCleared", "OrphanedDeviceFence", "OrphanedDeviceFenceDeleted")


class DraDecision(Struct):
    """One DRA decision, shaped as the loop's decisions are (kind, subject, outcomes, event, summary)."""

    kind: str  # "stale-slices" | "stale-slices-cleared" | "orphaned-fence"
    subject: str
    outcomes: list[ControllerOutcome] = field(default_factory=list)
    event: dict | None = None
    summary: str = ""


def trim_slice(s: dict) -> dict:
    """What the controller keeps of a ResourceSlice: its name, node, pool and devices (name, the
    uuid and pcieBusID attributes, taints)."""
    m, spec = md(s), s.get("spec") or {}
    devices = []
    for d in spec.get("devices") or []:
        if not isinstance(d, dict):
            continue
        attrs = d.get("attributes") if isinstance(d.get("attributes"), dict) else {}
        devices.append({"name": d.get("name"), "taints": d.get("taints") or [],
                        "attributes": {k: v for k, v in attrs.items() if k.rpartition("/")[2] in ("uuid", "pcieBusID")}})
    return {"metadata": {k: m[k] for k in ("name", "uid", "creationTimestamp") if k in m},
            "spec": {"driver": spec.get("driver"), "nodeName": spec.get("nodeName"), "pool": spec.get("pool"),
                     "devices": devices}}


def _trim_rule(version: str) -> Callable[[dict], dict]:
    def trim(r: dict) -> dict:
        m = md(r)
        return {"apiVersion": f"{kdra.GROUP}/{version}", "kind": "DeviceTaintRule",
                "metadata": {k: m[k] for k in ("name", "uid", "labels", "annotations", "creationTimestamp") if k in m},
                "spec": r.get("spec") or {}}
    return trim


def delete_request(rule: dict, whole: bool = False) -> str:
    """The exact request an orphaned fence's deletion sends and what the rule fences (its spec; the
    whole rule with `whole`, for the log: an Event's message is cut at 1 KiB)."""
    m = md(rule)
    version = str(rule.get("apiVersion", "")).rpartition("/")[2]
    shown: dict = {"spec": rule.get("spec") or {}}
    if whole:
        shown = {"apiVersion": rule.get("apiVersion"), "kind": "DeviceTaintRule",
                 "metadata": {k: m[k] for k in ("name", "uid", "labels", "annotations") if k in m}, **shown}
    return (f"DELETE {kdra.taint_rules_path(version, str(m.get('name', '')))} (precondition uid={m.get('uid', '')}) "
            f"of {json.dumps(shown, sort_keys=True, separators=(',', ':'))}")


def read_for_fleet(kube: Any, driver: str) -> tuple[dict, list[dict], list[str]]:
    """`gpuwarden fleet`'s DRA reads: the driver's slices by node, and the DeviceTaintRules that fence
    devices (all of them: an operator's fence counts too); a server without resource.k8s.io/v1 gives
    nothing and no warning, one that refuses says so."""
    warnings: list[str] = []
    try:
        slices = list(kube.iter_items(kdra.SLICES, field_selector=f"spec.driver={driver}"))
    except KubeError as exc:
        if exc.status != 404:
            warnings.append(f"cannot list ResourceSlices of {driver}: {exc}")
        return {}, [], warnings
    rules: list[dict] = []
    try:
        version = kdra.taint_rule_version(kube)
        if version is not None:
            rules = list(kube.iter_items(kdra.taint_rules_path(version)))
    except KubeError as exc:
        warnings.append(f"cannot list DeviceTaintRules: {exc}")
    return by_node(slices, driver), rules, warnings


class DraWatch:
    """The slices and rules caches, the judgements of controller.dra, and their Events and deletes."""

    def __init__(self, cfg: Any, kube: Any, recorder: Any, log: Any, clock: Callable[[], float],
                 leading: Callable[[], bool]) -> None:
        self.cfg, self.kube, self.recorder, self.log, self.clock, self.leading = cfg, kube, recorder, log, clock, leading
        self.slices = Informer(kube, kdra.SLICES, trim_slice, field_selector=f"spec.driver={cfg.dra_driver}",
                               name="resourceslices", log=log)
        self.rules: Informer | None = None  # once discovery names the DeviceTaintRule version
        self._asked = float("-inf")
        self.bucket = TokenBucket(cfg.max_fence_deletes, cfg.fence_deletes_per_hour, clock)
        self.stale: dict[str, StaleSlices] = {}  # node -> reported, until it clears
        self.orphans: dict[str, OrphanFence] = {}  # rule uid -> reported
        self._exists: dict[str, float] = {}  # node -> when it was found to exist outside the cache
        self.seen: set[str] = set()  # nodes this instance saw in its cache (with --node-selector: its pool)
        self.m_stale: Any = None
        self.m_orphans: Any = None

    def register(self, registry: Any) -> None:
        """Its gauges, in the controller's registry (/metrics)."""
        from prometheus_client import Gauge

        self.m_stale = Gauge("gpuwarden_controller_stale_resourceslice_nodes", "Nodes deleted or NotReady past "
                             "--slice-stale whose ResourceSlices still advertise devices", registry=registry)
        self.m_orphans = Gauge("gpuwarden_controller_orphaned_device_fences", "gpuwarden DeviceTaintRules whose "
                               "node is deleted or whose agent is silent past --fence-orphan", registry=registry)

    @property
    def informers(self) -> list[Informer]:
        """The caches the loop fills and watches with its own (the rules' one starts itself: its path
        waits for discovery)."""
        return [self.slices]

    @property
    def acting(self) -> bool:
        return self.cfg.execute and "fences" in self.cfg.actions

    # -- reading -----------------------------------------------------------------------------------
    def _rules_ready(self, now: float, watching: bool, stop: threading.Event | None) -> bool:
        if self.rules is None and now - self._asked >= DISCOVERY_RETRY_S:
            self._asked = now
            version = kdra.taint_rule_version(self.kube)
            if version is None:
                self.log.info("dra-no-devicetaintrules", why=f"the API server serves no devicetaintrules in "
                                                             f"{kdra.GROUP}: no fence to look after")
                return False
            self.rules = Informer(self.kube, kdra.taint_rules_path(version), _trim_rule(version),
                                  label_selector=RULE_SELECTOR, name="devicetaintrules", log=self.log)
            if watching and stop is not None:
                start_informers([self.rules], stop)
        if self.rules is None:
            return False
        if not watching:
            self.rules.sync()
        return self.rules.ever_synced

    def _gone(self, node: str, now: float) -> bool:
        """The node is confirmed absent from the API (not merely outside the cache: another pool, or
        a node this reconcile's cache does not show yet). With --node-selector only a node once seen in
        the pool is asked about: the others are another pool's (no request per foreign node)."""
        if self.cfg.node_selector and node not in self.seen:
            return False
        seen = self._exists.get(node)
        if seen is not None and now - seen < EXISTS_TTL_S:
            return False
        items = self.kube.list("/api/v1/nodes", field_selector=f"metadata.name={node}").get("items") or []
        if items:
            self._exists[node] = now
            return False
        self._exists.pop(node, None)
        return True

    # -- one pass ----------------------------------------------------------------------------------
    def reconcile(self, nodes: list[dict], now: float, watching: bool = False,
                  stop: threading.Event | None = None) -> list[DraDecision]:
        by_name = {md(n).get("name", ""): n for n in nodes}
        self.seen.update(by_name)
        out = self._stale_slices(by_name, now)
        try:
            ready = self._rules_ready(now, watching, stop)
        except KubeError as exc:
            self.log.warn("dra-rules-unread", error=str(exc))
            ready = False
        if ready and self.rules is not None:
            out += self._orphaned(self.rules.snapshot(), by_name, now)
        return out

    def _stale_slices(self, by_name: dict[str, dict], now: float) -> list[DraDecision]:
        found = stale_slices(by_node(self.slices.snapshot(), self.cfg.dra_driver), by_name, now, self.cfg.slice_stale_s)
        current: dict[str, StaleSlices] = {}
        out = []
        for s in found:
            if s.gone and s.node not in self.stale and not self._gone(s.node, now):
                continue  # exists, outside this controller's pool (or not in the cache yet)
            current[s.node] = s
            if s.node in self.stale:
                continue  # reported once per episode
            summary = s.summary()
            d = DraDecision("stale-slices", s.node, [ControllerOutcome("skipped", "reported only: the controller "
                                                                                  "acts on no ResourceSlice")],
                            summary=summary)
            d.event = self.recorder.emit(ObjectRef("Node", s.node), "Warning", "StaleResourceSlices",
                                         f"{summary}. Fix: bring the node back, or delete its slices once it is "
                                         f"gone for good (kubectl delete resourceslices --field-selector "
                                         f"spec.nodeName={s.node})", action="report")
            self.log.warn("stale-resourceslices", node=s.node, slices=s.slices, devices=s.devices, why=s.why,
                          gone=s.gone)
            out.append(d)
        for node, s in list(self.stale.items()):
            if node in current:
                continue
            why = "its ResourceSlices advertise no device any more" if node not in by_name or s.gone \
                else f"node {node} is Ready again, or its slices are gone"
            d = DraDecision("stale-slices-cleared", node, summary=why)
            d.event = self.recorder.emit(ObjectRef("Node", node), "Normal", "StaleResourceSlicesCleared",
                                         f"StaleResourceSlices cleared: {why}", action="report")
            self.log.info("stale-resourceslices-cleared", node=node, why=why)
            out.append(d)
        self.stale = {n: self.stale.get(n, s) for n, s in current.items()}
        if self.m_stale is not None:
            self.m_stale.set(len(current))
        return out

    def _orphaned(self, rules: list[dict], by_name: dict[str, dict], now: float) -> list[DraDecision]:
        found = orphan_fences(rules, by_name, now, self.cfg.fence_orphan_s)
        current: dict[str, OrphanFence] = {}
        out = []
        for o in found:
            known = o.uid in self.orphans
            if o.gone and not known and not self._gone(o.node, now):
                continue  # exists, outside this controller's pool (or not in the cache yet)
            if not self.acting:
                current[o.uid] = o
                if not known:  # reported once
                    out.append(self._report(o, ControllerOutcome("skipped", "reported only (--actions without fences)")
                                            if self.cfg.execute else
                                            ControllerOutcome("dry-run", f"delete it: {delete_request(o.rule)}")))
                continue
            if not self.leading():
                self.log.warn("not-acting", why="lost the Lease", rule=o.name)
                current.update({u: x for u, x in self.orphans.items() if u not in current})
                break
            if o.gone and known and not self._gone(o.node, now):
                continue  # the node is back under its name: its agent judges the fence again
            outcome = self._delete(o)
            if outcome.result != "done":
                current[o.uid] = o  # tried again at the next reconcile
            if outcome.result == "done" or not known:
                out.append(self._report(o, outcome))
            else:
                self.log.warn("orphaned-device-fence", rule=o.name, node=o.node, result=outcome.result,
                              detail=outcome.detail)
        self.orphans = current
        if self.m_orphans is not None:
            self.m_orphans.set(len(current))
        return out

    def _delete(self, o: OrphanFence) -> ControllerOutcome:
        if not self.bucket.take():
            return ControllerOutcome("skipped", f"rate limited: more than {self.cfg.max_fence_deletes} fence "
                                                f"deletions at once ({self.cfg.fence_deletes_per_hour:g}/h refill)")
        try:
            return ControllerOutcome("done", kdra.delete_taint_rule(self.kube, o.rule))
        except KubeError as exc:
            return ControllerOutcome("failed", f"DeviceTaintRule {o.name}: {exc}")

    def _report(self, o: OrphanFence, outcome: ControllerOutcome) -> DraDecision:
        dev = kdra.rule_device(o.rule)
        summary = (f"gpuwarden's DeviceTaintRule {o.name} fences device {dev} of node {o.node}, and {o.why}: "
                   f"no agent will remove it")
        d = DraDecision("orphaned-fence", o.name, [outcome], summary=summary)
        if outcome.result == "done":
            msg, reason, etype = f"{outcome.detail}. Evidence: {summary}", "OrphanedDeviceFenceDeleted", "Normal"
        elif outcome.result == "dry-run":
            msg = f"Dry run: would {outcome.detail} (the controller acts with --execute --actions ...,fences). " \
                  f"Evidence: {summary}"
            reason, etype = "OrphanedDeviceFence", "Warning"
        else:
            msg, reason, etype = f"{outcome.detail}. Evidence: {summary}", "OrphanedDeviceFence", "Warning"
        version = str(o.rule.get("apiVersion", "")).rpartition("/")[2]
        obj = ObjectRef("DeviceTaintRule", o.name, uid=o.uid, api_version=f"{kdra.GROUP}/{version}")
        d.event = self.recorder.emit(obj, etype, reason, msg, action="delete-device-fence")
        self.log.warn("orphaned-device-fence", rule=o.name, uid=o.uid, node=o.node, device=str(dev), why=o.why,
                      result=outcome.result, detail=outcome.detail, request=delete_request(o.rule, whole=True))
        return d
