"""Cascade and storm detection: a pure function of observed state and time (no API calls).

`FleetHistory.observe(nodes, pods, events, now, cfg)` turns successive observations into
- **episodes**: a GPU node failing, from its first signal (NotReady/Unknown, GPUUnchargedMemory or
  GPUDriver True, a GPU-NODE-*/GPU-DRV-* Warning Event) until no signal is left; each episode holds
  the pods that were on the node when it failed (arrived before the failure, still there or last
  seen after it);
- **placements**: which pod was on which node, from when (creationTimestamp) until last seen; pods
  deleted since (the node lifecycle controller evicts them) are remembered for the window.

`detect(history, now, cfg)` then finds
- a **cascade** per workload: a chain of >= `cascade_nodes` distinct GPU nodes whose failures, in
  time order, all fall within `window_s`, each holding a pod of the workload when it failed, and
  (with `require_hop`) each later pod created after the previous node failed — the pod followed the
  failure. The *second* failed node is the signal: one failed node never is. A workload is reported
  again only when its chain ends in a node failure it was not reported for yet.
  Only workloads whose pods request GPUs (`gpu_workloads_only`), outside `skip_namespaces`, not
  DaemonSets (they run everywhere by design) and not static/control-plane/opted-out pods count.
- a **storm**: at least `storm_nodes` GPU nodes and at least `storm_fraction` of them started
  failing within `storm_window_s` (and never fewer than two); reported once when it starts.

The history is serialisable (`to_json`/`from_json`): the leader keeps it on its Lease, so a new
leader does not forget the first hop of a cascade in progress.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from msgspec import Struct, field

from gpuwarden.controller.model import (WORKLOAD_KINDS, FailureSignal, WorkloadRef, clock_time, event_first,
                                        involved_node, is_gpu_node, md, node_signals, owner_lookup, parse_time,
                                        pod_gpus, resolve_workload)
from gpuwarden.kube.events import event_pod
from gpuwarden.parsers.wallclock import format_rfc3339
from gpuwarden.remediation.guard import protected_pod

MAX_PODS_PER_EPISODE = 20
#: our agents' actions that remove a pod whose memory escaped (agent Events, `action` field)
ACTED_FOR_MEMORY = ("evict-pod-for-memory", "kill-pod-processes")
MAX_EPISODES_PER_NODE = 5
MAX_STATE_BYTES = 150_000


class PodSeen(Struct):  # one per GPU pod of the cluster: 60,000 at 5,000 nodes
    namespace: str
    name: str
    uid: str
    node: str
    arrived: float  # creationTimestamp (else first seen)
    gpus: int
    first_seen: float
    last_seen: float
    present: bool = True
    protected: str = ""  # why it can never be a culprit (static, control plane, opted out)
    lookup: tuple[str, str, str] | None = None  # the owner to read to resolve the workload
    workload: WorkloadRef | None = None
    pod: dict | None = None  # the trimmed object, in memory only

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_json(self) -> dict:
        d: dict[str, Any] = {"ns": self.namespace, "name": self.name, "uid": self.uid, "node": self.node,
                             "arrived": round(self.arrived, 3), "gpus": self.gpus}
        if self.protected:
            d["protected"] = self.protected
        if self.workload is not None:
            w = self.workload
            d["workload"] = [w.kind, w.namespace, w.name]
        elif self.lookup is not None:
            d["lookup"] = list(self.lookup)
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "PodSeen":
        w = d.get("workload")
        lk = d.get("lookup")
        arrived = float(d.get("arrived", 0.0))
        return cls(d.get("ns", ""), d.get("name", ""), d.get("uid", ""), d.get("node", ""), arrived,
                   int(d.get("gpus", 0)), arrived, arrived, present=False, protected=d.get("protected", ""),
                   lookup=tuple(lk) if lk else None, workload=WorkloadRef(*w) if w else None)


class Episode(Struct):
    node: str
    start: float
    end: float | None = None  # None: still failing
    signals: list[str] = field(default_factory=list)
    pods: list[PodSeen] = field(default_factory=list)

    @property
    def ongoing(self) -> bool:
        return self.end is None

    def to_json(self) -> dict:
        keep = sorted(self.pods, key=lambda p: (not p.gpus, p.arrived))[:MAX_PODS_PER_EPISODE]
        return {"node": self.node, "start": round(self.start, 3), "end": None if self.end is None else round(self.end, 3),
                "signals": self.signals, "pods": [p.to_json() for p in keep]}

    @classmethod
    def from_json(cls, d: Mapping) -> "Episode":
        end = d.get("end")
        return cls(d.get("node", ""), float(d.get("start", 0.0)), None if end is None else float(end),
                   list(d.get("signals") or []), [PodSeen.from_json(p) for p in d.get("pods") or []])


class Link(Struct):
    node: str
    at: float  # when the node started failing
    signals: list[str]
    pod: str  # namespace/name
    uid: str
    arrived: float
    hopped: bool | None  # None for the first link; True: the pod arrived after the previous node failed

    def describe(self, prev: "Link | None" = None) -> str:
        s = f"{self.node} failed {clock_time(self.at)} [{'; '.join(self.signals)}] holding pod {self.pod}"
        if prev is not None:
            when = "after" if self.hopped else "before"
            s += f" (created {clock_time(self.arrived)}, {when} {prev.node} failed)"
        return s

    def to_json(self) -> dict:
        d = {"node": self.node, "failedAt": format_rfc3339(self.at), "signals": self.signals, "pod": self.pod,
             "podUID": self.uid, "podCreated": format_rfc3339(self.arrived)}
        if self.hopped is not None:
            d["hopped"] = self.hopped
        return d


class Cascade(Struct):
    workload: WorkloadRef
    links: list[Link]

    @property
    def trigger_at(self) -> float:
        return self.links[-1].at

    @property
    def nodes(self) -> list[str]:
        return [ln.node for ln in self.links]

    def summary(self) -> str:
        span = self.links[-1].at - self.links[0].at
        steps = "; ".join(f"{i}) {ln.describe(self.links[i - 2] if i > 1 else None)}"
                          for i, ln in enumerate(self.links, 1))
        return (f"{self.workload.kind.lower()} {self.workload.namespace}/{self.workload.name}: its pods were on "
                f"{len(self.links)} GPU nodes that failed one after another within {int(span)}s: {steps}")

    def to_json(self) -> dict:
        return {"workload": self.workload.key, "chain": [ln.to_json() for ln in self.links]}


class Storm(Struct):
    nodes: list[tuple[str, float, list[str]]]  # (node, failed at, signals), oldest first
    total: int  # GPU nodes known
    window_s: float

    def summary(self) -> str:
        listed = ", ".join(f"{n} {clock_time(t)} [{'; '.join(s)}]" for n, t, s in self.nodes[:20])
        more = f" and {len(self.nodes) - 20} more" if len(self.nodes) > 20 else ""
        return (f"{len(self.nodes)} of {self.total} GPU nodes started failing within {int(self.window_s)}s: "
                f"{listed}{more}")

    def to_json(self) -> dict:
        return {"nodes": [{"node": n, "failedAt": format_rfc3339(t), "signals": s} for n, t, s in self.nodes],
                "gpuNodes": self.total, "windowSeconds": self.window_s}


class Detection(Struct):
    cascades: list[Cascade] = field(default_factory=list)
    storm: Storm | None = None  # the storm in progress, if any
    storm_new: bool = False  # it started with this observation


class FleetHistory:
    """What the controller has seen: failure episodes, pod placements, what it already reported."""

    def __init__(self) -> None:
        self.episodes: list[Episode] = []
        self.placements: dict[str, PodSeen] = {}
        self.acted: dict[str, list[tuple[str, float]]] = {}  # workload key -> failures (node, start) reported
        self.storm_since: float | None = None
        #: fence storms in progress (controller/fencing.py): code -> since; carried on the Lease, so a new
        #: leader closes the breaker its predecessor opened once the storm passes
        self.fence_storms: dict[str, float] = {}
        self.fence_passed: dict[str, float] = {}  # code -> when its last fence storm passed (for storm_window)
        self.gpu_nodes: set[str] = set()
        #: nodes that fail every pod, reported: node -> {at, rate (failed pods/min), tainted (when, or None)}
        #: and, counted each reconcile, failed_after and spared. Carried on the Lease, so that a new
        #: leader neither reports such a node again within its window nor loses the pods its taint spares.
        self.failing: dict[str, dict] = {}
        #: quarantines whose Event was not sent (fenced, the API away): workload key -> {kind, namespace,
        #: name, event, at}; the Event is written from the workload's record (controller/loop.py)
        self.unrecorded: dict[str, dict] = {}

    # -- observing ---------------------------------------------------------------------------------
    def ongoing(self, node: str) -> Episode | None:
        for ep in reversed(self.episodes):
            if ep.node == node and ep.ongoing:
                return ep
        return None

    def observe(self, nodes: Iterable[Mapping], pods: Iterable[Mapping], events: Iterable[Mapping], now: float,
                cfg: Any) -> list[str]:
        """Fold one observation in; returns notes ("episode started ...") for the log."""
        notes: list[str] = []
        nodes = list(nodes)
        self.gpu_nodes = {md(n).get("name", "") for n in nodes if is_gpu_node(n)}
        events = list(events)
        self._placements(pods, now)
        acted = self._acted_on(events, now, cfg)
        by_node: dict[str, list[Mapping]] = {}
        for ev in events:
            n = involved_node(ev)
            if n:
                by_node.setdefault(n, []).append(ev)
        seen = set()
        for node in nodes:
            name = md(node).get("name", "")
            if name not in self.gpu_nodes:
                continue
            seen.add(name)
            sigs = node_signals(node, by_node.get(name, ()), now, cfg.bad_conditions, cfg.event_codes,
                                cfg.event_hold_s) + acted.get(name, [])
            ep = self.ongoing(name)
            if sigs and ep is None:
                last_end = max((e.end or 0.0 for e in self.episodes if e.node == name), default=0.0)
                start = max(min(s.at for s in sigs), last_end)
                ep = Episode(name, min(start, now), None, [s.describe() for s in sigs])
                self.episodes.append(ep)
                notes.append(f"GPU node {name} started failing at {clock_time(ep.start)}: {'; '.join(ep.signals)}")
            elif sigs and ep is not None:
                for s in sigs:
                    d = s.describe()
                    if d not in ep.signals:
                        ep.signals.append(d)
            elif not sigs and ep is not None:
                ep.end = now
                notes.append(f"GPU node {name} recovered (failing since {clock_time(ep.start)})")
        for ep in self.episodes:  # a failing node that disappeared (deleted, replaced)
            if ep.ongoing and ep.node not in seen:
                ep.end = now
                notes.append(f"GPU node {ep.node} is gone (failing since {clock_time(ep.start)})")
        self._attach(now, cfg)
        self.prune(now, cfg)
        return notes

    def _placements(self, pods: Iterable[Mapping], now: float) -> None:
        current = set()
        for pod in pods:
            m = md(pod)
            node = (pod.get("spec") or {}).get("nodeName") or ""
            uid = m.get("uid") or f"{m.get('namespace')}/{m.get('name')}"
            if not node or (pod.get("status") or {}).get("phase") == "Succeeded":
                continue
            current.add(uid)
            p = self.placements.get(uid)
            if p is None:
                # a pod evicted from a dead node keeps its deletionTimestamp for as long as the node is
                # gone: that is no protection
                probe = dict(pod, metadata={k: v for k, v in m.items() if k != "deletionTimestamp"})
                arrived = parse_time(m.get("creationTimestamp")) or now
                p = PodSeen(m.get("namespace", ""), m.get("name", ""), uid, node, arrived, pod_gpus(pod), now, now,
                            protected=protected_pod(probe, allow_unowned=True) or "", lookup=owner_lookup(pod))
                if p.lookup is None:
                    p.workload = resolve_workload(pod, {})
                self.placements[uid] = p
            p.last_seen, p.present, p.pod = now, True, pod
        for uid, p in self.placements.items():
            if uid not in current:
                p.present = False

    def _acted_on(self, events: Iterable[Mapping], now: float, cfg: Any) -> dict[str, list[FailureSignal]]:
        """Pods our agents evicted or killed for memory (their action Events about the Pod).

        Each is a signal that its node failed at the action's time, and the pod is placed on that node as
        the agent saw it, with the owner it read (annotations gpuwarden.io/owner-kind/-name, pod-created):
        an agent that acts early removes the pod before this controller may have listed it.
        """
        out: dict[str, list[FailureSignal]] = {}
        for ev in events:
            io = event_pod(ev)
            if io is None or ev.get("action") not in ACTED_FOR_MEMORY:
                continue
            ann = md(ev).get("annotations") or {}
            # the node is the one the Event is about, which the chart's policy checks against the agent's
            # token (an annotation is the writer's word; an older agent's Event about the pod names it)
            node = involved_node(ev) or ann.get("gpuwarden.io/node") or (ev.get("related") or {}).get("name") or ""
            at = event_first(ev) or now
            if not node or now - at > cfg.event_hold_s:
                continue
            ns, name = io.get("namespace", ""), io.get("name", "")
            uid = io.get("uid") or f"{ns}/{name}"
            p = self.placements.get(uid)
            if p is None:
                kind, owner = ann.get("gpuwarden.io/owner-kind", ""), ann.get("gpuwarden.io/owner-name", "")
                arrived = parse_time(ann.get("gpuwarden.io/pod-created")) or at
                lookup = (kind, ns, owner) if kind in ("ReplicaSet", "Job") and owner else None
                p = PodSeen(ns, name, uid, node, arrived, 1, at, at, present=False, lookup=lookup,
                            workload=WorkloadRef(kind, ns, owner) if owner and lookup is None else None)
                self.placements[uid] = p
            p.last_seen = max(p.last_seen, at)
            out.setdefault(node, []).append(FailureSignal(node, f"gpuwarden {ev.get('action')} {ns}/{name}",
                                                   ev.get("reason", ""), ev.get("message", ""), at, "event"))
        return out

    def _attach(self, now: float, cfg: Any) -> None:
        """Pods on a failed node that were there when it failed."""
        horizon = now - cfg.window_s - cfg.slack_s
        for ep in self.episodes:
            if not ep.ongoing and (ep.end or 0.0) < horizon:
                continue
            have = {p.uid for p in ep.pods}
            for p in self.placements.values():
                if p.node != ep.node or p.uid in have:
                    continue
                if p.arrived <= ep.start + cfg.slack_s and (p.present or p.last_seen >= ep.start - cfg.slack_s):
                    ep.pods.append(p)

    def unresolved(self) -> set[tuple[str, str, str]]:
        """Owners (ReplicaSets, Jobs) to read so that the pods on failed nodes map to workloads."""
        return {p.lookup for ep in self.episodes for p in ep.pods if p.workload is None and p.lookup}

    def resolve(self, owners: Mapping[tuple[str, str, str], Mapping | None]) -> None:
        """Name the workload of every attached pod whose owner is in `owners` (None: could not be read)."""
        for ep in self.episodes:
            for p in ep.pods:
                if p.workload is None and p.lookup in owners:
                    pod = p.pod or {"metadata": {"namespace": p.namespace, "name": p.name, "ownerReferences": [
                        {"kind": p.lookup[0], "name": p.lookup[2], "controller": True}]}}
                    p.workload = resolve_workload(pod, owners)

    def prune(self, now: float, cfg: Any) -> None:
        keep_s = max(cfg.window_s, cfg.storm_window_s) + cfg.slack_s
        self.placements = {u: p for u, p in self.placements.items() if p.present or p.last_seen >= now - keep_s}
        eps = [e for e in self.episodes if e.ongoing or (e.end or 0.0) >= now - keep_s]
        per_node: dict[str, list[Episode]] = {}
        for e in eps:
            per_node.setdefault(e.node, []).append(e)
        self.episodes = sorted((e for es in per_node.values() for e in es[-MAX_EPISODES_PER_NODE:]),
                               key=lambda e: (e.start, e.node))
        self.acted = {k: kept for k, eps in self.acted.items()
                      if (kept := [(n, t) for n, t in eps if t >= now - 2 * keep_s])}
        self.failing = {n: s for n, s in self.failing.items()
                        if s.get("tainted") is not None or s["at"] >= now - cfg.admission_window_s}
        self.fence_passed = {c: t for c, t in self.fence_passed.items() if t >= now - cfg.storm_window_s}

    # -- what was done -----------------------------------------------------------------------------
    def mark_reported(self, cascade: Cascade) -> None:
        have = self.acted.setdefault(cascade.workload.key, [])
        for ln in cascade.links:
            if not self.reported(cascade.workload.key, ln.node, ln.at):
                have.append((ln.node, round(ln.at, 3)))

    def reported(self, key: str, node: str, start: float) -> bool:
        return any(n == node and abs(t - start) < 0.01 for n, t in self.acted.get(key, ()))

    def note_storm(self, detection: Detection, now: float) -> None:
        if detection.storm is None:
            self.storm_since = None
        elif self.storm_since is None:
            self.storm_since = now

    # -- persistence -------------------------------------------------------------------------------
    def to_json(self) -> str:
        doc = {"v": 1, "episodes": [e.to_json() for e in self.episodes],
               "reported": {k: [[n, t] for n, t in eps] for k, eps in sorted(self.acted.items())},
               "stormSince": self.storm_since, "fenceStorms": dict(sorted(self.fence_storms.items())),
               "fencePassed": dict(sorted(self.fence_passed.items())),
               "failing": {n: {k: s.get(k) for k in ("at", "rate", "tainted", "fault")} for n, s in sorted(self.failing.items())},
               "unrecorded": dict(sorted(self.unrecorded.items()))}
        text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
        while len(text) > MAX_STATE_BYTES and doc["episodes"]:
            doc["episodes"].pop(0)
            text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
        return text

    @classmethod
    def from_json(cls, text: str) -> "FleetHistory":
        h = cls()
        if not text:
            return h
        try:
            doc = json.loads(text)
            h.episodes = [Episode.from_json(e) for e in doc.get("episodes") or []]
            h.acted = {str(k): [(str(n), float(t)) for n, t in v] for k, v in (doc.get("reported") or {}).items()}
            h.storm_since = doc.get("stormSince")
            h.fence_storms = {str(c): float(t) for c, t in (doc.get("fenceStorms") or {}).items()}
            h.fence_passed = {str(c): float(t) for c, t in (doc.get("fencePassed") or {}).items()}
            h.failing = {str(n): {"at": float(s["at"]), "rate": float(s["rate"]),
                                  "tainted": None if s.get("tainted") is None else float(s["tainted"]),
                                  "fault": bool(s.get("fault")), "failed_after": 0}
                         for n, s in (doc.get("failing") or {}).items()}
            h.unrecorded = {str(k): {f: str(u.get(f) or "") for f in ("kind", "namespace", "name", "event", "at")}
                            for k, u in (doc.get("unrecorded") or {}).items()
                            if isinstance(u, dict) and u.get("kind") in WORKLOAD_KINDS and u.get("event")}
        except (ValueError, TypeError, AttributeError):
            return cls()
        return h

    def merge(self, other: "FleetHistory") -> None:
        """Take over what a previous leader saw (episodes we do not have, what it reported)."""
        mine = {(e.node, round(e.start)) for e in self.episodes}
        for e in other.episodes:
            if (e.node, round(e.start)) not in mine:
                self.episodes.append(e)
        self.episodes.sort(key=lambda e: (e.start, e.node))
        for k, eps in other.acted.items():
            for n, t in eps:
                if not self.reported(k, n, t):
                    self.acted.setdefault(k, []).append((n, t))
        if self.storm_since is None and other.storm_since is not None:
            self.storm_since = other.storm_since
        for code, t in other.fence_storms.items():
            self.fence_storms.setdefault(code, t)
        for code, t in other.fence_passed.items():
            self.fence_passed[code] = max(t, self.fence_passed.get(code, t))
        for node, s in other.failing.items():
            if node not in self.failing or s["at"] > self.failing[node]["at"]:
                self.failing[node] = dict(s)
        for key, u in other.unrecorded.items():
            self.unrecorded.setdefault(key, dict(u))


# -- the rules -------------------------------------------------------------------------------------
def eligible(p: PodSeen, cfg: Any) -> bool:
    w = p.workload
    if w is None or p.protected:
        return False
    if cfg.gpu_workloads_only and p.gpus <= 0:
        return False
    if w.kind == "DaemonSet" or w.namespace in cfg.skipped_namespaces:
        return False
    return True


def find_chain(cands: list[tuple[Episode, list[PodSeen]]], cfg: Any) -> list[Link]:
    """The longest chain of distinct nodes, failures in time order within the window, each later pod
    created after the previous failure (with `require_hop`); ties go to the latest chain."""
    best: list[list[Link]] = []
    for ep, pods in cands:
        first = min(pods, key=lambda p: p.arrived)
        chain_j = [Link(ep.node, ep.start, list(ep.signals), first.ref, first.uid, first.arrived, None)]
        for chain in best:
            last = chain[-1]
            if ep.node in {ln.node for ln in chain} or ep.start < last.at or ep.start - chain[0].at > cfg.window_s:
                continue
            hop = [p for p in pods if p.arrived >= last.at - cfg.slack_s]
            if cfg.require_hop and not hop:
                continue
            p = min(hop or pods, key=lambda x: x.arrived)
            cand = chain + [Link(ep.node, ep.start, list(ep.signals), p.ref, p.uid, p.arrived, bool(hop))]
            if len(cand) > len(chain_j) or (len(cand) == len(chain_j) and cand[0].at > chain_j[0].at):
                chain_j = cand
        best.append(chain_j)
    if not best:
        return []
    return max(best, key=lambda c: (len(c), c[-1].at))


def detect(history: FleetHistory, now: float, cfg: Any) -> Detection:
    out = Detection()
    # cascades
    per_workload: dict[WorkloadRef, list[tuple[Episode, list[PodSeen]]]] = {}
    for ep in sorted(history.episodes, key=lambda e: (e.start, e.node)):
        mine: dict[WorkloadRef, list[PodSeen]] = {}
        for p in ep.pods:
            if eligible(p, cfg):
                mine.setdefault(p.workload, []).append(p)  # type: ignore[arg-type]
        for w, pods in mine.items():
            per_workload.setdefault(w, []).append((ep, pods))
    for w, cands in sorted(per_workload.items()):
        if len({ep.node for ep, _ in cands}) < cfg.cascade_nodes:
            continue
        chain = find_chain(cands, cfg)
        if len(chain) < cfg.cascade_nodes:
            continue
        last = chain[-1]
        if history.reported(w.key, last.node, last.at) or now - last.at > cfg.window_s:
            continue
        out.cascades.append(Cascade(w, chain))
    # storm
    recent: dict[str, Episode] = {}
    for ep in history.episodes:
        if ep.start >= now - cfg.storm_window_s and ep.node not in recent:
            recent[ep.node] = ep
    total = len(history.gpu_nodes | set(recent))
    n = len(recent)
    if n >= 2 and (cfg.storm_nodes > 0 or cfg.storm_fraction > 0) \
            and (cfg.storm_nodes <= 0 or n >= cfg.storm_nodes) \
            and (cfg.storm_fraction <= 0 or n >= cfg.storm_fraction * total):
        nodes = sorted(((e.node, e.start, list(e.signals)) for e in recent.values()), key=lambda x: (x[1], x[0]))
        out.storm = Storm(nodes, total, cfg.storm_window_s)
        out.storm_new = history.storm_since is None
    return out

