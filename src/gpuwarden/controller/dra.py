"""The controller's view of the DRA world (resource.k8s.io), pure: which DeviceTaintRules gpuwarden's
agents made and which of them outlived their node, which ResourceSlices still advertise the devices
of a node that is gone or NotReady, and how many GPU devices each node's slices advertise against the
GPUs its agent says are usable.

A fence must never outlive its node: an agent removes its own DeviceTaintRule once the GPU is
healthy, but an agent that is gone (its node deleted, or its DaemonSet pod not running for long)
removes nothing, and the rule would keep fencing a device of a node that comes back under the same
name. Slices of a dead node are the other half (kubernetes/kubernetes#141912): the scheduler keeps
binding claims to devices no kubelet will ever prepare.

Which rules are gpuwarden's: both labels the agent sets (`gpuwarden.io/node`,
`app.kubernetes.io/managed-by=gpuwarden`), a selector of exactly one device, the name
`kube.dra.taint_rule_name` gives that device, and the device annotation naming it. A rule anyone
else made fails at least the name; it is never touched.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from msgspec import Struct, field

from gpuwarden.controller.model import age, md, parse_time
from gpuwarden.kube import dra as kdra
from gpuwarden.kube.conditions import CONDITION_TYPES

#: `gpuwarden fleet`: slices of a node NotReady this long are reported (the controller's --slice-stale default)
SLICE_STALE_S = 600.0
#: slice and rule taint effects that keep the scheduler off a device
FENCING_EFFECTS = ("NoSchedule", "NoExecute")


def _d(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def conditions(node: Any) -> dict[str, dict]:
    """A node's conditions by type; garbage entries are skipped."""
    conds = _d(_d(node).get("status")).get("conditions")
    return {str(c.get("type", "")): c for c in (conds if isinstance(conds, list) else []) if isinstance(c, dict)}


def owned_node(rule: Any) -> str | None:
    """The node of a DeviceTaintRule that gpuwarden's agent made; None for any other rule (or garbage)."""
    m = _d(_d(rule).get("metadata"))
    labels = _d(m.get("labels"))
    node = labels.get(kdra.NODE_LABEL)
    if labels.get(kdra.MANAGED_LABEL) != kdra.MANAGED_BY or not isinstance(node, str) or not node:
        return None
    dev = kdra.rule_device(rule)
    if dev is None or m.get("name") != kdra.taint_rule_name(dev):
        return None
    if _d(m.get("annotations")).get(kdra.DEVICE_ANNOTATION) != str(dev):
        return None
    return node


def last_report(node: Mapping) -> float | None:
    """When gpuwarden's agent on the node last wrote a condition (its newest lastHeartbeatTime: the
    agent re-sends unchanged conditions every `heartbeat_s`, 5 min by default); None when it never did."""
    beats = [parse_time(c.get("lastHeartbeatTime")) for t, c in conditions(node).items() if t in CONDITION_TYPES]
    beats = [b for b in beats if b is not None]
    return max(beats) if beats else None


class OrphanFence(Struct):
    """A gpuwarden DeviceTaintRule whose node is gone (to confirm: `gone`) or whose agent is silent."""

    rule: dict
    node: str
    why: str
    gone: bool  # the node is not in the cache: confirmed by a read by name before anything is done

    @property
    def name(self) -> str:
        return str(md(self.rule).get("name", ""))

    @property
    def uid(self) -> str:
        return str(md(self.rule).get("uid", ""))


def orphan_fences(rules: Iterable[Any], nodes: Mapping[str, Mapping], now: float, orphan_s: float) -> list[OrphanFence]:
    """gpuwarden's rules whose node is not among `nodes`, or whose agent has written no condition for
    `orphan_s` (a rule younger than that is never orphaned: its agent just made it)."""
    out = []
    for rule in rules:
        node = owned_node(rule)
        if node is None:
            continue
        n = nodes.get(node)
        if n is None:
            out.append(OrphanFence(rule, node, f"node {node} does not exist", True))
            continue
        created = parse_time(md(rule).get("creationTimestamp"))
        if created is not None and now - created < orphan_s:
            continue
        last = last_report(n)
        if last is None:
            out.append(OrphanFence(rule, node, f"no gpuwarden agent reports on node {node} (no gpuwarden condition "
                                               f"on it) and the rule is {age(now - created) if created else '?'} old",
                                   False))
        elif now - last >= orphan_s:
            out.append(OrphanFence(rule, node, f"gpuwarden's agent on node {node} last reported {age(now - last)} ago "
                                               f"(more than {age(orphan_s)})", False))
    return out


def by_node(slices: Iterable[Any], driver: str) -> dict[str, kdra.NodeSlices]:
    """ResourceSlices of one node each (`spec.nodeName`), parsed; slices of no single node (network
    devices: `allNodes`, `nodeSelector`) are left out."""
    groups: dict[str, list] = {}
    for s in slices:
        node = _d(_d(s).get("spec")).get("nodeName")
        if isinstance(node, str) and node:
            groups.setdefault(node, []).append(s)
    return {n: kdra.parse_slices(n, driver, items) for n, items in groups.items()}


class StaleSlices(Struct):
    """ResourceSlices that advertise devices of a node that is gone (`gone`: to confirm) or NotReady."""

    node: str
    slices: list[str]
    devices: int
    why: str
    gone: bool
    since: float | None = None

    def summary(self) -> str:
        return (f"{len(self.slices)} ResourceSlice(s) ({', '.join(self.slices[:5])}"
                f"{' and more' if len(self.slices) > 5 else ''}) still advertise {self.devices} device(s) of "
                f"node {self.node}: {self.why}; the scheduler keeps allocating them to claims no kubelet will "
                f"prepare (kubernetes/kubernetes#141912)")


def stale_slices(slices: Mapping[str, kdra.NodeSlices], nodes: Mapping[str, Mapping], now: float,
                 stale_s: float) -> list[StaleSlices]:
    """Per node whose slices advertise at least one device: the node is not among `nodes`, or its
    Ready condition has been other than True for `stale_s` (a node without a Ready condition yet is
    not judged)."""
    out = []
    for node, ns in sorted(slices.items()):
        if not ns.devices:
            continue
        n = nodes.get(node)
        if n is None:
            out.append(StaleSlices(node, ns.names(), len(ns.devices), f"node {node} does not exist", True))
            continue
        ready = conditions(n).get("Ready")
        if ready is None or ready.get("status") == "True":
            continue
        since = parse_time(ready.get("lastTransitionTime"))
        if since is None or now - since < stale_s:
            continue
        out.append(StaleSlices(node, ns.names(), len(ns.devices),
                               f"Ready={ready.get('status')} ({ready.get('reason') or '-'}) for {age(now - since)}",
                               False, since))
    return out


def fenced(dev: kdra.SliceDevice, rules: Iterable[Any]) -> bool:
    """The scheduler keeps off this device: a slice taint, or a DeviceTaintRule selecting it (by
    driver, pool and device; a rule naming no device fences the whole pool), NoSchedule or NoExecute."""
    if any(t.get("effect") in FENCING_EFFECTS for t in dev.taints):
        return True
    for r in rules:
        spec = _d(_d(r).get("spec"))
        sel = _d(spec.get("deviceSelector"))
        if _d(spec.get("taint")).get("effect") not in FENCING_EFFECTS:
            continue
        if sel.get("driver") in (None, dev.ref.driver) and sel.get("pool") in (None, dev.ref.pool) \
                and sel.get("device") in (None, dev.ref.device) and (sel.get("pool") or sel.get("device")):
            return True
    return False


class DeviceCount(Struct):
    """A node's GPU devices as its ResourceSlices advertise them, against what its agent reports."""

    advertised: int
    fenced: int
    lost: int  # advertised devices the agent says are lost now (matched by UUID or PCI address)
    offered_lost: list[str] = field(default_factory=list)  # of those, the ones no taint fences

    @property
    def usable(self) -> int:
        """Advertised, less the ones fenced, less the lost ones still offered."""
        return max(self.advertised - self.fenced - len(self.offered_lost), 0)

    def to_json(self) -> dict:
        return {"advertised": self.advertised, "fenced": self.fenced, "lost": self.lost, "usable": self.usable,
                "offeredLost": list(self.offered_lost), "overcounted": bool(self.offered_lost)}


def device_count(ns: kdra.NodeSlices, lost: Iterable[Mapping], rules: Iterable[Any] = ()) -> DeviceCount:
    """Count the node's advertised devices; `lost` are the agent's lost GPUs (fleet.lost_gpus rows:
    `uuid`, `busId`)."""
    rules = list(rules)
    names = set()
    for g in lost:
        if g.get("uuid"):
            names.add(str(g["uuid"]))
        if g.get("busId"):
            key = kdra.pci_key(str(g["busId"]))
            if key:
                names.add(key)
    n_fenced = n_lost = 0
    offered = []
    for dev in ns.devices:
        is_fenced = fenced(dev, rules)
        n_fenced += is_fenced
        if dev.names() & names:
            n_lost += 1
            if not is_fenced:
                offered.append(str(dev.ref))
    return DeviceCount(len(ns.devices), n_fenced, n_lost, offered)
