"""A one-shot check on a node through a short-lived privileged pod, as `kubectl debug node/...` does.

The pod is pinned to the node (`nodeName`: no scheduler involved, every taint tolerated), shares
the host's PID and network namespaces (as `kubectl debug node` does) and mounts the host's root read-only at /host, then runs
`gpuwarden check --root /host --format json`. The report comes back through the API server alone:
the check also writes it, packed (gpuwarden.render.packed), to the termination message, which the
kubelet copies into `status.containerStatuses[].state.terminated.message`. When the message is
missing or had to be reduced, the pod's log (the full JSON on stdout) is read instead. The pod is
deleted in every case, and `activeDeadlineSeconds` bounds it even if this process dies first.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable

from msgspec import Struct, field

from gpuwarden import __version__
from gpuwarden.render.packed import unpack

IMAGE = f"ghcr.io/gpuwarden/gpuwarden:{__version__}"
CONTAINER = "check"
LABELS = {"app.kubernetes.io/name": "gpuwarden", "app.kubernetes.io/component": "check"}
TERMINATION_LOG = "/dev/termination-log"
HOST_MOUNTS = (("host", "/", "/host"), ("host-sys", "/sys", "/host/sys"), ("host-dev", "/dev", "/host/dev"))


class CheckError(RuntimeError):
    """The check could not be run or its result could not be read; the message says why."""


def pod_manifest(node: str, namespace: str, image: str = IMAGE, timeout_s: int = 120, name: str = "",
                 args: list[str] | None = None) -> dict:
    """The check pod for `node`: privileged, host PID, host root read-only at /host, never restarted."""
    name = name or f"gpuwarden-check-{uuid.uuid4().hex[:8]}"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {**LABELS, "gpuwarden.io/node": node[:63]}},
        "spec": {
            "nodeName": node,
            "hostPID": True,
            "hostNetwork": True,  # and so the node's UTS namespace: the report names the node, not the pod
            "restartPolicy": "Never",
            "activeDeadlineSeconds": int(timeout_s),
            "terminationGracePeriodSeconds": 5,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["gpuwarden"],
                "args": ["check", "--root", "/host", "--format", "json",
                         "--termination-message", TERMINATION_LOG, *(args or [])],
                "terminationMessagePath": TERMINATION_LOG,
                "terminationMessagePolicy": "File",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}],
                "securityContext": {"privileged": True, "runAsUser": 0, "readOnlyRootFilesystem": True},
                "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"memory": "512Mi"}},
                "volumeMounts": [*({"name": v, "mountPath": m, "readOnly": True} for v, _, m in HOST_MOUNTS),
                                 {"name": "tmp", "mountPath": "/tmp"}],
            }],
            "volumes": [*({"name": v, "hostPath": {"path": p, "type": "Directory"}} for v, p, _ in HOST_MOUNTS),
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
        },
    }


class CheckPodOutcome(Struct):
    """What the pod gave back: the report (None when unreadable), where it came from, how it ended."""

    pod: str
    report: dict | None
    source: str  # "termination message", "log", "reduced termination message" or ""
    exit_code: int | None
    notes: list[str] = field(default_factory=list)


def terminated(pod: dict, container: str = CONTAINER) -> dict | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            return (cs.get("state") or {}).get("terminated")
    return None


def waiting_reason(pod: dict) -> str:
    """Why the pod has not finished yet, in the kubelet's words (image pull, scheduling, ...)."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        w = (cs.get("state") or {}).get("waiting")
        if w:
            return f"{w.get('reason', 'Waiting')}: {w.get('message', '')}".strip(": ")
    for c in status.get("conditions") or []:
        if c.get("status") == "False" and c.get("message"):
            return f"{c.get('type')}: {c.get('message')}"
    return f"phase {status.get('phase') or 'unknown'}"


def run(kube: Any, node: str, namespace: str, image: str = IMAGE, timeout_s: float = 120.0,
        poll_s: float = 1.0, args: list[str] | None = None,
        on_created: Callable[[dict], None] | None = None) -> CheckPodOutcome:
    """Create the pod, wait (at most `timeout_s`) for its container to end, read the report, delete it."""
    from gpuwarden.kube.errors import KubeError

    try:
        kube.get_node(node)
    except KubeError as exc:
        raise CheckError(f"no node {node!r}" if exc.not_found else f"cannot read node {node!r}: {exc}") from None
    body = pod_manifest(node, namespace, image, int(timeout_s) + 30, args=args)
    name = body["metadata"]["name"]
    path = f"/api/v1/namespaces/{namespace}/pods"
    try:
        created = kube.request("POST", path, body)
    except KubeError as exc:
        raise CheckError(f"cannot create the check pod in namespace {namespace!r}: {exc}") from None
    uid = (created.get("metadata") or {}).get("uid", "")
    try:
        if on_created is not None:
            on_created(created)
        deadline = time.monotonic() + timeout_s
        pod = created
        while (term := terminated(pod)) is None:
            status = pod.get("status") or {}
            if status.get("phase") in ("Failed", "Succeeded"):
                raise CheckError(f"pod {namespace}/{name} ended ({status.get('phase')}: "
                                 f"{status.get('reason') or ''} {status.get('message') or ''}".rstrip() + ") with no "
                                 "container result")
            if time.monotonic() >= deadline:
                raise CheckError(f"pod {namespace}/{name} did not finish within {timeout_s:.0f} s "
                                 f"({waiting_reason(pod)})")
            time.sleep(poll_s)
            try:
                pod = kube.get_pod(namespace, name)
            except KubeError as exc:
                if exc.not_found:
                    raise CheckError(f"pod {namespace}/{name} was deleted before it finished") from None
                raise CheckError(f"cannot read pod {namespace}/{name}: {exc}") from None
        return _collect(kube, namespace, name, term)
    finally:
        try:
            kube.delete_pod(namespace, name, uid=uid, grace_s=0)
        except KubeError:
            pass  # already gone; activeDeadlineSeconds bounds it otherwise


def _collect(kube: Any, namespace: str, name: str, term: dict) -> CheckPodOutcome:
    from gpuwarden.kube.errors import KubeError

    code = term.get("exitCode")
    packed = unpack(term.get("message") or "")
    notes: list[str] = []
    if packed is not None and packed.get("packed") != "reduced":
        return CheckPodOutcome(name, packed, "termination message", code)
    try:
        log = kube.request_text("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log",
                                query=[("container", CONTAINER)], accept="text/plain")
        full = unpack(log[log.find("{"):]) if "{" in log else None
        if full is not None:
            return CheckPodOutcome(name, full, "log", code)
        notes.append("the pod's log holds no JSON report")
    except KubeError as exc:
        notes.append(f"cannot read the pod's log: {exc}")
    if packed is not None:
        notes.append("the report was reduced to fit the termination message: evidence and fixes left out")
        return CheckPodOutcome(name, packed, "reduced termination message", code, notes)
    reason = term.get("reason") or ""
    notes.append(f"the container ended with exit code {code} ({reason}) and no readable report")
    return CheckPodOutcome(name, None, "", code, notes)
