"""The controller's writes: quarantine / release a workload, taint / untaint the GPU pool, open / close
the agents' circuit breaker. Each read-plan-write is guarded by the object's resourceVersion and
retried on a conflict (re-read, re-planned). `dry_run` computes the same plan and writes nothing.

Every plan is idempotent: it is made from the object as the API shows it (a node already carrying
the taint and its holder needs no write, a workload already quarantined is skipped), so an action
a leader was stopped in the middle of (fenced, killed) is finished by whoever acts next, each object
written once. A write the Lease fence refuses (`Fenced`: kube.client's `fence`) ends the action: the
nodes not yet written are not tried. A pool action with any node not written is `failed`, so it is
not marked handled and is taken up again.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from msgspec import Struct, field

from gpuwarden.controller import quarantine as q
from gpuwarden.controller.lease import Fenced
from gpuwarden.controller.model import WorkloadRef, is_gpu_node, md
from gpuwarden.kube.errors import KubeError
from gpuwarden.parsers.wallclock import format_rfc3339
from gpuwarden.remediation import breaker

ATTEMPTS = 3
ADMISSION_TAINT_VALUE = "admission"
ADMISSION_HOLDER = "node/admission-failures"  # in the node's holders annotation, beside cascade workloads
BREAKER_ANNOTATION = "gpuwarden.io/breaker"


class ControllerOutcome(Struct):
    result: str  # done | dry-run | skipped | failed
    detail: str
    undo: dict = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    #: a workload's quarantine record: the one written (done), or the one found (skipped: already quarantined)
    record: dict | None = None


def _guarded(read: Callable[[], Any], plan: Callable[[Any], Any], write: Callable[[Any, Any], Any],
             dry_run: bool) -> tuple[str, Any, Any]:
    """read -> plan -> write, re-read and re-planned on 409. Returns (result, plan, object)."""
    last: Exception | None = None
    for _ in range(ATTEMPTS):
        obj = read()
        p = plan(obj)
        if isinstance(p, q.Skip) or p is None:
            return "skipped", p, obj
        if dry_run:
            return "dry-run", p, obj
        try:
            write(obj, p)
            return "done", p, obj
        except KubeError as exc:
            if not exc.conflict:
                raise
            last = exc
    raise last or RuntimeError("conflict")


# -- workloads -------------------------------------------------------------------------------------
def quarantine_workload(kube: Any, ref: WorkloadRef, reason: str, nodes: list[str], chain: list[dict], at: float,
                        by: str, dry_run: bool, taint: dict | None = None, stop: bool = True) -> ControllerOutcome:
    if ref.kind not in q.SCALABLE + q.SUSPENDABLE:
        return ControllerOutcome("skipped", f"cannot quarantine a {ref.kind}: reported only")
    try:
        result, p, _ = _guarded(lambda: kube.get(ref.path),
                                lambda obj: q.plan_quarantine(obj, ref, reason, nodes, chain, at, by, taint, stop),
                                lambda obj, p: kube.merge_patch(ref.path, p.patch), dry_run)
    except KubeError as exc:
        if exc.not_found:
            return ControllerOutcome("skipped", f"{ref.kind.lower()} {ref.namespace}/{ref.name} is gone")
        return ControllerOutcome("failed", f"{ref.key}: {exc}")
    if result == "skipped":
        return ControllerOutcome("skipped", p.why, record=p.record)
    if result == "done" and p.jobs:
        for job in p.jobs:
            _suspend_job(kube, WorkloadRef("Job", ref.namespace, job), True)
    return ControllerOutcome(result, p.describe, p.undo, record=p.record if result == "done" else None)


def _suspend_job(kube: Any, ref: WorkloadRef, suspend: bool) -> None:
    try:
        kube.merge_patch(ref.path, {"spec": {"suspend": suspend}})
    except KubeError:
        pass  # a CronJob's Job may be gone already; the CronJob's own suspend is what matters


def release_workload(kube: Any, ref: WorkloadRef, at: float, by: str, dry_run: bool = False,
                     force: bool = False) -> ControllerOutcome:
    """Undo a quarantine from the workload's annotation, and drop it from the pool taint's holders."""
    p: Any = None
    result = "skipped"
    if ref.kind in q.SCALABLE + q.SUSPENDABLE:
        try:
            result, p, _ = _guarded(lambda: kube.get(ref.path), lambda obj: q.plan_release(obj, ref, at, by, force),
                                    lambda obj, p: kube.merge_patch(ref.path, p.patch), dry_run)
        except KubeError as exc:
            if not exc.not_found:
                return ControllerOutcome("failed", f"{ref.key}: {exc}")
            p = q.Skip(f"{ref.kind.lower()} {ref.namespace}/{ref.name} not found", absent=True)
    else:
        p = q.Skip(f"a {ref.kind} carries no quarantine annotation", absent=True)
    undo = p.undo if isinstance(p, q.QuarantinePatch) else {}
    if result == "done":
        for job in p.jobs:
            _suspend_job(kube, WorkloadRef("Job", ref.namespace, job), False)
    if result == "skipped" and not p.absent:
        return ControllerOutcome("skipped", p.why)  # changed since: refuse (the taint stays too)
    untaint = untaint_pool(kube, ref, (undo.get("taint") or {}).get("key", ""), dry_run)
    if result == "skipped":
        if not untaint.nodes:
            return ControllerOutcome("skipped", p.why)
        return ControllerOutcome("dry-run" if dry_run else "done", untaint.detail, {}, untaint.nodes)
    detail = p.describe + (f"; {untaint.detail}" if untaint.nodes else "")
    return ControllerOutcome(result, detail, undo, untaint.nodes)


# -- the pool taint --------------------------------------------------------------------------------
#: node writes in flight at once for a pool-wide taint or untaint (a pool of 5,000 nodes: 5,000
#: PATCHes, at most this many concurrent, never a burst of thousands on the API server)
POOL_WORKERS = 8
#: node names a pool action's Event and log line name; the rest are counted
NAMES_SHOWN = 5


def _each_node(kube: Any, nodes: list[dict], plan: Callable[[dict], Any], dry_run: bool
               ) -> tuple[list[str], list[str]]:
    """Plan and write each node's patch (the listed copy first: no GET unless a 409 says it changed),
    POOL_WORKERS at a time. Returns (names done or that would be, names failed with why); once a write
    is fenced, the nodes not yet written are not tried (failed: fenced)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    fenced = threading.Event()

    def one(node: dict) -> tuple[str, str]:
        name = md(node).get("name", "")
        path = f"/api/v1/nodes/{name}"
        if fenced.is_set():
            return name, "failed: fenced (not tried)"
        first = [node]

        def read() -> dict:  # after a 409: read it again, through the list the controller may do anyway
            if first:
                return first.pop()
            items = list(kube.iter_items("/api/v1/nodes", field_selector=f"metadata.name={name}"))
            if not items:
                raise KubeError(404, "NotFound", f"node {name} is gone")
            return items[0]

        try:
            result, _, _ = _guarded(read, plan, lambda n, patch: kube.merge_patch(path, patch), dry_run)
        except Fenced as exc:
            fenced.set()
            return name, f"failed: {exc}"
        except KubeError as exc:
            return name, f"failed: {exc}"
        return name, result

    done, failed = [], []
    with ThreadPoolExecutor(max_workers=POOL_WORKERS, thread_name_prefix="pool") as ex:
        for name, result in ex.map(one, nodes):
            if result in ("done", "dry-run"):
                done.append(name)
            elif result.startswith("failed"):
                failed.append(f"{name} ({result[8:]})")
    return sorted(done), failed


def names(items: list[str], shown: int = NAMES_SHOWN) -> str:
    """"a, b, c and 4,997 more": a pool action is summarised, not listed."""
    if not items:
        return "-"
    head = ", ".join(items[:shown])
    return head if len(items) <= shown else f"{head} and {len(items) - shown:,} more"


def _slim(node: dict) -> dict:
    """What a pool action reads of a listed Node (not its images, addresses, nodeInfo)."""
    st = node.get("status") or {}
    return {"metadata": md(node), "spec": node.get("spec") or {},
            "status": {k: st[k] for k in ("capacity", "allocatable", "conditions") if k in st}}


def taint_pool(kube: Any, ref: WorkloadRef, taint_key: str, node_selector: str, dry_run: bool) -> ControllerOutcome:
    taint = q.pool_taint(taint_key)
    nodes = [_slim(n) for n in kube.iter_items("/api/v1/nodes", node_selector) if is_gpu_node(n)]
    done, failed = _each_node(kube, nodes, lambda n: q.plan_taint(n, taint, ref.key), dry_run)
    what = f"taint {len(done):,} GPU node(s) {taint['key']}={taint['value']}:{taint['effect']}: {names(done)}"
    if failed:
        what += f"; failed on {len(failed):,}: {names(failed, 3)}"
    # any node not tainted (fenced: the Lease lost mid-way; the API away): failed, so the action is not
    # marked handled and is taken up again, by this leader or the next, for the nodes still without it
    return ControllerOutcome("failed" if failed else ("dry-run" if dry_run else "done"), what, {"taint": taint}, done)


def taint_node(kube: Any, node: str, taint_key: str, dry_run: bool) -> ControllerOutcome:
    """Taint one node NoSchedule (value `admission`): it fails every pod the scheduler sends there.
    Undo: kubectl taint node NODE KEY-"""
    taint = {"key": taint_key, "value": ADMISSION_TAINT_VALUE, "effect": q.TAINT_EFFECT}
    items = [_slim(n) for n in kube.iter_items("/api/v1/nodes", field_selector=f"metadata.name={node}")]
    if not items:
        return ControllerOutcome("skipped", f"node {node} is gone")
    done, failed = _each_node(kube, items, lambda n: q.plan_taint(n, taint, ADMISSION_HOLDER), dry_run)
    what = f"taint node {node} {taint['key']}={taint['value']}:{taint['effect']}"
    if failed:
        return ControllerOutcome("failed", f"{what}: {failed[0]}")
    if not done:
        return ControllerOutcome("skipped", f"node {node} is tainted {taint['key']} already")
    return ControllerOutcome("dry-run" if dry_run else "done", what, {"taint": taint}, done)


def untaint_node(kube: Any, node: str, taint_key: str, dry_run: bool) -> ControllerOutcome:
    """Drop the `admission` holder from one node (and the taint, when it was the last holder): the
    cause the node was tainted for has cleared."""
    items = [_slim(n) for n in kube.iter_items("/api/v1/nodes", field_selector=f"metadata.name={node}")]
    if not items:
        return ControllerOutcome("skipped", f"node {node} is gone")
    done, failed = _each_node(kube, items, lambda n: q.plan_untaint(n, taint_key, ADMISSION_HOLDER,
                                                                    (ADMISSION_TAINT_VALUE, q.TAINT_VALUE)), dry_run)
    what = f"lift the taint {taint_key}={ADMISSION_TAINT_VALUE}:{q.TAINT_EFFECT} from node {node}"
    if failed:
        return ControllerOutcome("failed", f"{what}: {failed[0]}")
    if not done:
        return ControllerOutcome("skipped", f"node {node} does not hold it any more")
    return ControllerOutcome("dry-run" if dry_run else "done", what, nodes=done)


def untaint_pool(kube: Any, ref: WorkloadRef, taint_key: str, dry_run: bool) -> ControllerOutcome:
    """Drop `ref` from the holders of the pool taint on every node; the taint goes with its last holder."""
    held = [_slim(n) for n in kube.iter_items("/api/v1/nodes") if ref.key in q.holders(n)]

    def plan(n: dict) -> Any:
        key = taint_key or next((t.get("key") for t in (n.get("spec") or {}).get("taints") or []
                                 if t.get("value") == q.TAINT_VALUE), "gpuwarden.io/quarantine")
        return q.plan_untaint(n, key, ref.key)

    done, _ = _each_node(kube, held, plan, dry_run)
    return ControllerOutcome("dry-run" if dry_run else "done",
                   f"release the pool taint on {f'{len(done):,} node(s): ' if done else ''}{names(done) if done else 'no node'}",
                   nodes=done)


# -- the agents' circuit breaker --------------------------------------------------------------------
def open_breaker(kube: Any, namespace: str, name: str, reason: str, at: float, by: str, dry_run: bool) -> ControllerOutcome:
    """data.open="true" on the agents' breaker ConfigMap (created if missing); the previous state is kept
    in the `gpuwarden.io/breaker` annotation. An already open breaker is left alone."""
    note = {"openedAt": format_rfc3339(at), "openedBy": by, "reason": reason[:1000]}
    for _ in range(ATTEMPTS):
        cm = kube.get_configmap(namespace, name)
        if cm is not None and breaker.check(kube, namespace, name).open:
            return ControllerOutcome("skipped", f"the breaker ConfigMap {namespace}/{name} is already open")
        what = f"open the agents' circuit breaker (ConfigMap {namespace}/{name} data.open=\"true\")"
        if dry_run:
            return ControllerOutcome("dry-run", what)
        data = {"open": "true", "reason": f"gpuwarden controller: {reason}"[:1000]}
        try:
            if cm is None:
                kube.create_configmap(namespace, {
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": namespace,
                                 "annotations": {BREAKER_ANNOTATION: json.dumps({**note, "previous": None})}},
                    "data": data})
            else:
                prev = {k: v for k, v in (cm.get("data") or {}).items() if k in ("open", "reason")}
                kube.patch_configmap(namespace, name, {
                    "metadata": {"resourceVersion": md(cm).get("resourceVersion", ""),
                                 "annotations": {BREAKER_ANNOTATION: json.dumps({**note, "previous": prev})}},
                    "data": data})
            return ControllerOutcome("done", what)
        except KubeError as exc:
            if not exc.conflict:
                return ControllerOutcome("failed", f"{what}: {exc}")
    return ControllerOutcome("failed", f"open the breaker ConfigMap {namespace}/{name}: conflicting writes")


def close_breaker(kube: Any, namespace: str, name: str, at: float, by: str, dry_run: bool) -> ControllerOutcome:
    cm = kube.get_configmap(namespace, name)
    if cm is None or not breaker.check(kube, namespace, name).open:
        return ControllerOutcome("skipped", f"the breaker ConfigMap {namespace}/{name} is not open")
    what = f"close the agents' circuit breaker (ConfigMap {namespace}/{name} data.open=\"false\")"
    if dry_run:
        return ControllerOutcome("dry-run", what)
    try:
        kube.patch_configmap(namespace, name, {
            "metadata": {"resourceVersion": md(cm).get("resourceVersion", ""),
                         "annotations": {BREAKER_ANNOTATION: json.dumps({"closedAt": format_rfc3339(at), "closedBy": by,
                                                                         "previous": cm.get("data") or {}})}},
            "data": {"open": "false", "reason": f"closed by {by} at {format_rfc3339(at)}"}})
    except KubeError as exc:
        return ControllerOutcome("failed", f"{what}: {exc}")
    return ControllerOutcome("done", what)


def close_fence_storm_breaker(kube: Any, namespace: str, name: str, at: float, by: str, dry_run: bool) -> ControllerOutcome:
    """Close the agents' breaker when a fence storm opened it (its data.reason says so), else leave it: a
    breaker an operator or a node storm opened stays open until `gpuwarden release breaker`."""
    from gpuwarden.controller.fencing import REASON_PREFIX

    cm = kube.get_configmap(namespace, name)
    if cm is None or not breaker.check(kube, namespace, name).open:
        return ControllerOutcome("skipped", f"the breaker ConfigMap {namespace}/{name} is not open")
    reason = str((cm.get("data") or {}).get("reason", ""))
    if not reason.startswith(f"gpuwarden controller: {REASON_PREFIX}"):
        return ControllerOutcome("skipped", f"the breaker ConfigMap {namespace}/{name} was not opened by a fence "
                                            "storm: it stays open until `gpuwarden release breaker`")
    return close_breaker(kube, namespace, name, at, by, dry_run)
