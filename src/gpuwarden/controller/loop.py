"""The controller: informers -> history -> detection -> (leader only) quarantine / breaker, with
Events and structured logs for every decision.

`step()` is one leader-election attempt followed, when leading, by one `reconcile()`; tests drive it
directly. `run()` renews the Lease on a thread of its own, every `retry_period_s` from the start of
the previous attempt whatever a reconcile is doing (a pool taint of 5,000 nodes takes tens of
seconds), and reconciles on the main thread while it leads: at least every `interval_s`, or soon
after a watched change, with watches feeding the caches.

One leader, per request: the Lease is renewed through a client of its own (an action's failures do
not put the renewal into backoff), and every other write of the controller passes the Lease fence
(`LeaderElector.fence`, asked by kube.client before each non-GET request): it is sent only while
the renew deadline has not passed, with what is left of it as its timeout. A leader that loses the
Lease stops between two writes of an action; the action's plans are idempotent (actions.py), so
the next leader finishes it from what the API shows, each object written once.

Dry run (the default) evaluates everything exactly as --execute would, emits the same Events
(reason CascadeDetected / GPUNodeStorm, saying what *would* be done) and logs, and writes nothing
else (its only other writes are the Lease, which carries the detection history).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable

from msgspec import Struct, field

from gpuwarden.controller import actions, admission, fencing
from gpuwarden.controller.config import ControllerConfig
from gpuwarden.controller.dra_watch import DraWatch
from gpuwarden.controller.detect import Cascade, FleetHistory, Storm, detect
from gpuwarden.controller.quarantine import ANNOTATION as QUARANTINE_ANNOTATION
from gpuwarden.controller.quarantine import event_name
from gpuwarden.controller.quarantine import holders as quarantine_holders
from gpuwarden.controller.quarantine import read_record as read_quarantine
from gpuwarden.controller.lease import LeaderElector
from gpuwarden.kube.client import Kube
from gpuwarden.kube.errors import KubeError
from gpuwarden.kube.events import EventRecorder, ObjectRef
from gpuwarden.kube.informer import Informer, start_informers
from gpuwarden.kube.log import Log
from gpuwarden.controller.model import (QUARANTINABLE, WorkloadRef, md, parse_time, trim_event, trim_gpu_pod,
                                        trim_pod)
from gpuwarden.remediation.guard import TokenBucket

COMPONENT = "gpuwarden-controller"
OWNER_CACHE_MAX = 4096
#: kube-apiserver's default --event-ttl: a quarantine record older than this gets no Event written from it
RECORD_EVENT_TTL_S = 3600.0


def trim_node(node: dict) -> dict:
    m = md(node)
    st = node.get("status") or {}
    spec = node.get("spec") or {}
    keep_status: dict[str, Any] = {"conditions": st.get("conditions") or []}
    for section in ("capacity", "allocatable"):
        gpu = {k: v for k, v in (st.get(section) or {}).items() if k.startswith("nvidia.com/")}
        if gpu:
            keep_status[section] = gpu
    return {"metadata": {k: m[k] for k in ("name", "uid", "labels", "annotations", "resourceVersion") if k in m},
            "spec": {k: spec[k] for k in ("taints", "unschedulable") if k in spec},
            "status": keep_status}


class Decision(Struct):
    kind: str  # "cascade" | "storm" | "failing-node" | "fence-storm" | "fence-storm-passed"
    subject: str  # workload key, or "breaker"
    outcomes: list[actions.ControllerOutcome] = field(default_factory=list)
    event: dict | None = None
    summary: str = ""


class Controller:
    def __init__(self, cfg: ControllerConfig, kube: Any, clock: Callable[[], float] = time.time,
                 log: Log | None = None) -> None:
        self.cfg = cfg
        self.kube = kube
        self.clock = clock
        self.log = log or Log(cfg.log_format, component=COMPONENT, identity=cfg.identity)
        self.by = f"{COMPONENT}/{cfg.identity}"
        self.history = FleetHistory()
        # the Lease has a client of its own: its backoff and timeouts are not an action's
        lease_kube = Kube(kube.api, kube.timeout_s) if isinstance(kube, Kube) else kube
        if isinstance(lease_kube, Kube):  # a failed call must not delay the next renewal of the Lease
            lease_kube.backoff_max_s = min(lease_kube.backoff_max_s, cfg.retry_period_s / 2)
        self.elector = (LeaderElector(lease_kube, cfg.namespace, cfg.lease_name, cfg.identity, cfg.lease_duration_s,
                                      cfg.renew_deadline_s, clock, self.log) if cfg.leader_elect else None)
        if self.elector is not None and isinstance(kube, Kube):
            kube.fence = self.elector.fence  # every write but the Lease's: only while provably leading
        # no aggregation: a decision is reported once (a new one has a new message), so no Event patch
        # and no `patch` on events in the chart's RBAC
        self.recorder = EventRecorder(kube, cfg.identity, cfg.namespace, aggregate_s=0.0, clock=clock, log=self.log)
        if isinstance(kube, Kube):  # a failed call must not delay the next renewal of the Lease
            kube.backoff_max_s = min(kube.backoff_max_s, cfg.retry_period_s / 2)
        self.bucket = TokenBucket(cfg.max_quarantines, cfg.quarantines_per_hour, clock)
        self.wake = threading.Event()
        self.informers = [
            Informer(kube, "/api/v1/nodes", trim_node, label_selector=cfg.node_selector, name="nodes", log=self.log),
            # with gpu_workloads_only (the default) a pod that requests no GPU can be no culprit: not kept
            Informer(kube, "/api/v1/pods", trim_gpu_pod if cfg.gpu_workloads_only else trim_pod, name="pods",
                     log=self.log),
            # the agents' Events about Nodes (GPU-NODE-*, GPU-DRV-* findings and their clearing)
            Informer(kube, "/api/v1/events", trim_event, field_selector="involvedObject.kind=Node,source=gpuwarden",
                     name="events", log=self.log),
            # the agents' own actions on pods (evicted or killed for memory): they name the pod's owner, so a
            # pod removed before this controller saw it still leads to its workload
            Informer(kube, "/api/v1/events", trim_event, field_selector="involvedObject.kind=Pod,source=gpuwarden",
                     name="pod-events", log=self.log),
        ]
        # --dra-driver: the driver's ResourceSlices and gpuwarden's DeviceTaintRules (controller/dra_watch.py)
        self.dra = DraWatch(cfg, kube, self.recorder, self.log, clock, self.is_leader) if cfg.dra_driver else None
        self.informers += self.dra.informers if self.dra is not None else []
        for inf in self.informers:
            inf.changed = self.wake
        self.owners: dict[tuple[str, str, str], dict | None] = {}
        self.leading = False
        self.watching = False
        self.reconciles = 0
        self.decisions: list[Decision] = []
        self._stop = threading.Event()
        self._state_sent = ""
        self._state = self.history.to_json()  # what the Lease carries: published after each reconcile
        self._carried: FleetHistory | None = None  # found on the Lease when we took it; merged by reconcile
        self.last_loop = 0.0
        self.renew_beat = 0.0  # monotonic time of the renewal thread's last attempt
        self.reconciling_since: float | None = None
        self.server = None
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self.m_leader = Gauge("gpuwarden_controller_leader", "1 while this instance may act: it holds the Lease "
                              "and renewed it within the renew deadline", registry=self.registry)
        self.m_leader.set_function(lambda: 1.0 if self.may_act() else 0.0)
        self.m_failing = Gauge("gpuwarden_controller_failing_gpu_nodes", "GPU nodes failing now (as last observed)",
                               registry=self.registry)
        self.m_spared = Gauge("gpuwarden_controller_pods_spared", "Estimated pods not failed by the nodes this "
                              "controller tainted for failing every pod (their rate before the taint x time since, "
                              "less the failures since)", registry=self.registry)
        self.m_decisions = Counter("gpuwarden_controller_decisions_total",
                                   "Cascades and storms found, by kind and what was done (done, dry-run, skipped, "
                                   "failed, reported)", ["kind", "result"], registry=self.registry)
        if self.dra is not None:
            self.dra.register(self.registry)

    # -- leadership --------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def may_act(self) -> bool:
        """What gpuwarden_controller_leader says, read at each scrape: leading, and not stopped."""
        return self.leading and self.is_leader() and not self._stop.is_set()

    def _campaign(self) -> bool:
        if self.elector is None:
            self.leading = True
            return True
        state = self._state
        # acquiring, the Lease's state is the previous leader's: kept until ours has it merged
        send = state if self.leading and state != self._state_sent else None
        ok = self.elector.try_acquire_or_renew(send)
        if ok and send is not None:
            self._state_sent = state
        if ok and not self.leading:
            prev = FleetHistory.from_json(self.elector.acquired_state or "")
            self._carried = prev  # merged by the reconcile thread, which alone touches the history
            self._state_sent = state  # sent again once a reconcile has merged it
            self.log.info("leading", identity=self.cfg.identity, carried_episodes=len(prev.episodes),
                          carried_failing_nodes=len(prev.failing))
            self.wake.set()
        elif not ok and self.leading:
            self.log.warn("not-leading", identity=self.cfg.identity, holder=self.elector.holder,
                          stepped_down=self.elector.stepped_down)
        self.leading = ok
        return ok

    def _renew_loop(self) -> None:
        """The Lease's own schedule: an attempt every retry period from the start of the previous one
        (at once after one that took longer), whatever the reconcile thread is doing."""
        period = self.cfg.retry_period_s
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.renew_beat = time.monotonic()
            try:
                self._campaign()
            except Exception as exc:  # the renewal survives anything: it is what keeps two leaders apart
                self.log.error("lease-failed", error=f"{type(exc).__name__}: {exc}")
            next_at = max(next_at + period, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def step(self) -> list[Decision] | None:
        """One leader-election attempt, then one reconcile when leading (None when not)."""
        if not self._campaign():
            return None
        return self.reconcile()

    # -- one pass ----------------------------------------------------------------------------------
    def reconcile(self) -> list[Decision]:
        self.reconciling_since = time.monotonic()
        try:
            return self._reconcile()
        finally:
            self.reconciling_since = None

    def _reconcile(self) -> list[Decision]:
        cfg = self.cfg
        if not self.watching:
            for inf in self.informers:
                inf.sync()
        elif not all(inf.ever_synced for inf in self.informers):
            # an empty cache is not an empty cluster: every failing node would look "gone"
            self.log.warn("not-reconciling", why="caches not filled yet",
                          waiting=[i.name for i in self.informers if not i.ever_synced])
            return []
        carried, self._carried = self._carried, None
        if carried is not None:
            self.history.merge(carried)
        now = self.clock()
        nodes, pods, events, pod_events = (inf.snapshot() for inf in self.informers[:4])
        for note in self.history.observe(nodes, pods, list(events) + list(pod_events), now, cfg):
            self.log.info("node-health", note=note)
        self._resolve_owners()
        det = detect(self.history, now, cfg)
        out: list[Decision] = []
        if self.history.unrecorded and cfg.execute:
            self._unrecorded()
        for c in det.cascades:
            if not self.is_leader():
                self.log.warn("not-acting", why="lost the Lease", workload=c.workload.key)
                break
            out.append(self._cascade(c, now))
        out.extend(self._fence_storms(nodes, events, now, det.storm is not None))
        storm_failed = False
        if det.storm is not None and det.storm_new and self.history.fence_storms:
            # the same wave, seen as fences of one code: the fence storm's breaker (closed when it passes) holds it
            self.log.info("storm-within-fence-storm", nodes=len(det.storm.nodes), codes=sorted(self.history.fence_storms))
        elif det.storm is not None and det.storm_new and self.is_leader():
            out.append(self._storm(det.storm, now))
            storm_failed = any(o.result == "failed" for o in out[-1].outcomes)
        if not storm_failed:  # else: opening the breaker is tried again at the next reconcile
            self.history.note_storm(det, now)
        for f in admission.find(pods, nodes, now, cfg):
            if not self.is_leader():
                break
            d = self._failing_node(f, now, storm=det.storm is not None or bool(self.history.fence_storms))
            if d is not None:
                out.append(d)
        out.extend(self._lift_cleared(nodes, now))
        if self.dra is not None:
            out.extend(self.dra.reconcile(nodes, now, self.watching, self._stop))
        self._count_spared(pods, now)
        self.m_failing.set(sum(1 for ep in self.history.episodes if ep.ongoing))
        for d in out:
            results = {o.result for o in d.outcomes}
            result = next((r for r in ("done", "failed", "dry-run", "skipped") if r in results), "reported")
            self.m_decisions.labels(d.kind, result).inc()
        self.reconciles += 1
        self.decisions.extend(out)
        self._state = self.history.to_json()
        return out

    def status(self) -> dict:
        """/healthz: the loop turned recently, or it is inside a reconcile (a pool action of thousands of
        nodes takes minutes; each of its requests has a deadline) while the renewal thread goes on;
        /readyz: the caches are filled (followers too)."""
        budget = 3 * max(self.cfg.retry_period_s, self.cfg.interval_s) + 30
        now = time.monotonic()
        turned = self.last_loop == 0.0 or now - self.last_loop < budget
        working = self.reconciling_since is not None and now - self.renew_beat < budget
        alive = not self._stop.is_set() and (turned or working)
        ready = all(i.ever_synced for i in self.informers) if self.watching else self.last_loop > 0
        return {"alive": alive, "ready": ready, "detail": f"last loop {time.monotonic() - self.last_loop:.0f}s ago"}

    def metrics(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def _resolve_owners(self) -> None:
        need = self.history.unresolved()
        found: dict[tuple[str, str, str], dict | None] = {}
        for key in need:
            if key not in self.owners:
                kind, ns, name = key
                try:
                    self.owners[key] = self.kube.get_or_none(WorkloadRef(kind, ns, name).path)
                except KubeError as exc:
                    self.log.warn("owner-unreadable", owner="/".join(key), error=str(exc))
                    continue
            found[key] = self.owners[key]
        if len(self.owners) > OWNER_CACHE_MAX:
            self.owners.clear()
        if found:
            self.history.resolve(found)

    # -- cascade -----------------------------------------------------------------------------------
    def _cascade(self, c: Cascade, now: float) -> Decision:
        cfg = self.cfg
        dry = not cfg.execute
        ref = c.workload
        summary = c.summary()
        chain = [ln.to_json() for ln in c.links]
        d = Decision("cascade", ref.key, summary=summary)
        limited = not (self.bucket.available() if dry else self.bucket.take())
        if limited:
            d.outcomes.append(actions.ControllerOutcome("skipped", f"rate limited: more than {cfg.max_quarantines} quarantines "
                                                         f"at once ({cfg.quarantines_per_hour:g}/h refill); "
                                                         f"this looks like a storm, not one culprit"))
        else:
            taint = None
            if "taint" in cfg.actions:
                t = actions.taint_pool(self.kube, ref, cfg.taint_key, cfg.node_selector, dry)
                d.outcomes.append(t)
                taint = t.undo.get("taint") if t.result in ("done", "dry-run") else None
            if "workload" in cfg.actions or taint:
                d.outcomes.append(actions.quarantine_workload(self.kube, ref, f"cascade: {summary}", c.nodes, chain,
                                                              now, self.by, dry, taint, "workload" in cfg.actions))
        failed = any(o.result == "failed" for o in d.outcomes)
        if not failed:  # a failed write is tried again at the next reconcile (within the token bucket)
            self.history.mark_reported(c)
        acted = any(o.result == "done" for o in d.outcomes)
        what = "; ".join(_verb(o) for o in d.outcomes) or "reported only"
        undo = f" Undo: gpuwarden release {ref.key}" if acted else ""
        if dry:
            msg = f"Dry run: {what} (the controller acts with --execute). Evidence: {summary}"
        else:
            msg = f"{what}.{undo}. Evidence: {summary}"
        obj = (ObjectRef(ref.kind, ref.name, ref.namespace, api_version=ref.api_version) if ref.kind in QUARANTINABLE
               else ObjectRef("Pod", c.links[-1].pod.split("/", 1)[1], ref.namespace, c.links[-1].uid))
        rec = next((o.record for o in d.outcomes if o.record is not None), None)
        done = next((o for o in d.outcomes if o.record is not None and o.result == "done"), None)
        if done is not None and rec.get("event"):
            # the action's Event under the name its record gives: written once, by us or, if this one is
            # not sent (the Lease fence, the API away), by whoever leads next from the record
            got = self.recorder.emit_once(obj, "Warning", "WorkloadQuarantined", msg, rec["event"], action="quarantine")
            d.event = self.recorder.emitted[-1] if got == "created" else None
            if got.startswith("failed"):
                self.history.unrecorded[ref.key] = {"kind": ref.kind, "namespace": ref.namespace, "name": ref.name,
                                                    "event": rec["event"], "at": rec.get("at", "")}
        elif not dry and rec is not None and _names_its_event(ref, rec) and set(c.nodes) <= set(rec.get("nodes") or ()):
            # already quarantined for this very chain (a leader acted, then lost the Lease before its Event
            # or its state reached the API): the action's record, not a second report of it
            d.event = self._write_record(ref, rec)
            self.log.info("cascade-already-acted", workload=ref.key, nodes=c.nodes, by=rec.get("by"),
                          at=rec.get("at"), event=rec.get("event"), written=d.event is not None)
            return d
        else:
            d.event = self.recorder.emit(obj, "Warning", "WorkloadQuarantined" if acted else "CascadeDetected", msg,
                                         action="quarantine")
        self.log.warn("cascade", workload=ref.key, nodes=c.nodes, chain=chain, dry_run=dry, retry=failed,
                      outcomes=[{"result": o.result, "detail": o.detail} for o in d.outcomes])
        return d

    # -- the record of an action -------------------------------------------------------------------
    def _write_record(self, ref: WorkloadRef, rec: dict) -> dict | None:
        """Write the `WorkloadQuarantined` Event of a quarantine from its record on the workload, under
        the name the record gives (created once: a second create is refused). Not for a record older than
        the API server's Event TTL (1 h by default): its Event may have expired, and is not written again."""
        at = parse_time(rec.get("at"))
        if at is None or self.clock() - at > RECORD_EVENT_TTL_S:
            return None
        reason = str(rec.get("reason") or "")
        evidence = reason[len("cascade: "):] if reason.startswith("cascade: ") else reason
        msg = (f"{rec.get('action') or 'quarantined'} (by {rec.get('by', '?')} at {rec.get('at', '?')}; written by "
               f"{self.by} from the workload's {QUARANTINE_ANNOTATION} record: the Event of its author was not "
               f"sent). Undo: gpuwarden release {ref.key}. Evidence: {evidence}")
        obj = ObjectRef(ref.kind, ref.name, ref.namespace, api_version=ref.api_version)
        got = self.recorder.emit_once(obj, "Warning", "WorkloadQuarantined", msg, str(rec["event"]), action="quarantine")
        if got.startswith("failed"):
            self.history.unrecorded[ref.key] = {"kind": ref.kind, "namespace": ref.namespace, "name": ref.name,
                                                "event": rec["event"], "at": rec.get("at", "")}
            return None
        self.history.unrecorded.pop(ref.key, None)
        if got == "created":
            self.log.warn("quarantine-record-written", workload=ref.key, event=rec["event"], by=rec.get("by"),
                          at=rec.get("at"))
            return self.recorder.emitted[-1]
        return None

    def _unrecorded(self) -> None:
        """Actions whose Event was not sent: written from the workload's record (or dropped: released,
        gone, quarantined again since) at each reconcile until the API takes it."""
        for key, u in list(self.history.unrecorded.items()):
            if not self.is_leader():
                return
            ref = WorkloadRef(u["kind"], u["namespace"], u["name"])
            try:
                obj = self.kube.get_or_none(ref.path)
            except KubeError as exc:
                self.log.warn("quarantine-record-unread", workload=key, error=str(exc))
                continue
            rec = read_quarantine(obj) if obj is not None else None
            if rec is None or rec.get("event") != u["event"] or not _names_its_event(ref, rec):
                self.history.unrecorded.pop(key, None)
                continue
            self._write_record(ref, rec)
            if key in self.history.unrecorded and self.clock() - (parse_time(u.get("at")) or 0) > RECORD_EVENT_TTL_S:
                self.history.unrecorded.pop(key, None)

    # -- a node that fails every pod -----------------------------------------------------------------
    def _failing_node(self, f: admission.FailingNode, now: float, storm: bool) -> Decision | None:
        """Taint the node (execute, action `node`), within the cascade quarantine's token bucket; in a
        storm, report only (the breaker is the answer to many nodes failing, not one node's taint)."""
        cfg = self.cfg
        seen = self.history.failing.get(f.node)
        if seen is not None and now - seen["at"] < cfg.admission_window_s:
            return None  # reported (or tainted) within the window: once per window per node
        dry = not cfg.execute
        d = Decision("failing-node", f.node, summary=f.summary())
        if storm:
            d.outcomes.append(actions.ControllerOutcome("skipped", "a storm is in progress: the agents' circuit breaker, not "
                                                         "one node's taint"))
        elif "node" not in cfg.actions:
            d.outcomes.append(actions.ControllerOutcome("skipped", "reported only (--actions without node)"))
        elif not (self.bucket.available() if dry else self.bucket.take()):
            d.outcomes.append(actions.ControllerOutcome("skipped", f"rate limited: more than {cfg.max_quarantines} quarantines "
                                                         f"at once ({cfg.quarantines_per_hour:g}/h refill)"))
        else:
            d.outcomes.append(actions.taint_node(self.kube, f.node, cfg.taint_key, dry))
        if any(o.result == "failed" for o in d.outcomes):
            self.log.warn("failing-node", node=f.node, retry=True, outcomes=[o.detail for o in d.outcomes])
            return d  # tried again at the next reconcile
        acted = any(o.result == "done" for o in d.outcomes)
        self.history.failing[f.node] = {"at": now, "rate": f.rate_per_min, "tainted": now if acted else None,
                                        "fault": f.fault, "failed_after": 0}
        what = "; ".join(_verb(o) for o in d.outcomes)
        spares = f" At {f.rate_per_min:.1f} failed pods/min, the taint spares ~{int(f.rate_per_min * 60)} an hour."
        undo = f" Undo: kubectl taint node {f.node} {cfg.taint_key}-" if acted else ""
        if dry:
            msg = f"Dry run: {what} (the controller acts with --execute).{spares} Evidence: {f.summary()}"
        else:
            msg = f"{what}.{spares if acted else ''}{undo}. Evidence: {f.summary()}"
        d.event = self.recorder.emit(ObjectRef("Node", f.node), "Warning", "NodeFailsEveryPod", msg,
                                     action="taint-node")
        self.log.warn("failing-node", node=f.node, failed=f.failed, sent=f.sent, rate_per_min=round(f.rate_per_min, 2),
                      cause=f.cause, workloads=f.workloads, dry_run=dry,
                      outcomes=[{"result": o.result, "detail": o.detail} for o in d.outcomes])
        return d

    def _lift_cleared(self, nodes: list[dict], now: float) -> list[Decision]:
        """Lift the taint of a node tainted while its agent reported a GPU fault, once the agent reports
        none (its conditions all False): the cause is gone. A taint put on the failures alone stays
        until an operator lifts it (nothing says the GPU stack recovered: no pod is sent there). A record
        whose taint is gone (lifted, removed by hand, node deleted) is pruned after its window."""
        by_name = {md(n).get("name", ""): n for n in nodes}
        out: list[Decision] = []
        for node, s in list(self.history.failing.items()):
            if s.get("tainted") is None:
                continue
            n = by_name.get(node)
            if n is None or actions.ADMISSION_HOLDER not in quarantine_holders(n):
                # gone or lifted by hand: nothing left to lift (pruned next). Not before a window has passed:
                # the cache may not show a taint this reconcile just put
                if now - s["tainted"] >= self.cfg.admission_window_s:
                    s["tainted"] = None
                continue
            if not s.get("fault") or admission.agent_fault(n) or not admission.agent_reports(n):
                continue
            if not self.is_leader():
                break
            d = Decision("failing-node-cleared", node)
            o = actions.untaint_node(self.kube, node, self.cfg.taint_key, not self.cfg.execute)
            d.outcomes.append(o)
            if o.result == "failed":
                self.log.warn("failing-node-cleared", node=node, retry=True, outcome=o.detail)
                out.append(d)
                continue
            s["tainted"] = None
            d.event = self.recorder.emit(ObjectRef("Node", node), "Normal", "NodeFailsEveryPodCleared",
                                         f"{_verb(o)}: gpuwarden's agent there reports no GPU problem any more "
                                         f"(the fault it was tainted for has cleared)", action="untaint-node")
            self.log.info("failing-node-cleared", node=node, outcome=o.detail)
            out.append(d)
        return out

    def _count_spared(self, pods: list[dict], now: float) -> None:
        """Pods a tainted failing node did not fail: its failure rate before the taint, times the time
        since, less the failures it still had since (pods bound before the taint, or tolerating it)."""
        total = 0.0
        for node, s in self.history.failing.items():
            if s["tainted"] is None:
                continue
            after = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName") == node
                        and (p.get("status") or {}).get("failure")
                        and (parse_time(md(p).get("creationTimestamp")) or 0) > s["tainted"])
            s["failed_after"] = after
            s["spared"] = max(0, int(s["rate"] * (now - s["tainted"]) / 60.0) - after)
            total += s["spared"]
        self.m_spared.set(total)

    # -- storm -------------------------------------------------------------------------------------
    def _storm(self, s: Storm, now: float) -> Decision:
        cfg = self.cfg
        dry = not cfg.execute
        summary = s.summary()
        d = Decision("storm", "breaker", summary=summary)
        if cfg.open_breaker:
            d.outcomes.append(actions.open_breaker(self.kube, cfg.agent_namespace, cfg.breaker_configmap, summary, now,
                                                   self.by, dry))
        what = "; ".join(_verb(o) for o in d.outcomes) or "reported only (--no-open-breaker)"
        close = " Close it with: gpuwarden release breaker" if cfg.open_breaker else ""
        msg = (f"Dry run: {what} (the controller acts with --execute).{close}. Evidence: {summary}" if dry
               else f"{what}.{close}. Evidence: {summary}")
        obj = ObjectRef("ConfigMap", cfg.breaker_configmap, cfg.agent_namespace)
        d.event = self.recorder.emit(obj, "Warning", "GPUNodeStorm", msg, action="open-breaker")
        self.log.warn("storm", nodes=[n for n, _, _ in s.nodes], gpu_nodes=s.total, dry_run=dry,
                      storm=s.to_json(), outcomes=[{"result": o.result, "detail": o.detail} for o in d.outcomes])
        return d

    # -- fence storm -------------------------------------------------------------------------------
    def _fence_storms(self, nodes: Any, events: Any, now: float, node_storm: bool) -> list[Decision]:
        """Many GPU nodes fenced for one code: open the agents' breaker; close it once the storm passed
        (controller/fencing.py). Carried on the Lease with the history."""
        det = fencing.detect(nodes, events, now, self.cfg, self.history.gpu_nodes, self.history.fence_storms,
                             self.history.fence_passed)
        out: list[Decision] = []
        for s in det.started:
            if not self.is_leader():
                break
            d = self._fence_storm(s, now)
            out.append(d)
            if not any(o.result == "failed" for o in d.outcomes):  # else tried again at the next reconcile
                self.history.fence_storms[s.code] = now
        for code, still in det.passed.items():
            if not self.is_leader():
                break
            d = self._fence_storm_passed(code, still, now, det.ongoing, node_storm)
            out.append(d)
            if not any(o.result == "failed" for o in d.outcomes):
                self.history.fence_storms.pop(code, None)
                self.history.fence_passed[code] = now
        return out

    def _fence_storm(self, s: fencing.FenceStorm, now: float) -> Decision:
        cfg = self.cfg
        dry = not cfg.execute
        summary = s.summary()
        d = Decision("fence-storm", s.code, summary=summary)
        if cfg.open_breaker:
            d.outcomes.append(actions.open_breaker(self.kube, cfg.agent_namespace, cfg.breaker_configmap, summary, now,
                                                   self.by, dry))
        what = "; ".join(_verb(o) for o in d.outcomes) or "reported only (--no-open-breaker)"
        why = (f"{len(s.fences)} of {s.total} GPU nodes fenced for {s.code} within {int(s.window_s)}s, at least "
               f"--storm-nodes {cfg.storm_nodes} and --storm-fraction {cfg.storm_fraction:g} of them")
        msg = (f"{'Dry run: ' if dry else ''}{what}: {why}. It closes when fewer GPU nodes than that still show "
               f"{s.code}. Evidence: {summary}")
        obj = ObjectRef("ConfigMap", cfg.breaker_configmap, cfg.agent_namespace)
        d.event = self.recorder.emit(obj, "Warning", "GPUFenceStorm", msg, action="open-breaker")
        self.log.warn("fence-storm", code=s.code, why=why, nodes=[f.node for f in s.fences], gpu_nodes=s.total,
                      still_showing=s.showing, dry_run=dry, storm=s.to_json(),
                      outcomes=[{"result": o.result, "detail": o.detail} for o in d.outcomes])
        return d

    def _fence_storm_passed(self, code: str, still: int, now: float, ongoing: dict[str, int],
                            node_storm: bool) -> Decision:
        cfg = self.cfg
        dry = not cfg.execute
        why = (f"{still} of {len(self.history.gpu_nodes)} GPU nodes still show {code}, under the storm's "
               f"thresholds (--storm-nodes {cfg.storm_nodes}, --storm-fraction {cfg.storm_fraction:g})")
        d = Decision("fence-storm-passed", code, summary=why)
        if ongoing or node_storm:
            d.outcomes.append(actions.ControllerOutcome(
                "skipped", "the breaker stays open: " + (f"a fence storm goes on for {', '.join(sorted(ongoing))}"
                                                         if ongoing else "a storm of failing GPU nodes is in progress")))
        elif cfg.open_breaker:
            d.outcomes.append(actions.close_fence_storm_breaker(self.kube, cfg.agent_namespace, cfg.breaker_configmap,
                                                                now, self.by, dry))
        what = "; ".join(_verb(o) for o in d.outcomes) or "reported only (--no-open-breaker)"
        obj = ObjectRef("ConfigMap", cfg.breaker_configmap, cfg.agent_namespace)
        d.event = self.recorder.emit(obj, "Normal", "GPUFenceStormPassed",
                                     f"{'Dry run: ' if dry else ''}{what}: the fence storm for {code} passed: {why}",
                                     action="close-breaker")
        self.log.info("fence-storm-passed", code=code, why=why, dry_run=dry,
                      outcomes=[{"result": o.result, "detail": o.detail} for o in d.outcomes])
        return d

    # -- the loop ----------------------------------------------------------------------------------
    def stop(self, *_: Any) -> None:
        self._stop.set()
        self.wake.set()

    def run(self) -> int:
        cfg = self.cfg
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        self.log.info("controller-started", execute=cfg.execute, actions=cfg.actions, watch=cfg.watch,
                      lease=f"{cfg.namespace}/{cfg.lease_name}" if cfg.leader_elect else None,
                      window_s=cfg.window_s, cascade_nodes=cfg.cascade_nodes, storm_nodes=cfg.storm_nodes,
                      storm_fraction=cfg.storm_fraction)
        if cfg.listen and self.server is None:
            from gpuwarden.status_server import StatusServer

            try:
                self.server = StatusServer(cfg.listen, self.status, self.metrics).start()
                self.log.info("serving", address=self.server.address)
            except OSError as exc:
                self.log.error("serve-failed", listen=cfg.listen, error=str(exc))
        if cfg.watch:
            start_informers(self.informers, self._stop)
            self.watching = True
        renewer = threading.Thread(target=self._renew_loop, name="lease", daemon=True)
        renewer.start()
        next_reconcile = float("-inf")
        started = time.monotonic()
        try:
            while not self._stop.is_set():
                now = self.last_loop = time.monotonic()
                try:
                    if self.may_act() and (now >= next_reconcile or self.wake.is_set()):
                        if self.wake.is_set():
                            self._stop.wait(0.2)  # let a burst of changes land
                            self.wake.clear()
                        self.reconcile()
                        # at least every interval, and at most once a second however busy the cluster
                        next_reconcile = time.monotonic() + cfg.interval_s
                        self._stop.wait(min(1.0, cfg.interval_s))
                        if cfg.once:
                            break
                    elif cfg.once and now - started > 2 * cfg.lease_duration_s + cfg.retry_period_s:
                        self.log.warn("not-leading", why="--once: another instance holds the Lease",
                                      holder=self.elector.holder if self.elector else None)
                        return 1
                except Exception as exc:  # the loop survives anything one pass does
                    self.log.error("reconcile-failed", error=f"{type(exc).__name__}: {exc}")
                    # try again after a retry period, not at once: an API away must not spin the loop
                    next_reconcile = time.monotonic() + min(cfg.interval_s, cfg.retry_period_s)
                if self.may_act():
                    self.wake.wait(max(0.0, min(cfg.retry_period_s, next_reconcile - time.monotonic())))
                else:  # a follower: woken when the renewal thread takes the Lease
                    self.wake.clear()
                    self.wake.wait(cfg.retry_period_s)
        finally:
            self._stop.set()
            for inf in self.informers:
                inf.interrupt()
            renewer.join(cfg.renew_deadline_s + 1.0)  # its requests end by the renew deadline
            if self.elector is not None:
                self.elector.release(self.history.to_json())
            self.leading = False
            if self.server is not None:
                self.server.stop()
            self.log.info("controller-stopped", reconciles=self.reconciles)
        return 0


def _names_its_event(ref: WorkloadRef, rec: dict) -> bool:
    """The record names the Event its own fields give (workload, time, author): one this controller
    wrote, not an annotation that picks an Event name of its choosing."""
    ev, at, by = rec.get("event"), rec.get("at"), rec.get("by")
    return isinstance(ev, str) and isinstance(at, str) and isinstance(by, str) and ev == event_name(ref, at, by)


def _verb(o: actions.ControllerOutcome) -> str:
    if o.result == "done":
        return o.detail
    if o.result == "dry-run":
        return f"would {o.detail}"
    if o.result == "failed":
        return f"FAILED to act: {o.detail}"
    return f"not acting: {o.detail}"
