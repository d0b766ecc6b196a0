"""Quarantine and release as data: the annotation, and the merge patches that apply and undo it (pure).

A quarantined workload carries `gpuwarden.io/quarantine` (JSON):

    {"at": "2026-11-22T10:06:31Z", "by": "gpuwarden-controller/<identity>",
     "reason": "cascade: deployment ml/trainer: its pods were on 2 GPU nodes that failed ...",
     "nodes": ["gpu-a", "gpu-b"], "chain": [{"node": "gpu-a", "failedAt": ..., "signals": [...],
     "pod": "ml/trainer-7d9c-x2", ...}, ...],
     "undo": {"kind": "Deployment", "replicas": 3, "taint": {"key": ..., "value": ..., "effect": ...}}}

`action` is what was done, and `event` the name of the Event that reports it (`WorkloadQuarantined`):
the record is written in the same write as the action, so an action that happened always carries
its author, reason, time and evidence, and whoever leads next writes a missing Event from it, under
that name, exactly once (controller/loop.py `_record`).

`undo` is what `gpuwarden release` restores: `replicas` (Deployment, StatefulSet, ReplicaSet),
`suspend` (Job, CronJob; a CronJob also lists the active `jobs` it suspended), and `taint` when the
GPU pool was tainted. Every write carries the object's resourceVersion, so a concurrent change makes
it fail (and be re-planned) instead of being overwritten. Release leaves
`gpuwarden.io/quarantine-released` (JSON: when, by whom, what was restored).

The pool taint is `<taint_key>=cascade:NoSchedule` on every GPU node (or those matching
--node-selector). Taints are unique per key and effect, so one taint serves every quarantined
workload: each tainted node lists the workloads holding it in `gpuwarden.io/quarantine-holders`
(JSON list of workload keys), and the taint goes when the last holder is released.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from msgspec import Struct, field

from gpuwarden.controller.model import WorkloadRef, annotations, md
from gpuwarden.parsers.wallclock import format_rfc3339
from gpuwarden.remediation.guard import OPT_OUT

ANNOTATION = "gpuwarden.io/quarantine"
RELEASED = "gpuwarden.io/quarantine-released"
NODE_HOLDERS = "gpuwarden.io/quarantine-holders"
TAINT_VALUE = "cascade"
TAINT_EFFECT = "NoSchedule"
SCALABLE = ("Deployment", "StatefulSet", "ReplicaSet")
SUSPENDABLE = ("Job", "CronJob")


class QuarantinePatch(Struct):
    describe: str  # "scale deployment ml/trainer from 3 to 0"
    patch: dict  # merge patch (carries metadata.resourceVersion)
    undo: dict = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)  # a CronJob's active Jobs to suspend / resume too
    record: dict = field(default_factory=dict)  # the quarantine record it writes


class Skip(Struct):
    why: str
    absent: bool = False  # nothing recorded to undo (as opposed to: refused)
    record: dict | None = None  # already quarantined: the record found


def event_name(ref: WorkloadRef, at: str, by: str) -> str:
    """The name of the Event that reports a quarantine: one per record (workload, time, author), so
    that its creation is idempotent: a second create of it is refused (409), never a second record."""
    digest = hashlib.sha256(f"{ref.kind}/{ref.namespace}/{ref.name}/{at}/{by}".encode()).hexdigest()[:16]
    stem = "".join(c if c.isalnum() or c in "-." else "-" for c in ref.name.lower()).strip("-.")[:200] or "workload"
    return f"{stem}.gwq-{digest}"


def record(obj: Mapping, reason: str, nodes: list[str], chain: list[dict], undo: dict, at: float, by: str,
           ref: WorkloadRef | None = None, action: str = "") -> dict:
    rec = {"at": format_rfc3339(at), "by": by, "reason": reason, "nodes": nodes, "chain": chain, "undo": undo}
    if ref is not None:
        rec["action"] = action
        rec["event"] = event_name(ref, rec["at"], by)
    return rec


def read_record(obj: Mapping) -> dict | None:
    """The quarantine record on a workload, or None (a garbled one reads as {"garbled": text})."""
    raw = annotations(obj).get(ANNOTATION)
    if raw is None:
        return None
    try:
        rec = json.loads(raw)
        return rec if isinstance(rec, dict) else {"garbled": raw}
    except ValueError:
        return {"garbled": raw}


def _truthy(v: Any) -> bool:
    return str(v).strip().lower() in ("true", "yes", "1")


def plan_quarantine(obj: Mapping, ref: WorkloadRef, reason: str, nodes: list[str], chain: list[dict], at: float,
                    by: str, taint: dict | None = None, stop: bool = True) -> QuarantinePatch | Skip:
    """Scale to zero / suspend `obj` (`stop`), recording the undo (and the pool `taint`, when one was set);
    Skip says why not."""
    existing = read_record(obj)
    if existing is not None:
        return Skip(f"already quarantined since {existing.get('at', '?')} ({ANNOTATION})", record=existing)
    if _truthy(annotations(obj).get(OPT_OUT, "")):
        return Skip(f"opted out ({OPT_OUT}: \"true\")")
    if ref.kind not in SCALABLE + SUSPENDABLE:
        return Skip(f"cannot quarantine a {ref.kind}: reported only")
    spec = obj.get("spec") or {}
    undo: dict[str, Any] = {"kind": ref.kind}
    spec_patch: dict[str, Any] = {}
    jobs: list[str] = []
    what = ""
    if stop and ref.kind in SCALABLE:
        replicas = spec.get("replicas")
        replicas = 1 if replicas is None else int(replicas)
        if replicas == 0:
            return Skip(f"{ref.kind.lower()} {ref.namespace}/{ref.name} is already scaled to 0")
        undo["replicas"] = replicas
        spec_patch = {"replicas": 0}
        what = f"scale {ref.kind.lower()} {ref.namespace}/{ref.name} from {replicas} to 0"
    elif stop:
        if spec.get("suspend") is True:
            return Skip(f"{ref.kind.lower()} {ref.namespace}/{ref.name} is already suspended")
        undo["suspend"] = False
        spec_patch = {"suspend": True}
        what = f"suspend {ref.kind.lower()} {ref.namespace}/{ref.name}"
        if ref.kind == "CronJob":
            jobs = sorted(a.get("name", "") for a in ((obj.get("status") or {}).get("active") or []) if a.get("name"))
            undo["jobs"] = jobs
            if jobs:
                what += f" and its active job(s) {', '.join(jobs)}"
        else:
            what += " (the Job controller stops its pods)"
    if taint:
        undo["taint"] = dict(taint)
        what = what or f"record the pool taint on {ref.kind.lower()} {ref.namespace}/{ref.name}"
    if not what:
        return Skip("nothing to do (no quarantine action enabled)")
    rec = record(obj, reason, nodes, chain, undo, at, by, ref, what)
    patch: dict[str, Any] = {"metadata": {"resourceVersion": md(obj).get("resourceVersion", ""),
                                          "annotations": {ANNOTATION: json.dumps(rec, separators=(",", ":"))}}}
    if spec_patch:
        patch["spec"] = spec_patch
    return QuarantinePatch(what, patch, undo, jobs, rec)


def plan_release(obj: Mapping, ref: WorkloadRef, at: float, by: str, force: bool = False) -> QuarantinePatch | Skip:
    """Undo a quarantine from its record; Skip when there is none or the object changed since."""
    rec = read_record(obj)
    if rec is None:
        return Skip(f"{ref.key} is not quarantined (no {ANNOTATION} annotation)", absent=True)
    undo = rec.get("undo") if isinstance(rec.get("undo"), dict) else None
    if undo is None or undo.get("kind") not in (None, ref.kind):
        if not force:
            return Skip(f"{ref.key}: the {ANNOTATION} record has no usable undo ({json.dumps(rec)[:200]}); "
                        f"--force removes the annotation without restoring anything")
        undo = {}
    spec = obj.get("spec") or {}
    spec_patch: dict[str, Any] = {}
    jobs: list[str] = []
    what: list[str] = []
    if "replicas" in undo:
        cur = spec.get("replicas")
        cur = 1 if cur is None else int(cur)
        if cur != 0 and not force:
            return Skip(f"{ref.key} has replicas={cur}, not 0: it was changed after the quarantine; "
                        f"--force drops the annotation and keeps replicas={cur}")
        if cur == 0:
            spec_patch["replicas"] = int(undo["replicas"])
            what.append(f"scale {ref.kind.lower()} {ref.namespace}/{ref.name} back to {int(undo['replicas'])}")
    if "suspend" in undo:
        if spec.get("suspend") is not True and not force:
            return Skip(f"{ref.key} is not suspended any more: it was changed after the quarantine; "
                        f"--force drops the annotation")
        spec_patch["suspend"] = bool(undo["suspend"])
        what.append(f"resume {ref.kind.lower()} {ref.namespace}/{ref.name}")
        jobs = list(undo.get("jobs") or [])
        if jobs:
            what.append(f"resume job(s) {', '.join(jobs)}")
    released = {"at": format_rfc3339(at), "by": by, "quarantinedAt": rec.get("at"), "restored": undo}
    patch: dict[str, Any] = {"metadata": {"resourceVersion": md(obj).get("resourceVersion", ""),
                                          "annotations": {ANNOTATION: None,
                                                          RELEASED: json.dumps(released, separators=(",", ":"))}}}
    if spec_patch:
        patch["spec"] = spec_patch
    return QuarantinePatch("; ".join(what) or f"remove the {ANNOTATION} annotation from {ref.key}", patch, undo, jobs)


# -- the pool taint --------------------------------------------------------------------------------
def pool_taint(key: str) -> dict:
    return {"key": key, "value": TAINT_VALUE, "effect": TAINT_EFFECT}


def holders(node: Mapping) -> list[str]:
    try:
        v = json.loads(annotations(node).get(NODE_HOLDERS) or "[]")
        return [str(x) for x in v] if isinstance(v, list) else []
    except ValueError:
        return []


def _same(t: Mapping, taint: Mapping) -> bool:
    return t.get("key") == taint["key"] and t.get("effect") == taint["effect"]


def plan_taint(node: Mapping, taint: dict, holder: str) -> dict | None:
    """Merge patch adding `taint` and `holder` to a node (None: nothing to do)."""
    taints = list(((node.get("spec") or {}).get("taints")) or [])
    hs = holders(node)
    has = any(_same(t, taint) for t in taints)
    if has and holder in hs:
        return None
    if not has:
        taints.append(dict(taint))
    return {"metadata": {"resourceVersion": md(node).get("resourceVersion", ""),
                         "annotations": {NODE_HOLDERS: json.dumps(sorted(set(hs) | {holder}))}},
            "spec": {"taints": taints}}


def plan_untaint(node: Mapping, taint_key: str, holder: str, values: tuple[str, ...] = (TAINT_VALUE,)) -> dict | None:
    """Merge patch removing `holder` (and the taint of one of `values`, when it was the last holder);
    None if not held."""
    hs = holders(node)
    if holder not in hs:
        return None
    rest = [h for h in hs if h != holder]
    patch: dict[str, Any] = {"metadata": {"resourceVersion": md(node).get("resourceVersion", ""),
                                          "annotations": {NODE_HOLDERS: json.dumps(rest) if rest else None}}}
    if not rest:
        taints = list(((node.get("spec") or {}).get("taints")) or [])
        patch["spec"] = {"taints": [t for t in taints if not (t.get("key") == taint_key and t.get("value") in values
                                                             and t.get("effect") == TAINT_EFFECT)]}
    return patch
