"""The other cascade: a node that fails every pod sent to it.

When a node's GPUs are lost (Xid 79) or its device plugin is unhealthy, the node still looks
schedulable: each GPU pod the scheduler binds there is refused by the kubelet's admission
(`UnexpectedAdmissionError`: the device plugin's Allocate failed; `OutOfnvidia.com/gpu`, the
devices went away) or dies at start (`StartError`), and its workload controller makes a new one,
which the scheduler sends to the same node: thousands of failed pods an hour (NVIDIA/k8s-device-plugin
issues 1640, 1223, 231). A healthy node shows none of these.

A healthy node fails pods too, for the workload's own reasons: an image that does not start
(`StartError`: `exec: "x": executable file not found`), CrashLoopBackOff, ImagePull, OOMKilled, an exit
code. Thirty pods of one broken Job bound to a healthy node must not fence it. So a failure counts
against the node only when it names the node's GPU stack or the node's agent reports a GPU fault:
- refused at admission by the device plugin or the DRA driver (`UnexpectedAdmissionError` naming a
  device, `OutOf<GPU resource>`): always the node's;
- dead at start in the runtime's GPU hook or CDI injection (`nvidia-container-cli: ...`, unresolvable
  CDI devices): the node's, unless the same workload also died at start on another node in the window
  (then it is the image's or the workload's: a workload failing on several nodes is the cascade
  detector's business);
- any other admission or start failure (`StartError` of the command, `OutOfcpu`,
  `TopologyAffinityError`): only while gpuwarden's agent on the node reports a GPU fault (one of its
  NodeConditions True), which explains it.
`model.classify_failure` decides the kind from the kubelet's and the runtime's own words, never from
quoted text (a command or image name is the tenant's to choose).

`find` is pure: from the pods in the controller's cache it counts, per node, the pods created in the
last `admission_window_s` that failed so, and names a node when they are at least
`admission_failures` and at least `admission_fraction` of the pods sent there in that window. The
cause is what gpuwarden's agent on that node reports (its NodeConditions that are True: GPU lost,
plugin unhealthy, admission blocked), or says that it reports nothing.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from msgspec import Struct, field

from gpuwarden.controller.model import GPU_ADMISSION, GPU_START, START, conditions, failure_of, md, parse_time
from gpuwarden.kube.conditions import CONDITION_TYPES

class FailingNode(Struct):
    """A node that failed `failed` of the `sent` pods bound to it in the window."""

    node: str
    failed: int
    sent: int
    window_s: float
    first: float  # creation time of the first failed pod in the window
    last: float
    example: str  # one failure, as the kubelet said it
    workloads: list[str] = field(default_factory=list)
    cause: str = ""  # what gpuwarden's agent reports on that node
    fault: bool = False  # gpuwarden's agent there reports a GPU fault (its lifting lifts the taint)

    @property
    def rate_per_min(self) -> float:
        """Failures a minute while they came: n failures are n - 1 gaps from the first to the last, over
        the real time between them (creation times have 1 s resolution: at least 1 s). No floor of a
        minute: 11 failures in 7 s are ~86/min, not 11, or the pods a taint spares come out ~8x low."""
        if self.failed < 2:
            return 0.0
        return (self.failed - 1) * 60.0 / max(self.last - self.first, 1.0)

    def summary(self) -> str:
        return (f"node {self.node} failed {self.failed} of the {self.sent} pods sent to it in the last "
                f"{int(self.window_s // 60)}m ({self.rate_per_min:.1f}/min; {self.example}); "
                f"workloads: {', '.join(self.workloads[:5])}{' and more' if len(self.workloads) > 5 else ''}; "
                f"cause: {self.cause}")


def agent_fault(node: Mapping) -> bool:
    """gpuwarden's agent on the node reports a GPU problem now (one of its conditions is True)."""
    return any(t in CONDITION_TYPES and c.get("status") == "True" for t, c in conditions(node).items())


def agent_reports(node: Mapping) -> bool:
    """gpuwarden's agent posts its conditions on the node (True or False)."""
    return any(t in CONDITION_TYPES for t in conditions(node))


def agent_cause(node: Mapping) -> str:
    """The problems gpuwarden's agent reports on the node (its True conditions), or why there is none."""
    ours = {t: c for t, c in conditions(node).items() if t in CONDITION_TYPES}
    true = [f"{t}={c.get('reason', '')} ({(c.get('message') or '')[:160]})" for t, c in sorted(ours.items())
            if c.get("status") == "True"]
    if true:
        return "gpuwarden's agent there reports " + "; ".join(true)
    if ours:
        return "gpuwarden's agent there reports no GPU problem (the failures are not explained by it)"
    return "no gpuwarden agent reports on this node"


def _owner(p: Mapping) -> str:
    m = md(p)
    return next((f"{o.get('kind', '').lower()}/{m.get('namespace', '')}/{o.get('name', '')}"
                 for o in m.get("ownerReferences") or [] if o.get("controller")), "")


def counts(kind: str, owner: str, node: str, fault: bool, start_nodes: Mapping[str, set[str]]) -> bool:
    """Whether one failure of `kind` by `owner`'s pod counts against `node` (see the module's text)."""
    if fault or kind == GPU_ADMISSION:
        return True
    return kind == GPU_START and start_nodes.get(owner, set()) <= {node}


def find(pods: Iterable[Mapping], nodes: Iterable[Mapping], now: float, cfg: Any) -> list[FailingNode]:
    window = cfg.admission_window_s
    failures: list[tuple[str, float, str, str, str]] = []  # (node, created, kind, text, owner)
    sent: dict[str, int] = {}
    start_nodes: dict[str, set[str]] = {}  # workload -> nodes where its pods died at start
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName") or ""
        created = parse_time(md(p).get("creationTimestamp"))
        if not node or created is None or now - created > window:
            continue
        sent[node] = sent.get(node, 0) + 1
        kind, why = failure_of(p)
        if why:
            owner = _owner(p)
            failures.append((node, created, kind, why, owner))
            if kind in (GPU_START, START) and owner:  # an unowned pod is on one node only
                start_nodes.setdefault(owner, set()).add(node)
    node_objs = {md(n).get("name", ""): n for n in nodes}
    faults = {name: agent_fault(n) for name, n in node_objs.items()}
    by_node: dict[str, list[tuple[float, str, str]]] = {}
    for node, created, kind, why, owner in failures:
        if node in node_objs and counts(kind, owner, node, faults[node], start_nodes):
            by_node.setdefault(node, []).append((created, why, owner))
    out = []
    for node, fails in sorted(by_node.items()):  # outside --node-selector: not this controller's pool
        if len(fails) < cfg.admission_failures or len(fails) < cfg.admission_fraction * sent[node]:
            continue
        fails.sort()
        out.append(FailingNode(node, len(fails), sent[node], window, fails[0][0], fails[-1][0], fails[-1][1],
                               sorted({o for _, _, o in fails if o}), agent_cause(node_objs[node]), faults[node]))
    return out
